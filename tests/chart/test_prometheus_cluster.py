"""The chart's monitoring against a real Prometheus and Alertmanager on the cluster.

The chart is installed (a worker pool scaled by the operator, the queue exporter, two operator
replicas) in a test namespace, with a Redis of the in-cluster services (e2e/services) as its broker.
Prometheus and Alertmanager of the same services run in a second namespace of this test's own:
Prometheus discovers the release's pods, scrapes every container port named `metrics` and loads the
alert rules of the chart's PrometheusRule as `helm template` renders them for this release. Then a
task that can never succeed is sent; the worker dead-letters it, the exporter counts it, and the
chart's `TaskherdDeadLetterQueue` fires in Prometheus and is listed by Alertmanager with the pool's
labels; emptying the DLQ resolves it in both.

The rules are loaded as rendered, with one change: `TaskherdDeadLetterQueue` waits 10 s instead of
its `for: 5m` (so that the test takes minutes, not ten); `promtool test rules` checks the real
durations (test_rules.py).
"""
from __future__ import annotations

import json
import logging
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from celery import Celery

from chart_support import CHART, by_kind, render
from e2e.chaos import images as pinned_images
from e2e.lib.pytest_plugin import create_test_namespace
from e2e.lib.waiting import wait_for
from e2e.services import access, deploy
from e2e.services.config import PROMETHEUS_RULES_CONFIGMAP
from e2e.services.endpoints import in_cluster
from taskherd.commands import dlq

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.timeout(600)]
log = logging.getLogger("taskherd.e2e.chart.prometheus")
# one line per poll of Prometheus' API would bury the waits' own progress lines
logging.getLogger("httpx").setLevel(logging.WARNING)

APP = Path(__file__).parent / "apps" / "chart_app.py"
POOL, QUEUE, DLQ = "work", "monitored", "monitored.dlq"
ALERT = "TaskherdDeadLetterQueue"
#: the alert's `for` in this test (the chart's is 5m): pending, then firing after one more evaluation
ALERT_FOR = "10s"
SERVICES = ("redis", "alertmanager", "prometheus")
BROKER_DATABASE = 1
#: what the release runs, by the pod label app.kubernetes.io/component: pods scraped
SCRAPED = {"worker": 1, "exporter": 1, "operator": 2}


class Monitoring:
    """The release, and this host's way to its broker, Prometheus and Alertmanager."""

    def __init__(self, *, namespace: str, release: str, broker_url: str, prometheus: str, alertmanager: str) -> None:
        self.namespace, self.release = namespace, release
        self.broker_url = broker_url
        self.prometheus, self.alertmanager = prometheus, alertmanager
        self.workerpool = f"{release}-taskherd-{POOL}"

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's vector: [{"metric": {labels}, "value": [time, "value"]}]."""
        response = httpx.get(f"{self.prometheus}/api/v1/query", params={"query": expr}, timeout=10)
        response.raise_for_status()
        return response.json()["data"]["result"]

    def one(self, expr: str) -> float | None:
        """The value of a query expected to give at most one series (None: no series)."""
        result = self.query(expr)
        assert len(result) <= 1, f"{expr} gave {len(result)} series: {result}"
        return float(result[0]["value"][1]) if result else None

    def targets(self) -> list[dict[str, Any]]:
        response = httpx.get(f"{self.prometheus}/api/v1/targets", params={"state": "active"}, timeout=10)
        response.raise_for_status()
        return [t for t in response.json()["data"]["activeTargets"] if t["labels"].get("namespace") == self.namespace]

    def prometheus_alerts(self) -> list[dict[str, Any]]:
        response = httpx.get(f"{self.prometheus}/api/v1/alerts", timeout=10)
        response.raise_for_status()
        return [a for a in response.json()["data"]["alerts"]
                if a["labels"].get("alertname") == ALERT and a["labels"].get("namespace") == self.namespace]

    def alertmanager_alerts(self) -> list[dict[str, Any]]:
        """What Alertmanager's v2 API lists (active, silenced, inhibited; resolved ones are not)."""
        response = httpx.get(f"{self.alertmanager}/api/v2/alerts", timeout=10, params=[
            ("filter", f'alertname="{ALERT}"'), ("filter", f'namespace="{self.namespace}"')])
        response.raise_for_status()
        return response.json()

    def rules(self) -> list[dict[str, Any]]:
        response = httpx.get(f"{self.prometheus}/api/v1/rules", timeout=10)
        response.raise_for_status()
        return [rule for group in response.json()["data"]["groups"] for rule in group["rules"]]


