"""A worker's boot on the host, as the chart's container runs it, phase by phase, in CPU and wall time.

A new pod of a scale-up spends its time booting the worker (docs/benchmarks.md section 5): on a
node whose cores are shared by several booting workers, what decides is the CPU each boot needs, so
CPU seconds are the figure here and wall time is shown beside it (on a busy machine it mostly
measures the load). Each run starts one real worker (prefork, concurrency 2, the host's Redis) of
bench/worker_boot_app.py with the command and the environment the chart renders for a pool
(`helm template`), waits for it to be ready, and stops it. Phases (marks taken inside the worker):

  interpreter, CLI, Celery   exec -> the app module's `from celery import ...` done (each command
                      line imports Celery before it loads the app)
  taskherd import     -> `from taskherd.worker import configure` done
  configure           -> configure(app) done (the app module is loaded)
  worker setup        -> Celery's worker_init (the worker object, its options)
  pool start          -> the pool's children are forked
  broker connect, to ready   -> "ready" (connections, queues declared, mingle, gossip, event loop;
                      one phase: Celery orders a consumer's steps differently from run to run, so
                      a mark "connected" falls before or after mingle's one-second wait)
  pool children       CPU of the pool children until "ready" (their start)

CPU is the main process's user + system time at each mark (all its threads), plus the children's;
wall time runs from the exec. `readyz` is when the worker's readiness endpoint (what the chart's
HTTP probe asks) first answered 200, polled every 20 ms.

Variants, alternated within each round so the machine's noise hits all alike: vanilla Celery (the
same app without configure(), Celery's command line, the chart's options) as the baseline; the
taskherd app through Celery's command line (`celery --app=... worker`, the chart's command until
this variant showed what it cost); the chart's command as it renders now (`taskherd worker ...`);
and that with mingle and gossip (a pool's `mingle: true`, `gossip: true`). Medians over rounds.
`--variants "chart command,chart command without GcFreeze"` measures what a component costs or
saves. (The host's virtualenv has PyYAML, for the tests; the worker image does not: kombu imports
it when present, ~30 ms of CPU the pod does not pay.)

    source scripts/services.sh env && .venv/bin/python bench/worker_boot.py [--rounds 7] [--variants ...]
    .venv/bin/python bench/worker_boot.py --imports [--rounds 7]   # what the worker imports, by CPU

`--imports` runs `python -X importtime` on the worker's imports (the app module and the worker's
modules) and prints the packages and the modules costing most, each the minimum over rounds of its
self time (the minimum is the figure least disturbed by other processes on a busy machine).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml

from repo_paths import ROOT  # first: the shared helpers below live in the repository
from e2e.lib import cluster as clusterlib
from e2e.lib import services

BENCH = ROOT / "bench"
APP = "worker_boot_app"
QUEUE = "boot"
#: phase -> (from mark, to mark); the first phase starts at the exec (wall) or at zero CPU
PHASES = (("interpreter, CLI, Celery", None, "celery_imported"), ("taskherd import", "celery_imported", "taskherd_imported"),
          ("configure", "taskherd_imported", "configured"), ("worker setup", "configured", "worker_init"),
          ("pool start", "worker_init", "pool_started"), ("broker connect, to ready", "pool_started", "ready"))
#: the pool as bench/scaleup.py deploys it (concurrency 2, the limits its tasks need)
POOL = {"name": "boot", "app": APP, "queues": [QUEUE], "concurrency": 2, "logLevel": "INFO",
        "timeLimits": {"softSeconds": 20, "hardSeconds": 30}}
VARIANTS = ("vanilla celery", "celery command line", "chart command", "chart command with mingle and gossip")


def chart_container() -> tuple[list[str], dict[str, str]]:
    """The worker container's command and literal environment as the chart renders them for POOL."""
    values = {"broker": {"type": "redis", "existingSecret": {"name": "broker"}}, "workerPools": [POOL],
              "workerPoolDefaults": {"autoscaling": {"enabled": False}}, "operator": {"enabled": False},
              "exporter": {"enabled": False}}
    args = [clusterlib.helm_path(), "template", "boot", str(ROOT / "charts" / "taskherd"), "--namespace", "bench",
            "--kube-version", clusterlib.versions()["KUBERNETES_VERSION"]]
    for key, value in values.items():
        args += ["--set-json", f"{key}={json.dumps(value)}"]
    rendered = subprocess.run(args, capture_output=True, text=True, timeout=120)
    if rendered.returncode != 0:
        raise SystemExit(f"helm template failed (helm at {args[0]}; `make helm-binary` builds it):\n{rendered.stderr}")
    deployment = next(doc for doc in yaml.safe_load_all(rendered.stdout)
                      if doc and doc["kind"] == "Deployment" and doc["metadata"]["name"].endswith("boot"))
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    env = {item["name"]: item["value"] for item in container.get("env", []) if "value" in item}
    return container["command"], env


