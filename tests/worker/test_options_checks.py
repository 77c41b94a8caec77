"""Worker options and app settings that made a worker start in a state where it silently did
nothing, lied to its probes, or failed with a traceback naming nothing (probe opts38):

- ``celery worker -B``: the embedded beat wrote its own record into the worker's heartbeat.json, so
  a worker whose main loop was stopped stayed "alive" (and readiness and drain read beat's pid);
- a prefetch multiplier out of range (-1, 0, or past RabbitMQ's 16-bit basic.qos count);
- ``taskherd worker -P gevent`` without gevent, and Celery's SecurityError (pickle while root): tracebacks;
- ``app.conf.task_default_queue`` set after configure() to a queue nobody consumes;
- ``taskherd worker --time-limit`` named ``time_limit=`` instead of the flag;
- ``--purge`` / ``celery purge`` left the parked countdown tasks (taskherd.delayed) to run afterwards.

Real workers on the project's brokers; the test app is written here (OPTS_POST: code run after configure()).
"""
from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
from celery import Celery

from e2e.lib.waiting import wait_for
from support.worker_process import WorkerProcess, python_env
from taskherd.worker import ProfileError, configure

APP = '''
import os
from celery import Celery
from taskherd.worker import configure

env = os.environ.get
app = Celery("opts", broker=env("OPTS_BROKER_URL"))
app.conf.broker_connection_retry_on_startup = True
configure(app, queues=[env("OPTS_QUEUE")], soft_time_limit=8, time_limit=10,
          delivery_counter_url=env("OPTS_COUNTER_URL") or None, **eval(env("OPTS_KW") or "{}"))
exec(env("OPTS_POST") or "")


@app.task(name="opts.work")
def work(key):
    return key
'''


@pytest.fixture
def app_dir(tmp_path) -> Path:
    directory = tmp_path / "optsapp"
    directory.mkdir()
    (directory / "opts_app.py").write_text(APP)
    return directory


def app_env(app_dir: Path, broker_url: str, queue: str, counter_url: str = "", **more: str) -> dict[str, str]:
    path = os.pathsep.join(filter(None, [str(app_dir), os.environ.get("PYTHONPATH")]))
    return {"PYTHONPATH": path, "OPTS_BROKER_URL": broker_url, "OPTS_QUEUE": queue,
            "OPTS_COUNTER_URL": counter_url, "TASKHERD_HEARTBEAT_INTERVAL": "1", **more}


class TaskherdWorker(WorkerProcess):
    """The same worker process, started by `taskherd worker`."""

    def command(self) -> list[str]:
        return [sys.executable, "-m", "taskherd.cli", "worker", "-A", self.app_module,
                "--queues", ",".join(self.queues), "--concurrency", str(self.concurrency), "--loglevel", "INFO",
                "--hostname", self.hostname, "--without-mingle", "--without-gossip", *self.extra_args]


def refused(worker: WorkerProcess) -> str:
    """The log of a worker that must exit 1 before it is ready."""
    with pytest.raises(AssertionError, match=r"worker exited \(1\)") as exited:
        try:
            worker.start()
        finally:
            worker.kill()
    return str(exited.value)


def taskherd_worker(app_dir: Path, env: dict[str, str], *argv: str) -> subprocess.CompletedProcess:
    """`taskherd worker -A opts_app …` run to its end (it must refuse before starting)."""
    full = python_env({k: v for k, v in env.items() if k != "PYTHONPATH"}, path=[app_dir, Path(__file__).parent.parent])
    full.pop("C_FORCE_ROOT", None)
    return subprocess.run([sys.executable, "-m", "taskherd.cli", "worker", "-A", "opts_app", *argv], env=full,
                          capture_output=True, text=True, timeout=120, cwd=app_dir)


