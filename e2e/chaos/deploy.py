"""Putting the ledger on the cluster: its tables, Secrets, code ConfigMap, `helm upgrade --install`
of charts/taskherd with e2e/chaos/app/values.yaml, and the outbox relay beside the workers.

The ledger's code reaches the pods as a ConfigMap mounted at /app/ledger (as the demo's shop
does), so the suite needs no image beyond the project's worker and operator images.
"""
from __future__ import annotations

import copy
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import psycopg
import yaml

from e2e.lib import cluster as clusters
from e2e.services.config import PORTS

from .images import Image
from .world import QUORUM_NAMESPACE, SERVICES_NAMESPACE, STORE_NAMESPACE, Tenancy

REPO_ROOT = Path(__file__).resolve().parents[2]
CHART = REPO_ROOT / "charts" / "taskherd"
APP_DIR = Path(__file__).resolve().parent / "app"
LEDGER_CODE = APP_DIR / "ledger"
BASE_VALUES = APP_DIR / "values.yaml"
RELEASE = "ledger"
POOL = "ledger"
RELAY = "ledger-outbox-relay"
WORKER_SELECTOR = f"app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component=worker"
OPERATOR_SELECTOR = f"app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component=operator"

Log = Callable[[str], None]


def ledger_modules():
    """`ledger.app` and `ledger.db` as the host imports them (publishing, reading the ledger)."""
    if str(APP_DIR) not in sys.path:
        sys.path.insert(0, str(APP_DIR))
    from ledger import app, db

    return app, db


@dataclass(frozen=True)
class Release:
    cluster: clusters.Cluster
    namespace: str
    tenancy: Tenancy
    values: dict

    @property
    def pool(self) -> dict:
        [pool] = [p for p in self.values["workerPools"] if p["name"] == POOL]
        return pool

    @property
    def min_replicas(self) -> int:
        return self.pool["autoscaling"]["minReplicas"]

    @property
    def max_replicas(self) -> int:
        return self.pool["autoscaling"]["maxReplicas"]


def _peer(namespace: str, component: str) -> dict:
    return {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": component}}}


def _egress(namespace: str, component: str, port: str) -> dict:
    return {"to": [_peer(namespace, component)], "ports": [{"port": PORTS[component][port], "protocol": "TCP"}]}


def values_for(tenancy: Tenancy, images: dict[str, Image] | None = None) -> dict:
    """e2e/chaos/app/values.yaml plus what depends on the run: the images, broker kind, where the
    services are (NetworkPolicy peers, enforced on kind), the code volume, the queue type."""
    values = copy.deepcopy(yaml.safe_load(BASE_VALUES.read_text()))
    for component, key in (("worker", "workerPoolDefaults"), ("operator", "operator")):
        if images and component in images:
            # the chart takes the registry host apart from the repository
            registry, _, repository = images[component].repository.rpartition("/")
            values.setdefault(key, {})["image"] = {"registry": registry, "repository": repository,
                                                   "tag": images[component].tag, "pullPolicy": "IfNotPresent"}
    rabbit_namespace = QUORUM_NAMESPACE if tenancy.quorum else SERVICES_NAMESPACE
    broker = values["broker"]
    broker["type"] = tenancy.broker
    if tenancy.broker == "redis":
        broker["existingSecret"].pop("managementUrlKey", None)
        broker["ports"] = [PORTS["redis"]["redis"]]
        broker["networkPeers"] = [_peer(SERVICES_NAMESPACE, "redis")]
    else:
        broker["ports"] = [PORTS["rabbitmq"]["amqp"], PORTS["rabbitmq"]["management"]]
        broker["networkPeers"] = [_peer(rabbit_namespace, "rabbitmq")]
    [pool] = [p for p in values["workerPools"] if p["name"] == POOL]
    pool["env"] = pool["env"] + [{"name": "PYTHONPATH", "value": "/app"},
                                 {"name": "LEDGER_QUEUE_TYPE", "value": tenancy.queue_type}]
    pool["extraVolumes"] = [{"name": "ledger-code", "configMap": {"name": "ledger-code"}}]
    pool["extraVolumeMounts"] = [{"name": "ledger-code", "mountPath": "/app/ledger", "readOnly": True}]
    worker_egress = [_egress(SERVICES_NAMESPACE, "postgres", "postgres"), _egress(STORE_NAMESPACE, "redis", "redis")]
    if tenancy.broker == "rabbitmq":
        worker_egress.append(_egress(SERVICES_NAMESPACE, "redis", "redis"))  # the delivery counter
    values["networkPolicy"] = {"workerExtraEgress": worker_egress,
                               # the operator reads each worker's in-flight gauge to remove idle workers first
                               "metricsIngress": {"enabled": True}}
    return values


def create_schema(tenancy: Tenancy) -> None:
    _, db = ledger_modules()
    with psycopg.connect(tenancy.host.database, autocommit=True, connect_timeout=10) as conn:
        db.create_schema(conn)


def _secret(name: str, data: dict[str, str]) -> dict:
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque", "metadata": {"name": name}, "stringData": data}


def _code_configmap() -> dict:
    files = {p.name: p.read_text() for p in sorted(LEDGER_CODE.glob("*.py"))}
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ledger-code"}, "data": files}


def relay_deployment(image: str, pull_policy: str) -> dict:
    """The outbox relay: publishes the ledger's committed outbox rows (`taskherd outbox relay`)."""
    secret = lambda name, key: {"secretKeyRef": {"name": name, "key": key}}  # noqa: E731
    labels = {"app.kubernetes.io/name": RELAY, "app.kubernetes.io/part-of": RELEASE}
    return {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": RELAY, "labels": labels},
        "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "template": {
            "metadata": {"labels": labels},
            "spec": {
                "automountServiceAccountToken": False, "enableServiceLinks": False,
                "terminationGracePeriodSeconds": 15,
                "securityContext": {"runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001,
                                    "seccompProfile": {"type": "RuntimeDefault"}},
                "containers": [{
                    "name": "relay", "image": image, "imagePullPolicy": pull_policy,
                    "command": ["taskherd", "outbox", "relay", "-A", "ledger.worker:app", "--batch-size", "20",
                                "--poll-interval", "0.5"],
                    "env": [{"name": "TASKHERD_BROKER_URL", "valueFrom": secret("ledger-broker", "url")},
                            {"name": "TASKHERD_OUTBOX_DSN", "valueFrom": secret("ledger-database", "dsn")},
                            {"name": "TASKHERD_DELIVERY_COUNTER_URL",
                             "valueFrom": {"secretKeyRef": {"name": "ledger-broker", "key": "delivery-counter-url",
                                                            "optional": True}}},
                            {"name": "LEDGER_QUEUE_TYPE", "valueFrom": {"configMapKeyRef": {
                                "name": "ledger-settings", "key": "queue-type"}}},
                            {"name": "PYTHONPATH", "value": "/app"}, {"name": "HOME", "value": "/tmp"},
                            {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"}],
                    "resources": {"requests": {"cpu": "20m", "memory": "96Mi"}, "limits": {"memory": "192Mi"}},
                    "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                        "capabilities": {"drop": ["ALL"]}},
                    "volumeMounts": [{"name": "ledger-code", "mountPath": "/app/ledger", "readOnly": True},
                                     {"name": "tmp", "mountPath": "/tmp"}],
                }],
                "volumes": [{"name": "ledger-code", "configMap": {"name": "ledger-code"}},
                            {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}}],
            }}}}


