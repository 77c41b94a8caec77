"""Scale-up on the local cluster: from the scale call to new pods Ready and taking tasks, with a breakdown.

The chart (charts/taskherd) is installed in a fresh namespace under the `restricted` Pod Security
Standard with one worker pool of bench/scaleup_app.py (configure(app), concurrency 2), operator and
exporter off: the benchmark itself makes the scale call, through the Deployment's scale subresource
as the operator does (`kubectl scale`). The broker is the host's loopback Redis (a leased
database), which pods reach through a forwarder on the pod bridge. A backlog of short tasks waits
in the queue, so a new pod takes a task as soon as it consumes.

Each round scales 1 -> N (6) and times, per new pod (host clock; the local cluster shares it):

  schedule         scale call -> the pod is bound to a node (ReplicaSet controller + scheduler)
  container start  bound -> the worker process starts (sandbox, volumes, runc)
  imports          process start -> Celery's worker_init (interpreter, Celery, the app, taskherd)
  broker connect   worker_init -> consumer connected (pool forked, broker connection)
  first task       connected -> the pod's first task starts
  Ready            scale call -> the pod's Ready condition (the probes' periods decide the lag)

Pod events come from a `kubectl get pods --watch`, the worker's own timestamps from
bench/scaleup_app.py. Variants differ only in the chart's probe values: the chart's defaults, and
probes every second. Medians over rounds; "all N" is the last of the new pods.

By default the pods run THIS checkout's worker package: its modules are compiled here and mounted
over the image's (a ConfigMap of sourceless .pyc files first on PYTHONPATH), so a change to the
worker's boot is measured without rebuilding the shared image. `--image-code` runs the image's.

The per-pod start times (scale call -> first task) of the chart-default variant are written to
$TASKHERD_HOME/bench/scaleup.json, which bench/autoscaling.py replays.

    source scripts/services.sh env && .venv/bin/python bench/scaleup.py [--rounds 3] [--to 6]
"""
from __future__ import annotations

import argparse
import base64
import contextlib
import datetime as dt
import json
import os
import py_compile
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import redis
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

from e2e.lib import cluster as clusterlib  # noqa: E402
from e2e.lib.forwarder import Forwarder, pod_gateway_address  # noqa: E402
from support.services import leased_redis_db  # noqa: E402

from autoscaling import measured_starts_path  # noqa: E402

CHART = ROOT / "charts" / "taskherd"
APP = ROOT / "bench" / "scaleup_app.py"
POOL, QUEUE = "bench", "scaleup"
#: probe values of each variant (merged over the chart's)
VARIANTS = {
    "chart defaults": {},
    "exec probes every 1 s": {"startup": {"periodSeconds": 1}, "readiness": {"periodSeconds": 1}},
}
PHASES = (("schedule", "scale_call", "bound"), ("container start", "bound", "process_started"),
          ("imports", "process_started", "worker_init"), ("broker connect", "worker_init", "connected"),
          ("first task", "connected", "first_task"))


class PodWatch(threading.Thread):
    """`kubectl get pods --watch`: when each pod was first seen, bound to a node, Ready, deleted."""

    def __init__(self, cluster: clusterlib.Cluster, namespace: str, selector: str):
        super().__init__(daemon=True)
        self.process = subprocess.Popen(
            [cluster.kubectl_bin, "--kubeconfig", cluster.kubeconfig, "-n", namespace, "get", "pods", "-l", selector,
             "--watch", "--output-watch-events", "-o", "json"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=cluster.env())
        self.seen: dict[str, dict[str, float]] = {}
        self.lock = threading.Lock()

    def run(self) -> None:
        pending = ""
        for line in self.process.stdout:  # one compact JSON event per line (pretty ones span lines)
            pending += line
            try:
                event = json.loads(pending)
            except ValueError:
                continue
            now, pending = time.time(), ""
            pod = event.get("object") or {}
            name = pod.get("metadata", {}).get("name")
            if not name:
                continue
            with self.lock:
                times = self.seen.setdefault(name, {"added": now})
                if (pod.get("spec") or {}).get("nodeName"):
                    times.setdefault("bound", now)
                conditions = (pod.get("status") or {}).get("conditions") or []
                if any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions):
                    times.setdefault("ready", now)
                if event.get("type") == "DELETED" or pod["metadata"].get("deletionTimestamp"):
                    times.setdefault("deleted", now)

    def live(self) -> list[str]:
        with self.lock:
            return [name for name, times in self.seen.items() if "deleted" not in times]

    def times(self, name: str) -> dict[str, float]:
        with self.lock:
            return dict(self.seen.get(name, {}))

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)


