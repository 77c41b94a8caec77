"""The multiprocess directory of a worker whose pool children recycle (max-tasks-per-child 1) stays
bounded, a child death included: once the main process held a
``pool_child_last_death_timestamp_seconds`` sample (a ``max`` gauge), every child forked after it
left a ``gauge_max_<pid>.db`` behind that nothing folded away (40 tasks, 41 files; 3,000 files made
a scrape take 0.15-0.2 s)."""
from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
from celery import Celery
from prometheus_client.parser import text_string_to_metric_families

from e2e.lib.services import free_port
from e2e.lib.waiting import wait_for
from worker_support import core_env, dead_letters

RECYCLES = 100


@pytest.fixture
def record_url(redis_url) -> str:
    """The files do not depend on the broker: Redis only, recording in the broker's database."""
    return redis_url


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def test_recycled_children_leave_a_bounded_number_of_files(redis_url, recorded, unique_name, worker_factory,
                                                           tmp_path):
    port = free_port()
    heartbeat = tmp_path / "hb"
    env = {**core_env(redis_url, unique_name, redis_url, max_deliveries=1), "TASKHERD_METRICS_PORT": str(port),
           "TASKHERD_HEARTBEAT_DIR": str(heartbeat)}
    worker = worker_factory("apps.core_app", queues=[unique_name], concurrency=2, env=env,
                            extra_args=["--max-tasks-per-child", "1"])
    (directory,) = (heartbeat / "prometheus").glob("worker-*")
    producer = Celery(broker=redis_url, set_as_current=False)

    # One child killed under a task: the main process records its death (the max gauge).
    producer.send_task("core.kill_worker", args=("killer",), queue=unique_name)
    wait_for("the killer dead-lettered", lambda: len(dead_letters(redis_url, unique_name)), equals=1,
             timeout=60, explain=worker.tail)
    for i in range(RECYCLES):
        producer.send_task("core.record", args=(f"r{i}", "ok"), queue=unique_name)
    wait_for(f"{RECYCLES} tasks, a child each", lambda: sum(len(recorded(f"r{i}")) for i in range(RECYCLES)),
             equals=RECYCLES, timeout=120, explain=worker.tail)
    pids = {pid for i in range(RECYCLES) for _, pid, _ in recorded(f"r{i}")}
    assert len(pids) == RECYCLES, "each task ran in a child of its own"

    def settled():
        samples = scrape(port)  # a scrape folds the dead children's files
        done = samples.get(("taskherd_tasks_total", (("outcome", "succeeded"), ("task", "core.record"))), 0)
        return samples if done == RECYCLES else None

    started = time.monotonic()
    samples = wait_for("the outcomes on /metrics", settled, timeout=30)
    files = sorted(p.name for p in Path(directory).glob("*.db"))
    # The main process's files, the archives, the two live children's: a handful, whatever the recycling.
    assert len(files) <= 12, f"{len(files)} files after {RECYCLES} recycles: {files[:20]}"
    assert not [name for name in files if name.startswith("gauge_max_") and name != "gauge_max_archive.db"
                and name != f"gauge_max_{worker.pid}.db"]
    assert samples[("taskherd_pool_child_deaths_total", (("cause", "SIGKILL"), ("task", "core.kill_worker")))] == 1
    last = samples[("taskherd_pool_child_last_death_timestamp_seconds",
                    (("cause", "SIGKILL"), ("task", "core.kill_worker")))]
    assert 0 < last <= time.time()
    assert samples[("taskherd_task_runtime_seconds_count", (("task", "core.record"),))] == RECYCLES
    assert time.monotonic() - started < 10
