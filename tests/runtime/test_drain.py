"""`taskherd drain` during three running tasks, on both brokers.

Running tasks finish and are acknowledged once; the queued tasks stay queued; the countdown task the
worker was holding in memory goes back to the queue; another worker takes all of them; nothing is
lost or run twice; the drain lasts about as long as the longest running task, and SIGTERM afterwards
ends the worker at once.
"""
import json
import signal
import subprocess
import time

import kombu
import redis
from celery import Celery

from runtime.helpers import TASKHERD, probe
from e2e.lib.waiting import wait_for

LONG_TASKS = {"long-4": 4, "long-6": 6, "long-8": 8}
QUICK_TASKS = ["quick-0", "quick-1", "quick-2", "quick-3"]
COUNTDOWN = 16


def ready_messages(broker_url: str, queue: str) -> int:
    with kombu.Connection(broker_url) as connection:
        try:
            return connection.default_channel.queue_declare(queue=queue, passive=True).message_count
        except connection.channel_errors:
            if broker_url.startswith("redis"):
                return 0  # Redis deletes an empty list: "no such queue" means empty there
            raise


def test_drain_finishes_running_tasks_and_leaves_the_rest_to_another_worker(broker_url, redis_url, unique_name,
                                                                             worker_factory, tmp_path):
    ledger = redis.Redis.from_url(redis_url)
    heartbeat_dir = tmp_path / "heartbeat-a"
    env = {"TEST_BROKER_URL": broker_url, "TEST_LEDGER_URL": redis_url, "TEST_QUEUE": unique_name,
           "TASKHERD_HEARTBEAT_INTERVAL": "0.5"}
    worker_a = worker_factory("apps.runtime_app", queues=[unique_name], concurrency=3,
                              env={**env, "TASKHERD_HEARTBEAT_DIR": str(heartbeat_dir)})
    producer = Celery(broker=broker_url)

    def heartbeat():
        return json.loads((heartbeat_dir / "heartbeat.json").read_text())

    # A countdown task first: the worker holds it in memory (reserved, not started).
    producer.send_task("runtime.sleep", args=("countdown", 0), countdown=COUNTDOWN, queue=unique_name)
    wait_for("the countdown task held by the worker", lambda: heartbeat()["scheduled"], timeout=15, equals=1)
    for key, seconds in LONG_TASKS.items():
        producer.send_task("runtime.sleep", args=(key, seconds), queue=unique_name)
    wait_for("three long tasks started", lambda: ledger.llen("started"), timeout=15, equals=3)
    long_started = time.monotonic()
    for key in QUICK_TASKS:
        producer.send_task("runtime.sleep", args=(key, 0), queue=unique_name)
    time.sleep(1)
    assert ready_messages(broker_url, unique_name) == 4, "the busy worker (prefetch 1) took a queued task"

    drain = subprocess.Popen([*TASKHERD, "drain", "--dir", str(heartbeat_dir)], stdout=subprocess.PIPE, text=True)
    drain_started = time.monotonic()
    wait_for("not ready while draining", lambda: probe("readiness", heartbeat_dir)[0], timeout=3, equals=1)
    # Stops consuming at once and gives the held countdown task back.
    wait_for("the countdown task back in the queue", lambda: ready_messages(broker_url, unique_name),
             timeout=3, equals=5)
    output, _ = drain.communicate(timeout=30)
    drain_seconds = time.monotonic() - drain_started
    assert drain.returncode == 0, output
    assert "worker idle" in output
    remaining = max(LONG_TASKS.values()) - (drain_started - long_started)
    assert remaining - 0.5 <= drain_seconds <= remaining + 3, (drain_seconds, remaining)

    assert sorted(ledger.lrange("done", 0, -1)) == sorted(k.encode() for k in LONG_TASKS)
    assert ready_messages(broker_url, unique_name) == 5, "a queued task was consumed during the drain"
    assert heartbeat()["active"] == [] and heartbeat()["scheduled"] == 0

    sigterm_at = time.monotonic()
    worker_a.signal(signal.SIGTERM)
    worker_a.wait(timeout=15)
    assert time.monotonic() - sigterm_at < 10, "the warm shutdown after a drain was not quick"

    worker_b = worker_factory("apps.runtime_app", queues=[unique_name], concurrency=2,
                              env={**env, "TASKHERD_HEARTBEAT_DIR": str(tmp_path / "heartbeat-b")})
    every_key = [*LONG_TASKS, *QUICK_TASKS, "countdown"]
    wait_for("all tasks done", lambda: ledger.llen("done"), timeout=COUNTDOWN + 30, equals=len(every_key),
             explain=lambda: f"done: {ledger.lrange('done', 0, -1)}")
    worker_b.stop()
    assert sorted(ledger.lrange("done", 0, -1)) == sorted(k.encode() for k in every_key)
    runs = {key: int(ledger.get(f"runs:{key}")) for key in every_key}
    assert runs == {key: 1 for key in every_key}, f"a task ran twice: {runs}"
    assert ready_messages(broker_url, unique_name) == 0
    # Worker A acknowledged what it ran: worker B (and the broker) saw no redelivery of it.
    assert not any(f"[{key}" in worker_b.log() for key in LONG_TASKS)
    assert "runtime.sleep" in worker_b.log()
    producer.close()


def test_drain_returns_a_prefetched_message_waiting_for_a_busy_pool(redis_url, unique_name, worker_factory, tmp_path):
    """With a prefetch above 1 (not taskherd's profile) a message waits in the prefork pool's outbound
    buffer while every child is busy: the drain hands it back at once instead of running it."""
    ledger = redis.Redis.from_url(redis_url)
    heartbeat_dir = tmp_path / "heartbeat"
    env = {"TEST_BROKER_URL": redis_url, "TEST_LEDGER_URL": redis_url, "TEST_QUEUE": unique_name,
           "TASKHERD_HEARTBEAT_INTERVAL": "0.5", "TEST_PREFETCH_MULTIPLIER": "2",
           "TASKHERD_HEARTBEAT_DIR": str(heartbeat_dir)}
    worker = worker_factory("apps.runtime_app", queues=[unique_name], concurrency=1, env=env)
    producer = Celery(broker=redis_url)
    producer.send_task("runtime.sleep", args=("running", 4), queue=unique_name)
    wait_for("the first task started", lambda: ledger.llen("started"), timeout=15, equals=1)
    producer.send_task("runtime.sleep", args=("prefetched", 0), queue=unique_name)
    wait_for("the second message reserved by the busy worker",
             lambda: json.loads((heartbeat_dir / "heartbeat.json").read_text())["reserved"], timeout=5, equals=1)
    assert ready_messages(redis_url, unique_name) == 0

    drain = subprocess.Popen([*TASKHERD, "drain", "--dir", str(heartbeat_dir)], stdout=subprocess.PIPE, text=True)
    wait_for("the prefetched message back in the queue", lambda: ready_messages(redis_url, unique_name),
             timeout=2, equals=1)
    output, _ = drain.communicate(timeout=30)
    assert drain.returncode == 0, output
    assert ledger.lrange("done", 0, -1) == [b"running"]
    worker.stop()
    assert ledger.get("runs:prefetched") is None, "the drained worker ran the message it gave back"
    assert ready_messages(redis_url, unique_name) == 1
    producer.close()
