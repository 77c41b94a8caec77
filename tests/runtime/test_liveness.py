"""Liveness against a real worker: a wedged main loop fails it, a long task within its limits does not.

The heartbeat interval is lowered to 0.5 s and the staleness threshold to 3 s to keep the test fast;
the task (20 s) stays long relative to the threshold, as a 60 s task is to the default 30 s.
"""
import json
import signal
import time

from celery import Celery

from runtime.helpers import probe
from e2e.lib.waiting import wait_for

INTERVAL = 0.5
MAX_AGE = 3.0
TASK_SECONDS = 20


def test_a_long_task_keeps_liveness_passing_and_a_stopped_main_loop_fails_it(redis_url, unique_name, worker_factory,
                                                                              tmp_path):
    heartbeat_dir = tmp_path / "heartbeat"
    env = {"TEST_BROKER_URL": redis_url, "TEST_LEDGER_URL": redis_url, "TEST_QUEUE": unique_name,
           "TASKHERD_HEARTBEAT_DIR": str(heartbeat_dir), "TASKHERD_HEARTBEAT_INTERVAL": str(INTERVAL),
           "TEST_SOFT_TIME_LIMIT": "25", "TEST_TIME_LIMIT": "30"}
    worker = worker_factory("apps.runtime_app", queues=[unique_name], env=env, concurrency=2)
    assert probe("startup", heartbeat_dir)[0] == 0

    producer = Celery(broker=redis_url)
    producer.send_task("runtime.sleep", args=("long", TASK_SECONDS), queue=unique_name)
    worker.wait_for_log("Task runtime.sleep", timeout=15)  # "received" is logged, then it starts

    def running_task():
        record = json.loads((heartbeat_dir / "heartbeat.json").read_text())
        return record["active"][0] if record["active"] else None

    active = wait_for("the task appears in the heartbeat", running_task, timeout=10)
    assert active["name"] == "runtime.sleep" and active["time_limit"] == 30 and active["soft_time_limit"] == 25
    assert active["worker_pid"] in worker.child_pids()

    failures = []
    checks = 0
    while running_task():
        code, output = probe("liveness", heartbeat_dir, "--max-age", str(MAX_AGE))
        checks += 1
        if code != 0:
            failures.append(output)
        time.sleep(0.3)
    assert checks >= 20, "the task ended too early to say anything"
    assert not failures, f"liveness failed during a task within its limits: {failures[:3]}"
    worker.wait_for_log("succeeded", timeout=10)

    # Wedge the main loop: the pool children keep running, the heartbeat must go stale.
    worker.signal(signal.SIGSTOP)
    stopped_at = time.monotonic()
    try:
        _, failed_output = wait_for("liveness failing after SIGSTOP",
                                    lambda: probe("liveness", heartbeat_dir, "--max-age", str(MAX_AGE)),
                                    until=lambda result: result[0] == 1, timeout=MAX_AGE + 5, interval=0.1)
        elapsed = time.monotonic() - stopped_at
    finally:
        worker.signal(signal.SIGCONT)
    assert "main loop is not running" in failed_output
    # Not before the threshold (the last beat may be up to one interval old), not much after.
    assert MAX_AGE - INTERVAL - 0.2 <= elapsed <= MAX_AGE + 2.0, elapsed
    wait_for("liveness passing again after SIGCONT",
             lambda: probe("liveness", heartbeat_dir, "--max-age", str(MAX_AGE))[0], timeout=5, equals=0)

    # A warm shutdown (SIGTERM) waits for a running task with the main loop stopped on purpose:
    # liveness must not restart the worker meanwhile; readiness says it is going.
    producer.send_task("runtime.sleep", args=("finishing", 3 * MAX_AGE), queue=unique_name)
    wait_for("the last task running", running_task, timeout=10)
    worker.signal(signal.SIGTERM)
    outputs = []
    while worker.is_running():
        outputs.append((probe("liveness", heartbeat_dir, "--max-age", str(MAX_AGE)),
                        probe("readiness", heartbeat_dir, "--max-age", str(MAX_AGE))))
        time.sleep(0.3)
    assert worker.wait(timeout=5) == 0
    assert len(outputs) >= 10, "the shutdown did not wait for the task"
    assert all(live[0] == 0 for live, _ in outputs), [live for live, _ in outputs if live[0]][:3]
    assert "stopping (warm shutdown)" in outputs[-1][0][1]
    assert outputs[-1][1][0] == 1
    producer.close()
