"""Fast recovery on Redis with real workers: SIGKILL of a whole worker, a slow live worker, two at once."""
from __future__ import annotations

import json
import time
import uuid

import pytest
import redis
from celery import Celery

from e2e.lib.waiting import wait_for
from support.private_redis import private_redis
from taskherd.worker.components import recovery

pytestmark = pytest.mark.slow

#: With the default settings (heartbeat 1 s, timeout 4 s) a killed worker's task is back after
#: about 4 s, at most 5 s (bench/pod_kill.py measures it); here a bound with room for a loaded machine.
TARGET_SECONDS = 12


def worker_env(redis_url: str, queue: str, **extra: str) -> dict[str, str]:
    return {"TEST_BROKER_URL": redis_url, "TEST_QUEUE": queue, "TEST_LEDGER_URL": redis_url,
            "TEST_RECOVERY": "1", **extra}


def runs(client: redis.Redis, token: str) -> list[dict]:
    return [json.loads(r) for r in client.lrange(f"runs:{token}", 0, -1)]


def starts(client, token):
    return [r for r in runs(client, token) if r["event"] == "start"]


def ends(client, token):
    return [r for r in runs(client, token) if r["event"] == "end"]


def node_of(worker) -> str:
    return worker.hostname.split("@")[0]


def send_hold(redis_url: str, queue: str, token: str, seconds: float, redelivered_seconds: float | None = None):
    producer = Celery(broker=redis_url)
    try:
        producer.send_task("recovery.hold", args=(token, seconds), queue=queue,
                           kwargs={} if redelivered_seconds is None else {"redelivered_seconds": redelivered_seconds})
    finally:
        producer.close()


def assert_no_bookkeeping_left(client: redis.Redis) -> None:
    assert client.hlen("unacked") == 0, "a finished task left its kombu unacked entry"
    assert client.hlen(recovery.OWNER_KEY) == 0
    assert not [k for k in client.keys(recovery.KEY_NAMESPACE + "held.*") if client.hlen(k)]


def test_killed_worker_task_restarts_elsewhere_within_target(redis_url, unique_name, worker_factory):
    client = redis.Redis.from_url(redis_url)
    env = worker_env(redis_url, unique_name)  # default heartbeat 1 s, timeout 4 s
    first = worker_factory("apps.recovery_app", queues=[unique_name], env=env, concurrency=1)
    second = worker_factory("apps.recovery_app", queues=[unique_name], env=env, concurrency=1)
    token = uuid.uuid4().hex
    # 120 s on first delivery: vanilla Redis would leave it unacked for visibility_timeout (3600 s).
    send_hold(redis_url, unique_name, token, 120, redelivered_seconds=1)
    first_start = wait_for("the task to start", lambda: starts(client, token), timeout=30)[0]
    victim, survivor = (first, second) if first_start["host"].startswith(node_of(first)) else (second, first)

    killed_at = time.time()
    victim.kill()  # SIGKILL to the main process and its pool child
    restarted = wait_for("the task to restart", lambda: starts(client, token)[1:], timeout=TARGET_SECONDS + 30)[0]
    latency = restarted["at"] - killed_at
    assert restarted["host"].startswith(node_of(survivor))
    assert restarted["redelivered"] is True
    assert latency <= TARGET_SECONDS, f"restarted {latency:.1f}s after SIGKILL, target {TARGET_SECONDS}s"

    wait_for("the restarted task to finish", lambda: ends(client, token), timeout=30)
    time.sleep(1)
    assert len(starts(client, token)) == 2 and len(ends(client, token)) == 1
    assert_no_bookkeeping_left(client)
    assert survivor.is_running()
    print(f"restarted {latency:.1f}s after SIGKILL")


def test_slow_live_worker_keeps_its_task(redis_url, unique_name, worker_factory):
    client = redis.Redis.from_url(redis_url)
    # A 3 s lease and a task five times longer: the lease, not the task, must decide.
    env = worker_env(redis_url, unique_name, TEST_RECOVERY_HEARTBEAT="1", TEST_RECOVERY_TIMEOUT="3")
    busy = worker_factory("apps.recovery_app", queues=[unique_name], env=env, concurrency=1)
    token = uuid.uuid4().hex
    send_hold(redis_url, unique_name, token, 15)
    wait_for("the task to start", lambda: starts(client, token), timeout=30)
    # A second worker joins while the task runs: its restorer sweeps every second.
    idle = worker_factory("apps.recovery_app", queues=[unique_name], env=env, concurrency=1)
    wait_for("the slow task to finish", lambda: ends(client, token), timeout=40)
    time.sleep(4)  # longer than the lease: a wrongful restore would have started a second run
    assert len(starts(client, token)) == 1, f"the slow task ran again: {runs(client, token)}"
    assert len(ends(client, token)) == 1
    assert client.llen(unique_name) == 0 and client.hlen("unacked") == 0
    assert "restored" not in idle.log() and "restored" not in busy.log()


