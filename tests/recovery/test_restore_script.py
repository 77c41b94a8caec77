"""The ownership records and the atomic restore, driven through real kombu channels on real Redis.

Each "worker" here is a kombu channel using TrackingQoS with its own identity, as in a worker
process; leases are made to lapse by using a tiny timeout.
"""
from __future__ import annotations

import json
import threading
import time

import pytest
import redis
from celery import Celery
from kombu import Connection, Exchange, Queue

from taskherd.worker.components import recovery


class FakeWorker:
    """A consumer channel with delivery tracking and a lease, like one worker process."""

    def __init__(self, url: str, worker_id: str, *, prefix: str = "", timeout: float = 0.4):
        options = {"global_keyprefix": prefix} if prefix else {}
        self.connection = Connection(url, transport_options=options)
        self.channel = self.connection.channel()
        qos = recovery._tracking_qos_class()
        qos.tracker = recovery.Tracker(worker_id=worker_id, prefix=prefix)
        self.channel.QoS = qos  # before the channel's qos is first built
        client = redis.Redis.from_url(url)
        self.lease = recovery.Lease(client=client, worker_id=worker_id, prefix=prefix,
                                    settings=recovery.FastRecovery(heartbeat_interval=timeout / 2, timeout=timeout))
        self.lease.refresh()

    def get(self, queue: str):
        message = self.channel.basic_get(queue, no_ack=False)
        assert message is not None, f"nothing to get from {queue}"
        return message

    def close(self):
        self.connection.release()


def publish(url: str, queue: str, count: int, *, prefix: str = "", priority: int = 0, declared: bool = False):
    app = Celery(broker=url)
    if prefix:
        app.conf.broker_transport_options = {"global_keyprefix": prefix}
    if declared:  # a direct exchange and a binding table, as Celery declares task_queues
        app.conf.task_queues = [Queue(queue, Exchange(queue), routing_key=queue)]
    for i in range(count):
        app.send_task("t.x", args=(i,), queue=queue, priority=priority)
    app.close()


def all_messages(client: redis.Redis, keys: list[str]) -> list[dict]:
    return [json.loads(raw) for key in keys for raw in client.lrange(key, 0, -1)]


