"""Messages as a producer puts them on the wire, published raw to Redis and RabbitMQ, and one real
worker per broker that consumes them (shared by a whole test module: starting a worker costs
seconds, a message milliseconds).

Two kinds of message:
- :class:`Wire`: what any AMQP client can send (body bytes, headers, content type/encoding). On
  Redis it is wrapped as kombu wraps a message (JSON, base64 body, delivery tag), so only the
  message itself is wrong, never kombu's envelope around it.
- :class:`RedisItem`: bytes LPUSHed onto the Redis list as they are (a shell script, a producer
  that hand-writes kombu's JSON). On RabbitMQ the same bytes are published as a JSON body without
  headers — what that producer would send there.
"""
from __future__ import annotations

import base64
import contextlib
import dataclasses
import json
import os
import sys
import uuid
from pathlib import Path
from typing import Any, Iterator

import amqp
import redis
from kombu import Connection

from e2e.lib import services
from e2e.lib.waiting import wait_for
from support.worker_process import WorkerProcess
from worker_support import core_env, dead_letters

#: pass as a header value to leave the header out
DROP = object()


def task_headers(task: str = "core.record", **overrides: Any) -> dict:
    """The headers of a protocol-2 message as Celery 5 sends it, with ``overrides``."""
    headers = {"lang": "py", "task": task, "id": str(uuid.uuid4()), "shadow": None, "eta": None,
               "expires": None, "group": None, "group_index": None, "retries": 0, "timelimit": [None, None],
               "root_id": None, "parent_id": None, "argsrepr": "", "kwargsrepr": "", "origin": "test@host",
               "ignore_result": False}
    headers.update(overrides)
    return {name: value for name, value in headers.items() if value is not DROP}


def json_body(value: Any) -> bytes:
    return json.dumps(value).encode("utf-8")


@dataclasses.dataclass(frozen=True)
class Wire:
    body: bytes
    headers: dict | None = None
    content_type: str | None = "application/json"
    content_encoding: str | None = "utf-8"

    @property
    def raw(self) -> bytes:
        """The bytes an envelope must keep for this message."""
        return self.body


@dataclasses.dataclass(frozen=True)
class RedisItem:
    item: bytes

    @property
    def raw(self) -> bytes:
        return self.item


def kombu_payload(body: bytes, headers: dict | None, *, queue: str, content_type: str | None = "application/json",
                  content_encoding: str | None = "utf-8") -> dict:
    """A message as kombu's Redis transport stores it in a list."""
    return {
        "body": base64.b64encode(body).decode("ascii"),
        "content-type": content_type,
        "content-encoding": content_encoding,
        "headers": headers or {},
        "properties": {"body_encoding": "base64", "delivery_tag": str(uuid.uuid4()),
                       "delivery_info": {"exchange": "", "routing_key": queue}, "priority": 0, "delivery_mode": 2},
    }


