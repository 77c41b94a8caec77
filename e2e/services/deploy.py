"""Putting the services on a cluster and taking them off: `up` (idempotent, recovers from a previous
run's leftovers), `down`, `status`, and the credentials a caller needs to build URLs."""
from __future__ import annotations

import base64
import json
import secrets
import time
from dataclasses import dataclass
from typing import Any, Callable

import yaml

from e2e.lib import cluster as clusters

from . import image as images
from . import manifests
from .config import COMPONENTS, FIELD_MANAGER, NAMESPACE, SECRET, SECRET_KEYS, SETTINGS_ANNOTATION, Settings, \
    merge_settings
from .endpoints import Credentials, Endpoints, in_cluster
from .rollout import Rollout, rollout_of

Log = Callable[[str], None]


class ServicesError(RuntimeError):
    """A service did not come up, or the cluster refused something; the message says which and why."""


@dataclass(frozen=True)
class Deployed:
    namespace: str
    settings: Settings
    credentials: Credentials

    @property
    def pods(self) -> Endpoints:
        """The URLs pods use (Service DNS names)."""
        return in_cluster(self.credentials, namespace=self.namespace, components=self.settings.components)


def _get(cluster: clusters.Cluster, *args: str) -> Any | None:
    r = cluster.kubectl("get", *args, "-o", "json", check=False)
    if r.returncode != 0:
        if "NotFound" in r.stderr:
            return None
        raise ServicesError(f"`kubectl get {' '.join(args)}` failed: {r.stderr.strip()}")
    return json.loads(r.stdout)


def deployed_settings(cluster: clusters.Cluster, namespace: str = NAMESPACE) -> Settings | None:
    ns = _get(cluster, "namespace", namespace)
    text = ((ns or {}).get("metadata", {}).get("annotations") or {}).get(SETTINGS_ANNOTATION)
    return Settings.from_json(text) if text else None


def default_storage_class(cluster: clusters.Cluster) -> str | None:
    classes = _get(cluster, "storageclass") or {"items": []}
    for sc in classes["items"]:
        annotations = sc["metadata"].get("annotations") or {}
        if annotations.get("storageclass.kubernetes.io/is-default-class") == "true":
            return sc["metadata"]["name"]
    return None


def read_credentials(cluster: clusters.Cluster, namespace: str = NAMESPACE) -> Credentials:
    secret = _get(cluster, "secret", SECRET, "-n", namespace)
    if secret is None:
        raise ServicesError(f"Secret {namespace}/{SECRET} does not exist: are the services up? "
                            f"(`python -m e2e.services up`)")
    return Credentials.from_secret_data({k: base64.b64decode(v).decode() for k, v in secret["data"].items()})


def _ensure_secret(cluster: clusters.Cluster, namespace: str) -> None:
    """Created once with random values and then kept: the data on the volumes was made with them."""
    if _get(cluster, "secret", SECRET, "-n", namespace) is not None:
        return
    values = {key: secrets.token_urlsafe(24) for key in SECRET_KEYS}
    values["username"] = "taskherd"
    r = cluster.kubectl("create", "-f", "-", input=yaml.safe_dump(manifests.secret(values, namespace)), check=False)
    if r.returncode != 0 and "AlreadyExists" not in r.stderr:
        raise ServicesError(f"creating Secret {namespace}/{SECRET}: {r.stderr.strip()}")


def _wait_namespace_usable(cluster: clusters.Cluster, namespace: str, log: Log) -> None:
    """A namespace still terminating (a previous `down` that was interrupted) refuses new objects."""
    ns = _get(cluster, "namespace", namespace)
    if ns and ns.get("status", {}).get("phase") == "Terminating":
        log(f"namespace {namespace} is still terminating (a previous down): waiting for it to go")
        clusters.wait_for(f"namespace {namespace} to be deleted",
                          lambda: _get(cluster, "namespace", namespace) is None, timeout=300, interval=2)


