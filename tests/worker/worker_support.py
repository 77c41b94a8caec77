"""Helpers for the reliability-core tests: a recording Redis next to each broker, DLQ reading."""
from __future__ import annotations

from typing import Any, Callable

import pytest
import redis
from celery import Celery, signals

from taskherd.worker import configure
from taskherd.commands.dlq import DeadLetter, open_dead_letters


@pytest.fixture
def record_url(broker_url, request) -> str:
    """Where test tasks record their runs: the broker's own database on Redis, a leased one otherwise."""
    return broker_url if broker_url.startswith("redis") else request.getfixturevalue("redis_url")


@pytest.fixture
def recorded(record_url) -> Callable[[str], list[tuple[float, int, str]]]:
    client = redis.Redis.from_url(record_url)

    def read(key: str) -> list[tuple[float, int, str]]:
        rows = []
        for raw in client.lrange(key, 0, -1):
            when, pid, value = raw.decode().split("|", 2)
            rows.append((float(when), int(pid), value))
        return rows

    yield read
    client.close()


@pytest.fixture
def producer(broker_url, record_url, unique_name):
    """The producer side of the app: the same profile, so it declares the queue as workers do
    (RabbitMQ refuses a second declaration with different arguments)."""
    app = Celery("producer", broker=broker_url, set_as_current=False)
    app.conf.update(broker_connection_retry_on_startup=True)
    configure(app, queues=[unique_name], delivery_counter_url=record_url)
    yield app
    app.close()


def core_env(broker_url: str, queue: str, record_url: str, **knobs: str) -> dict[str, str]:
    env = {"TEST_BROKER_URL": broker_url, "TEST_QUEUE": queue, "TEST_RECORD_URL": record_url,
           "TEST_COUNTER_URL": record_url}
    env.update({f"TEST_{k.upper()}": str(v) for k, v in knobs.items()})
    return env


def dead_letters(broker_url: str, queue: str, dlq: str | None = None, *, keyprefix: str = "") -> list[DeadLetter]:
    """The messages of ``queue``'s DLQ (``<queue>.dlq`` unless ``dlq`` names it), left in place;
    [] while the DLQ does not exist yet."""
    from amqp.exceptions import NotFound

    store = open_dead_letters(broker_url, dlq or f"{queue}.dlq", keyprefix=keyprefix)
    try:
        return store.letters()
    except NotFound:
        return []
    finally:
        try:
            store.close()
        except Exception:  # noqa: BLE001 - a channel closed by the NotFound above
            pass




def make_dlq_unwritable(broker_url: str, dlq: str, *, queue_type: str = "classic") -> Callable[[], None]:
    """Makes publishing an envelope to ``dlq`` fail; returns the function that repairs it.

    Redis: the DLQ key holds a string (LPUSH fails with WRONGTYPE). RabbitMQ: the DLQ is declared
    with other arguments than the worker's (its declaration fails with PRECONDITION_FAILED) — a
    classic queue with a length limit, or a classic one where the profile wants a quorum one."""
    from kombu import Connection, Queue

    if broker_url.startswith("redis"):
        client = redis.Redis.from_url(broker_url)
        client.set(dlq, "not a list")
        return lambda: client.delete(dlq)
    arguments = {"x-max-length": 1} if queue_type == "classic" else None
    with Connection(broker_url) as connection:
        Queue(dlq, routing_key=dlq, durable=True, queue_arguments=arguments)(connection.default_channel).declare()

    def repair() -> None:
        with Connection(broker_url) as connection:
            connection.default_channel.queue_delete(dlq)

    return repair


class _WorkerOf:
    """What a worker_init receiver gets as its sender: a WorkController, which knows its app."""

    def __init__(self, app: Any):
        self.app = app


def before_and_after_worker_start(component: Any, read: Callable[[], Any]) -> tuple[Any, Any]:
    """What ``read()`` gives once ``component`` (one of the default components) is installed in an
    app, and then once Celery's worker_init has been sent: what a producer importing the app
    sees, and what the started worker's process (and the children it forks) runs with."""
    from taskherd.worker.components import default_components

    assert any(isinstance(default, type(component)) for default in default_components())
    app = Celery(f"{type(component).__name__}-test", set_as_current=False)
    component.install(app)
    before = read()
    # Sent as that app's worker would (a WorkController has .app): receivers of other apps this test
    # process configured (the Metrics component's, say) let it pass, as they would in a real worker.
    signals.worker_init.send(sender=_WorkerOf(app))
    return before, read()
