"""What the cluster benchmarks share: the chart installed in a namespace of its own, against the
host's loopback broker, running this checkout's worker code; and a watch of its pods.

:class:`Release` creates a namespace under the `restricted` Pod Security Standard, a Secret with the
broker URL the pods use (the host's broker through a forwarder on the pod bridge: the local cluster's
pods cannot reach the host's loopback), a ConfigMap with the app (bench/cluster_app.py), and, unless
`image_code`, a ConfigMap with this checkout's `taskherd` package as sourceless, unchecked .pyc
files first on the pods' PYTHONPATH, so a change to the worker is measured without rebuilding the
shared image. Everything goes on exit (helm uninstall, namespace deleted, forwarder closed).
"""
from __future__ import annotations

import base64
import contextlib
import json
import py_compile
import subprocess
import tempfile
import threading
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import yaml

from repo_paths import ROOT  # first: the shared helpers below live in the repository

from e2e.lib import cluster as clusterlib
from e2e.lib.forwarder import Forwarder, pod_gateway_address
from e2e.lib.waiting import wait_for

CHART = ROOT / "charts" / "taskherd"
APP = ROOT / "bench" / "cluster_app.py"
POOL = "bench"


class PodWatch(threading.Thread):
    """`kubectl get pods --watch`: when each pod was first seen, bound to a node, Ready, deleted."""

    def __init__(self, cluster: clusterlib.Cluster, namespace: str, selector: str):
        super().__init__(daemon=True)
        self.process = subprocess.Popen(
            [cluster.kubectl_bin, "--kubeconfig", cluster.kubeconfig, "-n", namespace, "get", "pods", "-l", selector,
             "--watch", "--output-watch-events", "-o", "json"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=cluster.env())
        self.seen: dict[str, dict[str, float]] = {}
        self.objects: dict[str, dict] = {}
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
                self.objects[name] = pod
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

    def pod(self, name: str) -> dict:
        with self.lock:
            return self.objects.get(name, {})

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)


def code_overlay(namespace: str) -> tuple[str, list[dict]]:
    """(ConfigMap manifest, volume items) of this checkout's taskherd package as sourceless,
    unchecked .pyc files: the image's Python imports them before its own copy without recompiling."""
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


def merge(base: dict, override: dict) -> dict:
    """`override` merged into `base` key by key (dicts deeply, anything else replaced)."""
    merged = dict(base)
    for key, value in override.items():
        merged[key] = merge(merged[key], value) if isinstance(value, dict) and isinstance(merged.get(key), dict) \
            else value
    return merged


