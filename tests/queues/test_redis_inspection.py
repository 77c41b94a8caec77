"""Queue inspection on Redis against real queues with known contents."""
from __future__ import annotations

import contextlib
import time
import uuid
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis
from celery import Celery

from e2e.lib.waiting import wait_for
from taskherd.queues import BrokerUnreachable, inspect_queues
from taskherd.worker.components import publish_stamps

PUBLISHED_AT = publish_stamps.PUBLISHED_AT_HEADER


def producer(redis_url: str, prefix: str) -> Celery:
    app = Celery(broker=redis_url)
    if prefix:
        app.conf.broker_transport_options = {"global_keyprefix": prefix}
    return app


@pytest.fixture
def stamped():
    publish_stamps.connect()
    yield
    publish_stamps.disconnect()


def test_age_looks_past_a_run_of_eta_messages_longer_than_the_first_read(redis_url, unique_name, stamped):
    """The first read of a list is a few messages; behind them, more are read until one is not delayed."""
    from taskherd.queues.redis import FIRST_CHUNK

    app = producer(redis_url, "")
    for _ in range(FIRST_CHUNK * 3 + 1):
        app.send_task("t.eta", queue=unique_name, countdown=3600)
    before = time.time()
    app.send_task("t.plain", queue=unique_name)
    app.close()
    now = time.time() + 10
    stats = inspect_queues(redis_url, [unique_name], now=now)[unique_name]
    assert stats.ready == FIRST_CHUNK * 3 + 2
    assert now - time.time() <= stats.oldest_age_seconds <= now - before


@pytest.mark.parametrize("prefix", ["", "tenant-a:"])
def test_ready_depth_counts_every_priority_list_and_age_skips_eta(redis_url, unique_name, prefix, stamped):
    app = producer(redis_url, prefix)
    queue = unique_name
    old_stamp = time.time() - 300
    publish_stamps.disconnect()  # one message with a known, old stamp, in the priority-6 list
    app.send_task("t.old", queue=queue, priority=6, headers={PUBLISHED_AT: old_stamp})
    publish_stamps.connect()
    app.send_task("t.eta", queue=queue, countdown=3600)  # the oldest of list 0, but waits on purpose
    before = time.time()
    app.send_task("t.a", queue=queue)
    app.send_task("t.b", queue=queue)
    after = time.time()
    app.send_task("t.c", queue=queue, priority=9)
    app.send_task("t.other", queue=queue + "-other")
    app.close()

    client = redis.Redis.from_url(redis_url)
    assert client.llen(prefix + queue + "\x06\x166") == 1, "the priority message is not in its sub-list"
    now = time.time() + 10
    stats = inspect_queues(redis_url, [queue, queue + "-missing"], global_keyprefix=prefix, now=now)
    assert stats[queue].ready == 5 and stats[queue].unacked == 0 and stats[queue].consumers is None
    assert stats[queue].depth == 5
    assert abs(stats[queue].oldest_age_seconds - (now - old_stamp)) < 0.01
    missing = stats[queue + "-missing"]
    assert (missing.ready, missing.unacked, missing.oldest_age_seconds) == (0, 0, None)

    client.delete(prefix + queue + "\x06\x166")  # without the old one: the oldest non-ETA of list 0
    age = inspect_queues(redis_url, [queue], global_keyprefix=prefix, now=now)[queue].oldest_age_seconds
    assert now - after <= age <= now - before
    if prefix:  # the prefix is honoured, not ignored: unprefixed names hold nothing
        assert inspect_queues(redis_url, [queue], now=now)[queue].ready == 0


def test_unacked_counted_per_queue_while_a_worker_runs(redis_url, unique_name, worker_factory, stamped):
    queue, other = unique_name, unique_name + "-other"
    env = {"TEST_BROKER_URL": redis_url, "TEST_QUEUE": queue, "TEST_VISIBILITY_TIMEOUT": "600"}
    worker_factory("apps.recovery_app", queues=[queue], env=env, concurrency=1)
    app = producer(redis_url, "")
    for _ in range(3):
        app.send_task("recovery.hold", args=(uuid.uuid4().hex, 30), queue=queue)
    app.send_task("recovery.hold", args=("elsewhere", 1), queue=other)  # no worker consumes it
    app.close()

    wait_for("the worker to take a message (unacked 1)",
             lambda: inspect_queues(redis_url, [queue, other], visibility_timeout=600)[queue].unacked,
             equals=1, timeout=30)
    time.sleep(2)
    stats = inspect_queues(redis_url, [queue, other], visibility_timeout=600)
    assert (stats[queue].ready, stats[queue].unacked, stats[queue].depth) == (2, 1, 3)
    assert (stats[other].ready, stats[other].unacked) == (1, 0)
    assert 2 <= stats[queue].oldest_unacked_age_seconds < 30
    assert stats[queue].visibility_timeout_seconds == 600
    assert 570 < stats[queue].visibility_timeout_remaining_seconds <= 598
    assert stats[other].oldest_unacked_age_seconds is None


