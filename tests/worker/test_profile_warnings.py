"""Who hears the profile's warnings: the worker, in its log when it starts; never a producer that
imports the same app module (it calls configure() too)."""
import subprocess
import sys

from support.worker_process import TESTS_DIR
from worker_support import core_env

PREFETCH_WARNING = "prefetch_multiplier=4 with late acks"


def test_a_risky_setting_is_logged_by_the_worker_and_not_printed_by_a_producer(
        amqp_url, redis_url, unique_name, worker_factory):
    env = core_env(amqp_url, unique_name, redis_url, prefetch_multiplier=4)
    worker = worker_factory("apps.core_app", queues=[unique_name], env=env, concurrency=1)
    worker.wait_for_log(PREFETCH_WARNING, timeout=30)
    assert "ProfileWarning" in worker.log()

    # A producer: the same module imported, a task sent, every warning shown.
    producer = subprocess.run(
        [sys.executable, "-W", "always", "-c",
         f"import apps.core_app as m; m.app.send_task('core.record', args=('sent',), queue={unique_name!r})"],
        env={**worker.env, "PYTHONPATH": str(TESTS_DIR)}, capture_output=True, text=True, timeout=60)
    assert producer.returncode == 0, producer.stderr
    assert "ProfileWarning" not in producer.stderr and PREFETCH_WARNING not in producer.stderr, producer.stderr
