"""The early notice's count on RabbitMQ (taskherd.queues.rabbitmq_counts): pipelined passive
declares over AMQP, frames written and read by hand — against the REAL RabbitMQ."""
from __future__ import annotations

import time

import httpx
import pytest
from amqp.serialization import dumps
from kombu import Connection

from taskherd.queues.rabbitmq import vhost_of
from taskherd.queues.rabbitmq_counts import (QUEUE_DECLARE, CountFailed, ReadyCounter, _method_frame,
                                             declare_passive_frame)


def test_a_passive_declare_is_the_frame_py_amqp_writes():
    name = "orders.é"
    arguments = dumps("BsbbbbbF", (0, name, True, False, False, False, False, {}))
    assert declare_passive_frame(3, name.encode()) == _method_frame(3, QUEUE_DECLARE, arguments)


def publish(url: str, queue: str, n: int) -> None:
    with Connection(url) as connection:
        channel = connection.channel()
        channel.queue_declare(queue, durable=True, auto_delete=False)
        for _ in range(n):
            # confirmed: the count, on a connection of its own, would otherwise race the publish
            channel.basic_publish_confirm(channel.prepare_message(b"{}"), routing_key=queue)


def test_the_ready_messages_are_counted_at_once_and_missing_queues_are_none(amqp_url, unique_name):
    """Right after publishing (the management API would still say 0 for up to 5 s); a message a
    consumer holds unacknowledged is not ready; a missing queue, or one whose name AMQP cannot
    carry, is None and the queues after it are still counted."""
    names = [f"{unique_name}-{i}" for i in range(6)] + [f"{unique_name}-é"]
    for i, name in enumerate(names):
        publish(amqp_url, name, i)
    with Connection(amqp_url) as consumer:
        channel = consumer.channel()
        channel.basic_qos(0, 2, False)
        held = [channel.basic_get(names[5], no_ack=False) for _ in range(2)]
        assert all(held)
        counter = ReadyCounter(amqp_url)
        try:
            asked = [names[0], unique_name + "-missing", names[1], unique_name + "-gone", "x" * 256] + names[2:]
            counts = counter.counts(asked)
            assert counts == {names[0]: 0, unique_name + "-missing": None, names[1]: 1, unique_name + "-gone": None,
                              "x" * 256: None, names[2]: 2, names[3]: 3, names[4]: 4, names[5]: 3, names[6]: 6}
            publish(amqp_url, names[0], 4)
            assert counter.counts([names[0]]) == {names[0]: 4}, "the next count, on the same connection"
        finally:
            counter.close()


def test_many_missing_queues_among_many(amqp_url, unique_name):
    """Every second queue missing: the channel is closed and opened again 100 times in one count."""
    names = [f"{unique_name}-{i}" for i in range(200)]
    for i, name in enumerate(names):
        if i % 2 == 0:
            publish(amqp_url, name, 1 + i % 3)
    counter = ReadyCounter(amqp_url)
    try:
        assert counter.counts(names) == {name: (1 + i % 3 if i % 2 == 0 else None) for i, name in enumerate(names)}
    finally:
        counter.close()


def test_a_connection_the_broker_dropped_is_opened_again(amqp_url, rabbitmq_api_url, unique_name):
    publish(amqp_url, unique_name, 2)
    counter = ReadyCounter(amqp_url)
    try:
        assert counter.counts([unique_name]) == {unique_name: 2}
        vhost = vhost_of(amqp_url)

        def ours():
            listed = httpx.get(f"{rabbitmq_api_url}/api/vhosts/{vhost}/connections").json()
            return [c["name"] for c in listed]
        deadline = time.monotonic() + 30  # the management API lists a connection after its stats
        while not ours() and time.monotonic() < deadline:
            time.sleep(0.5)
        assert len(ours()) == 1, "only the counter is connected to this vhost"
        httpx.delete(f"{rabbitmq_api_url}/api/connections/{ours()[0]}").raise_for_status()
        time.sleep(0.5)
        assert counter.counts([unique_name]) == {unique_name: 2}
    finally:
        counter.close()


def test_an_unreachable_broker_is_not_tried_again_until_retry_after():
    """A broker that does not answer would hold every count (once a second) for the timeout."""
    now = [0.0]
    counter = ReadyCounter("amqp://guest:guest@127.0.0.1:1//", timeout=2, retry_after_seconds=30,
                           clock=lambda: now[0])
    with pytest.raises(OSError):
        counter.counts(["celery"])
    now[0] = 29.0
    started = time.monotonic()
    with pytest.raises(CountFailed, match="the last count failed 29 s ago"):
        counter.counts(["celery"])
    assert time.monotonic() - started < 0.1, "refused at once, without connecting"
    now[0] = 30.0
    with pytest.raises(OSError):
        counter.counts(["celery"])