# -- D1: -B ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("broker_url", ["redis"], indirect=True)
def test_an_embedded_beat_leaves_the_heartbeat_to_the_worker_whose_stopped_loop_fails_liveness(
        broker_url, unique_name, app_dir, tmp_path):
    post = "app.conf.beat_schedule = {'tick': {'task': 'opts.work', 'schedule': 1.0, 'args': ('beat',)}}"
    worker = WorkerProcess("opts_app", log_dir=tmp_path, queues=[unique_name], concurrency=1,
                           env=app_env(app_dir, broker_url, unique_name, OPTS_POST=post),
                           extra_args=["-B", "-s", str(tmp_path / "beat-schedule")])
    heartbeat = Path(worker.env["TASKHERD_HEARTBEAT_DIR"]) / "heartbeat.json"

    def probe(kind: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "taskherd.cli", "probe", kind, "--dir", str(heartbeat.parent)],
                              capture_output=True, text=True, timeout=30)

    try:
        worker.start()
        worker.wait_for_log("beat: Starting...", timeout=30)
        worker.wait_for_log("Task opts.work[", timeout=30)  # beat's ticks are running
        seen = set()
        for _ in range(25):  # 5 s: beat ticks every second; the worker writes every second
            record = json.loads(heartbeat.read_text())
            seen.add((record.get("role", "worker"), record["pid"]))
            time.sleep(0.2)
        assert seen == {("worker", worker.pid)}, f"only the worker's own record, never beat's: {seen}"
        assert probe("liveness").returncode == 0
        worker.signal(signal.SIGSTOP)
        try:
            time.sleep(12)  # 6 missed intervals of 1 s, and margin
            verdict = probe("liveness")
            assert verdict.returncode == 1, verdict.stdout
            assert "the worker's main loop is not running" in verdict.stdout, verdict.stdout
            assert json.loads(heartbeat.read_text())["pid"] == worker.pid
        finally:
            worker.signal(signal.SIGCONT)
    finally:
        worker.kill()


def test_the_beat_heartbeat_knows_an_embedded_beat_from_a_standalone_one():
    """beat_init fires in both; only Celery's embedded services (-B) run in a _Threaded thread or a
    _Process child."""
    import threading

    from celery import beat as celery_beat

    from taskherd.worker.components.beat import embedded_in_a_worker

    assert embedded_in_a_worker() is False
    seen = []
    thread = celery_beat._Threaded(Celery("embedded", set_as_current=False))
    thread.run = lambda: seen.append(embedded_in_a_worker())
    thread.start()
    thread.join(10)
    plain = threading.Thread(target=lambda: seen.append(embedded_in_a_worker()))
    plain.start()
    plain.join(10)
    assert seen == [True, False]


# -- D2: prefetch ------------------------------------------------------------------------------------

@pytest.mark.parametrize("broker_url", ["redis", "rabbitmq"], indirect=True)
def test_a_prefetch_multiplier_below_one_is_refused_at_worker_start_naming_it_as_written(
        broker_url, redis_url, unique_name, app_dir, tmp_path):
    env = app_env(app_dir, broker_url, unique_name, redis_url)
    said = refused(WorkerProcess("opts_app", log_dir=tmp_path, queues=[unique_name], concurrency=2, env=env,
                                 extra_args=["--prefetch-multiplier", "-1"]))
    assert ("the worker runs with --prefetch-multiplier=-1: --prefetch-multiplier must be an integer >= 1 (0 means "
            "unlimited prefetch)") in said, said[-3000:]
    assert "struct.error" not in said
    said = refused(WorkerProcess("opts_app", log_dir=tmp_path, queues=[unique_name], concurrency=2,
                                 env={**env, "OPTS_POST": "app.conf.worker_prefetch_multiplier = 0"}))
    assert ("the worker runs with app.conf.worker_prefetch_multiplier=0, changed after configure(app), which set 1: "
            "app.conf.worker_prefetch_multiplier must be an integer >= 1") in said, said[-3000:]


