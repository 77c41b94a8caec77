"""Putting the shop on the cluster and taking it off again: the cluster, the images, the Secrets,
the code ConfigMap and `helm upgrade --install` of charts/taskherd with examples/shop/values.yaml.
"""
from __future__ import annotations

import copy
import hashlib
import subprocess
import time
from pathlib import Path
from typing import Callable

import yaml

from e2e.lib import cluster as clusters
from e2e.services.config import NAMESPACE as SERVICES_NAMESPACE
from e2e.services.config import PORTS

from .config import CHART, NAMESPACE, POOL, RELEASE, REPO_ROOT, SHOP, SHOP_VALUES, state_dir
from .environment import World

Log = Callable[[str], None]
#: bound on `helm upgrade --install --wait` of the demo's release
INSTALL_SECONDS = 600
#: what the worker and operator images are built from: a change here means `make images`
IMAGE_INPUTS = ("worker", "operator", "images/worker", "images/operator",
                "images/build.sh", "e2e/cluster/versions.env")


class DeployError(RuntimeError):
    """A deployment step failed; the message has the step and what the tool said."""


def run_make(target: str, log: Log, *, timeout: float = 3600) -> None:
    """`make <target>`, its output streamed with a prefix so the narration stays readable."""
    log(f"make {target}")
    started = time.monotonic()
    proc = subprocess.Popen(["make", "--no-print-directory", target], cwd=REPO_ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    tail: list[str] = []
    for line in proc.stdout:
        line = line.rstrip()
        tail = (tail + [line])[-30:]
        print(f"    │ {line}", flush=True)
    if proc.wait(timeout=timeout) != 0:
        raise DeployError(f"`make {target}` failed ({proc.returncode}); its last lines:\n" + "\n".join(tail[-6:]))
    log(f"make {target}: done in {time.monotonic() - started:.0f}s")


def pick_cluster(log: Log) -> clusters.Cluster:
    """An explicit kubeconfig, else kind, else the local cluster (started with `make cluster` if down)."""
    cluster = clusters.resolve()
    if cluster.is_local:
        try:
            cluster.check_reachable()
        except clusters.ClusterUnavailable:
            run_make("cluster", log)
    cluster.check_reachable()
    log(f"cluster: {cluster.source} ({cluster.kubeconfig})")
    return cluster


def _images_key() -> str:
    h = hashlib.sha256()
    for item in IMAGE_INPUTS:
        path = REPO_ROOT / item
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        for f in files:
            if "__pycache__" in f.parts or f.suffix == ".pyc" or ".egg-info" in str(f):
                continue
            h.update(str(f.relative_to(REPO_ROOT)).encode())
            h.update(f.read_bytes())
    return h.hexdigest()[:16]


def _local_has_images() -> bool:
    v = clusters.versions()
    sock = clusters.taskherd_home() / "cluster" / "containerd" / "containerd.sock"
    r = subprocess.run(["ctr", "--address", str(sock), "-n", "k8s.io", "images", "ls", "-q"],
                       capture_output=True, text=True)
    names = set(r.stdout.split())
    return r.returncode == 0 and {v["WORKER_IMAGE"], v["OPERATOR_IMAGE"]} <= {n.removeprefix("docker.io/") for n in names}


def ensure_images(cluster: clusters.Cluster, log: Log) -> None:
    """`make images` when the sources changed since the last build (or the cluster lacks them)."""
    stamp = state_dir() / "images.key"
    key = _images_key()
    present = _local_has_images() if cluster.is_local else True
    if stamp.exists() and stamp.read_text() == key and present:
        log(f"images: up to date (sources unchanged since the last build, key {key})")
    else:
        # images/build.sh waits for any other checkout's build itself (its lock on the shared builder)
        run_make("images", log)
        stamp.write_text(key)
    if cluster.source == "kind":
        # Resolving kind again runs e2e/kind/up.sh: on a healthy cluster it only loads the image
        # archives that changed (make images' list) into every node.
        clusters.resolve()
    elif cluster.source == "explicit":
        log("images: an explicit cluster must be able to pull taskherd.local/worker:dev and "
            "taskherd.local/operator:dev (push them to your registry and set the image values)")


def services_peer(component: str) -> dict:
    """A NetworkPolicy peer: the pods of one in-cluster service (e2e/services)."""
    return {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": SERVICES_NAMESPACE}},
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": component}}}


def _egress(component: str, port: str) -> dict:
    return {"to": [services_peer(component)], "ports": [{"port": PORTS[component][port], "protocol": "TCP"}]}


def demo_values(world: World) -> dict:
    """examples/shop/values.yaml plus what depends on where the services are."""
    values = yaml.safe_load(SHOP_VALUES.read_text())
    values = copy.deepcopy(values)
    broker = values["broker"]
    broker["type"] = world.broker
    if world.broker == "redis":
        broker["existingSecret"].pop("managementUrlKey", None)
        broker["ports"] = [PORTS["redis"]["redis"]]
        broker["networkPeers"] = [services_peer("redis")]
    else:
        broker["ports"] = [PORTS["rabbitmq"]["amqp"], PORTS["rabbitmq"]["management"]]
        broker["networkPeers"] = [services_peer("rabbitmq")]
    [pool] = [p for p in values["workerPools"] if p["name"] == POOL]
    # The shop's code reaches the pods as a ConfigMap; your own app would be in its image instead
    # (examples/shop/Dockerfile).
    pool["env"] = pool.get("env", []) + [{"name": "PYTHONPATH", "value": "/app"}]
    pool["extraVolumes"] = [{"name": "shop-code", "configMap": {"name": "shop-code"}}]
    pool["extraVolumeMounts"] = [{"name": "shop-code", "mountPath": "/app/shop", "readOnly": True}]
    pool["autoscaling"]["deadLetter"]["alertmanagerUrl"] = world.pods.alertmanager_url
    # the charges' database; on RabbitMQ, the Redis that counts deliveries
    worker_egress = [_egress("postgres", "postgres")] + ([_egress("redis", "redis")] if world.broker == "rabbitmq" else [])
    values["networkPolicy"] = {
        "workerExtraEgress": worker_egress,
        "operatorExtraEgress": [_egress("alertmanager", "http")],
        # the operator reads each worker's in-flight gauge to remove idle workers first
        "metricsIngress": {"enabled": True},
    }
    return values


def _apply_generic(cluster: clusters.Cluster, kind: str, name: str, *args: str) -> None:
    manifest = cluster.kubectl("create", kind, *([] if kind == "configmap" else ["generic"]), name, *args,
                               "-n", NAMESPACE, "--dry-run=client", "-o", "yaml").stdout
    cluster.apply(manifest, namespace=NAMESPACE)


def install(cluster: clusters.Cluster, world: World, run_dir: Path, log: Log) -> dict:
    """Namespace, Secrets, code ConfigMap, chart. Returns the values used (also saved in the run folder)."""
    cluster.apply(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": NAMESPACE, "labels": {
            "app.kubernetes.io/part-of": "taskherd-demo",
            # the chart's pods meet the restricted Pod Security Standard: enforce it
            "pod-security.kubernetes.io/enforce": "restricted"}}}))
    broker_secret = [f"--from-literal=url={world.pods.broker_url}"]
    if world.broker == "rabbitmq":
        broker_secret += [f"--from-literal=management-url={world.pods.management_url}",
                          f"--from-literal=delivery-counter-url={world.pods.delivery_counter_url}"]
    _apply_generic(cluster, "secret", "shop-broker", *broker_secret)
    _apply_generic(cluster, "secret", "shop-database", f"--from-literal=dsn={world.pods.database_url}")
    code = sorted(p for p in (SHOP / "shop").glob("*.py"))
    _apply_generic(cluster, "configmap", "shop-code", *[f"--from-file={p.name}={p}" for p in code])
    log(f"secrets shop-broker ({world.broker}), shop-database; configmap shop-code ({len(code)} files)")

    values = demo_values(world)
    values_file = run_dir / "values-demo.yaml"
    values_file.write_text("# examples/shop/values.yaml + this machine (written by e2e/demo)\n"
                           + yaml.safe_dump(values, sort_keys=False))
    started = time.monotonic()
    try:
        # A bound, not an estimate: Ready in about a minute on an idle machine, four times that at a
        # load average near 90 (a kind run beside a soak), where 240 s once ran out.
        helm(cluster, "upgrade", "--install", RELEASE, str(CHART), "--namespace", NAMESPACE, "-f", str(values_file),
             "--wait", "--timeout", f"{INSTALL_SECONDS}s", timeout=INSTALL_SECONDS + 60)
    except DeployError as exc:
        pods = cluster.kubectl("get", "pods", "-n", NAMESPACE, "-o", "wide", check=False, timeout=60)
        raise DeployError(f"{exc}\npods then:\n{(pods.stdout or pods.stderr).rstrip()}") from None
    log(f"helm upgrade --install {RELEASE} charts/taskherd -f examples/shop/values.yaml: "
        f"ready in {time.monotonic() - started:.0f}s")
    return values


