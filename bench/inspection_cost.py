"""Queue inspection cost against queue depth (10 to 1,000,000 messages) on Redis and RabbitMQ.

What the operator and `taskherd exporter` pay per poll, `taskherd.queues.inspect_queues` on a work
queue and its DLQ (ready and unacknowledged counts, the oldest message's age), beside what KEDA's
scalers ask for the same queue: LLEN on Redis (`listLength`), a passive queue.declare over AMQP and
one management API GET over HTTP on RabbitMQ (its two protocols). The queue is filled step by step
with copies of one real Celery message (a publish stamp in its headers); each figure is the median
over `--calls` calls of the wall time and of this process's CPU time (the client's side; the
broker's own work shows in the wall time).

The queues live in a leased Redis database and a fresh RabbitMQ vhost, removed afterwards. The
RabbitMQ messages are transient (delivery_mode 1) so that a million of them costs the shared
broker memory, not a gigabyte of disk writes.

    source scripts/services.sh env && .venv/bin/python bench/inspection_cost.py [--depths 10,1000,100000,1000000]
"""
from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import statistics
import time
from urllib.parse import quote, unquote, urlsplit

import httpx
import redis

import repo_paths  # noqa: F401 - first: the shared helpers below live in the repository

from e2e.lib.services import fresh_vhost, leased_redis_db
from e2e.lib.waiting import wait_for

from taskherd.queues import inspect_queues
from taskherd.queues.rabbitmq import vhost_of

QUEUE = "inspect"


def timed(call, calls: int) -> tuple[float, float]:
    """(median wall ms, median client CPU ms) of `calls` calls."""
    call()  # warm: connections, imports
    walls, cpus = [], []
    for _ in range(calls):
        wall, cpu = time.perf_counter(), time.process_time()
        call()
        cpus.append(time.process_time() - cpu)
        walls.append(time.perf_counter() - wall)
    return statistics.median(walls) * 1000, statistics.median(cpus) * 1000


def template_message(redis_url: str) -> bytes:
    """One real task message as kombu's Redis transport stores it (JSON envelope, base64 body),
    with taskherd's publish stamp in its headers."""
    from celery import Celery

    client = redis.Redis.from_url(redis_url)
    app = Celery(broker=redis_url, set_as_current=False)
    app.send_task("bench.inspect", args=(1, "x" * 32), queue="template",
                  headers={"taskherd_published_at": time.time()})
    app.close()
    return client.rpop("template")


class RedisQueue:
    def __init__(self, url: str, raw: bytes):
        self.url, self.client, self.raw = url, redis.Redis.from_url(url), raw
        self.filled = 0

    def fill(self, depth: int) -> None:
        while self.filled < depth:
            batch = min(10_000, depth - self.filled)
            self.client.lpush(QUEUE, *([self.raw] * batch))
            self.filled += batch

    def figures(self, calls: int) -> dict[str, tuple[float, float]]:
        kept = redis.Redis.from_url(self.url)  # the operator keeps its client between polls
        from taskherd.queues.redis import inspect_redis

        return {"taskherd": timed(lambda: inspect_redis(self.url, [QUEUE, QUEUE + ".dlq"], client=kept), calls),
                "KEDA Redis (LLEN)": timed(lambda: kept.llen(QUEUE), calls)}