@pytest.mark.parametrize("prefix", ["", "tenant-b:"])
def test_concurrent_restorers_restore_each_message_exactly_once(redis_url, unique_name, prefix):
    client = redis.Redis.from_url(redis_url)
    plain, urgent = unique_name, unique_name + "-urgent"
    publish(redis_url, plain, 12, prefix=prefix, declared=True)
    publish(redis_url, urgent, 8, prefix=prefix, priority=9)
    dead = FakeWorker(redis_url, "dead-1", prefix=prefix)
    taken = [dead.get(plain) for _ in range(12)] + [dead.get(urgent) for _ in range(8)]
    tags = {m.delivery_tag for m in taken}
    assert client.hlen(prefix + "unacked") == 20 and client.hlen(prefix + recovery.held_key("dead-1")) == 20
    assert client.llen(prefix + plain) == 0
    time.sleep(0.6)  # the lease lapses (timeout 0.4 s)

    results: list[dict] = []
    barrier = threading.Barrier(8)

    def restorer():
        barrier.wait()
        results.append(recovery.restore_dead_workers(redis.Redis.from_url(redis_url), prefix=prefix))

    threads = [threading.Thread(target=restorer) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(r.get("dead-1", 0) for r in results) == 20

    restored = all_messages(client, [prefix + plain, prefix + urgent + "\x06\x169"])
    assert sorted(m["properties"]["delivery_tag"] for m in restored) == sorted(tags), "lost or duplicated"
    assert all(m["headers"]["redelivered"] and m["properties"]["delivery_info"]["redelivered"] for m in restored)
    assert client.hlen(prefix + "unacked") == 0 and client.zcard(prefix + "unacked_index") == 0
    assert client.hlen(prefix + recovery.OWNER_KEY) == 0
    assert not client.exists(prefix + recovery.held_key("dead-1"))
    assert not client.sismember(prefix + recovery.WORKERS_KEY, "dead-1")
    dead.close()  # kombu's own restore at close finds nothing left to push
    assert len(all_messages(client, [prefix + plain, prefix + urgent + "\x06\x169"])) == 20


def test_a_live_lease_is_never_restored(redis_url, unique_name):
    client = redis.Redis.from_url(redis_url)
    publish(redis_url, unique_name, 1)
    live = FakeWorker(redis_url, "live-1", timeout=30)
    live.get(unique_name)
    assert recovery.restore_dead_workers(client) == {}
    assert recovery.restore_worker(client, "live-1") == -1
    assert client.hlen("unacked") == 1 and client.llen(unique_name) == 0
    live.close()


def test_ack_after_a_lapsed_lease_leaves_the_new_holder_entry_alone(redis_url, unique_name):
    client = redis.Redis.from_url(redis_url)
    publish(redis_url, unique_name, 1)
    stale = FakeWorker(redis_url, "stale-1")
    first = stale.get(unique_name)
    time.sleep(0.6)
    assert recovery.restore_dead_workers(client) == {"stale-1": 1}
    fresh = FakeWorker(redis_url, "fresh-1", timeout=30)
    second = fresh.get(unique_name)
    assert second.delivery_tag == first.delivery_tag  # kombu keeps the tag across redeliveries

    first.ack()  # the lapsed worker finishes late: the delivery is fresh-1's now
    assert client.hexists("unacked", first.delivery_tag), "a stale ack removed the new holder's entry"
    second.ack()
    assert client.hlen("unacked") == 0 and client.hlen(recovery.OWNER_KEY) == 0
    assert client.hlen(recovery.held_key("fresh-1")) == 0
    stale.close()
    fresh.close()
    assert client.llen(unique_name) == 0, "an acked message came back"


def test_a_worker_whose_lease_lapsed_knows_it_no_longer_holds_the_delivery(redis_url, unique_name, monkeypatch):
    # What a worker's main process asks before dead-lettering a hard-timed-out task: on kind, a
    # worker partitioned from Redis dead-lettered as `hard-time-limit` a poison task that another
    # worker had meanwhile run and dead-lettered for its real reason (two envelopes, two reasons).
    client = redis.Redis.from_url(redis_url)
    publish(redis_url, unique_name, 1)
    stale = FakeWorker(redis_url, "stale-2")
    message = stale.get(unique_name)
    monkeypatch.setattr(recovery, "_installed_lease", stale.lease)
    monkeypatch.setattr(recovery, "_installed_tracker", recovery.Tracker(worker_id="stale-2"))
    assert recovery.holds(message.delivery_tag) is True
    time.sleep(0.6)
    assert recovery.restore_dead_workers(client) == {"stale-2": 1}
    assert recovery.holds(message.delivery_tag) is False, "restored: back on its queue"
    fresh = FakeWorker(redis_url, "fresh-2", timeout=30)
    again = fresh.get(unique_name)
    assert again.delivery_tag == message.delivery_tag
    assert recovery.holds(message.delivery_tag) is False, "redelivered to another worker"
    monkeypatch.setattr(recovery, "_installed_lease", None)
    assert recovery.holds(message.delivery_tag) is None, "no fast recovery in this process: unknown"
    again.ack()
    stale.close()
    fresh.close()


def test_reject_with_requeue_gives_the_message_back_and_forgets_it(redis_url, unique_name):
    client = redis.Redis.from_url(redis_url)
    publish(redis_url, unique_name, 1)
    worker = FakeWorker(redis_url, "w-1", timeout=30)
    message = worker.get(unique_name)
    message.reject(requeue=True)
    assert client.llen(unique_name) == 1 and client.hlen("unacked") == 0
    assert client.hlen(recovery.OWNER_KEY) == 0 and client.hlen(recovery.held_key("w-1")) == 0
    worker.close()


def test_settings_refuse_a_timeout_shorter_than_two_heartbeats():
    (problem,) = recovery.FastRecovery(heartbeat_interval=5, timeout=4).problems()
    assert "FastRecovery(timeout=4) must be at least twice heartbeat_interval=5" in problem
    assert recovery.FastRecovery().expected_recovery_seconds == 5


def test_restorer_waits_a_full_lease_period_of_healthy_redis():
    assert not recovery.may_restore(now=100.0, redis_healthy_since=None, timeout=15)  # Redis failing
    assert not recovery.may_restore(now=100.0, redis_healthy_since=90.0, timeout=15)  # just came back
    assert recovery.may_restore(now=105.0, redis_healthy_since=90.0, timeout=15)


def test_settings_come_from_the_environment_when_not_given(monkeypatch):
    from taskherd.contract import ContractError

    monkeypatch.setenv("TASKHERD_RECOVERY_HEARTBEAT_INTERVAL", "2")
    monkeypatch.setenv("TASKHERD_RECOVERY_TIMEOUT", "7")
    assert recovery.FastRecovery.from_env() == recovery.FastRecovery(heartbeat_interval=2, timeout=7)
    monkeypatch.setenv("TASKHERD_RECOVERY_TIMEOUT", "soon")
    with pytest.raises(ContractError, match="TASKHERD_RECOVERY_TIMEOUT='soon' is invalid"):
        recovery.FastRecovery.from_env()


def test_each_pass_finds_only_the_lapsed_workers_in_the_expiry_index(redis_url, unique_name):
    """The restorer of every interval reads the expiry index (server time), not every registered worker."""
    client = redis.Redis.from_url(redis_url)
    publish(redis_url, unique_name, 2)
    dead, alive = FakeWorker(redis_url, "w-dead"), FakeWorker(redis_url, "w-alive", timeout=30)
    dead.get(unique_name), alive.get(unique_name)
    assert client.zcard(recovery.EXPIRY_KEY) == 2 and client.scard(recovery.WORKERS_KEY) == 2
    assert recovery.restore_lapsed_workers(client) == {}, "both leases still run"
    time.sleep(0.6)  # w-dead's 0.4 s lease runs out; w-alive's has 30 s
    assert recovery.restore_lapsed_workers(client, exclude=["w-other"]) == {"w-dead": 1}
    assert client.llen(unique_name) == 1, "the dead worker's message is back"
    assert client.zrange(recovery.EXPIRY_KEY, 0, -1) == [b"w-alive"] and client.smembers(recovery.WORKERS_KEY) == {b"w-alive"}
    assert recovery.restore_lapsed_workers(client) == {}, "restored once"
    dead.close(), alive.close()


def test_a_restorer_that_was_stalled_itself_does_not_trust_the_others_silence():
    assert not recovery.stalled(previous=None, now=100.0, interval=1.0)  # the first refresh
    assert not recovery.stalled(previous=98.5, now=100.0, interval=1.0)  # a little late
    assert recovery.stalled(previous=97.5, now=100.0, interval=1.0)      # more than two intervals


def pop(client: redis.Redis, worker_id: str, lists: list[str], *, prefix: str = ""):
    keys = recovery.Keys(prefix)
    return client.eval(recovery.POP_SCRIPT, 4 + len(lists), keys(recovery.OWNER_KEY),
                       keys(recovery.held_key(worker_id)), keys(recovery.UNACKED_KEY),
                       keys(recovery.UNACKED_INDEX_KEY), *(keys(name) for name in lists), worker_id, repr(time.time()))


@pytest.mark.parametrize("prefix", ["", "tenant-b:"])
def test_a_pop_records_the_delivery_as_the_workers_in_the_same_step(redis_url, unique_name, prefix):
    """What kombu's BRPOP leaves nowhere — a message popped, not yet in `unacked` — is already the
    popping worker's: if it dies now, its lapsed lease gives the message back exactly as it was."""
    client = redis.Redis.from_url(redis_url)
    publish(redis_url, unique_name, 1, prefix=prefix)
    [raw] = client.lrange(prefix + unique_name, 0, -1)

    popped_from, item = pop(client, "w-dead", [unique_name, unique_name + "\x06\x163"], prefix=prefix)

    assert (popped_from, item) == ((prefix + unique_name).encode(), raw)
    tag = json.loads(raw)["properties"]["delivery_tag"]
    assert client.hget(prefix + recovery.OWNER_KEY, tag) == b"w-dead"
    message, exchange, routing_key = json.loads(client.hget(prefix + recovery.UNACKED_KEY, tag))
    assert message == json.loads(raw) and routing_key == unique_name
    assert client.zscore(prefix + recovery.UNACKED_INDEX_KEY, tag) is not None
    assert client.llen(prefix + unique_name) == 0

    # the worker dies before kombu saw the message: no lease, so the next restorer pass gives it back
    assert recovery.restore_worker(client, "w-dead", prefix=prefix) == 1
    assert client.lrange(prefix + unique_name, 0, -1) == [raw], "restored exactly as it was popped"
    assert client.hlen(prefix + recovery.UNACKED_KEY) == 0 and client.hlen(prefix + recovery.OWNER_KEY) == 0


def test_a_pop_takes_kombus_order_and_returns_nothing_when_every_list_is_empty(redis_url, unique_name):
    client = redis.Redis.from_url(redis_url)
    low, high = unique_name + "\x06\x169", unique_name
    client.lpush(low, json.dumps({"properties": {"delivery_tag": "t-low", "delivery_info": {}}}))
    client.lpush(high, json.dumps({"properties": {"delivery_tag": "t-high", "delivery_info": {}}}))

    assert pop(client, "w", [high, low])[0] == high.encode()
    assert pop(client, "w", [high, low])[0] == low.encode()
    assert pop(client, "w", [high, low]) is None


def test_an_item_that_is_not_a_kombu_message_is_popped_untracked(redis_url, unique_name):
    """The bad-message guard dead-letters it as soon as the worker reads it; nothing to own."""
    client = redis.Redis.from_url(redis_url)
    for raw in (b"not json", b"[1, 2]", json.dumps({"properties": {"delivery_tag": 7}}).encode()):
        client.lpush(unique_name, raw)
        assert pop(client, "w", [unique_name]) == [unique_name.encode(), raw]
    assert client.hlen(recovery.OWNER_KEY) == 0 and client.hlen(recovery.UNACKED_KEY) == 0