def install(cluster: clusters.Cluster, namespace: str, tenancy: Tenancy, run_dir: Path, log: Log,
            images: dict[str, Image] | None = None) -> Release:
    """Tables, Secrets, code, chart and relay; returns once every worker and the relay are Ready."""
    started = time.monotonic()
    create_schema(tenancy)
    pods = tenancy.pods
    broker_data = {"url": pods.broker, "delivery-counter-url": pods.delivery_counter}
    if pods.management:
        broker_data["management-url"] = pods.management
    objects = [_secret("ledger-broker", broker_data), _secret("ledger-database", {"dsn": pods.database}),
               _secret("ledger-store", {"url": pods.store}), _code_configmap(),
               {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ledger-settings"},
                "data": {"queue-type": tenancy.queue_type}}]
    cluster.apply(yaml.safe_dump_all(objects), namespace=namespace)
    values = values_for(tenancy, images)
    values_file = run_dir / f"values-{tenancy.broker}{'-quorum' if tenancy.quorum else ''}.yaml"
    values_file.parent.mkdir(parents=True, exist_ok=True)
    values_file.write_text("# e2e/chaos/app/values.yaml + this run (written by e2e/chaos)\n"
                           + yaml.safe_dump(values, sort_keys=False))
    cluster.helm("upgrade", "--install", RELEASE, str(CHART), "--namespace", namespace, "-f", str(values_file),
                 "--wait", "--timeout", "300s", timeout=360)
    worker = images["worker"].ref if images and "worker" in images else clusters.versions()["WORKER_IMAGE"]
    cluster.apply(json.dumps(relay_deployment(worker, "IfNotPresent")), namespace=namespace)
    cluster.kubectl("-n", namespace, "rollout", "status", f"deployment/{RELAY}", "--timeout=180s", timeout=200)
    log(f"ledger installed in {namespace} ({tenancy.broker}{', quorum queues' if tenancy.quorum else ''}): "
        f"{time.monotonic() - started:.0f}s")
    return Release(cluster=cluster, namespace=namespace, tenancy=tenancy, values=values)


def upgrade(release: Release, values: dict, run_dir: Path, *, wait: bool = False) -> Release:
    """`helm upgrade` of the release with new values (kept in the run folder)."""
    values_file = run_dir / f"values-upgrade-{int(time.time())}.yaml"
    values_file.write_text(yaml.safe_dump(values, sort_keys=False))
    release.cluster.helm("upgrade", RELEASE, str(CHART), "--namespace", release.namespace, "-f", str(values_file),
                         *(["--wait", "--timeout", "300s"] if wait else []), timeout=360)
    return Release(cluster=release.cluster, namespace=release.namespace, tenancy=release.tenancy, values=values)


def worker_deployment(release: Release) -> dict[str, Any]:
    [deployment] = release.cluster.kubectl_json("-n", release.namespace, "get", "deployments", "-l",
                                                WORKER_SELECTOR)["items"]
    return deployment