class RabbitQueue:
    def __init__(self, amqp_url: str, api_url: str, raw: bytes):
        import amqp

        self.amqp_url = amqp_url
        parts = urlsplit(amqp_url)
        self.connection = amqp.Connection(host=f"{parts.hostname}:{parts.port}", userid=unquote(parts.username),
                                          password=unquote(parts.password), virtual_host=vhost_of(amqp_url))
        self.connection.connect()
        self.channel = self.connection.channel()
        self.channel.queue_declare(QUEUE, durable=True, auto_delete=False,
                                   arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": QUEUE + ".dlq"})
        self.channel.queue_declare(QUEUE + ".dlq", durable=True, auto_delete=False)
        envelope = json.loads(raw)  # the same task message, as an AMQP producer sends it
        self.message = amqp.Message(base64.b64decode(envelope["body"]), content_type=envelope["content-type"],
                                    content_encoding=envelope["content-encoding"],
                                    application_headers=envelope["headers"], timestamp=int(time.time()),
                                    delivery_mode=1)
        api = urlsplit(api_url)
        self.api_base = f"{api.scheme}://{api.hostname}:{api.port}"
        self.api_auth = (unquote(api.username or "guest"), unquote(api.password or "guest"))
        self.management_url = f"{api.scheme}://{api.username}:{api.password}@{api.hostname}:{api.port}"
        self.filled = 0

    def fill(self, depth: int) -> None:
        while self.filled < depth:
            self.channel.basic_publish(self.message, exchange="", routing_key=QUEUE)
            self.filled += 1
            if self.filled % 5000 == 0:
                # A round trip on the same channel: the broker has taken everything published before
                # it, so the publisher never runs far ahead of the broker's flow control.
                self.channel.queue_declare(QUEUE, passive=True)
        wait_for(f"RabbitMQ to hold {depth} messages",
                 lambda: self.channel.queue_declare(QUEUE, passive=True).message_count, 600, 0.5,
                 until=lambda count: count >= depth)
        # The management API's figures lag the queue by its statistics interval (5 s).
        url = f"{self.api_base}/api/queues/{quote(vhost_of(self.amqp_url), safe='')}/{QUEUE}"
        wait_for(f"the management API to report {depth} ready messages",
                 lambda: httpx.get(url, auth=self.api_auth, timeout=30).json().get("messages_ready", 0), 600, 1,
                 until=lambda ready: ready >= depth)

    def figures(self, calls: int) -> dict[str, tuple[float, float]]:
        url = f"{self.api_base}/api/queues/{quote(vhost_of(self.amqp_url), safe='')}/{QUEUE}"
        with httpx.Client(auth=self.api_auth, timeout=30) as client:
            return {"taskherd": timed(lambda: inspect_queues(self.amqp_url, [QUEUE, QUEUE + ".dlq"],
                                                             management_url=self.management_url), calls),
                    "KEDA AMQP (passive declare)": timed(
                        lambda: self.channel.queue_declare(QUEUE, passive=True), calls),
                    "KEDA HTTP (one GET)": timed(lambda: client.get(url).json(), calls)}

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.connection.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depths", default="10,1000,100000,1000000")
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--brokers", default="redis,rabbitmq")
    args = parser.parse_args(argv)
    depths = [int(d) for d in args.depths.split(",")]
    table: dict[tuple[str, str], dict[int, tuple[float, float]]] = {}
    for broker in args.brokers.split(","):
        with contextlib.ExitStack() as stack:
            redis_url = stack.enter_context(leased_redis_db(os.environ["TASKHERD_REDIS_URL"]))
            raw = template_message(redis_url)
            if broker == "redis":
                queue = RedisQueue(redis_url, raw)
            else:
                url = stack.enter_context(fresh_vhost(os.environ["TASKHERD_AMQP_URL"],
                                                      os.environ["TASKHERD_RABBITMQ_API_URL"]))
                queue = RabbitQueue(url, os.environ["TASKHERD_RABBITMQ_API_URL"], raw)
                stack.callback(queue.close)
            for depth in depths:
                filling = time.monotonic()
                queue.fill(depth)
                print(f"  {broker}: {depth:>9,} messages (filled in {time.monotonic() - filling:.0f} s)", flush=True)
                for name, figure in queue.figures(args.calls).items():
                    table.setdefault((broker, name), {})[depth] = figure
    print(f"\ninspection cost per call against queue depth: wall ms / client CPU ms, median of {args.calls}")
    print(f"{'broker':<10}{'inspection':<30}" + "".join(f"{d:>18,}" for d in depths))
    for (broker, name), by_depth in table.items():
        print(f"{broker:<10}{name:<30}" + "".join(f"{w:>10.2f} /{c:>6.2f}" for w, c in (by_depth[d] for d in depths)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