def test_two_workers_killed_at_once_each_task_restored_once(redis_url, unique_name, worker_factory):
    client = redis.Redis.from_url(redis_url)
    env = worker_env(redis_url, unique_name, TEST_RECOVERY_HEARTBEAT="2", TEST_RECOVERY_TIMEOUT="6")
    victims = [worker_factory("apps.recovery_app", queues=[unique_name], env=env, concurrency=1) for _ in range(2)]
    tokens = [uuid.uuid4().hex for _ in victims]
    for token in tokens:
        send_hold(redis_url, unique_name, token, 120, redelivered_seconds=2)
    for token in tokens:
        wait_for(f"task {token} to start", lambda: starts(client, token), timeout=30)
    # Two survivors: two restorers race for the same dead workers.
    survivors = [worker_factory("apps.recovery_app", queues=[unique_name], env=env, concurrency=1) for _ in range(2)]
    killed_at = time.time()
    for victim in victims:
        victim.kill()
    for token in tokens:
        wait_for(f"task {token} to finish elsewhere", lambda: ends(client, token), timeout=60)
    time.sleep(3)
    survivor_nodes = {node_of(w) for w in survivors}
    for token in tokens:
        token_starts = starts(client, token)
        assert len(token_starts) == 2, f"task {token} started {len(token_starts)} times: {token_starts}"
        assert any(token_starts[1]["host"].startswith(n) for n in survivor_nodes)
        assert token_starts[1]["at"] - killed_at <= 6 + 2 + 5
        assert len(ends(client, token)) == 1
    assert_no_bookkeeping_left(client)
    assert client.scard(recovery.WORKERS_KEY) == 2  # the dead workers were forgotten


def test_recovery_honours_the_global_key_prefix(redis_url, unique_name, worker_factory):
    client = redis.Redis.from_url(redis_url)
    prefix = "tenant-c:"
    env = worker_env(redis_url, unique_name, TEST_KEYPREFIX=prefix, TEST_RECOVERY_HEARTBEAT="1",
                     TEST_RECOVERY_TIMEOUT="3")
    victim = worker_factory("apps.recovery_app", queues=[unique_name], env=env, concurrency=1)
    token = uuid.uuid4().hex
    producer = Celery(broker=redis_url)
    producer.conf.broker_transport_options = {"global_keyprefix": prefix}
    producer.send_task("recovery.hold", args=(token, 120), kwargs={"redelivered_seconds": 1}, queue=unique_name)
    producer.close()
    wait_for("the task to start", lambda: starts(client, token), timeout=30)
    assert client.hlen(prefix + recovery.OWNER_KEY) == 1 and client.hlen(recovery.OWNER_KEY) == 0
    survivor = worker_factory("apps.recovery_app", queues=[unique_name], env=env, concurrency=1)
    killed_at = time.time()
    victim.kill()
    restarted = wait_for("the task to restart", lambda: starts(client, token)[1:], timeout=30)[0]
    assert restarted["host"].startswith(node_of(survivor)) and restarted["at"] - killed_at <= 3 + 1 + 5
    wait_for("the restarted task to finish", lambda: ends(client, token), timeout=30)
    # the ack follows the task's return: give it a moment
    wait_for("the prefixed bookkeeping to empty",
             lambda: (client.hlen(prefix + "unacked"), client.hlen(prefix + recovery.OWNER_KEY)), timeout=10,
             equals=(0, 0))


def test_warm_shutdown_finishes_the_task_once_and_leaves_no_lease(redis_url, unique_name, worker_factory):
    client = redis.Redis.from_url(redis_url)
    env = worker_env(redis_url, unique_name, TEST_RECOVERY_HEARTBEAT="1", TEST_RECOVERY_TIMEOUT="3")
    worker = worker_factory("apps.recovery_app", queues=[unique_name], env=env, concurrency=1)
    watcher = worker_factory("apps.recovery_app", queues=[unique_name + "-idle"], env=env, concurrency=1)
    token = uuid.uuid4().hex
    send_hold(redis_url, unique_name, token, 6)
    wait_for("the task to start", lambda: starts(client, token), timeout=30)
    assert worker.stop(timeout=30) == 0  # SIGTERM: warm shutdown waits for the task
    time.sleep(4)  # beyond the lease: nothing may be restored now
    assert len(starts(client, token)) == 1 and len(ends(client, token)) == 1
    assert client.llen(unique_name) == 0
    assert_no_bookkeeping_left(client)
    assert client.scard(recovery.WORKERS_KEY) == 1  # only the watcher is registered
    assert watcher.is_running()


def test_a_full_redis_keeps_the_message_on_its_list_and_the_worker_up(redis_url, unique_name, worker_factory,
                                                                        tmp_path):
    """Over maxmemory (noeviction) Redis refuses a worker's wait (BLMOVE may grow memory): the
    worker asks again a second later instead of failing, and its pop (which only shrinks memory
    before it records the delivery) still takes the message. kombu's BRPOP would take it and then
    fail to record it in `unacked`."""
    ledger = redis.Redis.from_url(redis_url)
    with private_redis(tmp_path / "full", "--maxmemory-policy", "noeviction") as (broker_url, _):
        broker = redis.Redis.from_url(broker_url)
        worker = worker_factory("apps.recovery_app", queues=[unique_name], concurrency=1,
                                env={**worker_env(broker_url, unique_name), "TEST_LEDGER_URL": redis_url})
        token = uuid.uuid4().hex
        send_hold(broker_url, "staging", token, 0.1)  # published while there is room, not yet on the queue
        broker.config_set("maxmemory", 1)  # full from now on: every command that may grow memory is refused
        wait_for("the worker's wait to be refused", lambda: "Redis refused to pop" in worker.log(), timeout=30)
        broker.rename("staging", unique_name)  # a rename grows nothing: allowed when full

        wait_for("the task to run", lambda: ends(ledger, token), timeout=30)
        assert worker.is_running()
        assert len(starts(ledger, token)) == 1
        broker.config_set("maxmemory", 0)