def variant_command(variant: str, chart_command: list[str]) -> tuple[list[str], dict[str, str]]:
    """(argv, extra environment) of a variant, run with this checkout's interpreter. A variant may end
    in `without <Component>[+<Component>]`: the same, with those default components left out."""
    if " without " in variant:
        base, left_out = variant.rsplit(" without ", 1)
        argv, extra = variant_command(base, chart_command)
        return argv, {**extra, "WORKER_BOOT_WITHOUT": left_out.replace("+", ",")}
    options = chart_command[chart_command.index("worker") + 1:]
    app = [a for a in options if a.startswith("--app=")]
    celery_options = [a for a in options if not a.startswith("--app=")]
    celery = [sys.executable, "-m", "celery", *app, "worker", *celery_options]
    if variant == "vanilla celery":
        return celery, {"WORKER_BOOT_VANILLA": "1"}
    if variant == "celery command line":
        return celery, {}
    # The chart's command, run by this checkout's interpreter: `taskherd` is taskherd.cli's entry point.
    module = {"taskherd": "taskherd.cli", "celery": "celery"}[chart_command[0]]
    chart = [sys.executable, "-m", module, *chart_command[1:]]
    if variant == "chart command":
        return chart, {}
    if variant == "chart command with mingle and gossip":
        return [a for a in chart if a not in ("--without-mingle", "--without-gossip")], {}
    raise SystemExit(f"--variants: unknown variant {variant!r} (one of {', '.join(VARIANTS)})")


def stop(process: subprocess.Popen) -> None:
    """Warm shutdown, then SIGKILL of the worker's own session (its pool children) if it hangs."""
    with contextlib.suppress(ProcessLookupError):
        process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)


def log_tail(workdir: Path, lines: int = 40) -> str:
    return "\n".join((workdir / "worker.log").read_text(errors="replace").splitlines()[-lines:])


def boot_once(argv: list[str], env: dict[str, str], workdir: Path, timeout: float) -> dict:
    """One worker from exec to ready: its report (bench/worker_boot_app.py) plus the exec time and readyz."""
    report_path = workdir / "report.json"
    report_path.unlink(missing_ok=True)
    port = services.free_port()
    env = {**env, "WORKER_BOOT_REPORT": str(report_path), "TASKHERD_METRICS_PORT": str(port),
           "TASKHERD_HEARTBEAT_DIR": str(workdir / "heartbeat"), "TASKHERD_METRICS_DIR": str(workdir / "prometheus")}
    log = open(workdir / "worker.log", "ab")
    exec_at = time.time()
    process = subprocess.Popen(argv, env=env, cwd=BENCH, stdout=log, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL, start_new_session=True)
    log.close()
    readyz_at = None
    # The readiness endpoint is the Metrics component's server: vanilla Celery has none.
    serves_probes = env.get("WORKER_BOOT_VANILLA") != "1" and "Metrics" not in env.get("WORKER_BOOT_WITHOUT", "").split(",")
    try:
        while not report_path.exists() or (readyz_at is None and serves_probes):
            if process.poll() is not None:
                raise SystemExit(f"the worker exited ({process.returncode}):\n{log_tail(workdir)}")
            if time.time() - exec_at > timeout:
                raise SystemExit(f"the worker was not ready within {timeout:g} s:\n{log_tail(workdir)}")
            if readyz_at is None and serves_probes:
                with contextlib.suppress(OSError):
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as response:
                        if response.status == 200:
                            readyz_at = time.time()
            time.sleep(0.02)
        report = json.loads(report_path.read_text())
    finally:
        stop(process)
    report["exec_at"], report["readyz_at"] = exec_at, readyz_at
    return report


def phases(report: dict) -> dict[str, tuple[float, float]]:
    """phase -> (CPU s, wall s); a phase whose marks a variant does not take (vanilla: taskherd) is 0."""
    marks = report["marks"]
    marks.setdefault("taskherd_imported", marks["celery_imported"])
    result = {}
    for name, start, end in PHASES:
        wall_start, cpu_start = marks[start] if start else (report["exec_at"], 0.0)
        result[name] = (marks[end][1] - cpu_start, marks[end][0] - wall_start)
    result["pool children"] = (report["children_cpu"], float("nan"))
    ready_wall = marks["ready"][0] - report["exec_at"]
    result["total to ready"] = (marks["ready"][1] + report["children_cpu"], ready_wall)
    if report["readyz_at"] is not None:
        result["readyz answers 200"] = (float("nan"), report["readyz_at"] - report["exec_at"])
    return result


