"""The Kubernetes objects of the in-cluster services, as plain dicts: a pure function of the settings,
the namespace, the image and the StorageClass.

Each component is a StatefulSet named after it (so its pods are `<component>-0`, `-1`, …) behind a
Service of the same name, running the services image (images/services) as uid 10002 under the
`restricted` Pod Security Standard. Data lives on a PersistentVolumeClaim per pod when the cluster
has a default StorageClass, else on an emptyDir: it survives a container restart either way, and a
pod deletion only with a claim.
"""
from __future__ import annotations

import hashlib
import json
from typing import Any

import yaml

from .config import (FIELD_MANAGER, NAMESPACE, PART_OF, PORTS, PROMETHEUS_RULES_CONFIGMAP,
                     RABBITMQ_NODES_SERVICE, SECRET, SERVICES_UID, SETTINGS_ANNOTATION, VOLUME_SIZE, Settings)

CONFIG_MAP = "taskherd-services-config"
CONFIG_DIR = "/etc/taskherd-services"
#: on a StatefulSet: the parts of its spec the API refuses to change (volume claims, the
#: governing Service) and RabbitMQ's node count; when it differs, the deployer recreates it
SHAPE_ANNOTATION = "taskherd.io/shape"
CONFIG_HASH_ANNOTATION = "taskherd.io/config-hash"
#: the label (and taint) of a control-plane node, kubeadm's and kind's
CONTROL_PLANE_LABEL = "node-role.kubernetes.io/control-plane"

#: per component: requests (small: the e2e suite shares a small machine) and readiness
RESOURCES = {
    "redis": {"cpu": "20m", "memory": "32Mi"},
    "rabbitmq": {"cpu": "100m", "memory": "192Mi"},
    "postgres": {"cpu": "50m", "memory": "64Mi"},
    "alertmanager": {"cpu": "10m", "memory": "32Mi"},
    "prometheus": {"cpu": "50m", "memory": "128Mi"},
}


def labels(component: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": component, "app.kubernetes.io/part-of": PART_OF,
            "app.kubernetes.io/managed-by": FIELD_MANAGER}


