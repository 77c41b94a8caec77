"""A task running past its hard time limit fails liveness: the pool did not (or could not) kill it.

The threads pool cannot enforce hard time limits, which makes it a real way to get a task that
outlives its limit while the main loop stays healthy.
"""
import json
import time

from celery import Celery

from runtime.helpers import probe
from e2e.lib.waiting import wait_for


def test_a_task_past_its_hard_limit_fails_liveness(redis_url, unique_name, worker_factory, tmp_path):
    heartbeat_dir = tmp_path / "heartbeat"
    env = {"TEST_BROKER_URL": redis_url, "TEST_LEDGER_URL": redis_url, "TEST_QUEUE": unique_name,
           "TASKHERD_HEARTBEAT_DIR": str(heartbeat_dir), "TASKHERD_HEARTBEAT_INTERVAL": "0.5",
           "TEST_SOFT_TIME_LIMIT": "1", "TEST_TIME_LIMIT": "2"}
    worker_factory("apps.runtime_app", queues=[unique_name], env=env, concurrency=2, pool="threads")
    producer = Celery(broker=redis_url)
    producer.send_task("runtime.sleep", args=("overrun", 10), queue=unique_name)
    options = ("--max-age", "3", "--task-margin", "1")
    wait_for("the task running", lambda: "1 active" in probe("liveness", heartbeat_dir, *options)[1], timeout=10)
    started = json.loads((heartbeat_dir / "heartbeat.json").read_text())["active"][0]["started_at"]
    _, output = wait_for("liveness failing for the overrunning task", lambda: probe("liveness", heartbeat_dir, *options),
                         until=lambda result: result[0] == 1, timeout=10)
    assert "pool stuck: runtime.sleep[" in output and "hard limit 2s + margin 1s" in output
    assert time.time() - started >= 3, "failed before the limit + margin had passed"
    producer.close()