def _recreate_changed_statefulsets(cluster: clusters.Cluster, objects: list[dict], namespace: str, log: Log) -> None:
    """A StatefulSet whose volume claims, governing Service or RabbitMQ node count changed cannot be
    updated in place: delete it and its claims (its data goes: it was another shape of service)."""
    for obj in objects:
        if obj["kind"] != "StatefulSet":
            continue
        name = obj["metadata"]["name"]
        live = _get(cluster, "statefulset", name, "-n", namespace)
        want = obj["metadata"]["annotations"][manifests.SHAPE_ANNOTATION]
        if live is None or (live["metadata"].get("annotations") or {}).get(manifests.SHAPE_ANNOTATION) == want:
            continue
        log(f"{name}: its shape changed (volumes or node count): recreating it, with fresh data")
        _delete_component(cluster, name, namespace)


def _delete_component(cluster: clusters.Cluster, component: str, namespace: str) -> None:
    cluster.kubectl("delete", "statefulset", component, "-n", namespace, "--ignore-not-found", "--wait=true",
                    "--cascade=foreground", "--timeout=180s", timeout=240)
    selector = ",".join(f"{k}={v}" for k, v in manifests.selector(component).items())
    cluster.kubectl("delete", "pvc", "-n", namespace, "-l", selector, "--ignore-not-found", "--wait=true",
                    "--timeout=120s", timeout=180)


def _remove_dropped_components(cluster: clusters.Cluster, settings: Settings, namespace: str, log: Log) -> None:
    for component in COMPONENTS:
        if component in settings.components:
            continue
        if _get(cluster, "statefulset", component, "-n", namespace) is not None:
            log(f"{component}: no longer among the components: removing it")
            _delete_component(cluster, component, namespace)
            cluster.kubectl("delete", "service", component, "-n", namespace, "--ignore-not-found")


def rollouts(cluster: clusters.Cluster, components: tuple[str, ...], namespace: str = NAMESPACE) -> list[Rollout]:
    pods = _get(cluster, "pods", "-n", namespace, "-l", "app.kubernetes.io/part-of=taskherd-services")
    out = []
    for component in components:
        sts = _get(cluster, "statefulset", component, "-n", namespace)
        mine = [p for p in (pods or {"items": []})["items"]
                if p["metadata"]["labels"].get("app.kubernetes.io/name") == component]
        out.append(rollout_of(component, sts, mine))
    return out


def wait_ready(cluster: clusters.Cluster, components: tuple[str, ...], *, namespace: str = NAMESPACE,
               timeout: float = 300, log: Log = print) -> None:
    """Until every component's pods run the current revision and are Ready; says what changed on the
    way and, on timeout, what each unready pod's container last said."""
    told: dict[str, str] = {}

    def all_ready() -> bool:
        states = rollouts(cluster, components, namespace)
        for state in states:
            if told.get(state.component) != state.summary:
                told[state.component] = state.summary
                log(f"  {state.component}: {state.summary}")
        return all(s.done for s in states)

    try:
        # a failing kubectl (the API server restarting, on a loaded machine) is "not yet"; the
        # timeout reports it if it was the last answer
        clusters.wait_for(f"the services in {namespace} to be ready", all_ready, timeout=timeout, interval=1,
                          ignoring=(clusters.CommandFailed, ServicesError))
    except clusters.WaitTimeout as exc:
        raise ServicesError(f"{exc}\n{_unready_pod_logs(cluster, namespace)}") from exc


