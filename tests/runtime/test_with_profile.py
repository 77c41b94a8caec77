"""The runtime installers alongside taskherd's reliability profile, configured through the environment."""
import httpx
from celery import Celery

from e2e.lib.services import free_port
from e2e.lib.waiting import wait_for
from runtime.helpers import probe


def test_probes_and_metrics_work_on_a_profiled_app(redis_url, unique_name, worker_factory, tmp_path):
    heartbeat_dir, port = tmp_path / "heartbeat", free_port()
    env = {"TEST_BROKER_URL": redis_url, "TEST_QUEUE": unique_name, "TASKHERD_HEARTBEAT_DIR": str(heartbeat_dir),
           "TASKHERD_HEARTBEAT_INTERVAL": "1", "TASKHERD_METRICS_PORT": str(port),
           "TASKHERD_METRICS_ADDR": "127.0.0.1"}
    worker_factory("apps.runtime_profile_app", queues=[unique_name], env=env, concurrency=2)
    for kind in ("startup", "liveness", "readiness"):
        code, output = probe(kind, heartbeat_dir)
        assert code == 0, output
    producer = Celery(broker=redis_url)
    producer.send_task("runtime_profile.add", args=(2, 3), queue=unique_name)
    producer.send_task("runtime_profile.refuse", queue=unique_name)

    def counted():
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        return [line for line in text.splitlines() if line.startswith("taskherd_tasks_total{")]

    # A permanent failure is dead-lettered: it counts as failed (Celery's signal) and as dead_lettered.
    lines = wait_for("the tasks' outcomes counted", counted, timeout=20, until=lambda found: len(found) == 3)
    assert sorted(lines) == [
        'taskherd_tasks_total{outcome="dead_lettered",task="runtime_profile.refuse"} 1.0',
        'taskherd_tasks_total{outcome="failed",task="runtime_profile.refuse"} 1.0',
        'taskherd_tasks_total{outcome="succeeded",task="runtime_profile.add"} 1.0']
    producer.close()