def selector(component: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": component, "app.kubernetes.io/part-of": PART_OF}


def secret_env(name: str, key: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": SECRET, "key": key}}}


def readiness_probe(component: str) -> dict[str, Any]:
    """Cheap and local: no probe talks to another pod or forks a VM (rabbitmq-diagnostics would)."""
    timing = {"periodSeconds": 5, "timeoutSeconds": 3, "failureThreshold": 2}
    if component == "redis":
        # LOADING (the AOF being replayed after a restart) is not PONG: not ready until it is done
        return {"exec": {"command": ["sh", "-c", 'test "$(redis-cli -h 127.0.0.1 ping)" = PONG']}, **timing}
    if component == "postgres":
        return {"exec": {"command": ["/usr/lib/postgresql/15/bin/pg_isready", "-q", "-h", "127.0.0.1",
                                     "-p", str(PORTS["postgres"]["postgres"])]}, **timing}
    if component == "rabbitmq":
        # the AMQP listener opens once the node has booted (and, in a cluster, joined)
        return {"tcpSocket": {"port": "amqp"}, **timing}
    return {"httpGet": {"path": "/-/ready", "port": "http"}, **timing}


def component_env(component: str, settings: Settings) -> list[dict[str, Any]]:
    if component == "redis":
        # REDISCLI_AUTH: the readiness probe's redis-cli authenticates without a password argument
        return [secret_env("REDIS_PASSWORD", "redis-password"), secret_env("REDISCLI_AUTH", "redis-password")]
    if component == "rabbitmq":
        return [secret_env("RABBITMQ_USER", "username"), secret_env("RABBITMQ_PASSWORD", "password"),
                secret_env("RABBITMQ_ERLANG_COOKIE", "erlang-cookie"),
                {"name": "RABBITMQ_NODES", "value": str(settings.rabbitmq_nodes)}]
    if component == "postgres":
        return [secret_env("POSTGRES_USER", "username"), secret_env("POSTGRES_PASSWORD", "password")]
    return []


def alertmanager_config() -> str:
    # No receiver integrations: alerts are held and served by the v2 API, which is what tests read.
    return yaml.safe_dump({
        "route": {"receiver": "hold", "group_by": ["alertname", "namespace"], "group_wait": "5s",
                  "group_interval": "30s", "repeat_interval": "4h"},
        "receivers": [{"name": "hold"}],
    }, sort_keys=False)


def prometheus_config(settings: Settings, namespace: str) -> str:
    discovery: dict[str, Any] = {"role": "pod"}
    if settings.prometheus_namespaces:
        discovery["namespaces"] = {"names": list(settings.prometheus_namespaces)}
    port = PORTS["alertmanager"]["http"]
    return yaml.safe_dump({
        "global": {"scrape_interval": "5s", "evaluation_interval": "5s"},
        "alerting": {"alertmanagers": [{"static_configs": [
            {"targets": [f"alertmanager.{namespace}.svc:{port}"]}]}]} if "alertmanager" in settings.components else {},
        # the ConfigMap's keys; not `*`, which also matches the volume's hidden `..<timestamp>` directory
        "rule_files": [f"{CONFIG_DIR}/rules/*.yml", f"{CONFIG_DIR}/rules/*.yaml"],
        "scrape_configs": [{
            "job_name": "pods",
            # The labels a target exposes win over the ones below, as with the chart's
            # ServiceMonitor (honorLabels): the operator labels its per-pool series with the
            # WorkerPool's `namespace`, which would otherwise become `exported_namespace`.
            "honor_labels": True,
            "kubernetes_sd_configs": [discovery],
            # The labels the Prometheus Operator gives a PodMonitor's targets (namespace, pod,
            # container) and the chart's PodMonitor adds (pool): the chart's alerts read them.
            "relabel_configs": [
                # every container port named `metrics` (the chart's workers, exporter and operator)
                {"source_labels": ["__meta_kubernetes_pod_container_port_name"], "regex": "metrics",
                 "action": "keep"},
                {"source_labels": ["__meta_kubernetes_pod_phase"], "regex": "Running", "action": "keep"},
                {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
                {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
                {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
                {"source_labels": ["__meta_kubernetes_pod_label_app_kubernetes_io_component"],
                 "target_label": "component"},
                {"source_labels": ["__meta_kubernetes_pod_label_app_kubernetes_io_instance"],
                 "target_label": "release"},
                {"source_labels": ["__meta_kubernetes_pod_label_taskherd_io_pool"], "target_label": "pool"},
            ],
        }],
    }, sort_keys=False)


def config_files(settings: Settings, namespace: str) -> dict[str, str]:
    return {"alertmanager.yml": alertmanager_config(), "prometheus.yml": prometheus_config(settings, namespace)}


def _digest(data: Any) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def statefulset(component: str, settings: Settings, *, namespace: str, image: str, pull_policy: str,
                storage_class: str | None) -> dict[str, Any]:
    replicas = settings.rabbitmq_nodes if component == "rabbitmq" else 1
    container: dict[str, Any] = {
        "name": component,
        "image": image,
        "imagePullPolicy": pull_policy,
        "args": [component],
        "env": component_env(component, settings),
        "ports": [{"name": name, "containerPort": port} for name, port in PORTS[component].items()],
        "readinessProbe": readiness_probe(component),
        "resources": {"requests": RESOURCES[component]},
        "volumeMounts": [{"name": "data", "mountPath": "/data"}],
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
    }
    if component == "rabbitmq":
        container["ports"] += [{"name": "epmd", "containerPort": 4369}, {"name": "dist", "containerPort": 25672}]
    pod_annotations = {}
    volumes: list[dict[str, Any]] = []
    if component in ("alertmanager", "prometheus"):
        files = config_files(settings, namespace)
        container["volumeMounts"].append({"name": "config", "mountPath": CONFIG_DIR, "readOnly": True})
        volumes.append({"name": "config", "configMap": {"name": CONFIG_MAP}})
        # Neither reloads its configuration by itself: a change rolls the pod.
        pod_annotations[CONFIG_HASH_ANNOTATION] = _digest(files[f"{component}.yml"])
        if component == "prometheus":
            container["volumeMounts"].append({"name": "rules", "mountPath": f"{CONFIG_DIR}/rules", "readOnly": True})
            volumes.append({"name": "rules", "configMap": {"name": PROMETHEUS_RULES_CONFIGMAP}})
    claim_templates = []
    if storage_class:
        claim_templates = [{"metadata": {"name": "data", "labels": selector(component)},
                            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": storage_class,
                                     "resources": {"requests": {"storage": VOLUME_SIZE}}}}]
    else:
        volumes.append({"name": "data", "emptyDir": {}})
    service_name = RABBITMQ_NODES_SERVICE if component == "rabbitmq" else component
    shape = {"claims": claim_templates, "serviceName": service_name,
             "replicas": replicas if component == "rabbitmq" else None}
    pod_spec: dict[str, Any] = {
        "automountServiceAccountToken": component == "prometheus",
        "serviceAccountName": "prometheus" if component == "prometheus" else "default",
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": 30,
        "securityContext": {"runAsNonRoot": True, "runAsUser": SERVICES_UID, "runAsGroup": SERVICES_UID,
                            "fsGroup": SERVICES_UID, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [container],
        "volumes": volumes,
    }
    if replicas > 1:
        # spread the nodes of a RabbitMQ cluster over the cluster's nodes where there are several
        pod_spec["affinity"] = {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
            "weight": 100, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname",
                                               "labelSelector": {"matchLabels": selector(component)}}}]}}
    else:
        # A single server goes to a control-plane node where one takes pods (kind's does, tolerated):
        # the node faults (node loss, drain) aim at worker nodes, and a broker or database on the
        # node they hit would turn the fault into a service outage too.
        pod_spec["tolerations"] = [{"key": CONTROL_PLANE_LABEL, "operator": "Exists", "effect": "NoSchedule"}]
        pod_spec["affinity"] = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
            "weight": 100, "preference": {"matchExpressions": [{"key": CONTROL_PLANE_LABEL, "operator": "Exists"}]}}]}}
    return {
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": component, "namespace": namespace, "labels": labels(component),
                     "annotations": {SHAPE_ANNOTATION: _digest(shape)}},
        "spec": {
            "serviceName": service_name,
            "replicas": replicas,
            # RabbitMQ's nodes must boot together after a full stop: each waits for the peer that
            # stopped last, which OrderedReady would never start. And a broken pod of an old
            # revision is replaced by a rolling update, where OrderedReady waits for it forever.
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": selector(component)},
            "template": {"metadata": {"labels": labels(component), "annotations": pod_annotations},
                         "spec": pod_spec},
            "volumeClaimTemplates": claim_templates,
        },
    }


