"""No-op tasks per second: vanilla Celery (same ack settings) vs the taskherd profile, both brokers.

    .venv/bin/python bench/throughput.py [--tasks 5000] [--rounds 3] [--brokers redis,rabbitmq]

Each round, for each variant: publish N tasks to a fresh queue with no worker running, start a
real `celery worker` (prefork, concurrency 2), and time the queue draining from the first message
taken to the last (worker boot is excluded). Variants alternate within a round so that machine
noise hits both alike; the figure reported is the median over rounds, with its overhead against
vanilla. `profile-X-Y` variants leave components out of configure() (what each one costs).
`profile` is what every task pays (configure() alone); `taskherd` adds the Redis idempotency guard,
which a task opts into, and is also compared with `handrolled`: vanilla plus the idempotency key a
user writes by hand (the same two Redis round trips), the like-for-like baseline of a guarded task.
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
from typing import Any

from celery import Celery

from repo_paths import ROOT  # first: the shared helpers below live in the repository
from e2e.lib import services
from e2e.lib.waiting import wait_for
from support.worker_process import python_env

VARIANTS = ("vanilla", "profile", "handrolled", "taskherd")
#: (variant, its like-for-like baseline) reported besides the overhead against vanilla
LIKE_FOR_LIKE = (("taskherd", "handrolled"),)


def producer(variant: str, broker_url: str, queue: str) -> Celery:
    app = Celery(broker=broker_url, set_as_current=False)
    app.conf.task_default_queue = queue
    if variant.split("-")[0] in ("taskherd", "profile"):  # same queue declarations (dead-letter arguments) as its workers
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


def filled_queue(variant: str, broker_url: str, tasks: int, prefix: str = "bench") -> tuple[str, Celery, Any]:
    """(a fresh queue holding `tasks` no-op task messages, the producer app that sent them (close it),
    a function returning the queue's ready messages), once the broker has them all."""
    queue = f"{prefix}-{variant}-{uuid.uuid4().hex[:6]}"
    app = producer(variant, broker_url, queue)
    with app.producer_or_acquire() as prod:
        for _ in range(tasks):
            app.send_task("bench.noop", queue=queue, producer=prod)
    depth = depth_reader(broker_url, queue)
    # AMQP publishes are asynchronous: wait until the broker has them all
    wait_for(f"the {tasks} published messages in {queue}", depth, 60, 0.05, equals=tasks)
    return queue, app, depth


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) of a worker: its main process, its live pool children, and the
    children it has already reaped (max_tasks_per_child replaces them)."""
    def stat(p: int, with_reaped: bool) -> float:
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            return 0.0
        ticks = int(fields[11]) + int(fields[12]) + (int(fields[13]) + int(fields[14]) if with_reaped else 0)
        return ticks / os.sysconf("SC_CLK_TCK")

    children = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(FileNotFoundError):
            children += [int(c) for c in (task / "children").read_text().split()]
    return stat(pid, True) + sum(stat(c, False) for c in children)


def rss_mb(pid: int) -> float:
    """Resident memory of one process (VmRSS), MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def one_run(variant: str, broker_url: str, redis_url: str, tasks: int, log_dir: Path,
            profile_to: Path | None = None, task_ms: float = 0,
            profiler: str = "pyinstrument") -> tuple[float, float, float]:
    """(tasks per second, worker CPU microseconds per task, the main process's resident memory
    once the queue is drained in MB) for one worker draining `tasks`."""
    queue, app, depth = filled_queue(variant, broker_url, tasks)

    env = python_env({"BENCH_VARIANT": variant, "BENCH_QUEUE": queue, "BENCH_BROKER_URL": broker_url,
                      "BENCH_REDIS_URL": redis_url, "BENCH_TASK_MS": str(task_ms)}, path=[ROOT / "bench"])
    log = open(log_dir / f"{queue}.log", "wb")
    pool = ["--pool", "prefork", "--concurrency", "2"]
    prefix = [sys.executable, "-m"]
    if profile_to is not None:
        # One process does everything (consumer and task), so one profile shows the whole cost.
        pool = ["--pool", "solo"]
        # pyinstrument samples (little distortion); cProfile (bench/cpu_profile.py) counts every call
        # (exact call counts, inflated times of small functions), on a CPU clock from the worker's
        # readiness on: the load of a shared machine does not enter, nor does the boot.
        if profiler == "pyinstrument":
            prefix += ["pyinstrument", "-r", "pstats", "-o", str(profile_to), "-m"]
        else:
            prefix = [sys.executable, str(ROOT / "bench" / "cpu_profile.py"), str(profile_to), "-m"]
    worker = subprocess.Popen(
        [*prefix, "celery", "-A", "throughput_app", "worker", *pool,
         "--loglevel", "WARNING", "--without-mingle", "--without-gossip", "--without-heartbeat", "--queues", queue],
        env=env, cwd=ROOT / "bench", stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    def depth_while_alive() -> int:
        assert worker.poll() is None, f"the worker exited ({worker.returncode}): see {log.name}"
        return depth()

    try:
        # Polled every 5 ms: the clock starts when the worker takes its first message.
        at_start = wait_for("the worker to take its first message (messages left)", depth_while_alive, 120, 0.005,
                            until=lambda remaining: remaining < tasks)
        started, cpu_at_start = time.monotonic(), cpu_seconds(worker.pid)
        wait_for("the queue drained (messages left)", depth_while_alive, 600, 0.005, equals=0)
        elapsed = time.monotonic() - started
        cpu = cpu_seconds(worker.pid) - cpu_at_start
        memory = rss_mb(worker.pid)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(worker.pid, signal.SIGTERM)
        worker.wait(60)
        log.close()
        app.close()
    return at_start / elapsed, cpu * 1e6 / at_start, memory


#: Functions whose cumulative time --profile reports, per task.
PROFILED = [
    ("celery", "trace.py", "trace_task"),
    ("taskherd", "task.py", "__call__"),
    ("taskherd", "deliveries.py", "record_delivery"),
    ("taskherd", "deliveries.py", "forget"),
    ("taskherd", "decorator.py", "guarded"),
    ("taskherd", "redis_store.py", "guard"),
    ("taskherd", "redis_store.py", "_finish"),
    ("taskherd", "renewer.py", "add"),
    ("redis", "client.py", "execute_command"),
    ("redis", "commands/core.py", "__call__"),
    ("kombu", "redis.py", "_brpop_read"),
    ("kombu", "messaging.py", "_receive_callback"),
    ("amqp", "channel.py", "_on_basic_deliver"),
    ("celery", "request.py", "execute_using_pool"),
    ("celery", "consumer.py", "on_task_received"),
]


def report_profile(path: Path, tasks: int) -> None:
    import pstats

    stats = pstats.Stats(str(path)).stats  # (file, line, name) -> (cc, nc, tt, ct, callers)
    total = max(ct for (_, _, _, ct, _) in stats.values())
    print(f"    {path.name}: {total:.2f} s sampled in the worker process")
    for package, file_suffix, name in PROFILED:
        cumulative = sum(ct for (file, _, fn), (_, _, _, ct, _) in stats.items()
                         if fn == name and file.endswith(file_suffix) and f"/{package}/" in file)
        if cumulative:
            print(f"    {package + '/' + file_suffix + ':' + name:<45} {cumulative * 1e6 / tasks:8.0f} us/task")


def per_round_overhead(figures: list[float], base: list[float], lower_is_better: bool) -> str:
    """The overhead against the baseline round by round (each round's variants ran back to back, so
    they shared the machine's load): "median (lowest..highest)". The machine's noise moves whole
    rounds; the ratio within a round moves much less than either median."""
    overheads = sorted((f / b - 1 if lower_is_better else 1 - f / b) * 100 for f, b in zip(figures, base))
    return f"{statistics.median(overheads):.1f}% ({overheads[0]:.0f}..{overheads[-1]:.0f})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--brokers", default="redis,rabbitmq")
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help="vanilla, profile (configure() alone), handrolled (vanilla plus a hand-written "
                             "idempotency key), taskherd (profile plus the guard); also: idempotency (the guard "
                             "alone), profile-X-Y or taskherd-X (without the components of class X and Y, e.g. "
                             "profile-Metrics)")
    parser.add_argument("--task-ms", type=float, default=0,
                        help="each task sleeps this long (default 0: no-op); shows the overhead on real work")
    parser.add_argument("--profile", action="store_true",
                        help="instead: one solo-pool worker per variant under a profiler, reporting where the "
                             "time per task goes")
    parser.add_argument("--profiler", choices=("pyinstrument", "cprofile"), default="pyinstrument",
                        help="with --profile: pyinstrument (sampling; pip install pyinstrument) or cProfile")
    args = parser.parse_args()
    log_dir = Path(os.environ.get("TMPDIR", "/tmp")) / f"taskherd-bench-{uuid.uuid4().hex[:6]}"
    log_dir.mkdir()

    rates: dict[tuple[str, str], list[float]] = {}
    cpus: dict[tuple[str, str], list[float]] = {}
    memories: dict[tuple[str, str], list[float]] = {}
    with services.leased_redis_db(os.environ["TASKHERD_REDIS_URL"]) as redis_url:
        for broker in args.brokers.split(","):
            with contextlib.ExitStack() as stack:
                if broker == "redis":
                    broker_url = redis_url
                else:
                    broker_url = stack.enter_context(services.fresh_vhost(
                        os.environ["TASKHERD_AMQP_URL"], os.environ["TASKHERD_RABBITMQ_API_URL"]))
                if args.profile:
                    for variant in args.variants.split(","):
                        path = log_dir / f"{broker}-{variant}.pstats"
                        rate, *_ = one_run(variant, broker_url, redis_url, args.tasks, log_dir, profile_to=path,
                                          profiler=args.profiler)
                        print(f"  {broker:<8} {variant:<15} solo, profiled: {rate:7.1f} tasks/s")
                        report_profile(path, args.tasks)
                    continue
                for round_ in range(args.rounds):
                    variants = args.variants.split(",")
                    order = variants if round_ % 2 == 0 else variants[::-1]
                    for variant in order:
                        rate, cpu, memory = one_run(variant, broker_url, redis_url, args.tasks, log_dir,
                                                    task_ms=args.task_ms)
                        rates.setdefault((broker, variant), []).append(rate)
                        cpus.setdefault((broker, variant), []).append(cpu)
                        memories.setdefault((broker, variant), []).append(memory)
                        print(f"  {broker:<8} {variant:<15} round {round_ + 1}: {rate:7.1f} tasks/s "
                              f"{cpu:6.0f} us CPU/task {memory:6.1f} MB main process", flush=True)

    if args.profile:
        return 0
    variants = args.variants.split(",")
    base = "vanilla" if "vanilla" in variants else variants[0]
    for title, figures, fmt, lower_is_better in (
            ("tasks/s", rates, "{:>12.1f}", False), ("worker CPU us/task (noise-robust)", cpus, "{:>12.0f}", True),
            ("main process resident memory after the drain, MB", memories, "{:>12.1f}", True)):
        kind = f"{args.task_ms:g} ms" if args.task_ms else "no-op"
        print(f"\n{kind} {title}, {args.tasks} tasks, prefork c=2, median of {args.rounds} rounds; "
              f"overhead vs {base}")
        pairs = [(v, like) for v, like in LIKE_FOR_LIKE
                 if v in variants and like in variants and base not in (v, like)]
        width = max(len(label) for label in variants + [f"{v} vs {like}" for v, like in pairs]) + 2
        print(f"{'variant':<{width}}" + "".join(f"{broker:>12}{'overhead':>10}{'per round':>22}"
                                                 for broker in args.brokers.split(",")))
        for v in variants:
            row = f"{v:<{width}}"
            for broker in args.brokers.split(","):
                median, base_median = statistics.median(figures[(broker, v)]), statistics.median(figures[(broker, base)])
                overhead = median / base_median - 1 if lower_is_better else 1 - median / base_median
                row += fmt.format(median) + (f"{overhead * 100:>9.1f}%" if v != base else f"{'':>10}")
                row += f"{per_round_overhead(figures[(broker, v)], figures[(broker, base)], lower_is_better):>22}" \
                    if v != base else f"{'':>22}"
            print(row)
        for v, like in pairs:  # the per-round overhead against its like-for-like baseline
            row = f"{v + ' vs ' + like:<{width}}"
            for broker in args.brokers.split(","):
                against = per_round_overhead(figures[(broker, v)], figures[(broker, like)], lower_is_better)
                row += f"{'':>22}{against:>22}"
            print(row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