@pytest.mark.parametrize("broker_url", ["rabbitmq"], indirect=True)
def test_a_prefetch_count_past_rabbitmqs_16_bits_is_refused_with_its_range(broker_url, redis_url, unique_name,
                                                                           app_dir, tmp_path):
    """configure(prefetch_multiplier=40000) with 2 pool processes: basic.qos's prefetch_count 80000
    was a struct.error ('H' format) naming nothing."""
    env = app_env(app_dir, broker_url, unique_name, redis_url, OPTS_KW="dict(prefetch_multiplier=40000)")
    said = refused(WorkerProcess("opts_app", log_dir=tmp_path, queues=[unique_name], concurrency=2, env=env))
    assert "configure()'s prefetch_multiplier=40000: prefetch_multiplier x pool size" in said, said[-3000:]
    assert "= 80000 prefetched messages, more than RabbitMQ's basic.qos takes (65535" in said
    assert "valid: an integer from 1 to 32767" in said
    assert "struct.error" not in said

    done = taskherd_worker(app_dir, {**env, "OPTS_KW": ""}, "-Q", unique_name, "-c", "3",
                           "--prefetch-multiplier", "30000")
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        "taskherd worker: --prefetch-multiplier=30000 x the pool size (-c/--concurrency) 3 = 90000 prefetched "
        "messages, more than RabbitMQ's basic.qos takes (65535: a 16-bit field); the worker would fail at its first "
        "connection (valid: an integer from 1 to 21845, 1 recommended with the pool size (-c/--concurrency) 3)"]

    with pytest.raises(ProfileError, match=r"prefetch_multiplier=70000 x at least one pool process 1 = 70000"):
        configure(Celery("huge", broker=broker_url, set_as_current=False), prefetch_multiplier=70000,
                  delivery_counter_url=redis_url)


def test_the_prefetch_rule_is_one():
    from taskherd.worker.profile import prefetch_problem

    assert prefetch_problem(1, named="x", amqp=True, pool_size=65535) is None
    assert "x=2 x the pool size 65535" in prefetch_problem(2, named="x", amqp=True, pool_size=65535)
    assert prefetch_problem(40000, named="x", amqp=False, pool_size=8) is None  # Redis: > 1 is judged apart
    for value in (0, -1, True, 1.5, "2"):
        assert "must be an integer >= 1" in prefetch_problem(value, named="--prefetch-multiplier", amqp=False)


# -- D3: one line, not a traceback -------------------------------------------------------------------

@pytest.mark.skipif(importlib.util.find_spec("gevent") is not None, reason="gevent is installed here")
def test_a_pool_whose_library_is_missing_is_one_line(app_dir, redis_url, unique_name):
    env = app_env(app_dir, redis_url, unique_name)
    done = taskherd_worker(app_dir, env, "-Q", unique_name, "-P", "gevent")
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [
        "taskherd worker: -P/--pool='gevent' needs the gevent library, which is not installed (pip install gevent; "
        "or another pool: valid: prefork, eventlet, gevent, solo, processes, threads, or module:Class of a Celery pool)"]
    done = taskherd_worker(app_dir, {**env, "OPTS_POST": "app.conf.worker_pool = 'gevent'"}, "-Q", unique_name)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert "taskherd worker: app.conf.worker_pool='gevent' needs the gevent library" in done.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="Celery refuses pickle only to a worker running as root")
def test_pickle_accepted_while_root_is_one_line_naming_the_setting(app_dir, redis_url, unique_name):
    env = app_env(app_dir, redis_url, unique_name, OPTS_POST="app.conf.accept_content = ['json', 'pickle']")
    done = taskherd_worker(app_dir, env, "-Q", unique_name)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("taskherd worker: app.conf.accept_content=['json', 'pickle'] accepts pickle and the "
                           "worker runs as root, which Celery refuses: Running a worker with superuser"), line
    assert "(valid: accept_content=['json']" in line


# -- D4: the default queue ---------------------------------------------------------------------------

@pytest.mark.parametrize("broker_url", ["redis"], indirect=True)
def test_a_default_queue_set_after_configure_is_refused_and_a_route_elsewhere_warned(
        broker_url, unique_name, app_dir, tmp_path):
    env = app_env(app_dir, broker_url, unique_name, OPTS_POST="app.conf.task_default_queue = 'other'")
    said = refused(TaskherdWorker("opts_app", log_dir=tmp_path, queues=[unique_name], concurrency=1, env=env))
    assert (f"app.conf.task_default_queue='other' (configure() set it to one of its queues, ['{unique_name}']: a "
            f"task sent without a queue goes to 'other', which no worker of the profile consumes") in said, said[-3000:]
    assert f"valid: one of ['{unique_name}']" in said

    routes = "app.conf.task_routes = {'opts.*': {'queue': 'elsewhere'}, 'x.y': '%s'}" % unique_name
    worker = TaskherdWorker("opts_app", log_dir=tmp_path, queues=[unique_name], concurrency=1,
                            env={**env, "OPTS_POST": routes})
    try:
        worker.start()
        assert (f"app.conf.task_routes['opts.*'] sends tasks to the queue 'elsewhere', not in configure(queues="
                f"['{unique_name}'])") in worker.log()
        assert "'x.y'" not in worker.log()
    finally:
        worker.kill()


