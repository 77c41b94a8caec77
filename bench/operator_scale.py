"""CPU per poll and decision latency of the operator with 200 and 1,000 WorkerPools.

Runs the operator's real poll loop (`taskherd.operator.poll.poll_once`: Secret -> REAL queue
inspection on the host Redis -> decision -> worker readings -> deletion costs -> paging -> status)
for 200 pools, 16 at a time as the scheduler does; the pools polled together share their broker's
inspection, as in the operator (inspection_batch.py). The Kubernetes API is an in-memory stand-in
(the API server's own cost is not the operator's); Redis is real (a leased database, 200 queues +
200 DLQs with 0-50 messages each, and 0-12 tasks running per pool: kombu's unacknowledged
deliveries, which every inspection accounts for); each pool has 0-6 worker pods whose /metrics the operator reads
over HTTP when it would (busyness and throughput, taskherd.operator.throughput.reading_due; pool-
child deaths every 30 s) from a server on loopback, in a process of its own, serving what a
worker with five task names serves, through the worker's own HTTP server and registry (so a
reading asks for its few series, as the operator does). The rounds follow a clock that advances one interval per
round, so those cadences happen as they would. Prints, side by side:
- CPU per poll (process time, includes the inspection threads) and wall latency per poll;
- latency of the decision function alone;
- the projected share of one core at the default 5 s interval (target: 1,000 pools <= 10 %), with
  the early notice's count between polls (every pool's ready messages each second, through the
  scheduler's own code: operator/early_notice.py) and the refresh of the broker's unacknowledged
  deliveries (once a second: taskherd.queues.redis_unacked) on top;
- the baseline: CPU of one `celery inspect ping` (asking the workers instead of the broker, what
  a naive autoscaler does per pool), measured here in the same run.

    source scripts/services.sh env && .venv/bin/python bench/operator_scale.py [--pools 200,1000] [--rounds 6]
        [--broker redis|rabbitmq]

With `--broker rabbitmq` the pools' queues live in a fresh vhost of the services' RabbitMQ, read
through its management API (one listing of the vhost a second, each queue's own document only
when its age needs the publish history), with no task running; the early notice counts them over
AMQP (pipelined passive declares). On both brokers the messages are stamped 10 s old and are
12-23 s old at the first round (printed): under the pools' 30 s age limit, as most of a fleet's
pools are.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

import redis
from prometheus_client import CollectorRegistry

import repo_paths  # noqa: F401 - first: the shared helpers below live in the repository
from e2e.lib.services import fresh_vhost, leased_redis_db
from e2e.lib.services import free_port
from e2e.lib.waiting import wait_for
from taskherd.operator.broker import LISTING_MAX_AGE_SECONDS, UNACKED_MAX_AGE_SECONDS, BrokerObserver
from taskherd.operator.busyness import READING_SAMPLES, MetricsBusynessReader, WorkerMetrics
from taskherd.operator.child_deaths import DEATH_SAMPLES, MetricsChildDeathReader
from taskherd.operator.early_notice import PROBE_SECONDS
from taskherd.operator.kube import Scale
from taskherd.operator.metrics import OperatorMetrics
from taskherd.operator.plan import PoolMemory
from taskherd.operator.policy import parse_spec
from taskherd.operator.poll import Deps, poll_once
from taskherd.operator.scaling import Observation, desired_replicas
from taskherd.operator.scheduler import PoolScheduler


class MemoryKube:
    """The API as dicts: every call the poll makes, answered from memory."""

    def __init__(self, url: str, pools: int, management_url: str | None = None):
        self.url, self.management_url = url, management_url
        self.replicas = {f"workers-{i}": random.randint(0, 6) for i in range(pools)}
        self.calls = 0

    async def read_secret(self, namespace, name):
        self.calls += 1
        return {"url": self.url, "management": self.management_url or ""}

    async def get_scale(self, namespace, target):
        self.calls += 1
        return Scale(self.replicas[target.name], self.replicas[target.name], f"app={target.name}")

    async def set_scale(self, namespace, target, replicas):
        self.calls += 1
        self.replicas[target.name] = replicas

    async def list_pods(self, namespace, selector):
        self.calls += 1
        name = selector.split("=", 1)[1]
        return [{"metadata": {"name": f"{name}-{k}"}, "status": {"phase": "Running", "podIP": "127.0.0.1",
                 "containerStatuses": [{"name": "worker", "restartCount": 0}]}} for k in range(self.replicas[name])]

    async def list_pod_events(self, namespace):
        self.calls += 1
        return []

    async def annotate_pod(self, namespace, name, key, value):
        self.calls += 1

    async def patch_pool_status(self, namespace, name, status):
        self.calls += 1

    async def post_event(self, namespace, pool, *, type, reason, message):
        self.calls += 1


#: the pools' messages are this old when published: under their 30 s age limit (bodies()) at the
#: first round, as a fleet's pools mostly are; fill() and fill_rabbitmq() return when they stamped them
STAMPED_AGE_SECONDS = 10


def fill(url: str, pools: int) -> float:
    client = redis.Redis.from_url(url)
    now = time.time()
    running = random.Random(7)  # its own draws: the pools' pods and messages stay as they were
    for i in range(pools):
        for queue, n in ((f"q{i}", random.randint(0, 50)), (f"q{i}.dlq", random.choice([0, 0, 0, 2]))):
            if n:
                client.lpush(queue, *[json.dumps({"body": "", "headers": {"taskherd_published_at": now - STAMPED_AGE_SECONDS}})
                                      for _ in range(n)])
        deliver(client, f"q{i}", running.randint(0, 12))
    return now


def fill_rabbitmq(amqp_url: str, management_url: str, pools: int) -> float:
    """The same queues and DLQs on RabbitMQ, their messages stamped as taskherd publishes them
    (the AMQP timestamp: the management API's head_message_timestamp). The queues are declared
    first and listed by the management API (5-20 s for 2,000), then the messages published and
    reported (its statistics come every 5 s), so that they are about as old at the first round
    as the Redis scenario's."""
    from kombu import Connection
    import httpx
    vhost = amqp_url.rsplit("/", 1)[1]

    def listed(column: str) -> int:
        queues = httpx.get(f"{management_url}/api/queues/{vhost}", params={"columns": f"name,{column}"}).json()
        return sum(q.get(column, 0) for q in queues) if column != "name" else len(queues)
    sizes = [(f"q{i}", random.randint(0, 50), random.choice([0, 0, 0, 2])) for i in range(pools)]
    with Connection(amqp_url) as connection:
        channel = connection.channel()
        for queue, _, _ in sizes:
            for name in (queue, queue + ".dlq"):
                channel.queue_declare(name, durable=True, auto_delete=False)
        wait_for(f"the management API to list the {2 * pools} queues", lambda: listed("name"), 120, 1,
                 equals=2 * pools)
        producer = connection.Producer(channel)
        now = time.time()
        for queue, ready, dead in sizes:
            for name, n in ((queue, ready), (queue + ".dlq", dead)):
                for _ in range(n):
                    producer.publish({"body": ""}, routing_key=name, timestamp=int(now) - STAMPED_AGE_SECONDS)
    expected = sum(ready + dead for _, ready, dead in sizes)
    wait_for(f"the management API to report the {expected} messages", lambda: listed("messages_ready"), 120, 1,
             equals=expected)
    return now


def deliver(client: redis.Redis, queue: str, n: int) -> list[str]:
    """`n` tasks running from `queue`: unacknowledged deliveries as kombu's Redis transport records
    them (0-12 a pool: 0-6 pods of two pool processes), which every inspection reads."""
    tags = [uuid.uuid4().hex for _ in range(n)]
    with client.pipeline(transaction=False) as pipe:
        for tag in tags:
            payload = json.dumps({"body": "W1tdLCB7fSwgbnVsbF0=", "content-encoding": "utf-8",
                                  "content-type": "application/json",
                                  "headers": {"lang": "py", "task": "orders.charge", "id": tag, "retries": 0,
                                              "taskherd_published_at": time.time() - 5},
                                  "properties": {"delivery_tag": tag, "priority": 0, "body_encoding": "base64",
                                                 "delivery_info": {"exchange": "", "routing_key": queue}}})
            pipe.hset("unacked", tag, json.dumps([payload, "", queue]))
            pipe.zadd("unacked_index", {tag: time.time() - 3})
        pipe.execute()
    return tags


def bodies(pools: int, broker: str = "redis") -> list[dict]:
    secret = {"name": "broker"} if broker == "redis" else {"name": "broker", "managementUrlKey": "management"}
    return [{"metadata": {"name": f"pool-{i}", "namespace": "bench", "generation": 1},
             "spec": {"scaleTargetRef": {"name": f"workers-{i}"},
                      "broker": {"type": broker, "secretRef": secret, "queues": [f"q{i}"]},
                      "minReplicas": 0, "maxReplicas": 20, "targetDepthPerWorker": 5,
                      "maxOldestMessageAgeSeconds": 30, "scaleDownStabilizationSeconds": 0}}
            for i in range(pools)]


#: a worker's /metrics, as five task names make it: served to the operator's readers
WORKER_METRICS_SERVER = r"""
import sys, threading
from prometheus_client import make_wsgi_app
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from taskherd import compat
from taskherd.build_info import build_info
from taskherd.worker.components.metrics import TaskMetrics
from taskherd.worker.components.probes import serve
registry = compat.filterable_registry()  # as the worker's (components/metrics.py)
metrics = TaskMetrics(registry=registry)
for task in ("orders.charge", "orders.ship", "mail.send", "reports.build", "cache.warm"):
    for outcome in ("succeeded", "failed", "retried"):
        metrics.tasks.labels(task, outcome).inc(3)
    metrics.runtime.labels(task).observe(0.4)
    metrics.queue_wait.labels(task).observe(1.5)
    metrics.in_flight.labels(task).set(0)
    metrics.deliveries.labels(task).inc(9)
class Worker(Collector):  # what the worker's WorkerCollector adds
    def collect(self):
        yield GaugeMetricFamily("taskherd_worker_slots", "slots", value=2)
        yield build_info()
registry.register(Worker())
serve(make_wsgi_app(registry), port=int(sys.argv[1]), address="127.0.0.1")  # the worker's own server
threading.Event().wait()
"""


class CountingReader(MetricsBusynessReader):
    """The operator's busyness reader, counting the pods it reads."""

    reads = 0

    async def __call__(self, pod):
        CountingReader.reads += 1
        return await super().__call__(pod)


class Clock:
    def __init__(self) -> None:
        self.t = time.time()

    def __call__(self) -> float:
        return self.t


async def run_rounds(url: str, pools: int, rounds: int, interval: float, metrics_port: int,
                     broker: str = "redis", management_url: str | None = None) -> tuple:
    kube = MemoryKube(url, pools, management_url)
    clock = Clock()
    # shared, as in the operator (handlers.py), and on the rounds' clock: one request per pod and poll
    worker_metrics = WorkerMetrics(port=metrics_port, names=READING_SAMPLES + DEATH_SAMPLES, clock=clock)
    observer = BrokerObserver(kube=kube, clock=clock)  # its unacknowledged deliveries: a read per round
    deps = Deps(kube=kube, observe=observer, busyness=CountingReader(worker_metrics),
                child_deaths=MetricsChildDeathReader(worker_metrics), poster=_no_post,
                metrics=OperatorMetrics(registry=CollectorRegistry()), clock=clock)
    slots = asyncio.Semaphore(16)
    memories = {b["metadata"]["name"]: PoolMemory() for b in bodies(pools, broker)}
    items = bodies(pools, broker)
    latencies: list[float] = []

    async def one(body):
        async with slots:
            started = time.perf_counter()
            result = await poll_once(body, memories[body["metadata"]["name"]], deps)
            memories[body["metadata"]["name"]] = result.memory
            latencies.append(time.perf_counter() - started)

    await asyncio.gather(*(one(b) for b in items))  # warm-up: imports, connections, first reads
    latencies.clear()
    first_round_at = time.time()
    cpu, calls, CountingReader.reads = time.process_time(), kube.calls, 0
    for _ in range(rounds):
        clock.t += interval
        await asyncio.gather(*(one(b) for b in items))
    poll_cpu = time.process_time() - cpu
    return first_round_at, latencies, poll_cpu, kube.calls - calls, CountingReader.reads, await count_cpu(
        kube, deps, observer, items, rounds * round(interval / PROBE_SECONDS)), (
        unacked_cpu(url, observer, pools, clock) if broker == "redis"
        else listing_cpu(url, management_url, observer, clock))


def listing_cpu(url: str, management_url: str, observer: BrokerObserver, clock: Clock) -> float:
    """CPU of one listing of the pools' vhost (the operator's, once a second; read through one
    pool's inspection), median of 10. The rounds above list it once per round (their clock moves
    one interval a round)."""
    from taskherd.queues.rabbitmq import inspect_rabbitmq
    listing = observer._listing(url, management_url)
    samples = []
    for _ in range(10):
        clock.t += 1.0
        started = time.process_time()
        inspect_rabbitmq(url, ["q0"], management_url=management_url, listing=listing)
        samples.append(time.process_time() - started)
    return statistics.median(samples)


def unacked_cpu(url: str, observer: BrokerObserver, pools: int, clock: Clock) -> float:
    """CPU of one refresh of the broker's unacknowledged deliveries (the operator's reader, once a
    second), median of 10, each after 5 % of them were acknowledged and as many new ones made (a
    turnover of 300 tasks a second at 6,000 running). The rounds above refresh once per round
    (their clock moves one interval a round): the operator refreshes every second."""
    client = redis.Redis.from_url(url)
    reader = observer._unacked(url, "")
    samples = []
    for _ in range(10):
        running = client.zrange("unacked_index", 0, -1)
        done = random.sample(running, len(running) // 20)
        with client.pipeline(transaction=False) as pipe:
            for tag in done:
                pipe.hdel("unacked", tag)
                pipe.zrem("unacked_index", tag)
            pipe.execute()
        for index in random.sample(range(pools), len(done)):
            deliver(client, f"q{index}", 1)
        clock.t += 1.0
        started = time.process_time()
        reader.by_queue(observer._redis_client(url), prefix="", queues=["q0"])
        samples.append(time.process_time() - started)
    return statistics.median(samples)


async def count_cpu(kube: MemoryKube, deps: Deps, observer: BrokerObserver, items: list[dict], counts: int) -> float:
    """CPU of one early-notice count over every pool (the scheduler's own code), median of `counts`:
    the worst case, every pool between polls and under maxReplicas."""
    scheduler = PoolScheduler(deps=deps, monotonic=lambda: 0.0, ready_counts=observer.ready_counts)
    for body in items:
        scheduler.upsert(body)
        entry = scheduler.pools[("bench", body["metadata"]["name"])]
        entry.replicas, entry.next_due = kube.replicas[body["spec"]["scaleTargetRef"]["name"]], 1e9
    samples = []
    for _ in range(counts):
        started = time.process_time()
        await scheduler._bring_forward(0.0)
        samples.append(time.process_time() - started)
    brought = sum(1 for entry in scheduler.pools.values() if entry.next_due < 1e9)
    assert brought == 0, f"{brought} pools outgrown after their polls scaled them"
    return statistics.median(samples)


async def _no_post(url, body):
    return None


def decision_latency(pools: int, repeat: int) -> list[float]:
    specs = [parse_spec(b["spec"]).scaling for b in bodies(pools)]
    observations = [Observation(ready=random.randint(0, 50), unacked=random.randint(0, 5),
                                oldest_message_age_seconds=random.uniform(0, 60)) for _ in specs]
    samples = []
    for _ in range(repeat):
        for policy, observation in zip(specs, observations):
            started = time.perf_counter()
            desired_replicas(policy, observation, 3, 1, [], 1000.0)
            samples.append(time.perf_counter() - started)
    return samples


def celery_inspect_cpu(url: str, runs: int = 3) -> float:
    cpus = []
    for _ in range(runs):
        proc = subprocess.Popen([str(Path(sys.executable).parent / "celery"), "-b", url, "inspect", "ping",
                                 "--timeout", "0.5"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _, _, usage = os.wait4(proc.pid, 0)
        cpus.append(usage.ru_utime + usage.ru_stime)
    return statistics.median(cpus)


def _serving(port: int) -> bool:
    import socket
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def pct(samples: list[float], q: int) -> float:
    return statistics.quantiles(samples, n=100)[q - 1]


def measure(base: str, pools: int, rounds: int, interval: float, metrics_port: int,
            broker: str = "redis") -> dict[str, float]:
    random.seed(3)
    if broker == "rabbitmq":
        management_url = os.environ["TASKHERD_RABBITMQ_API_URL"]
        with fresh_vhost(os.environ["TASKHERD_AMQP_URL"], management_url) as url:
            stamped = fill_rabbitmq(url, management_url, pools)
            first_round_at, latencies, cpu, calls, reads, per_count, per_refresh = asyncio.run(
                run_rounds(url, pools, rounds, interval, metrics_port, broker, management_url))
        running = 0
    else:
        with leased_redis_db(base) as url:
            stamped = fill(url, pools)
            first_round_at, latencies, cpu, calls, reads, per_count, per_refresh = asyncio.run(
                run_rounds(url, pools, rounds, interval, metrics_port))
            running = redis.Redis.from_url(url).zcard("unacked_index")
    polls = pools * rounds
    per_poll = cpu / polls
    decisions = decision_latency(pools, 50)
    return {"per_poll": per_poll, "latency_median": statistics.median(latencies), "latency_p99": pct(latencies, 99),
            "decision_median": statistics.median(decisions), "decision_p99": pct(decisions, 99),
            "share": per_poll * pools / interval, "calls": calls / polls, "reads": reads / polls,
            "per_count": per_count, "count_share": per_count / PROBE_SECONDS,
            "running": running, "per_refresh": per_refresh,
            "age": first_round_at - stamped + STAMPED_AGE_SECONDS,
            "refresh_share": per_refresh / (UNACKED_MAX_AGE_SECONDS if broker == "redis" else LISTING_MAX_AGE_SECONDS)}


def total(result: dict[str, float]) -> float:
    """The operator's share of a core: polls, early-notice counts and the once-a-second refreshes
    (Redis: the unacknowledged deliveries; RabbitMQ: the vhost's listing), the latter counted in
    full although the polls' rounds already include one per interval."""
    return result["share"] + result["count_share"] + result["refresh_share"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pools", default="200,1000", help="comma-separated numbers of WorkerPools")
    # 6 rounds of 5 s: the 30 s cadence of a steady pool's worker readings falls inside them
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--interval", type=float, default=5.0)
    parser.add_argument("--broker", choices=("redis", "rabbitmq"), default="redis",
                        help="the pools' broker (rabbitmq: a fresh vhost on the services' RabbitMQ, read "
                             "through its management API; no task running)")
    args = parser.parse_args()
    base = os.environ.get("TASKHERD_REDIS_URL")
    if not base:
        print("TASKHERD_REDIS_URL is not set: `source scripts/services.sh env` first", file=sys.stderr)
        return 2
    sizes = [int(p) for p in args.pools.split(",")]
    metrics_port = free_port()
    server = subprocess.Popen([sys.executable, "-c", WORKER_METRICS_SERVER, str(metrics_port)])
    try:
        wait_for("the worker metrics stand-in", lambda: _serving(metrics_port), timeout=30, interval=0.2)
        results = {pools: measure(base, pools, args.rounds, args.interval, metrics_port, args.broker)
                   for pools in sizes}
    finally:
        server.terminate()
        server.wait(10)
    with leased_redis_db(base) as url:
        baseline = celery_inspect_cpu(url)
    print(f"operator poll loop, {args.rounds} rounds per size, real {args.broker} inspection, in-memory API, "
          f"{args.interval:g} s polls")
    print(f"{'figure':<44}" + "".join(f"{str(p) + ' pools':>16}" for p in sizes))
    rows = (("CPU per poll, ms", lambda r: r["per_poll"] * 1000, "{:.2f}"),
            ("poll latency median / p99, ms", lambda r: f"{r['latency_median'] * 1000:.1f} / "
                                                       f"{r['latency_p99'] * 1000:.1f}", "{}"),
            ("desired_replicas median / p99, us", lambda r: f"{r['decision_median'] * 1e6:.1f} / "
                                                           f"{r['decision_p99'] * 1e6:.1f}", "{}"),
            ("share of one core, polls", lambda r: f"{r['share'] * 100:.1f} %", "{}"),
            ("early notice: CPU per count of all pools, ms", lambda r: r["per_count"] * 1000, "{:.2f}"),
            ("share of one core, counts (1 s)", lambda r: f"{r['count_share'] * 100:.1f} %", "{}"),
            ("running tasks (unacknowledged deliveries)", lambda r: r["running"], "{:,}"),
            ("oldest message's age at the first round, s", lambda r: r["age"], "{:.0f}"),
            ("refresh (1 s: unacked / listing), CPU, ms", lambda r: r["per_refresh"] * 1000, "{:.2f}"),
            ("share of one core, refreshes", lambda r: f"{r['refresh_share'] * 100:.1f} %", "{}"),
            ("share of one core, polls + counts + refreshes", lambda r: f"{total(r) * 100:.1f} %", "{}"),
            ("API calls per poll (in-memory)", lambda r: r["calls"], "{:.1f}"),
            ("worker /metrics readings per poll (HTTP)", lambda r: r["reads"], "{:.2f}"))
    for label, value, fmt in rows:
        print(f"{label:<44}" + "".join(f"{fmt.format(value(results[p])):>16}" for p in sizes))
    per_poll = statistics.median(r["per_poll"] for r in results.values())
    print(f"baseline: one `celery inspect ping` (asking the workers, per pool) costs {baseline * 1000:.0f} ms of CPU, "
          f"{baseline / per_poll:,.0f}x a poll")
    if 1000 in results:
        share = total(results[1000])
        print(f"target: 1,000 pools at {args.interval:g} s polls (early notice and refreshes included) <= 10 % of a core: "
              f"{'MET' if share <= 0.10 else 'MISSED'} ({share * 100:.1f} %)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