def chart_values(images: dict[str, pinned_images.Image], services_namespace: str) -> dict[str, Any]:
    """One small autoscaled pool; broker and metrics traffic allowed between the two namespaces by
    the chart's NetworkPolicies (enforced on kind; the local cluster's bridge network does not)."""
    def image(component: str) -> dict[str, str]:
        registry, repository = images[component].repository.split("/", 1)
        return {"registry": registry, "repository": repository, "tag": images[component].tag, "pullPolicy": "Never"}

    services_pods = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": services_namespace}}}
    return {
        "broker": {"existingSecret": {"name": "broker"}, "ports": [6379], "networkPeers": [
            {**services_pods, "podSelector": {"matchLabels": {"app.kubernetes.io/name": "redis"}}}]},
        "networkPolicy": {"metricsIngress": {"enabled": True, "from": [
            {**services_pods, "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}]}},
        "workerPoolDefaults": {"image": image("worker")},
        "operator": {"image": image("operator")},
        "exporter": {"image": image("worker"), "intervalSeconds": 5},
        "workerPools": [{
            "name": POOL, "app": "chart_app", "queues": [QUEUE], "concurrency": 1,
            "resources": {"requests": {"cpu": "10m", "memory": "96Mi"}, "limits": {"memory": "384Mi"}},
            "autoscaling": {"minReplicas": 1, "maxReplicas": 1, "pollIntervalSeconds": 5},
            "env": [{"name": "PYTHONPATH", "value": "/app"}],
            "extraVolumes": [{"name": "app", "configMap": {"name": "chart-app"}}],
            "extraVolumeMounts": [{"name": "app", "mountPath": "/app", "readOnly": True}],
        }],
    }


def rendered_rules(values: dict[str, Any], *, release: str, namespace: str) -> dict[str, Any]:
    """The rule groups of the chart's PrometheusRule for this release, as a Prometheus rule file,
    with the dead-letter alert's `for` shortened (the one change)."""
    objects = render(values={**values, "monitoring": {"prometheusRule": {"enabled": True}}},
                     release=release, namespace=namespace)
    (rule,) = by_kind(objects, "PrometheusRule").values()
    groups = rule["spec"]["groups"]
    (alert,) = [r for g in groups for r in g["rules"] if r.get("alert") == ALERT]
    assert alert["for"] == "5m", alert
    alert["for"] = ALERT_FOR
    return {"groups": groups}


@pytest.fixture(scope="module")
def monitoring(cluster, request, tmp_path_factory):
    started = time.monotonic()
    images = pinned_images.pinned(cluster, log.info)
    namespace = create_test_namespace(cluster, request, labels={"pod-security.kubernetes.io/enforce": "restricted"})
    services_namespace = create_test_namespace(cluster, request)
    release = "th" + uuid.uuid4().hex[:5]
    values = chart_values(images, services_namespace)
    rules = rendered_rules(values, release=release, namespace=namespace)
    # The rules are there before Prometheus starts: no wait for the kubelet to refresh the volume.
    cluster.kubectl("apply", "--server-side", "--field-manager=taskherd-chart-test", "-f", "-", input=json.dumps({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": PROMETHEUS_RULES_CONFIGMAP, "namespace": services_namespace},
        "data": {"taskherd.yml": yaml.safe_dump(rules)}}))
    values_file = tmp_path_factory.mktemp("values") / "values.yaml"
    values_file.write_text(yaml.safe_dump(values))
    try:
        with ThreadPoolExecutor(max_workers=1) as background:
            # The services and the release start together: workers retry the broker until Redis
            # answers, and the first test waits until Prometheus scrapes every pod.
            services_up = background.submit(deploy.up, cluster, namespace=services_namespace, components=SERVICES,
                                            prometheus_namespaces=(namespace,), log=log.info)
            credentials = wait_for("the services' credentials", lambda: deploy.read_credentials(
                cluster, services_namespace), timeout=300, interval=1, ignoring=(deploy.ServicesError,))
            # The Redis is this test's alone: any database index will do.
            pods = in_cluster(credentials, namespace=services_namespace, components=SERVICES)
            cluster.kubectl("-n", namespace, "create", "secret", "generic", "broker",
                            f"--from-literal=url={pods.redis_db(BROKER_DATABASE)}")
            cluster.kubectl("-n", namespace, "create", "configmap", "chart-app", f"--from-file=chart_app.py={APP}")
            result = cluster.helm("install", release, str(CHART), "-n", namespace, "-f", str(values_file),
                                  check=False, timeout=120)
            if result.returncode != 0:
                pytest.fail(f"helm install failed: {result.stderr}", pytrace=False)
            services = services_up.result()
        with access.reach(cluster, services, log=log.info) as host:
            log.info("release %s installed and services ready %.0f s after the start", release,
                     time.monotonic() - started)
            yield Monitoring(namespace=namespace, release=release, broker_url=host.redis_db(BROKER_DATABASE),
                             prometheus=host.prometheus, alertmanager=host.alertmanager)
    finally:
        # The namespace and the ClusterRole that lets Prometheus discover pods; the release's
        # namespace goes with the test harness's cleanup.
        deploy.down(cluster, namespace=services_namespace, log=log.info)


def test_prometheus_scrapes_workers_exporter_and_operator(monitoring):
    def health_by_component():
        seen: dict[str, list[str]] = {}
        for target in monitoring.targets():
            seen.setdefault(target["labels"].get("component", "?"), []).append(target["health"])
        return seen

    # from `helm install`: the pods start, become ready and are discovered and scraped
    wait_for("every pod of the release scraped and up (component: target health)", health_by_component,
             timeout=240, interval=2,
             until=lambda seen: {c: len(h) for c, h in seen.items()} == SCRAPED
             and all(h == "up" for hs in seen.values() for h in hs))

    ns, pool = monitoring.namespace, POOL
    # The worker: its main loop's heartbeat, labelled with its pool and container as the chart's
    # PodMonitor labels it (TaskherdHeartbeatStale and TaskherdTaskErrorRateHigh group by them).
    heartbeat = wait_for("the worker's heartbeat in Prometheus", lambda: monitoring.one(
        f'taskherd_heartbeat_timestamp_seconds{{namespace="{ns}",pool="{pool}",container="taskherd-worker"}}'),
        timeout=60, interval=2)
    assert time.time() - heartbeat < 60, f"the worker's last heartbeat is {time.time() - heartbeat:.0f} s old"
    # The exporter: polling the broker, and the (empty) DLQ of the pool's queue.
    assert wait_for("the exporter's last poll succeeded", lambda: monitoring.one(
        f'taskherd_exporter_poll_success{{namespace="{ns}",container="taskherd-exporter"}}'),
        timeout=60, interval=2) == 1
    assert monitoring.one(f'taskherd_dlq_messages{{namespace="{ns}",queue="{QUEUE}",dlq="{DLQ}"}}') == 0
    # The operator: one leader of two replicas, polling the WorkerPool (its own `namespace` and
    # `workerpool` labels kept).
    assert wait_for("operator replicas holding the Lease", lambda: monitoring.one(
        f'sum(taskherd_operator_leader{{namespace="{ns}",container="taskherd-operator"}})'),
        timeout=60, interval=2) == 1
    assert wait_for("the operator's polls of the WorkerPool", lambda: monitoring.one(
        f'sum(taskherd_operator_poll_duration_seconds_count{{namespace="{ns}",'
        f'workerpool="{monitoring.workerpool}"}})'), timeout=60, interval=2, until=lambda n: n and n > 0)


def test_the_charts_rules_load_and_evaluate_in_prometheus(monitoring):
    chart_alerts = {r["alert"] for g in yaml.safe_load((CHART / "files" / "prometheus-rules.yaml").read_text())["groups"]
                    for r in g["rules"]}

    def evaluated():
        rules = monitoring.rules()
        # a rule not evaluated yet has the zero time
        return rules if rules and not any(r["lastEvaluation"].startswith("0001") for r in rules) else None

    rules = wait_for("every rule evaluated once", evaluated, timeout=60, interval=2)
    assert {r["name"] for r in rules if r["type"] == "alerting"} == chart_alerts
    assert {r["name"] for r in rules if r["type"] == "recording"} == {"taskherd:dead_letter_threshold",
                                                                       "taskherd:workerpools"}
    broken = {r["name"]: r.get("lastError") for r in rules if r["health"] != "ok"}
    assert broken == {}, f"rules Prometheus cannot evaluate: {broken}"


def test_a_dead_letter_fires_the_charts_alert_and_reaches_alertmanager(monitoring):
    producer = Celery(broker=monitoring.broker_url)
    try:
        producer.send_task("chart.refuse", args=("the monitoring test's dead letter",), queue=QUEUE)
    finally:
        producer.close()

    ns = monitoring.namespace
    # The worker ran it and dead-lettered it, and says so.
    wait_for("the worker's dead_lettered count in Prometheus", lambda: monitoring.one(
        f'sum(taskherd_tasks_total{{namespace="{ns}",pool="{POOL}",outcome="dead_lettered"}})'),
        timeout=90, interval=2, equals=1)
    # The exporter counts the DLQ, and the alert fires after its `for`.
    wait_for(f"{DLQ} depth in Prometheus", lambda: monitoring.one(
        f'taskherd_dlq_messages{{namespace="{ns}",queue="{QUEUE}",dlq="{DLQ}"}}'), timeout=60, interval=2, equals=1)
    started = time.monotonic()
    wait_for(f"{ALERT} firing in Prometheus (states)",
             lambda: [a["state"] for a in monitoring.prometheus_alerts()], timeout=60, interval=1,
             equals=["firing"])
    log.info("%s firing %.0f s after the DLQ depth reached Prometheus", ALERT, time.monotonic() - started)

    (alert,) = wait_for(f"{ALERT} listed by Alertmanager", monitoring.alertmanager_alerts, timeout=60, interval=1)
    labels = alert["labels"]
    assert {k: labels.get(k) for k in ("alertname", "namespace", "queue", "dlq", "severity")} == {
        "alertname": ALERT, "namespace": ns, "queue": QUEUE, "dlq": DLQ, "severity": "warning"}, labels
    assert alert["status"]["state"] == "active", alert["status"]
    assert alert["annotations"]["summary"] == f"Dead-letter queue {DLQ} holds 1 message(s)"
    assert alert["annotations"]["runbook_url"].endswith("#runbook-the-dead-letter-alert-fired")

    # Emptied as an operator would, with the CLI: the alert resolves in Prometheus and Alertmanager.
    assert dlq.main(["purge", "-b", monitoring.broker_url, "-Q", QUEUE, "--force"]) == 0
    wait_for(f"{ALERT} gone from Prometheus", monitoring.prometheus_alerts, timeout=60, interval=1, equals=[])
    wait_for(f"{ALERT} resolved in Alertmanager", monitoring.alertmanager_alerts, timeout=60, interval=1, equals=[])
