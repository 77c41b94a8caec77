"""`make test`'s pytest: the cluster tests and the others side by side, as two pytest processes.

Why: the suite is ~40 min in one process, about half of it cluster tests spent waiting on pods,
the other half tests of real workers on the loopback services. The cluster tests cannot run beside
each other (a chaos fault restarts the kubelet or a broker the whole cluster shares), but nothing
of the other half touches the cluster, and the shared services are never stopped by a test (a test
that needs that runs a private redis-server; Redis databases are leased through Redis, RabbitMQ
vhosts and PostgreSQL databases are each test's own). So the two halves run at once.

The cluster half prints as it runs; the other half's output is written to a log and printed whole
when it ends (interleaved progress would be unreadable). The exit status is pytest's: a failure in
either half fails the run; "no tests collected" (5) counts only when neither half ran a test (a
PYTEST_ARGS naming one file leaves the other half empty). TASKHERD_TEST_JOBS=1 runs one process.

Usage: python scripts/run_tests.py [pytest arguments…]
"""
from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

NO_TESTS_COLLECTED = 5


def marker_expression(args: list[str]) -> tuple[str | None, list[str]]:
    """The -m expression of `args` (pytest keeps the last one given) and the arguments without it."""
    expression, rest, items = None, [], iter(args)
    for arg in items:
        if arg == "-m":
            expression = next(items, "")
        elif arg.startswith("-m") and not arg.startswith("--"):
            expression = arg[2:].lstrip("=")
        else:
            rest.append(arg)
    return expression, rest


def halves(args: list[str]) -> tuple[list[str], list[str]]:
    """The arguments of the cluster half and of the other half."""
    expression, rest = marker_expression(args)
    within = f"({expression}) and " if expression else ""
    return [*rest, "-m", f"{within}cluster"], [*rest, "-m", f"{within}not cluster"]


def combined_status(cluster: int, others: int) -> int:
    if cluster == others == NO_TESTS_COLLECTED:
        return NO_TESTS_COLLECTED
    failed = [code for code in (cluster, others) if code not in (0, NO_TESTS_COLLECTED)]
    return failed[0] if failed else 0


def main(args: list[str]) -> int:
    pytest = [sys.executable, "-m", "pytest"]
    if os.environ.get("TASKHERD_TEST_JOBS", "2") == "1":
        return subprocess.call([*pytest, *args])
    cluster_args, other_args = halves(args)
    log_dir = Path(os.environ.get("TASKHERD_HOME", Path.home() / ".cache/taskherd")) / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / "tests-without-cluster.log"
    print(f"make test: the tests without the cluster run beside the cluster tests (TASKHERD_TEST_JOBS=1: "
          f"one after the other); their output follows the cluster tests' and is in {log_path}", flush=True)
    started = time.monotonic()
    with open(log_path, "w") as log:
        # each half in its own process group: an interrupted run stops both, and all they started
        others = subprocess.Popen([*pytest, *other_args], stdout=log, stderr=subprocess.STDOUT,
                                  start_new_session=True)
        cluster = subprocess.Popen([*pytest, *cluster_args], start_new_session=True)
        try:
            cluster_status = cluster.wait()
            cluster_minutes = (time.monotonic() - started) / 60
            if others.poll() is None:
                print(f"\nmake test: the cluster tests ended after {cluster_minutes:.1f} min; waiting for the "
                      f"tests without the cluster ({shlex.join(other_args[-2:])})", flush=True)
            other_status = others.wait()
        except KeyboardInterrupt:
            for process in (cluster, others):
                if process.poll() is None:
                    os.killpg(process.pid, signal.SIGINT)
            for process in (cluster, others):
                process.wait()
            raise
    print(f"\n{'=' * 30} the tests without the cluster ({(time.monotonic() - started) / 60:.1f} min) "
          f"{'=' * 30}", flush=True)
    sys.stdout.write(log_path.read_text(errors="replace"))
    status = combined_status(cluster_status, other_status)
    print(f"make test: cluster tests exit {cluster_status}, tests without the cluster exit {other_status}: "
          f"{'passed' if status == 0 else f'exit {status}'}", flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