def helm(cluster: clusters.Cluster, *args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess:
    """helm against the chosen cluster (the pinned binary, the cluster's kubeconfig and helm dirs)."""
    cmd = [cluster.helm_bin, "--kubeconfig", cluster.kubeconfig, *args]
    r = subprocess.run(cmd, capture_output=True, text=True, env=cluster.env(), timeout=timeout)
    if check and r.returncode != 0:
        raise DeployError(f"`helm {' '.join(args)}` exited {r.returncode}: {(r.stderr or r.stdout).strip()}")
    return r


def release_exists(cluster: clusters.Cluster) -> bool:
    r = helm(cluster, "status", RELEASE, "--namespace", NAMESPACE, check=False, timeout=60)
    return r.returncode == 0


def uninstall(cluster: clusters.Cluster, log: Log) -> None:
    if release_exists(cluster):
        started = time.monotonic()
        helm(cluster, "uninstall", RELEASE, "--namespace", NAMESPACE, "--wait", "--timeout", "180s", timeout=240)
        # helm waits for the Deployments, not for their pods: wait until the last one has drained and gone
        clusters.wait_for("the previous release's pods to go", lambda: not cluster.kubectl_json(
            "get", "pods", "-n", NAMESPACE, "-l", f"app.kubernetes.io/instance={RELEASE}")["items"], 180)
        log(f"helm uninstall {RELEASE}: {time.monotonic() - started:.0f}s")


def delete_namespace(cluster: clusters.Cluster, log: Log) -> None:
    r = cluster.kubectl("delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait=true", "--timeout=180s",
                        check=False, timeout=240)
    if r.returncode != 0:
        raise DeployError(f"deleting namespace {NAMESPACE}: {r.stderr.strip()}")
    log(f"namespace {NAMESPACE} deleted")
