"""Cost of one liveness check: `taskherd probe liveness` vs `celery inspect ping`, same running worker.

Starts a private redis-server and one prefork worker (tests/apps/runtime_app.py, heartbeat and drain
installed), then runs each command `--runs` times alternately and prints the medians of wall time,
CPU time (user + sys of the child, from wait4) and peak RSS side by side with the ratio.

    .venv/bin/python bench/probe_cost.py [--runs 9]

Target: the probe at least 40x cheaper than `celery inspect ping` in CPU.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from repo_paths import ROOT  # first: the shared helpers below live in the repository
from support.private_redis import PrivateRedis
from support.worker_process import WorkerProcess

BIN = Path(sys.executable).parent


def measure(command: list[str], env: dict[str, str]) -> tuple[float, float, float, int]:
    """(wall seconds, CPU seconds, peak RSS MB, exit code) of one run of `command`."""
    started = time.perf_counter()
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - started
    process.returncode = os.waitstatus_to_exitcode(status)
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, process.returncode


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9)
    args = parser.parse_args()

    # An installed wheel ships compiled bytecode; a checkout run with PYTHONDONTWRITEBYTECODE=1 would
    # recompile taskherd (and the app `celery inspect` imports) on every call. Compile both, once.
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "worker" / "taskherd"),
                    str(ROOT / "tests" / "apps")], check=True)
    workdir = Path(tempfile.mkdtemp(prefix="taskherd-probe-bench-"))
    broker = PrivateRedis(workdir)
    hostname = f"bench-{os.getpid()}@localhost"
    worker = WorkerProcess("apps.runtime_app", log_dir=workdir, concurrency=2, hostname=hostname,
                           env={"TEST_BROKER_URL": f"{broker.url}/1", "TEST_LEDGER_URL": f"{broker.url}/2",
                                "TEST_QUEUE": "bench", "TASKHERD_HEARTBEAT_DIR": str(workdir / "heartbeat")})
    env = worker.env  # the probe and `celery inspect` see the worker's settings (and import its app)
    try:
        broker.start()
        worker.start()
        probe = [str(BIN / "taskherd"), "probe", "liveness"]
        ping = [str(BIN / "celery"), "-A", "apps.runtime_app", "inspect", "ping", "-d", hostname, "--timeout", "5"]
        for name, command in (("probe", probe), ("ping", ping)):  # warm the page cache, check both pass
            _, _, _, code = measure(command, env)
            if code != 0:
                raise SystemExit(f"{name} failed against a healthy worker: {' '.join(command)}")
        floor = [sys.executable, "-c", "pass"]  # what any Python probe pays before doing anything
        results: dict[str, list[tuple[float, float, float, int]]] = {"probe": [], "ping": [], "floor": []}
        for _ in range(args.runs):
            results["probe"].append(measure(probe, env))
            results["ping"].append(measure(ping, env))
            results["floor"].append(measure(floor, env))
    finally:
        worker.kill()
        broker.stop()
        shutil.rmtree(workdir, ignore_errors=True)

    def median(name: str, index: int) -> float:
        return statistics.median(run[index] for run in results[name])

    failures = {name: sum(1 for run in runs if run[3] != 0) for name, runs in results.items()}
    print(f"probe cost, median of {args.runs} runs each, same idle prefork worker (c=2) on a private Redis")
    print(f"{'':<12}{'taskherd probe liveness':>25}{'celery inspect ping':>22}{'ratio':>9}"
          f"{'python -c pass':>18}{'ratio':>8}")
    for label, index, unit, scale in (("wall time", 0, "ms", 1000), ("CPU time", 1, "ms", 1000), ("peak RSS", 2, "MB", 1)):
        ours, theirs, floor_value = median("probe", index), median("ping", index), median("floor", index)
        print(f"{label:<12}{ours * scale:>22.1f} {unit}{theirs * scale:>19.1f} {unit}{theirs / ours:>8.1f}x"
              f"{floor_value * scale:>15.1f} {unit}{theirs / floor_value:>7.1f}x")
    print(f"failed runs: probe {failures['probe']}, ping {failures['ping']}")
    cpu_ratio = median("ping", 1) / median("probe", 1)
    own = median("probe", 1) - median("floor", 1)
    print(f"probe's own CPU above interpreter start: {own * 1000:.1f} ms")
    print(f"target >= 40x cheaper in CPU: {'met' if cpu_ratio >= 40 else 'NOT met'} ({cpu_ratio:.0f}x; "
          f"the interpreter alone allows at most {median('ping', 1) / median('floor', 1):.0f}x here)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
