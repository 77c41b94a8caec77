"""A pool child that dies under a task is named and counted by the worker's main process: the signal,
or OOMKilled when the kernel's OOM killer took it (the container lives on, so Kubernetes records
nothing; this metric is what the operator puts in the WorkerPool status)."""
import os
import signal
import time
import uuid
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from support.worker_process import WorkerProcess
from taskherd.worker.child_deaths import OomKills, cause_of, parse_status, read_oom_kills
from e2e.lib.waiting import wait_for
from worker_support import core_env, dead_letters

DEATHS = "taskherd_pool_child_deaths_total"
LAST_DEATH = "taskherd_pool_child_last_death_timestamp_seconds"


# -- the pure parts -------------------------------------------------------------------------------
def test_billiards_message_gives_the_signal_or_the_exit_code():
    assert parse_status("Worker exited prematurely: signal 9 (SIGKILL) Job: 3.") == (9, None)
    assert parse_status("Worker exited prematurely: signal 11 (SIGSEGV) Job: 0.") == (11, None)
    assert parse_status("Worker exited prematurely: exitcode 70 Job: 12.") == (None, 70)
    assert parse_status("something else") == (None, None)
    assert cause_of(9, None, oom_killed=True) == "OOMKilled"
    assert cause_of(9, None, oom_killed=False) == "SIGKILL"
    assert cause_of(11, None, oom_killed=True) == "SIGSEGV", "only SIGKILL can be the OOM killer's"
    assert cause_of(None, 70, oom_killed=False) == "ExitCode70"
    assert cause_of(None, None, oom_killed=False) == "Unknown"


def test_each_oom_kill_the_cgroup_counted_is_attributed_to_one_death():
    counts = iter([4, 4, 6, 6, 6, None])
    kills = OomKills(lambda: next(counts))  # 4 before this worker started: nobody's here
    assert not kills.claim()  # still 4: a plain SIGKILL
    assert kills.claim() and kills.claim(), "two children killed at once are both OOMKilled"
    assert not kills.claim(), "a later death is not an OOM kill already attributed"
    assert not kills.claim(), "an unreadable counter attributes nothing"


def test_the_counter_is_read_from_the_cgroup_v1_or_v2_files(tmp_path):
    (tmp_path / "memory" / "kubepods" / "pod1").mkdir(parents=True)
    (tmp_path / "memory" / "kubepods" / "pod1" / "memory.oom_control").write_text(
        "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n")
    proc = tmp_path / "cgroup"
    proc.write_text("4:memory:/kubepods/pod1\n0::/\n")
    assert read_oom_kills(tmp_path, proc) == 3, "v1, on a host: the process's own cgroup"
    proc.write_text("4:memory:/elsewhere\n")
    (tmp_path / "memory" / "memory.oom_control").write_text("oom_kill 5\n")
    assert read_oom_kills(tmp_path, proc) == 5, "v1, in a container: the mount is the container's cgroup"
    proc.write_text("0::/\n")
    (tmp_path / "memory.events").write_text("low 0\nhigh 0\nmax 2\noom 2\noom_kill 2\n")
    assert read_oom_kills(tmp_path, proc) == 2, "v2"
    assert read_oom_kills(tmp_path / "none", tmp_path / "none") is None