def code_overlay(namespace: str) -> tuple[str, list[dict]]:
    """A ConfigMap of this checkout's taskherd package as sourceless, unchecked .pyc files: the
    image's Python imports them before its own copy (PYTHONPATH) without recompiling at boot."""
    package = ROOT / "worker" / "taskherd"
    binary, items = {}, []
    with tempfile.TemporaryDirectory() as scratch:
        for index, source in enumerate(sorted(package.rglob("*.py"))):
            relative = source.relative_to(package.parent).with_suffix(".pyc")
            target = Path(scratch) / f"m{index}.pyc"
            py_compile.compile(str(source), cfile=str(target), dfile=str(relative.with_suffix(".py")), doraise=True,
                               invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
            binary[f"m{index}"] = base64.b64encode(target.read_bytes()).decode()
            items.append({"key": f"m{index}", "path": str(relative)})
    manifest = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "taskherd-code", "namespace": namespace},
                "binaryData": binary}
    return yaml.safe_dump(manifest), items


def values(port: int, probes: dict, overlay_items: list | None) -> dict:
    volumes = [{"name": "app", "configMap": {"name": "scaleup-app"}}]
    mounts = [{"name": "app", "mountPath": "/app", "readOnly": True}]
    path = "/app"
    if overlay_items is not None:
        volumes.append({"name": "code", "configMap": {"name": "taskherd-code", "items": overlay_items}})
        mounts.append({"name": "code", "mountPath": "/overlay", "readOnly": True})
        path = "/overlay:/app"
    return {
        "broker": {"existingSecret": {"name": "broker"}, "ports": [port]},
        "operator": {"enabled": False}, "exporter": {"enabled": False},
        "workerPoolDefaults": {"image": {"pullPolicy": "Never"}},
        "workerPools": [{
            "name": POOL, "app": "scaleup_app", "queues": [QUEUE], "concurrency": 2,
            "timeLimits": {"softSeconds": 20, "hardSeconds": 30}, "drainMarginSeconds": 5, "shutdownSeconds": 5,
            "autoscaling": {"enabled": False}, "replicas": 1, "podDisruptionBudget": {"enabled": False},
            "resources": {"requests": {"cpu": "10m", "memory": "96Mi"}, "limits": {"memory": "384Mi"}},
            "probes": probes,
            "env": [{"name": "PYTHONPATH", "value": path}],
            "extraVolumes": volumes, "extraVolumeMounts": mounts,
        }],
    }


