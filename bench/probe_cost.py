"""CPU per probe: `celery inspect ping`, the exec probe (`taskherd probe liveness`) and the HTTP probe
(GET /livez on the worker's own server), against the same running worker.

Starts a private redis-server and one prefork worker (tests/apps/runtime_app.py: heartbeat, drain
and metrics, whose server also answers the probes), then runs each probe `--runs` times,
alternating, and reports medians:

- the probe's own process, where there is one (exec probe, `celery inspect ping`): wall time,
  CPU (user + sys from wait4) and peak RSS;
- the worker's side: CPU of the worker's main process during a burst of `--burst` probes of one
  kind (from /proc), minus what the idle worker spends in the same time. `celery inspect ping`
  costs the worker a broker round trip and a reply; the exec probe costs it nothing; the HTTP
  probe is all on the worker's side (the kubelet's Go client makes the request in-process, no
  fork: a few tens of microseconds not measured here).

Each HTTP probe opens a new connection, as the kubelet's prober does (it disables keep-alives).
Target: the HTTP probe at least 100x cheaper in CPU than `celery inspect ping`.

    .venv/bin/python bench/probe_cost.py [--runs 9] [--burst 200]
"""
from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from repo_paths import ROOT  # first: the shared helpers below live in the repository
from e2e.lib.services import free_port
from support.private_redis import PrivateRedis
from support.worker_process import WorkerProcess

BIN = Path(sys.executable).parent


def measure(command: list[str], env: dict[str, str]) -> tuple[float, float, float, int]:
    """(wall seconds, CPU seconds, peak RSS MB, exit code) of one run of `command`."""
    started = time.perf_counter()
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - started
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, os.waitstatus_to_exitcode(status)


def process_cpu(pid: int) -> float:
    """CPU seconds (user + sys) of one process so far, threads included."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def http_get(port: int, path: str) -> int:
    """One probe as the kubelet makes it: a new connection, GET, read the status, close."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: kube-probe/1.34\r\n"
                     f"Connection: close\r\n\r\n".encode())
        reply = b""
        while chunk := sock.recv(4096):
            reply += chunk
    return int(reply.split(b" ", 2)[1])