def test_static_routes_are_read_from_every_dict_form():
    from kombu import Queue

    from taskherd.worker.profile_undone import route_warnings

    conf = {"task_routes": [{"a.*": {"queue": Queue("q1")}}, [("b", "q2"), ("c", "main")], "mod.router",
                            lambda *a, **k: None]}
    warned = route_warnings(conf, ["main"])
    assert [w.split(" sends")[0] for w in warned] == ["app.conf.task_routes['a.*']", "app.conf.task_routes['b']"]
    assert route_warnings({"task_routes": None}, ["main"]) == []


# -- D5: the flag as written -------------------------------------------------------------------------

@pytest.mark.parametrize("broker_url", ["redis"], indirect=True)
def test_taskherd_worker_names_its_options_as_written(broker_url, unique_name, app_dir, tmp_path):
    env = app_env(app_dir, broker_url, unique_name)
    said = refused(TaskherdWorker("opts_app", log_dir=tmp_path, queues=[unique_name], concurrency=1, env=env,
                                  extra_args=["--time-limit", "300", "--soft-time-limit", "400"]))
    assert "the worker runs with --time-limit=300.0, not below visibility_timeout=" in said, said[-3000:]
    assert "(--soft-time-limit=400.0; --time-limit=300.0)" in said
    assert "time_limit=300.0," not in said.replace("--time-limit=300.0", "")


def test_flags_are_recorded_as_written():
    from taskherd.commands.worker import flags_given

    assert flags_given(["-A", "x", "--time-limit=5", "-c2", "--prefetch-multiplier", "3", "--", "-Q"]) == {
        "app": "-A", "time_limit": "--time-limit", "concurrency": "-c", "prefetch_multiplier": "--prefetch-multiplier"}


# -- D6: purge ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("broker_url", ["redis"], indirect=True)
def test_a_purge_erases_the_parked_countdown_tasks_of_the_purged_queue(broker_url, unique_name, app_dir, tmp_path):
    env = app_env(app_dir, broker_url, unique_name)
    client = redis.Redis.from_url(broker_url)
    producer = Celery("producer", broker=broker_url, set_as_current=False)

    def park(n: int) -> None:
        worker = WorkerProcess("opts_app", log_dir=tmp_path, queues=[unique_name], concurrency=1, env=env)
        try:
            worker.start()
            for i in range(n):
                producer.send_task("opts.work", args=(f"later-{i}",), queue=unique_name, countdown=300)
            wait_for("the countdown tasks parked", lambda: client.zcard("taskherd.delayed"), until=lambda c: c >= n,
                     timeout=30)
        finally:
            worker.stop()

    try:
        park(2)
        kept = json.dumps({"lists": ["kept"], "message": "{}"})
        client.zadd("taskherd.delayed", {kept: time.time() + 300})  # another queue's: not purged
        producer.send_task("opts.work", args=("now",), queue=unique_name)
        purged = subprocess.run([sys.executable, "-m", "celery", "-A", "opts_app", "purge", "-f", "-Q", unique_name],
                                env=python_env({k: v for k, v in env.items() if k != "PYTHONPATH"},
                                               path=[app_dir, Path(__file__).parent.parent]),
                                capture_output=True, text=True, timeout=120)
        assert purged.returncode == 0, purged.stderr
        assert f"Purged 3 messages from 1 known task queue." in purged.stdout, purged.stdout
        assert client.zrange("taskherd.delayed", 0, -1) == [kept.encode()]

        park(1)
        worker = WorkerProcess("opts_app", log_dir=tmp_path, queues=[unique_name], concurrency=1, env=env,
                               extra_args=["--purge"])
        try:
            worker.start()
            assert "purge: Erased 1 message from the queue." in worker.log(), worker.tail()
            assert client.zrange("taskherd.delayed", 0, -1) == [kept.encode()]
        finally:
            worker.kill()
    finally:
        producer.close()
