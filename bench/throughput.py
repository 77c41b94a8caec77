"""No-op tasks per second: vanilla Celery (same ack settings) vs the taskherd profile, both brokers.

    .venv/bin/python bench/throughput.py [--tasks 5000] [--rounds 3] [--brokers redis,rabbitmq]

Each round, for each variant: publish N tasks to a fresh queue with no worker running, start a
real `celery worker` (prefork, concurrency 2), and time the queue draining from the first message
taken to the last (worker boot is excluded). Variants alternate within a round so that machine
noise hits both alike; the figure reported is the median over rounds, with the ratio.
Needs the services (`bash scripts/services.sh up`; `source scripts/services.sh env`). Uses a leased
Redis database and a fresh RabbitMQ vhost, as the tests do.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import time
import uuid
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from celery import Celery  # noqa: E402

from support import services  # noqa: E402

VARIANTS = ("vanilla", "taskherd")


def producer(variant: str, broker_url: str, queue: str) -> Celery:
    app = Celery(broker=broker_url, set_as_current=False)
    app.conf.task_default_queue = queue
    if variant in ("taskherd", "profile"):  # same queue declarations (dead-letter arguments) as its workers
        from taskherd.worker import configure
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            configure(app, queues=[queue])
    return app


def depth_reader(broker_url: str, queue: str):
    """A function returning the number of ready messages in `queue`."""
    if broker_url.startswith("redis"):
        import redis
        client = redis.Redis.from_url(broker_url)
        return lambda: client.llen(queue)
    from kombu import Connection
    connection = Connection(broker_url)
    channel = connection.channel()
    return lambda: channel.queue_declare(queue, passive=True).message_count


def one_run(variant: str, broker_url: str, redis_url: str, tasks: int, log_dir: Path) -> float:
    queue = f"bench-{variant}-{uuid.uuid4().hex[:6]}"
    app = producer(variant, broker_url, queue)
    with app.producer_or_acquire() as prod:
        for _ in range(tasks):
            app.send_task("bench.noop", queue=queue, producer=prod)
    depth = depth_reader(broker_url, queue)
    deadline = time.monotonic() + 30
    while depth() != tasks:  # AMQP publishes are asynchronous: wait until the broker has them all
        assert time.monotonic() < deadline, f"published {tasks}, queue holds {depth()}"
        time.sleep(0.05)

    env = {**os.environ, "BENCH_VARIANT": variant, "BENCH_QUEUE": queue, "BENCH_BROKER_URL": broker_url,
           "BENCH_REDIS_URL": redis_url,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "bench"), os.environ.get("PYTHONPATH")]))}
    log = open(log_dir / f"{queue}.log", "wb")
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "throughput_app", "worker", "--pool", "prefork", "--concurrency", "2",
         "--loglevel", "WARNING", "--without-mingle", "--without-gossip", "--without-heartbeat", "--queues", queue],
        env=env, cwd=ROOT / "bench", stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while (remaining := depth()) >= tasks:
            assert worker.poll() is None and time.monotonic() < deadline, f"worker did not start: see {log.name}"
            time.sleep(0.005)
        started, at_start = time.monotonic(), remaining
        while (remaining := depth()) > 0:
            assert worker.poll() is None and time.monotonic() < deadline + 600, f"worker died: see {log.name}"
            time.sleep(0.005)
        elapsed = time.monotonic() - started
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(worker.pid, signal.SIGTERM)
        worker.wait(60)
        log.close()
        app.close()
    return at_start / elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--brokers", default="redis,rabbitmq")
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help="also: profile (configure() alone), idempotency (the guard alone)")
    args = parser.parse_args()
    log_dir = Path(os.environ.get("TMPDIR", "/tmp")) / f"taskherd-bench-{uuid.uuid4().hex[:6]}"
    log_dir.mkdir()

    rates: dict[tuple[str, str], list[float]] = {}
    with services.leased_redis_db(os.environ["TASKHERD_REDIS_URL"]) as redis_url:
        for broker in args.brokers.split(","):
            with contextlib.ExitStack() as stack:
                if broker == "redis":
                    broker_url = redis_url
                else:
                    broker_url = stack.enter_context(services.fresh_vhost(
                        os.environ["TASKHERD_AMQP_URL"], os.environ["TASKHERD_RABBITMQ_API_URL"]))
                for round_ in range(args.rounds):
                    variants = args.variants.split(",")
                    order = variants if round_ % 2 == 0 else variants[::-1]
                    for variant in order:
                        rate = one_run(variant, broker_url, redis_url, args.tasks, log_dir)
                        rates.setdefault((broker, variant), []).append(rate)
                        print(f"  {broker:<8} {variant:<8} round {round_ + 1}: {rate:7.1f} tasks/s", flush=True)

    variants = args.variants.split(",")
    print(f"\nno-op tasks/s, {args.tasks} tasks, prefork c=2, median of {args.rounds} rounds "
          f"(ratio = variant / vanilla)")
    print(f"{'broker':<9}" + "".join(f"{v:>12}" for v in variants) + "".join(f"{'ratio ' + v:>20}" for v in variants[1:]))
    for broker in args.brokers.split(","):
        medians = {v: statistics.median(rates[(broker, v)]) for v in variants}
        base = medians.get("vanilla") or medians[variants[0]]
        print(f"{broker:<9}" + "".join(f"{medians[v]:>12.1f}" for v in variants)
              + "".join(f"{medians[v] / base:>20.3f}" for v in variants[1:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