class Bench:
    def __init__(self, cluster: clusterlib.Cluster, namespace: str, release: str, host_url: str):
        self.cluster, self.namespace, self.release = cluster, namespace, release
        self.ledger = redis.Redis.from_url(host_url)
        self.host_url = host_url
        self.deployment = f"{release}-taskherd-{POOL}"
        self.selector = f"taskherd.io/pool={POOL},app.kubernetes.io/instance={release}"

    def kubectl(self, *args: str, **kwargs) -> subprocess.CompletedProcess:
        return self.cluster.kubectl("-n", self.namespace, *args, **kwargs)

    def helm(self, *args: str) -> None:
        result = subprocess.run([self.cluster.helm_bin, "--kubeconfig", self.cluster.kubeconfig, *args],
                                env=self.cluster.env(), capture_output=True, text=True, timeout=600)
        if result.returncode != 0:
            raise SystemExit(f"helm {' '.join(args[:2])} failed: {result.stderr.strip()}\n{self.diagnostics()}")

    def diagnostics(self) -> str:
        out = self.kubectl("get", "pods,events", "-o", "wide", check=False)
        logs = self.kubectl("logs", "-l", self.selector, "--tail=30", check=False)
        return f"{out.stdout}{out.stderr}\n{logs.stdout}{logs.stderr}"

    def publish(self, count: int, seconds: float) -> None:
        from celery import Celery

        producer = Celery(broker=self.host_url, set_as_current=False)
        with producer.producer_or_acquire() as publisher:
            for _ in range(count):
                producer.send_task("scaleup.work", args=(seconds,), queue=QUEUE, producer=publisher)
        producer.close()

    def settle(self, watch: PodWatch, replicas: int, timeout: float = 300) -> list[str]:
        """Waits until exactly `replicas` pods exist and are Ready; returns their names."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            live = watch.live()
            if len(live) == replicas and all("ready" in watch.times(p) for p in live):
                return live
            time.sleep(0.5)
        raise SystemExit(f"the pool did not settle at {replicas} Ready pods in {timeout:.0f}s:\n{self.diagnostics()}")

    def round(self, watch: PodWatch, to: int, backlog: int) -> list[dict[str, float]]:
        before = set(self.settle(watch, 1))
        self.ledger.delete(QUEUE)
        self.publish(backlog, 1.0)
        scale_call = time.time()
        self.kubectl("scale", f"deployment/{self.deployment}", f"--replicas={to}")
        deadline = time.monotonic() + 300
        while True:
            new = [p for p in watch.live() if p not in before]
            boots = {p: self.ledger.hgetall(f"boot:{p}") for p in new}
            if len(new) == to - 1 and all("ready" in watch.times(p) and b"first_task" in boots[p] for p in new):
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"scale to {to}: not every new pod was Ready and working after 300 s:\n"
                                 f"{self.diagnostics()}")
            time.sleep(0.25)
        pods = []
        for name in new:
            record = {k.decode(): float(v) for k, v in boots[name].items()}
            record.update(watch.times(name))
            record["scale_call"] = scale_call
            pods.append(record)
        self.ledger.delete(QUEUE)
        self.kubectl("scale", f"deployment/{self.deployment}", "--replicas=1")
        self.settle(watch, 1)
        return pods


def ago(pods: list[dict], start: str, end: str) -> list[float]:
    return [p[end] - p[start] for p in pods if start in p and end in p]


def report(name: str, rounds: list[list[dict]]) -> dict:
    pods = [p for r in rounds for p in r]
    print(f"\n{name}: {len(rounds)} rounds, {len(pods)} new pods; median (max) seconds")
    row = {}
    for label, start, end in PHASES:
        values = ago(pods, start, end)
        row[label] = statistics.median(values)
        print(f"  {label:<34} {statistics.median(values):6.2f} ({max(values):6.2f})")
    for label, end in (("scale call -> taking tasks", "first_task"), ("scale call -> Ready", "ready")):
        per_pod = ago(pods, "scale_call", end)
        last = [max(ago(r, "scale_call", end)) for r in rounds]
        row[label] = statistics.median(per_pod)
        row[label + ", all"] = statistics.median(last)
        print(f"  {label:<34} {statistics.median(per_pod):6.2f} ({max(per_pod):6.2f}); all new pods: "
              f"{statistics.median(last):6.2f} (rounds: {', '.join(f'{v:.1f}' for v in last)})")
    ready_lag = ago(pods, "worker_ready", "ready")
    row["worker ready -> pod Ready"] = statistics.median(ready_lag)
    print(f"  {'worker ready -> pod Ready':<34} {statistics.median(ready_lag):6.2f} ({max(ready_lag):6.2f})")
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--to", type=int, default=6, help="replicas to scale to from 1 (default 6)")
    parser.add_argument("--backlog", type=int, default=300, help="one-second tasks waiting at the scale call")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--image-code", action="store_true", help="run the image's taskherd, not this checkout's")
    args = parser.parse_args(argv)
    cluster = clusterlib.resolve()
    cluster.check_reachable()
    if not cluster.is_local:
        raise SystemExit("bench/scaleup.py needs the local cluster (`make cluster`): its pods reach the host's "
                         "loopback Redis through the pod bridge")
    release = "sc" + uuid.uuid4().hex[:5]
    namespace = f"bench-scaleup-{release}"
    results, samples = {}, {}
    with contextlib.ExitStack() as stack:
        host_url = stack.enter_context(leased_redis_db(os.environ["TASKHERD_REDIS_URL"]))
        db = host_url.rsplit("/", 1)[1]
        redis_port = int(host_url.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])
        gateway = pod_gateway_address()
        forwarder = Forwarder(listen_host=gateway, target=("127.0.0.1", redis_port))
        stack.callback(forwarder.close)
        cluster.apply(f"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {namespace}\n  labels:\n"
                      f"    taskherd.io/bench: scaleup\n    pod-security.kubernetes.io/enforce: restricted\n")
        stack.callback(lambda: cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False))
        clusterlib.wait_for("default ServiceAccount", lambda: cluster.kubectl(
            "-n", namespace, "get", "sa", "default", check=False).returncode == 0, timeout=60, interval=0.5)
        bench = Bench(cluster, namespace, release, host_url)
        bench.kubectl("create", "secret", "generic", "broker", f"--from-literal=url=redis://{gateway}:{forwarder.port}/{db}")
        bench.kubectl("create", "configmap", "scaleup-app", f"--from-file=scaleup_app.py={APP}")
        overlay_items = None
        if not args.image_code:
            manifest, overlay_items = code_overlay(namespace)
            bench.kubectl("create", "-f", "-", input=manifest)  # not apply: its annotation would exceed 256 KiB
        watch = PodWatch(cluster, namespace, bench.selector)
        watch.start()
        stack.callback(watch.stop)
        values_file = Path(stack.enter_context(tempfile.TemporaryDirectory())) / "values.yaml"
        installed = False
        stack.callback(lambda: installed and bench.helm("uninstall", release, "-n", namespace, "--wait",
                                                        "--timeout", "3m"))
        for variant in args.variants.split(","):
            values_file.write_text(yaml.safe_dump(values(forwarder.port, VARIANTS[variant], overlay_items)))
            bench.helm("upgrade", "--install", release, str(CHART), "-n", namespace, "-f", str(values_file),
                       "--wait", "--timeout", "5m")
            installed = True
            rounds = []
            for index in range(args.rounds):
                pods = bench.round(watch, args.to, args.backlog)
                rounds.append(pods)
                last = max(p["ready"] - p["scale_call"] for p in pods)
                print(f"  {variant}, round {index + 1}: 1 -> {args.to}, all Ready after {last:.1f} s", flush=True)
            results[variant] = report(variant, rounds)
            samples[variant] = [p["first_task"] - p["scale_call"] for r in rounds for p in r]
    default = "chart defaults" if "chart defaults" in samples else next(iter(samples))
    out = measured_starts_path()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "measured_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "what": f"seconds from the scale call (1 -> {args.to}) to each new pod's first task, variant {default!r}",
        "start_seconds": samples[default], "variants": results}, indent=1))
    print(f"\nper-pod start times written to {out} (bench/autoscaling.py replays them)")
    if len(results) > 1:
        base = results[next(iter(results))]
        print(f"\n{'scale call -> all new pods Ready':<40}" + "".join(f"{v:>26}" for v in results))
        print(f"{'':<40}" + "".join(f"{r['scale call -> Ready, all']:>25.1f}s" for r in results.values()))
        print(f"target: 1 -> {args.to} all Ready <= 10 s; baseline (first variant) "
              f"{base['scale call -> Ready, all']:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