# -- a real worker ---------------------------------------------------------------------------------
@pytest.fixture
def record_url(redis_url) -> str:
    """Counting does not depend on the broker: Redis only, recording in the broker's database."""
    return redis_url


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def deaths(port: int) -> dict[tuple[str, str, str], float]:
    """(metric, task, cause) -> value, from the worker's /metrics."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    return {(s.name, s.labels["task"], s.labels["cause"]): s.value
            for family in text_string_to_metric_families(text) for s in family.samples
            if s.name in (DEATHS, LAST_DEATH)}


def test_a_child_killed_mid_task_is_counted_with_its_signal(
        redis_url, recorded, unique_name, worker_factory):
    port = free_port()
    env = {**core_env(redis_url, unique_name, redis_url), "TASKHERD_METRICS_PORT": str(port)}
    worker = worker_factory("apps.core_app", queues=[unique_name], env=env, concurrency=1)
    from celery import Celery

    Celery(broker=redis_url).send_task("core.slow", args=("job", 1.0), queue=unique_name)
    wait_for("the task to start", lambda: recorded("job:start"), timeout=30)
    (_, child, _), = recorded("job:start")
    killed_at = time.time()
    os.kill(child, signal.SIGKILL)
    wait_for("the task to run again and finish", lambda: recorded("job:done"), timeout=60)

    seen = wait_for("the death on /metrics", lambda: deaths(port), timeout=15,
                    until=lambda seen: seen.get((DEATHS, "core.slow", "SIGKILL")))
    # every registered task x known cause exists from the start at 0 (increase() sees the first death)
    assert {key for key, value in seen.items() if key[0] == DEATHS and value} == {(DEATHS, "core.slow", "SIGKILL")}
    assert seen[(DEATHS, "core.slow", "SIGKILL")] == 1
    assert killed_at <= seen[(LAST_DEATH, "core.slow", "SIGKILL")] <= time.time()
    assert "the pool process running core.slow[" in worker.log() and "died: SIGKILL" in worker.log()


class MemoryCgroup:
    """A cgroup v1 memory cgroup of this test, under the test process's own: what a container's
    memory limit is to its processes."""

    def __init__(self, limit_mb: int):
        own = next((line.split(":", 2)[2] for line in Path("/proc/self/cgroup").read_text().splitlines()
                    if "memory" in line.split(":", 2)[1].split(",")), None)
        base = Path("/sys/fs/cgroup/memory")
        if own is None or not (base / own.lstrip("/")).is_dir():
            pytest.skip("needs a cgroup v1 memory controller holding this process (this machine's layout)")
        self.path = base / own.lstrip("/") / f"taskherd-test-{uuid.uuid4().hex[:8]}"
        try:
            self.path.mkdir()
        except OSError as exc:
            pytest.skip(f"cannot create a memory cgroup here ({exc}): run the tests as root, as make test does")
        (self.path / "memory.limit_in_bytes").write_text(str(limit_mb * 1024 * 1024))
        if (self.path / "memory.memsw.limit_in_bytes").exists():  # no swapping out of the limit
            (self.path / "memory.memsw.limit_in_bytes").write_text(str(limit_mb * 1024 * 1024))

    def oom_kills(self) -> int:
        text = (self.path / "memory.oom_control").read_text()
        return int(next(line.split()[1] for line in text.splitlines() if line.startswith("oom_kill ")))

    def remove(self) -> None:
        for _ in range(50):  # the worker's processes leave it as they are reaped
            try:
                self.path.rmdir()
                return
            except OSError:
                time.sleep(0.1)


class WorkerInCgroup(WorkerProcess):
    def __init__(self, cgroup: MemoryCgroup, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.cgroup = cgroup

    def command(self) -> list[str]:
        # The shell joins the cgroup, then becomes the worker: everything it forks is inside.
        return ["sh", "-c", f'echo $$ > {self.cgroup.path}/cgroup.procs && exec "$@"', "sh", *super().command()]


def test_a_child_the_oom_killer_takes_is_oomkilled_in_the_metrics_and_the_poison_bound_holds(
        redis_url, recorded, unique_name, tmp_path):
    cgroup = MemoryCgroup(limit_mb=300)
    port = free_port()
    env = {**core_env(redis_url, unique_name, redis_url, max_deliveries=2), "TASKHERD_METRICS_PORT": str(port)}
    worker = WorkerInCgroup(cgroup, "apps.core_app", log_dir=tmp_path, queues=[unique_name], env=env,
                            concurrency=1)
    try:
        worker.start()
        from celery import Celery

        Celery(broker=redis_url).send_task("core.allocate", args=("report", 600), queue=unique_name)
        (letter,) = wait_for("the report dead-lettered after two OOM kills",
                             lambda: dead_letters(redis_url, unique_name), timeout=120)
        assert letter.envelope.reason == "killed-worker"
        assert len(recorded("report:start")) == 2 and recorded("report:done") == []
        assert cgroup.oom_kills() == 2, "the kernel's OOM killer, not a signal we sent"
        seen = deaths(port)
        assert {key: value for key, value in seen.items() if key[0] == DEATHS and value} == {
            (DEATHS, "core.allocate", "OOMKilled"): 2}
        assert worker.is_running(), "the OOM killer took the pool child, not the worker"
        assert worker.log().count("died: OOMKilled") == 2
    finally:
        worker.kill()
        cgroup.remove()
