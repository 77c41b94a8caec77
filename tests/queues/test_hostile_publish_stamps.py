"""A publish stamp (``taskherd_published_at``) any producer can set to anything: the oldest age the
Redis inspection reports (to the operator and the exporter) stays finite, from the readable stamps.

float() read the stamp: it took Infinity, NaN, '1e999' and digits of other scripts ('١٢' is 12),
so one hostile message made a queue's oldest age NaN, -inf or 54 years; an integer too large for
a float (10**400) and headers that were no JSON object raised out of the inspection. An unreadable
stamp now counts as no stamp (taskherd.worker.deliveries.header_timestamp)."""
from __future__ import annotations

import json
import math
import time
import uuid

import pytest
import redis
from celery import Celery

from taskherd.queues import inspect_queues
from taskherd.queues.redis import oldest_undelayed, published_at
from taskherd.worker.components import publish_stamps

PUBLISHED_AT = publish_stamps.PUBLISHED_AT_HEADER
PRIORITY_6 = "\x06\x166"

#: stamps no reading may take: not numbers, not finite, out of 0..year 9999, or unconvertible
HOSTILE = [float("nan"), float("-inf"), float("inf"), "\u0661\u0662", "1e999", "-1e999", "Infinity", "NaN", "12",
           "1700000000.5", True, -5, 10 ** 400, 1e300, {"a": 1}, [1700000000]]


def _label(value) -> str:
    text = repr(value)
    return text if len(text) < 24 else text[:20] + "…"


@pytest.mark.parametrize("stamp", HOSTILE, ids=_label)
def test_an_unreadable_stamp_reads_as_no_stamp(stamp):
    payload = json.loads(json.dumps({"headers": {PUBLISHED_AT: stamp}}))  # as it comes off the list
    assert published_at(payload) is None
    assert oldest_undelayed([json.dumps(payload).encode()]) == (True, None)


def test_readable_stamps_and_headers_that_are_no_object():
    assert published_at({"headers": {PUBLISHED_AT: 1700000000.5}}) == 1700000000.5
    assert published_at({"headers": {PUBLISHED_AT: 1700000000}}) == 1700000000.0
    for headers in ([1], "eta", 5, None):
        assert published_at({"headers": headers}) is None
        assert oldest_undelayed([json.dumps({"headers": headers}).encode()]) == (True, None)


@pytest.fixture
def producer(redis_url):
    # The test writes its own stamps: the stamping hook, process-wide once an earlier test called
    # configure(), would replace them with "now".
    publish_stamps.disconnect()
    app = Celery(broker=redis_url)
    yield app
    app.close()


@pytest.mark.parametrize("stamp", HOSTILE, ids=_label)
def test_a_hostile_stamp_among_good_ones_leaves_the_oldest_age_finite_and_from_the_good_stamp(
        redis_url, unique_name, producer, stamp):
    """The hostile message is the oldest of its list (list 0); the priority-6 list's oldest has a
    good stamp: the queue's age is that one's. Before: NaN ('min' kept it), -inf's +inf age, or
    '١٢' read as 1970 — or the inspection raised (10**400)."""
    queue = unique_name
    good_stamp = time.time() - 300
    producer.send_task("t.hostile", queue=queue, headers={PUBLISHED_AT: stamp})
    producer.send_task("t.fresh", queue=queue, headers={PUBLISHED_AT: time.time()})
    producer.send_task("t.old", queue=queue, priority=6, headers={PUBLISHED_AT: good_stamp})
    client = redis.Redis.from_url(redis_url)
    assert client.llen(queue) == 2 and client.llen(queue + PRIORITY_6) == 1
    assert json.loads(client.lindex(queue, -1))["headers"][PUBLISHED_AT] is not None, "the hostile stamp went out"

    now = time.time()
    stats = inspect_queues(redis_url, [queue], now=now)[queue]
    assert stats.ready == 3
    assert math.isfinite(stats.oldest_age_seconds)
    assert abs(stats.oldest_age_seconds - (now - good_stamp)) < 0.01
    assert stats.oldest_age_method == "publish_stamp" and stats.oldest_age_error_seconds == 0.0


@pytest.mark.parametrize("stamp", HOSTILE, ids=_label)
def test_a_queue_whose_oldest_message_has_a_hostile_stamp_reads_as_one_with_an_unstamped_oldest(
        redis_url, unique_name, producer, stamp):
    """The fallback of a message without a stamp: counted, its age unknown (None, no method), not a
    figure made up from the header."""
    hostile, unstamped = unique_name + "-hostile", unique_name + "-unstamped"
    producer.send_task("t.hostile", queue=hostile, headers={PUBLISHED_AT: stamp})
    producer.send_task("t.unstamped", queue=unstamped)
    for queue in (hostile, unstamped):
        producer.send_task("t.after", queue=queue, headers={PUBLISHED_AT: time.time()})
    stats = inspect_queues(redis_url, [hostile, unstamped], now=time.time())
    read = {queue: (s.ready, s.oldest_age_seconds, s.oldest_age_method, s.oldest_age_error_seconds,
                    s.oldest_age_is_lower_bound) for queue, s in stats.items()}
    assert read[hostile] == read[unstamped] == (2, None, None, None, True)


def test_items_whose_headers_are_no_object_do_not_stop_the_inspection(redis_url, unique_name):
    """A list item with ``"headers": [..]`` (or a string): is_delayed raised AttributeError out of
    inspect_redis, and the operator and exporter read no figure for any queue."""
    queue = unique_name
    client = redis.Redis.from_url(redis_url)
    good_stamp = time.time() - 120
    good = {"body": "", "headers": {PUBLISHED_AT: good_stamp, "id": str(uuid.uuid4())},
            "properties": {"delivery_tag": str(uuid.uuid4())}}
    client.lpush(queue + PRIORITY_6, json.dumps(good))
    client.lpush(queue, json.dumps({"body": "", "headers": [1, 2], "properties": {}}),
                 json.dumps({"body": "", "headers": "eta", "properties": {}}))
    now = time.time()
    stats = inspect_queues(redis_url, [queue], now=now)[queue]
    assert stats.ready == 3
    assert abs(stats.oldest_age_seconds - (now - good_stamp)) < 0.01