def compile_checkout() -> None:
    """Byte-compiles this checkout's worker package and the app, as the image has them (pip compiles
    at install; bench/scaleup.py mounts .pyc files): without it, with PYTHONDONTWRITEBYTECODE set (as
    here and in the pod), every boot would compile them from source, a cost no pod pays."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "worker" / "taskherd"),
                    str(BENCH / f"{APP}.py")], check=True, env={**os.environ, "PYTHONDONTWRITEBYTECODE": ""})


def run_boots(args: argparse.Namespace) -> None:
    compile_checkout()
    chart_command, chart_env = chart_container()
    variants = [v.strip() for v in args.variants.split(",")] if args.variants else list(VARIANTS)
    commands = {v: variant_command(v, chart_command) for v in variants}
    results: dict[str, list[dict]] = {v: [] for v in variants}
    modules: dict[str, dict] = {}
    loads = [os.getloadavg()[0]]
    with services.leased_redis_db(os.environ["TASKHERD_REDIS_URL"]) as broker_url, \
            tempfile.TemporaryDirectory(prefix="worker-boot-") as tmp:
        base_env = {**os.environ, **chart_env, "TASKHERD_BROKER_URL": broker_url, "POD_NAME": "worker-boot",
                    "PYTHONPATH": os.pathsep.join(filter(None, [str(BENCH), os.environ.get("PYTHONPATH")]))}
        for round_ in range(args.rounds):
            for variant in variants:
                argv, extra = commands[variant]
                workdir = Path(tmp) / f"{round_}-{variants.index(variant)}"
                workdir.mkdir()
                report = boot_once(argv, {**base_env, **extra}, workdir, args.timeout)
                results[variant].append(phases(report))
                modules[variant] = {"count": len(report["modules"]), "packages": report["packages"]}
            loads.append(os.getloadavg()[0])
            print(f"round {round_ + 1}/{args.rounds} done, load average {loads[-1]:.1f}", file=sys.stderr)
    print(f"\nWorker boot, exec -> ready: CPU s / wall s, median of {args.rounds} (load average "
          f"{min(loads):.1f}-{max(loads):.1f}, {os.cpu_count()} cores)\n")
    names = [name for name, _, _ in PHASES] + ["pool children", "total to ready", "readyz answers 200"]
    print("| phase | " + " | ".join(variants) + " |")
    print("|---|" + "---|" * len(variants))
    for name in names:
        cells = []
        for variant in variants:
            runs = [run[name] for run in results[variant] if name in run]
            if not runs:
                cells.append("-")
                continue
            cpu = statistics.median(r[0] for r in runs)
            wall = statistics.median(r[1] for r in runs)
            if cpu != cpu:  # NaN: a phase with only one of the two figures
                cells.append(f"{wall:.2f} wall")
            elif wall != wall:
                cells.append(f"{cpu:.2f} CPU")
            else:
                cells.append(f"{cpu:.2f} / {wall:.2f}")
        print(f"| {name} | " + " | ".join(cells) + " |")
    print("| modules loaded | " + " | ".join(str(modules[v]["count"]) for v in variants) + " |")
    if args.packages:
        print("\nModules loaded at ready, by top-level package:")
        for variant in variants:
            top = sorted(modules[variant]["packages"].items(), key=lambda item: -item[1])
            print(f"  {variant}: " + ", ".join(f"{name} {count}" for name, count in top[:args.packages]))


def run_importtime(args: argparse.Namespace) -> None:
    """python -X importtime of the worker's imports, min self time per module over rounds."""
    compile_checkout()
    # The app module, then what the worker's start imports beyond it (its blueprint and pool).
    code = (f"import {APP}; import celery.worker, celery.worker.consumer, celery.concurrency.prefork, "
            "celery.apps.worker, kombu.transport.redis")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(BENCH), os.environ.get("PYTHONPATH")])),
           "TASKHERD_BROKER_URL": os.environ.get("TASKHERD_REDIS_URL", "redis://127.0.0.1:6390/0")}
    self_times: dict[str, list[int]] = {}
    for _ in range(args.rounds):
        done = subprocess.run([sys.executable, "-X", "importtime", "-c", code], env=env, cwd=BENCH,
                              capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise SystemExit(f"importing the worker failed:\n{done.stderr[-3000:]}")
        for line in done.stderr.splitlines():
            if line.startswith("import time:") and "|" in line and "self" not in line:
                self_us, _, name = line[len("import time:"):].split("|")
                self_times.setdefault(name.strip(), []).append(int(self_us))
    best = {name: min(times) for name, times in self_times.items()}
    packages: dict[str, int] = {}
    for name, us in best.items():
        packages[name.split(".", 1)[0]] = packages.get(name.split(".", 1)[0], 0) + us
    print(f"\n{len(best)} modules, {sum(best.values()) / 1e6:.2f} s of imports (sum of min self time over "
          f"{args.rounds} runs, load average {os.getloadavg()[0]:.1f})\n\nby top-level package (ms):")
    for name, us in sorted(packages.items(), key=lambda item: -item[1])[:args.top]:
        print(f"  {us / 1000:8.1f}  {name}")
    print("\nmodules (ms, self):")
    for name, us in sorted(best.items(), key=lambda item: -item[1])[:args.top]:
        print(f"  {us / 1000:8.1f}  {name}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--variants", help=f"comma-separated, of: {', '.join(VARIANTS)}")
    parser.add_argument("--timeout", type=float, default=180, help="seconds a worker may take to be ready")
    parser.add_argument("--packages", type=int, default=0, help="list this many top-level packages loaded at ready")
    parser.add_argument("--imports", action="store_true", help="python -X importtime of the worker's imports instead")
    parser.add_argument("--top", type=int, default=30, help="with --imports: how many packages and modules to list")
    args = parser.parse_args()
    (run_importtime if args.imports else run_boots)(args)


if __name__ == "__main__":
    main()
