"""Instructions per no-op task, counted by cachegrind: vanilla Celery (same ack settings) against the
taskherd profile, the worker's main process and its pool children apart.

    .venv/bin/python bench/instructions.py [--brokers rabbitmq,redis] [--variants vanilla,profile,taskherd]

bench/throughput.py times real workers, and on this machine a round's CPU per task moves by a third
with the hypervisor's steal and the neighbours: an overhead of a few percent is under its noise. An
instruction count does not move (two runs of the same worker agree within 1 %). Each variant's
worker (prefork, concurrency 2, `bench/throughput_app.py` as throughput.py runs it) drains a small
and a large queue under `valgrind --tool=cachegrind --cache-sim=no`; the difference of the two counts
over the difference of the two sizes is what a task costs, its boot left out. Children are not
recycled (`worker_max_tasks_per_child` off; throughput.py prices the recycling) so that each count
covers the same processes. What instructions do not show: system calls and the kernel's work, and
the cost of a miss in the caches — throughput.py's figures have them.
Needs valgrind (`make bench-instructions` installs it) and the services.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

from repo_paths import ROOT  # first: the shared helpers below live in the repository
from e2e.lib import services
from e2e.lib.waiting import wait_for
from support.worker_process import python_env
from throughput import filled_queue

#: Children kept for the whole drain (see the module docstring).
NO_RECYCLING = json.dumps({"worker_max_tasks_per_child": None})


def counted_drain(variant: str, broker_url: str, redis_url: str, tasks: int, out: Path) -> tuple[int, int]:
    """(instructions of the main process, of the pool children) of a worker under cachegrind that
    boots, drains `tasks` no-op tasks and stops."""
    queue, app, depth = filled_queue(variant, broker_url, tasks, prefix="instr")
    env = python_env({"BENCH_VARIANT": variant, "BENCH_QUEUE": queue, "BENCH_BROKER_URL": broker_url,
                      "BENCH_REDIS_URL": redis_url, "BENCH_CONF": NO_RECYCLING}, path=[ROOT / "bench"])
    prefix = out / queue
    with open(f"{prefix}.log", "wb") as log:
        worker = subprocess.Popen(
            ["valgrind", "--tool=cachegrind", "--cache-sim=no", f"--cachegrind-out-file={prefix}.%p",
             sys.executable, "-m", "celery", "-A", "throughput_app", "worker", "--pool", "prefork",
             "--concurrency", "2", "--loglevel", "WARNING", "--without-mingle", "--without-gossip",
             "--without-heartbeat", "--queues", queue],
            env=env, cwd=ROOT / "bench", stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        def depth_while_alive() -> int:
            assert worker.poll() is None, f"the worker exited ({worker.returncode}): see {prefix}.log"
            return depth()

        try:
            wait_for(f"{queue} drained under valgrind (messages left)", depth_while_alive, 600, 0.5, equals=0)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(worker.pid, signal.SIGTERM)
            worker.wait(600)
            app.close()
    counts = {}
    for path in out.glob(f"{queue}.*"):
        if path.suffix != ".log":
            summary = next(line for line in path.read_text().splitlines() if line.startswith("summary:"))
            counts[int(path.suffix[1:])] = int(summary.split()[1])
    main = counts.pop(worker.pid)
    # A child's count starts with its parent's at the fork: the same in both drains, so it cancels.
    return main, sum(counts.values())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--brokers", default="rabbitmq,redis")
    parser.add_argument("--variants", default="vanilla,profile,taskherd",
                        help="as bench/throughput.py's (profile-X-Y leaves components out)")
    parser.add_argument("--small", type=int, default=100, help="tasks of the first drain")
    parser.add_argument("--large", type=int, default=2100, help="tasks of the second drain")
    args = parser.parse_args()
    out = Path(os.environ.get("TMPDIR", "/tmp")) / f"taskherd-instructions-{uuid.uuid4().hex[:6]}"
    out.mkdir()
    variants, brokers = args.variants.split(","), args.brokers.split(",")
    per_task: dict[tuple[str, str], tuple[float, float]] = {}
    with services.leased_redis_db(os.environ["TASKHERD_REDIS_URL"]) as redis_url:
        for broker in brokers:
            with contextlib.ExitStack() as stack:
                broker_url = redis_url if broker == "redis" else stack.enter_context(services.fresh_vhost(
                    os.environ["TASKHERD_AMQP_URL"], os.environ["TASKHERD_RABBITMQ_API_URL"]))
                for variant in variants:
                    (main_small, kids_small), (main_large, kids_large) = (
                        counted_drain(variant, broker_url, redis_url, n, out) for n in (args.small, args.large))
                    tasks = args.large - args.small
                    per_task[(broker, variant)] = ((main_large - main_small) / tasks, (kids_large - kids_small) / tasks)
                    print(f"  {broker:<8} {variant:<15} main {per_task[(broker, variant)][0] / 1e3:7.0f}k  "
                          f"children {per_task[(broker, variant)][1] / 1e3:7.0f}k instructions per task", flush=True)

    base = "vanilla" if "vanilla" in variants else variants[0]
    print(f"\ninstructions per no-op task (thousands), prefork c=2, drains of {args.small} and {args.large}; "
          f"overhead vs {base}")
    width = max(len(v) for v in variants) + 2
    print(f"{'variant':<{width}}" + "".join(f"{broker + ' main':>16}{'children':>10}{'total':>10}{'overhead':>10}"
                                             for broker in brokers))
    for variant in variants:
        row = f"{variant:<{width}}"
        for broker in brokers:
            main_count, kids = per_task[(broker, variant)]
            total, base_total = main_count + kids, sum(per_task[(broker, base)])
            row += f"{main_count / 1e3:>16.0f}{kids / 1e3:>10.0f}{total / 1e3:>10.0f}"
            row += f"{(total / base_total - 1) * 100:>9.1f}%" if variant != base else f"{'':>10}"
        print(row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
