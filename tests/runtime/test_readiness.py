"""A broker outage fails readiness and never liveness; readiness comes back with the broker.

The broker is a redis-server of this test alone (the shared one is never stopped).
"""
import time

from celery import Celery

from runtime.helpers import probe
from e2e.lib.waiting import wait_for

INTERVAL = 0.5
MAX_AGE = "3"
OUTAGE_SECONDS = 8


def test_broker_outage_fails_readiness_not_liveness(private_redis, unique_name, worker_factory, tmp_path):
    heartbeat_dir = tmp_path / "heartbeat"
    broker = private_redis.url + "/1"
    env = {"TEST_BROKER_URL": broker, "TEST_LEDGER_URL": private_redis.url + "/2", "TEST_QUEUE": unique_name,
           "TASKHERD_HEARTBEAT_DIR": str(heartbeat_dir), "TASKHERD_HEARTBEAT_INTERVAL": str(INTERVAL)}
    worker = worker_factory("apps.runtime_app", queues=[unique_name], env=env, concurrency=1)
    wait_for("ready before the outage", lambda: probe("readiness", heartbeat_dir, "--max-age", MAX_AGE)[0],
             timeout=10, equals=0)

    private_redis.stop()
    stopped_at = time.monotonic()
    liveness_failures, readiness = [], []
    while time.monotonic() - stopped_at < OUTAGE_SECONDS:
        code, output = probe("liveness", heartbeat_dir, "--max-age", MAX_AGE)
        if code != 0:
            liveness_failures.append(output)
        readiness.append((time.monotonic() - stopped_at, *probe("readiness", heartbeat_dir, "--max-age", MAX_AGE)))
        time.sleep(0.3)
    assert not liveness_failures, f"liveness failed during a broker outage: {liveness_failures[:3]}"
    first_failure = next(at for at, code, _ in readiness if code == 1)
    assert first_failure < 3, readiness[:5]
    assert all(code == 1 for at, code, _ in readiness if at > first_failure), "readiness flapped during the outage"
    assert "broker disconnected" in readiness[-1][2]

    private_redis.start()  # same port: the worker reconnects on its own

    def readiness_while_live() -> int:
        code, output = probe("liveness", heartbeat_dir, "--max-age", MAX_AGE)
        assert code == 0, f"liveness failed while reconnecting: {output}"
        return probe("readiness", heartbeat_dir, "--max-age", MAX_AGE)[0]

    wait_for("ready again after the broker came back (readiness exit code)", readiness_while_live, timeout=45,
             interval=0.3, equals=0, explain=worker.tail)
    assert probe("liveness", heartbeat_dir, "--max-age", MAX_AGE)[0] == 0

    # And it works again, which is what readiness promised.
    producer = Celery(broker=broker)
    producer.send_task("runtime.sleep", args=("after-outage", 0), queue=unique_name)
    worker.wait_for_log("succeeded", timeout=20)
    producer.close()