class Release:
    """The chart in a fresh namespace against a host broker (module docstring). A context manager."""

    def __init__(self, *, host_broker_url: str, host_ledger_url: str, queue: str, label: str,
                 image_code: bool = False):
        self.cluster = clusterlib.resolve()
        self.cluster.check_reachable()
        if not self.cluster.is_local:
            raise SystemExit("the cluster benchmarks need the local cluster (`make cluster`): its pods reach the "
                             "host's loopback broker through the pod bridge")
        self.host_broker_url, self.queue, self.label, self.image_code = host_broker_url, queue, label, image_code
        self.host_ledger_url = host_ledger_url
        self.broker_type = "rabbitmq" if host_broker_url.startswith("amqp") else "redis"
        self.name = label[:2] + uuid.uuid4().hex[:5]
        self.namespace = f"bench-{label}-{self.name}"
        self.deployment = f"{self.name}-taskherd-{POOL}"
        self.selector = f"taskherd.io/pool={POOL},app.kubernetes.io/instance={self.name}"
        self.overlay_items: list[dict] | None = None
        self._stack = contextlib.ExitStack()
        self._installed = False

    # -- lifecycle --------------------------------------------------------------------------
    def __enter__(self) -> "Release":
        stack = self._stack.__enter__()
        self.forwarders: dict[int, Forwarder] = {}
        self.pod_broker_url = self._through_forwarder(self.host_broker_url)
        self.pod_ledger_url = self._through_forwarder(self.host_ledger_url)
        stack.callback(lambda: self.cluster.delete_namespace(self.namespace))
        self.cluster.create_namespace(self.namespace, labels={"taskherd.io/bench": self.label,
                                                              "pod-security.kubernetes.io/enforce": "restricted"},
                                      annotations={})
        self.kubectl("create", "secret", "generic", "broker", f"--from-literal=url={self.pod_broker_url}",
                     f"--from-literal=ledger={self.pod_ledger_url}")
        self.kubectl("create", "configmap", "cluster-app", f"--from-file=cluster_app.py={APP}")
        if not self.image_code:
            manifest, self.overlay_items = code_overlay(self.namespace)
            self.kubectl("create", "-f", "-", input=manifest)  # not apply: its annotation would exceed 256 KiB
        self.watch = PodWatch(self.cluster, self.namespace, self.selector)
        self.watch.start()
        stack.callback(self.watch.stop)
        self._values_dir = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        stack.callback(lambda: self._installed and self.helm("uninstall", self.name, "-n", self.namespace, "--wait",
                                                             "--timeout", "3m"))
        return self

    def __exit__(self, *exc_info) -> bool:
        return self._stack.__exit__(*exc_info)

    def _through_forwarder(self, host_url: str) -> str:
        """`host_url` as the pods reach it: the pod bridge's address, through a forwarder to its port."""
        parts = urlsplit(host_url)
        if parts.port not in self.forwarders:
            self.forwarders[parts.port] = Forwarder(listen_host=pod_gateway_address(), target=("127.0.0.1", parts.port))
            self._stack.callback(self.forwarders[parts.port].close)
        credentials = parts.netloc.rsplit("@", 1)[0] + "@" if "@" in parts.netloc else ""
        port = self.forwarders[parts.port].port
        return urlunsplit(parts._replace(netloc=f"{credentials}{pod_gateway_address()}:{port}"))

    def install(self, pool: dict) -> None:
        """`helm upgrade --install` with one worker pool: `pool` merged over the benchmark's defaults."""
        volumes = [{"name": "app", "configMap": {"name": "cluster-app"}}]
        mounts = [{"name": "app", "mountPath": "/app", "readOnly": True}]
        path = "/app"
        if self.overlay_items is not None:
            volumes.append({"name": "code", "configMap": {"name": "taskherd-code", "items": self.overlay_items}})
            mounts.append({"name": "code", "mountPath": "/overlay", "readOnly": True})
            path = "/overlay:/app"
        defaults = {
            "name": POOL, "app": "cluster_app", "queues": [self.queue], "concurrency": 2,
            "timeLimits": {"softSeconds": 20, "hardSeconds": 30}, "drainMarginSeconds": 5, "shutdownSeconds": 5,
            "autoscaling": {"enabled": False}, "replicas": 1, "podDisruptionBudget": {"enabled": False},
            "resources": {"requests": {"cpu": "10m", "memory": "96Mi"}, "limits": {"memory": "384Mi"}},
            "env": [{"name": "PYTHONPATH", "value": path},
                    {"name": "BENCH_LEDGER_URL", "valueFrom": {"secretKeyRef": {"name": "broker", "key": "ledger"}}}],
            "extraVolumes": volumes, "extraVolumeMounts": mounts,
        }
        values = {
            "broker": {"type": self.broker_type, "existingSecret": {"name": "broker"},
                       "ports": sorted(f.port for f in self.forwarders.values())},
            "operator": {"enabled": False}, "exporter": {"enabled": False},
            "workerPoolDefaults": {"image": {"pullPolicy": "Never"}},
            "workerPools": [merge(defaults, pool)],
        }
        values_file = self._values_dir / "values.yaml"
        values_file.write_text(yaml.safe_dump(values))
        self.helm("upgrade", "--install", self.name, str(CHART), "-n", self.namespace, "-f", str(values_file),
                  "--wait", "--timeout", "5m")
        self._installed = True

    # -- tools ------------------------------------------------------------------------------
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

    def scale(self, replicas: int) -> None:
        """Through the Deployment's scale subresource, as the operator does."""
        self.kubectl("scale", f"deployment/{self.deployment}", f"--replicas={replicas}")

    def settle(self, replicas: int, timeout: float = 300) -> list[str]:
        """Waits until exactly `replicas` pods exist and are Ready; returns their names."""
        def ready_pods() -> list[str]:
            return [p for p in self.watch.live() if "ready" in self.watch.times(p)]

        return wait_for(f"{replicas} Ready pods and no other", ready_pods, timeout, 0.5,
                        until=lambda ready: len(ready) == replicas == len(self.watch.live()),
                        explain=self.diagnostics)

    def publish(self, task: str, args: tuple, count: int = 1) -> None:
        import warnings

        from celery import Celery

        from taskherd.worker import configure

        producer = Celery(broker=self.host_broker_url, set_as_current=False)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            configure(producer, queues=[self.queue])  # the queue's declaration must match the workers'

        with producer.producer_or_acquire() as publisher:
            for _ in range(count):
                producer.send_task(task, args=args, queue=self.queue, producer=publisher)
        producer.close()