def worker_cost(pid: int, burst: int, probe) -> float:
    """The worker main process's CPU per probe over `burst` probes, minus its idle CPU meanwhile."""
    idle_started, idle_cpu = time.perf_counter(), process_cpu(pid)
    time.sleep(2.0)
    idle_rate = (process_cpu(pid) - idle_cpu) / (time.perf_counter() - idle_started)
    started, cpu = time.perf_counter(), process_cpu(pid)
    for _ in range(burst):
        probe()
    spent = process_cpu(pid) - cpu - idle_rate * (time.perf_counter() - started)
    return max(spent, 0.0) / burst


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9, help="probe processes per kind (exec, ping)")
    parser.add_argument("--burst", type=int, default=200, help="probes per kind for the worker-side figure")
    args = parser.parse_args()

    # An installed wheel ships compiled bytecode; a checkout run with PYTHONDONTWRITEBYTECODE=1 would
    # recompile taskherd (and the app `celery inspect` imports) on every call. Compile both, once.
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "worker" / "taskherd"),
                    str(ROOT / "tests" / "apps")], check=True)
    workdir = Path(tempfile.mkdtemp(prefix="taskherd-probe-bench-"))
    broker = PrivateRedis(workdir)
    port = free_port()
    hostname = f"bench-{os.getpid()}@localhost"
    worker = WorkerProcess("apps.runtime_app", log_dir=workdir, concurrency=2, hostname=hostname,
                           env={"TEST_BROKER_URL": f"{broker.url}/1", "TEST_LEDGER_URL": f"{broker.url}/2",
                                "TEST_QUEUE": "bench", "TASKHERD_HEARTBEAT_DIR": str(workdir / "heartbeat"),
                                "TEST_METRICS_PORT": str(port)})
    env = worker.env  # the probe and `celery inspect` see the worker's settings (and import its app)
    try:
        broker.start()
        worker.start()
        exec_probe = [str(BIN / "taskherd"), "probe", "liveness"]
        ping = [str(BIN / "celery"), "-A", "apps.runtime_app", "inspect", "ping", "-d", hostname, "--timeout", "5"]
        for name, command in (("exec probe", exec_probe), ("ping", ping)):  # warm the page cache, check both pass
            if measure(command, env)[3] != 0:
                raise SystemExit(f"{name} failed against a healthy worker: {' '.join(command)}")
        if http_get(port, "/livez") != 200:
            raise SystemExit(f"GET /livez on the worker's port {port} did not answer 200")
        floor = [sys.executable, "-c", "pass"]  # what any Python exec probe pays before doing anything
        runs: dict[str, list[tuple[float, float, float, int]]] = {"exec": [], "ping": [], "floor": []}
        for _ in range(args.runs):
            runs["exec"].append(measure(exec_probe, env))
            runs["ping"].append(measure(ping, env))
            runs["floor"].append(measure(floor, env))
        http_walls = []

        def timed_http() -> None:
            started = time.perf_counter()
            assert http_get(port, "/livez") == 200
            http_walls.append(time.perf_counter() - started)

        worker_side = {"http": worker_cost(worker.pid, args.burst, timed_http),
                       "ping": worker_cost(worker.pid, max(5, args.burst // 20), lambda: measure(ping, env)),
                       "exec": worker_cost(worker.pid, max(5, args.burst // 20), lambda: measure(exec_probe, env))}
    finally:
        worker.kill()
        broker.stop()
        shutil.rmtree(workdir, ignore_errors=True)

    def median(kind: str, index: int) -> float:
        return statistics.median(run[index] for run in runs[kind])

    failures = {kind: sum(1 for run in r if run[3] != 0) for kind, r in runs.items()}
    total = {"ping": median("ping", 1) + worker_side["ping"], "exec": median("exec", 1) + worker_side["exec"],
             "http": worker_side["http"]}
    print(f"probe cost, same idle prefork worker (c=2) on a private Redis; process figures: median of {args.runs}, "
          f"worker side: {args.burst} HTTP probes, {max(5, args.burst // 20)} of the others")
    print(f"{'':<30}{'celery inspect ping':>22}{'exec probe':>14}{'HTTP /livez':>14}{'python -c pass':>17}")
    print(f"{'wall time, ms':<30}{median('ping', 0) * 1000:>22.1f}{median('exec', 0) * 1000:>14.1f}"
          f"{statistics.median(http_walls) * 1000:>14.2f}{median('floor', 0) * 1000:>17.1f}")
    print(f"{'probe process CPU, ms':<30}{median('ping', 1) * 1000:>22.1f}{median('exec', 1) * 1000:>14.1f}"
          f"{'none':>14}{median('floor', 1) * 1000:>17.1f}")
    print(f"{'probe process peak RSS, MB':<30}{median('ping', 2):>22.1f}{median('exec', 2):>14.1f}{'none':>14}"
          f"{median('floor', 2):>17.1f}")
    print(f"{'worker CPU per probe, ms':<30}{worker_side['ping'] * 1000:>22.2f}{worker_side['exec'] * 1000:>14.2f}"
          f"{worker_side['http'] * 1000:>14.3f}")
    print(f"{'CPU per probe, total, ms':<30}{total['ping'] * 1000:>22.1f}{total['exec'] * 1000:>14.1f}"
          f"{total['http'] * 1000:>14.3f}")
    print(f"{'vs celery inspect ping':<30}{'1x':>22}{total['ping'] / total['exec']:>13.0f}x"
          f"{total['ping'] / max(total['http'], 1e-9):>13.0f}x")
    print(f"failed runs: ping {failures['ping']}, exec probe {failures['exec']}")
    ratio = total["ping"] / max(total["http"], 1e-9)
    print(f"target: HTTP probe >= 100x less CPU than celery inspect ping: {'MET' if ratio >= 100 else 'MISSED'} "
          f"({ratio:.0f}x; an exec probe in Python is capped near "
          f"{total['ping'] / median('floor', 1):.0f}x by the interpreter's start alone)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
