"""The operator's reader of kombu's unacknowledged deliveries (taskherd.queues.redis_unacked):
the same figures as reading them whole, at most once per max_age_seconds, and only new tags."""
from __future__ import annotations

import json
import time
import uuid

import redis
from celery import Celery

from e2e.lib.waiting import wait_for
from taskherd.queues.redis import UNACKED_INDEX_KEY, UNACKED_KEY, inspect_redis
from taskherd.queues.redis_unacked import UnackedDeliveries

from .test_redis_inspection import redis_without_scripts


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class _CountingClient(redis.Redis):
    """A real client that remembers which delivery tags HMGET asked for."""

    asked: list = []

    def hmget(self, name, keys, *args):
        self.asked.extend(keys)
        return super().hmget(name, keys, *args)


def _deliver(client: redis.Redis, queue: str, *, tag: str | None = None, at: float | None = None) -> str:
    """An unacknowledged delivery as kombu's Redis transport records it (hash entry + index)."""
    tag = tag or uuid.uuid4().hex
    payload = json.dumps({"body": "", "headers": {"id": tag}, "properties": {"delivery_tag": tag}})
    client.hset(UNACKED_KEY, tag, json.dumps([payload, "", queue]))
    client.zadd(UNACKED_INDEX_KEY, {tag: at if at is not None else time.time()})
    return tag


def _acknowledge(client: redis.Redis, tag: str) -> None:
    client.hdel(UNACKED_KEY, tag)
    client.zrem(UNACKED_INDEX_KEY, tag)


def test_a_running_workers_deliveries_as_when_read_whole(redis_url, unique_name, worker_factory):
    queue, other = unique_name, unique_name + "-other"
    env = {"TEST_BROKER_URL": redis_url, "TEST_QUEUE": queue, "TEST_VISIBILITY_TIMEOUT": "600"}
    worker_factory("apps.recovery_app", queues=[queue], env=env, concurrency=2)
    app = Celery(broker=redis_url)
    for _ in range(3):
        app.send_task("recovery.hold", args=(uuid.uuid4().hex, 30), queue=queue)
    app.close()
    client = redis.Redis.from_url(redis_url)
    wait_for("the worker to hold two messages", lambda: inspect_redis(redis_url, [queue])[queue].unacked,
             equals=2, timeout=30)

    whole = inspect_redis(redis_url, [queue, other], client=client)
    reader = UnackedDeliveries()
    read = inspect_redis(redis_url, [queue, other], client=client, unacked=reader)
    assert [(s.ready, s.unacked) for s in read.values()] == [(s.ready, s.unacked) for s in whole.values()] \
        == [(1, 2), (0, 0)]
    assert abs(read[queue].oldest_unacked_age_seconds - whole[queue].oldest_unacked_age_seconds) < 1


def test_read_at_most_once_per_max_age_and_only_the_new_tags(redis_url, unique_name):
    client = _CountingClient.from_url(redis_url)
    client.asked = []
    clock = _Clock()
    reader = UnackedDeliveries(max_age_seconds=1.0, clock=clock)
    first = [_deliver(client, unique_name, at=time.time() - 20) for _ in range(3)]
    assert reader.by_queue(client, prefix="", queues=[unique_name])[unique_name] and len(client.asked) == 3

    later = _deliver(client, unique_name)
    _acknowledge(client, first[0])
    clock.now += 0.5
    assert len(reader.by_queue(client, prefix="", queues=[unique_name])[unique_name]) == 3, "within max_age: the last reading"
    assert len(client.asked) == 3, "within max_age: nothing asked of Redis"

    clock.now += 0.6
    times = reader.by_queue(client, prefix="", queues=[unique_name])[unique_name]
    assert len(times) == 3 and min(times) < time.time() - 19, "one acknowledged, one new, the oldest kept"
    assert [tag.decode() for tag in client.asked[3:]] == [later], "only the new tag's queue was looked up"

    for tag in [*first[1:], later]:
        _acknowledge(client, tag)
    clock.now += 1.1
    assert reader.by_queue(client, prefix="", queues=[unique_name]) == {}


def test_tags_kombu_never_makes_and_redis_without_scripts_are_read_whole(redis_url, unique_name):
    client = redis.Redis.from_url(redis_url)
    _deliver(client, unique_name)
    _deliver(client, unique_name, tag=f"{unique_name} with a space")
    assert UnackedDeliveries().by_queue(client, prefix="", queues=[unique_name]) is None
    assert inspect_redis(redis_url, [unique_name], client=client, unacked=UnackedDeliveries())[unique_name].unacked == 2
    with redis_without_scripts(redis_url, unique_name) as limited:
        limited_client = redis.Redis.from_url(limited)
        assert UnackedDeliveries().by_queue(limited_client, prefix="", queues=[unique_name]) is None
        stats = inspect_redis(limited, [unique_name], client=limited_client, unacked=UnackedDeliveries())
        assert stats[unique_name].unacked == 2