def test_dlq_depth_is_the_ready_count_of_the_dlq(redis_url, unique_name):
    client = redis.Redis.from_url(redis_url)
    for i in range(4):
        client.lpush(unique_name + ".dlq", '{"headers": {}, "properties": {}}')
    stats = inspect_queues(redis_url, [unique_name + ".dlq"])
    assert stats[unique_name + ".dlq"].ready == 4


def test_unreachable_redis_raises_broker_unreachable():
    with pytest.raises(BrokerUnreachable, match="127.0.0.1:1"):
        inspect_queues("redis://127.0.0.1:1/3", ["q"])


@contextlib.contextmanager
def redis_without_scripts(redis_url: str, unique_name: str):
    """The URL of a user whose ACL forbids scripting (common on managed Redis), on the same database."""
    admin = redis.Redis.from_url(redis_url)
    user, password = f"noscripts-{unique_name}"[:60], uuid.uuid4().hex
    admin.acl_setuser(user, enabled=True, passwords=[f"+{password}"], keys=["*"], channels=["*"],
                      commands=["+@all", "-@scripting"])
    try:
        parts = urlsplit(redis_url)
        yield urlunsplit(parts._replace(netloc=f"{user}:{password}@{parts.hostname}:{parts.port}"))
    finally:
        admin.acl_deluser(user)
        admin.close()


def test_a_redis_that_refuses_scripts_is_inspected_one_command_at_a_time(redis_url, unique_name, stamped):
    """The lists are read by one script; a user whose ACL forbids scripting (common on managed
    Redis) gets the same figures from the plain commands."""
    app = producer(redis_url, "")
    app.send_task("t.a", queue=unique_name)
    app.send_task("t.b", queue=unique_name, priority=9)
    app.close()
    with redis_without_scripts(redis_url, unique_name) as limited:
        with pytest.raises(redis.exceptions.NoPermissionError):
            redis.Redis.from_url(limited).eval("return 1", 0)
        refused, allowed = inspect_queues(limited, [unique_name])[unique_name], inspect_queues(redis_url, [unique_name])[unique_name]
        assert refused.ready == allowed.ready == 2
        assert refused.oldest_age_seconds is not None and allowed.oldest_age_seconds is not None


def test_ready_counts_agree_with_the_inspection_for_any_queue_name_with_or_without_scripts(redis_url, unique_name):
    """The operator's early notice counts with one script whose queue names travel as one string:
    names holding the separator characters, newlines or non-ASCII text are counted as themselves,
    and a Redis that refuses scripts gets the same counts from LLEN."""
    from taskherd.queues.redis import ready_counts

    names = [f"{unique_name}:a", f"{unique_name}\nb,c", f"{unique_name}-ü-3:x", f"{unique_name}-empty"]
    app = producer(redis_url, "")
    for index, name in enumerate(names[:3]):
        for priority in (0, 9)[:index + 1]:
            app.send_task("t.a", queue=name, priority=priority)
    app.close()
    expected = {name: stats.ready for name, stats in inspect_queues(redis_url, names).items()}
    assert list(expected.values()) == [1, 2, 2, 0]
    client = redis.Redis.from_url(redis_url)
    assert ready_counts(client, names) == expected
    assert ready_counts(client, []) == {}
    with redis_without_scripts(redis_url, unique_name) as limited:
        assert ready_counts(redis.Redis.from_url(limited), names) == expected


def test_the_inspection_reads_any_message_and_queue_name_as_the_plain_commands_do(redis_url, unique_name):
    """The lists' messages come back in one string of length-prefixed parts: messages holding
    spaces, newlines, digits after a space or non-ASCII text, queue names holding the separators,
    and a client that decodes replies all give what the script-less commands give."""
    now = time.time()
    names = [f"{unique_name} a", f"{unique_name}\n12 3", f"{unique_name}-ü", f"{unique_name}-empty"]
    client = redis.Redis.from_url(redis_url)
    for index, name in enumerate(names[:3]):
        for step, key in enumerate((name, f"{name}\x06\x163", f"{name}\x06\x169")[:index + 1]):
            stamp = now - 100 * (index + 1) - step
            client.lpush(key, f'{{"body": "x y 7 8 ü\\n", "headers": {{"{PUBLISHED_AT}": {stamp}}}}}', "not json 5 6")
    decoding = urlunsplit(urlsplit(redis_url)._replace(query="decode_responses=True"))
    with redis_without_scripts(redis_url, unique_name) as limited:
        readings = [inspect_queues(url, names) for url in (redis_url, decoding, limited)]
    for reading in readings:
        assert [reading[name].ready for name in names] == [2, 4, 6, 0]
        # the oldest message of each list is the JSON one (LPUSH: the last pushed is the newest)
        assert [round(reading[name].oldest_age_seconds or 0, -1) for name in names] == [100, 200, 300, 0]