def _unready_pod_logs(cluster: clusters.Cluster, namespace: str) -> str:
    pods = _get(cluster, "pods", "-n", namespace) or {"items": []}
    lines = []
    for pod in pods["items"]:
        name = pod["metadata"]["name"]
        statuses = pod.get("status", {}).get("containerStatuses") or []
        if statuses and all(s.get("ready") for s in statuses):
            continue
        for previous in ("--previous", None):
            r = cluster.kubectl("logs", "-n", namespace, name, "--tail=15", *([previous] if previous else []),
                                check=False)
            if r.returncode == 0 and r.stdout.strip():
                lines.append(f"--- {name} ({'previous container' if previous else 'current container'}):\n"
                             f"{r.stdout.rstrip()}")
                break
        lines.append(f"--- {name} status: {json.dumps(statuses)[:600]}")
    return "\n".join(lines)


def _apply(cluster: clusters.Cluster, objects: list[dict]) -> None:
    # Server-side apply: fields this manager set before and no longer sets are removed, fields
    # others set (a test's Prometheus rules) stay.
    cluster.kubectl("apply", "--server-side", "--force-conflicts", f"--field-manager={FIELD_MANAGER}", "-f", "-",
                    input=yaml.safe_dump_all(objects), timeout=120)


def up(cluster: clusters.Cluster, *, namespace: str = NAMESPACE, log: Log = print, timeout: float = 420,
       rabbitmq_nodes: int | None = None, prometheus_namespaces: tuple[str, ...] | None = None,
       components: tuple[str, ...] | None = None) -> Deployed:
    """Deploy (or update, or repair) the services and wait until they are ready. Settings not given
    keep what is deployed (defaults on a fresh cluster): see config.merge_settings."""
    started = time.monotonic()
    _wait_namespace_usable(cluster, namespace, log)
    settings = merge_settings(deployed_settings(cluster, namespace),
                              {"rabbitmq_nodes": rabbitmq_nodes, "prometheus_namespaces": prometheus_namespaces,
                               "components": components})
    image, pull_policy = images.ensure(cluster, log)
    storage_class = default_storage_class(cluster)
    objects = manifests.render(settings, namespace=namespace, image=image, pull_policy=pull_policy,
                               storage_class=storage_class)
    _recreate_changed_statefulsets(cluster, objects, namespace, log)
    _remove_dropped_components(cluster, settings, namespace, log)
    namespace_object, rest = objects[0], objects[1:]
    _apply(cluster, [namespace_object])
    _ensure_secret(cluster, namespace)  # before the pods that read it
    _apply(cluster, rest)
    storage = f"PersistentVolumeClaim (StorageClass {storage_class})" if storage_class else "emptyDir"
    log(f"services in {namespace}: {', '.join(settings.components)} (RabbitMQ nodes {settings.rabbitmq_nodes}, "
        f"data on {storage}, image {image}); waiting until ready")
    wait_ready(cluster, settings.components, namespace=namespace, timeout=timeout, log=log)
    log(f"services ready in {time.monotonic() - started:.0f}s")
    return Deployed(namespace=namespace, settings=settings, credentials=read_credentials(cluster, namespace))


def current(cluster: clusters.Cluster, namespace: str = NAMESPACE) -> Deployed | None:
    """What is deployed, without changing anything; None when nothing is."""
    settings = deployed_settings(cluster, namespace)
    if settings is None:
        return None
    return Deployed(namespace=namespace, settings=settings, credentials=read_credentials(cluster, namespace))


def down(cluster: clusters.Cluster, *, namespace: str = NAMESPACE, log: Log = print) -> None:
    """Remove the namespace (pods, Services, Secret, volume claims) and the Prometheus ClusterRole."""
    started = time.monotonic()
    r = cluster.kubectl("delete", "namespace", namespace, "--ignore-not-found", "--wait=true", "--timeout=300s",
                        check=False, timeout=360)
    if r.returncode != 0:
        raise ServicesError(f"deleting namespace {namespace}: {r.stderr.strip()}")
    role = manifests.cluster_role_name(namespace)
    cluster.kubectl("delete", "clusterrolebinding,clusterrole", role, "--ignore-not-found", check=False)
    log(f"services removed from {namespace} ({time.monotonic() - started:.0f}s)")