def service(component: str, namespace: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": component, "namespace": namespace, "labels": labels(component)},
            "spec": {"selector": selector(component),
                     "ports": [{"name": n, "port": p, "targetPort": n} for n, p in PORTS[component].items()]}}


def rabbitmq_nodes_service(namespace: str) -> dict[str, Any]:
    # headless, and listing nodes before they are ready: booting nodes must resolve their peers
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": RABBITMQ_NODES_SERVICE, "namespace": namespace, "labels": labels("rabbitmq")},
            "spec": {"clusterIP": "None", "publishNotReadyAddresses": True, "selector": selector("rabbitmq"),
                     "ports": [{"name": "epmd", "port": 4369}, {"name": "dist", "port": 25672},
                               {"name": "amqp", "port": 5672}]}}


def namespace_object(settings: Settings, namespace: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": namespace,
                         "labels": {"app.kubernetes.io/part-of": PART_OF,
                                    "pod-security.kubernetes.io/enforce": "restricted"},
                         "annotations": {SETTINGS_ANNOTATION: settings.to_json()}}}


def prometheus_rbac(namespace: str) -> list[dict[str, Any]]:
    """Pod discovery reads pods (in every namespace, or the watched ones): a ClusterRole, one per
    services namespace so two deployments never share it."""
    name = cluster_role_name(namespace)
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": "prometheus", "namespace": namespace, "labels": labels("prometheus")}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": name, "labels": labels("prometheus")},
         "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": name, "labels": labels("prometheus")},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
         "subjects": [{"kind": "ServiceAccount", "name": "prometheus", "namespace": namespace}]},
    ]


def cluster_role_name(namespace: str) -> str:
    return f"{namespace}-prometheus"


def render(settings: Settings, *, namespace: str = NAMESPACE, image: str, pull_policy: str = "IfNotPresent",
           storage_class: str | None = None) -> list[dict[str, Any]]:
    """Every object `up` applies (the credentials Secret is created apart: only when missing)."""
    objects: list[dict[str, Any]] = [namespace_object(settings, namespace)]
    if {"alertmanager", "prometheus"} & set(settings.components):
        objects.append({"apiVersion": "v1", "kind": "ConfigMap",
                        "metadata": {"name": CONFIG_MAP, "namespace": namespace, "labels": labels("config")},
                        "data": config_files(settings, namespace)})
    if "prometheus" in settings.components:
        objects += prometheus_rbac(namespace)
        # Applied without data: keys written by tests (server-side apply, another field manager) stay.
        objects.append({"apiVersion": "v1", "kind": "ConfigMap",
                        "metadata": {"name": PROMETHEUS_RULES_CONFIGMAP, "namespace": namespace,
                                     "labels": labels("prometheus")}})
    for component in settings.components:
        objects.append(service(component, namespace))
        if component == "rabbitmq":
            objects.append(rabbitmq_nodes_service(namespace))
        objects.append(statefulset(component, settings, namespace=namespace, image=image,
                                   pull_policy=pull_policy, storage_class=storage_class))
    return objects


def secret(credentials: dict[str, str], namespace: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": SECRET, "namespace": namespace, "labels": labels("credentials")},
            "stringData": credentials}