@dataclasses.dataclass
class ConsumingWorker:
    """One real `celery worker` (apps.core_app, concurrency 1) on its own queue, and its broker."""

    broker: str
    broker_url: str
    record_url: str
    queue: str
    worker: WorkerProcess
    connection: Connection
    records: redis.Redis
    pid: int = 0
    pool_pids: tuple[int, ...] = ()

    @property
    def dead_letter_queue(self) -> str:
        return f"{self.queue}.dlq"

    def publish(self, message: Wire | RedisItem) -> None:
        """Publishes ``message`` to the work queue; returns once the broker has it."""
        if self.broker == "redis":
            client = redis.Redis.from_url(self.broker_url)
            try:
                client.lpush(self.queue, self._redis_item(message))
            finally:
                client.close()
            return
        if isinstance(message, RedisItem):
            message = Wire(message.item)
        properties = {"content_type": message.content_type, "content_encoding": message.content_encoding,
                      "application_headers": message.headers, "delivery_mode": 2}
        amqp_message = amqp.Message(message.body, **{k: v for k, v in properties.items() if v is not None})
        # confirm_publish: returns once RabbitMQ has it, so it is ahead of anything published next.
        # py-amqp writes nested tables recursively, two frames a level: a producer in another
        # language has no such limit, so none here either (a header nested 900 deep, say).
        limit = sys.getrecursionlimit()
        sys.setrecursionlimit(max(limit, 20_000))
        try:
            self.connection.default_channel.basic_publish(amqp_message, exchange="", routing_key=self.queue)
        finally:
            sys.setrecursionlimit(limit)

    def _redis_item(self, message: Wire | RedisItem) -> bytes:
        if isinstance(message, RedisItem):
            return message.item
        return json_body(kombu_payload(message.body, message.headers, queue=self.queue,
                                       content_type=message.content_type,
                                       content_encoding=message.content_encoding))

    def publish_good(self, key: str) -> None:
        """A well-formed core.record(key) as Celery 5 itself sends it."""
        self.publish(Wire(json_body([[key, "ok"], {}, {"callbacks": None, "errbacks": None, "chain": None,
                                                        "chord": None}]),
                          headers=task_headers(argsrepr=repr((key, "ok")))))

    def recorded(self, key: str) -> list[str]:
        return [raw.decode().split("|", 2)[2] for raw in self.records.lrange(key, 0, -1)]

    def letters(self) -> list:
        return dead_letters(self.broker_url, self.queue)

    def dead_letter_count(self) -> int:
        if self.broker == "redis":
            client = redis.Redis.from_url(self.broker_url)
            try:
                return client.llen(self.dead_letter_queue)
            finally:
                client.close()
        with Connection(self.broker_url) as connection:
            return connection.default_channel.queue_declare(self.dead_letter_queue, passive=True).message_count

    def purge_dead_letters(self) -> None:
        if self.broker == "redis":
            client = redis.Redis.from_url(self.broker_url)
            try:
                client.delete(self.dead_letter_queue)
            finally:
                client.close()
        else:
            with Connection(self.broker_url) as connection:
                connection.default_channel.queue_purge(self.dead_letter_queue)

    def unacked(self) -> int:
        """Messages waiting or held unacknowledged, on Redis (kombu's unacked hash). RabbitMQ
        reports them only through its management API, seconds late: 0 there."""
        if self.broker != "redis":
            return 0
        client = redis.Redis.from_url(self.broker_url)
        try:
            return client.hlen("unacked") + client.llen(self.queue)
        finally:
            client.close()

    def assert_alive_and_unchanged(self) -> None:
        assert self.worker.is_running(), f"the worker exited:\n{self.worker.tail()}"
        assert self.worker.pid == self.pid
        assert tuple(sorted(self.worker.child_pids())) == self.pool_pids, (
            f"a pool process was replaced (the message reached the pool):\n{self.worker.tail()}")


@contextlib.contextmanager
def consuming_worker(broker: str, log_dir: Path) -> Iterator[ConsumingWorker]:
    """A :class:`ConsumingWorker` on a Redis database or RabbitMQ vhost of its own."""
    redis_base = os.environ["TASKHERD_REDIS_URL"]
    with contextlib.ExitStack() as stack:
        if broker == "redis":
            broker_url = record_url = stack.enter_context(services.leased_redis_db(redis_base))
        else:
            broker_url = stack.enter_context(services.fresh_vhost(os.environ["TASKHERD_AMQP_URL"],
                                                                  os.environ["TASKHERD_RABBITMQ_API_URL"]))
            record_url = stack.enter_context(services.leased_redis_db(redis_base))
        queue = f"t-raw-{uuid.uuid4().hex[:8]}"
        worker = WorkerProcess("apps.core_app", log_dir=log_dir, queues=[queue], concurrency=1,
                               env=core_env(broker_url, queue, record_url))
        stack.callback(worker.kill)
        worker.start()
        connection = stack.enter_context(Connection(broker_url, transport_options={"confirm_publish": True}))
        records = redis.Redis.from_url(record_url)
        stack.callback(records.close)
        consuming = ConsumingWorker(broker=broker, broker_url=broker_url, record_url=record_url, queue=queue,
                                    worker=worker, connection=connection, records=records)
        # Settled: the pool is up and a first task went through (the DLQ is declared by then too).
        consuming.publish_good("warm-up")
        wait_for("the warm-up task", lambda: consuming.recorded("warm-up"), timeout=30, explain=worker.tail)
        consuming.pid, consuming.pool_pids = worker.pid, tuple(sorted(worker.child_pids()))
        yield consuming


def settle(consuming: ConsumingWorker, *, timeout: float = 20) -> None:
    """Waits until the worker holds nothing and its queue is empty (Redis)."""
    wait_for("the queue and unacked to be empty (unacked)", consuming.unacked, timeout=timeout, equals=0,
             explain=consuming.worker.tail)
