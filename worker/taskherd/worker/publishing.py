"""Publishing a message so that it is safe before anything else happens: the one way taskherd does it.

Every publish that takes a message's place — a dead-letter envelope, a message put back on its
queue, a DLQ redrive — must not return until the broker has the message in a queue, because the
caller acknowledges or deletes the original next:

- RabbitMQ: publisher confirms (``confirm_publish``: ``publish`` returns after the broker's ack and
  raises on a nack) and ``mandatory``: a message no queue takes (a queue that does not exist, a
  typo in ``taskherd dlq redrive --to``) is returned by the broker before its confirm, and
  :class:`Unroutable` is raised — without ``mandatory`` the broker confirms it and drops it.
- Redis: LPUSH returns after Redis applied it; kombu's ``global_keyprefix`` transport option must
  be passed in ``transport_options`` or the message lands in a list no worker reads.

Each call uses a connection of its own: after a returned message the channel still has that
message's confirm in flight, and a later publish on it would take that confirm for its own.
"""
from __future__ import annotations

from typing import Any, Iterable

#: kombu's retry policy for one publish: a broker blip is retried briefly, then the caller decides.
RETRY_POLICY = {"max_retries": 3, "interval_start": 0.2, "interval_step": 0.5}


class Unroutable(Exception):
    """The broker returned the message: no queue is bound to its exchange and routing key."""

    def __init__(self, exchange: str, routing_key: str, reply: str):
        self.exchange, self.routing_key = exchange, routing_key
        where = f"exchange {exchange!r}" if exchange else "the default exchange"
        super().__init__(f"no queue takes routing key {routing_key!r} on {where} (broker: {reply}); "
                         f"the message was not delivered")


def publish(body: Any, *, broker_url: str, exchange: str, routing_key: str, transport_options: dict | None = None,
            declare: Iterable[Any] = (), timeout: float = 10.0, **options: Any) -> None:
    """Publish ``body`` and return only once the broker has it in a queue; raise otherwise.

    ``declare``: kombu entities (queues) declared first, on the same channel. ``options`` go to
    ``kombu.Producer.publish`` (headers, content_type, serializer, priority, …).
    """
    from amqp.exceptions import ChannelError
    from kombu import Connection, Producer

    connection = Connection(broker_url, transport_options={**(transport_options or {}), "confirm_publish": True},
                            connect_timeout=timeout)
    try:
        connection.ensure_connection(max_retries=3, timeout=timeout)
        with connection.channel() as channel:
            for entity in declare:
                entity(channel).declare()
            try:
                Producer(channel).publish(body, exchange=exchange, routing_key=routing_key, mandatory=True,
                                          retry=True, retry_policy=RETRY_POLICY, **options)
            except ChannelError as exc:
                if getattr(exc, "reply_code", None) == 312:  # NO_ROUTE: returned, not delivered
                    raise Unroutable(exchange, routing_key, str(exc)) from exc
                raise
    finally:
        connection.release()


def message_properties(message: Any) -> dict[str, Any]:
    """The properties of a received kombu message worth keeping when it is published again."""
    properties = getattr(message, "properties", None) or {}
    kept = ("correlation_id", "reply_to", "priority", "delivery_mode", "expiration", "timestamp")
    return {name: properties[name] for name in kept if properties.get(name) is not None}
