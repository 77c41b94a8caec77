"""The alert rules the chart ships, tested with promtool on the file the PrometheusRule includes; each
alert reads metrics the project exports and links a runbook section of the README."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from chart_support import BROKER, CHART, REPO, by_kind, exported_metric_names, render

HERE = Path(__file__).parent
RULES = CHART / "files" / "prometheus-rules.yaml"
#: Series the rules read from elsewhere: Prometheus itself, kube-state-metrics, and what the chart
#: records from the values (taskherd.templates prometheusrule.yaml).
EXTERNAL = {"up", "kube_pod_container_status_restarts_total"}
RECORDED = {"taskherd:dead_letter_threshold", "taskherd:workerpools"}
ALERTS = [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def promtool() -> str:
    path = shutil.which("promtool")
    if not path:
        pytest.fail("promtool not found: `make chart-test-prereqs` installs Debian's prometheus package")
    return path


def test_rules_file_is_valid():
    result = subprocess.run([promtool(), "check", "rules", str(RULES)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in result.stdout


def test_alerts_fire_when_they_should_and_stay_quiet_otherwise():
    result = subprocess.run([promtool(), "test", "rules", "rules_test.yaml"], cwd=HERE,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    tested = set(re.findall(r"alertname: (\w+)", (HERE / "rules_test.yaml").read_text()))
    assert tested == {rule["alert"] for rule in ALERTS}


def test_every_alert_reads_exported_metrics_and_links_a_runbook_section():
    exported = exported_metric_names()
    readme = (REPO / "README.md").read_text()
    # GitHub's anchors: lower case, punctuation dropped, spaces to dashes.
    anchors = {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
               for heading in re.findall(r"^#+ (.*)$", readme, re.M)}
    for rule in ALERTS:
        names = set(re.findall(r"\b(?:taskherd[_:][a-z0-9_]+|up|kube_[a-z0-9_]+)\b", rule["expr"]))
        unknown = names - exported - EXTERNAL - RECORDED
        assert not unknown, f"{rule['alert']} reads metrics nothing exports: {unknown}"
        assert names, f"{rule['alert']} reads no metric"
        url = rule["annotations"]["runbook_url"]
        assert url.startswith("https://github.com/taskherd/taskherd/blob/main/README.md#"), url
        assert url.split("#", 1)[1] in anchors, f"{rule['alert']}: README has no section #{url.split('#', 1)[1]}"


def test_the_prometheus_rule_records_each_workerpools_threshold_and_passes_promtool(tmp_path):
    values = {**BROKER, "monitoring": {"prometheusRule": {"enabled": True}},
              "workerPools": [{"name": "fast", "app": "a", "queues": ["orders", "emails"],
                               "autoscaling": {"deadLetter": {"threshold": 5}}},
                              {"name": "fixed", "app": "a", "queues": ["reports"], "replicas": 2,
                               "autoscaling": {"enabled": False}}]}
    (rule,) = by_kind(render(values=values), "PrometheusRule").values()
    groups = {g["name"]: g["rules"] for g in rule["spec"]["groups"]}
    assert groups["taskherd"] == yaml.safe_load(RULES.read_text())["groups"][0]["rules"]
    recorded = {(r["record"], r["labels"].get("queue")): (r["expr"], r["labels"]["namespace"], r["labels"]["release"])
                for r in groups["taskherd-values"] if "record" in r}
    # The autoscaled pool's queues page at its threshold; the fixed pool has no WorkerPool (so none).
    assert recorded == {("taskherd:dead_letter_threshold", "orders"): ("vector(5)", "jobs", "th"),
                        ("taskherd:dead_letter_threshold", "emails"): ("vector(5)", "jobs", "th"),
                        ("taskherd:workerpools", None): ("vector(1)", "jobs", "th")}
    spec = tmp_path / "rules.yaml"
    spec.write_text(yaml.safe_dump(rule["spec"]))
    result = subprocess.run([promtool(), "check", "rules", str(spec)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def rendered_rules(values: dict, release: str = "th", namespace: str = "jobs") -> list[dict]:
    """Every rule of the chart's PrometheusRule, rendered for a release."""
    values = {**values, "monitoring": {"prometheusRule": {"enabled": True}}}
    (rule,) = by_kind(render(values=values, release=release, namespace=namespace), "PrometheusRule").values()
    return [r for g in rule["spec"]["groups"] for r in g["rules"]]


ONE_POOL = {**BROKER, "workerPools": [{"name": "fast", "app": "a", "queues": ["orders"]}]}


@pytest.mark.parametrize("where", ["file", "rendered"])
def test_every_alert_has_a_for_a_severity_a_summary_a_description_and_a_runbook(where):
    """No alert pages on one evaluation (a blip), and every page says what, why and where to look."""
    alerts = ALERTS if where == "file" else [r for r in rendered_rules(ONE_POOL) if "alert" in r]
    assert alerts
    for rule in alerts:
        assert re.fullmatch(r"[1-9][0-9]*[smh]", str(rule.get("for", ""))), f"{rule['alert']} has no `for`"
        assert rule.get("labels", {}).get("severity") in {"info", "warning", "critical"}, rule["alert"]
        for key in ("summary", "description", "runbook_url"):
            assert rule.get("annotations", {}).get(key), f"{rule['alert']} has no {key}"


def _component_of_metrics() -> dict[str, str]:
    """metric name -> the component (pod label app.kubernetes.io/component) whose program exports it,
    read from the code that defines them (as chart_support.exported_metric_names)."""
    from prometheus_client import CollectorRegistry

    from taskherd.commands.exporter import Snapshot, metric_families
    from taskherd.operator.metrics import OperatorMetrics
    from taskherd.worker.components.metrics import TaskMetrics, build_info, heartbeat_timestamp

    worker, operator = CollectorRegistry(), CollectorRegistry()
    TaskMetrics(registry=worker)
    OperatorMetrics(registry=operator)
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",),
                "info": ("_info",), "summary": ("_count", "_sum"), "unknown": ("",)}
    sources = {"worker": [*worker.collect(), heartbeat_timestamp(None), build_info()],
               "exporter": metric_families(Snapshot(), {}), "operator": list(operator.collect())}
    return {f.name + suffix: component for component, families in sources.items()
            for f in families for suffix in suffixes[f.type]}


RELEASE_RELABELLING = {"sourceLabels": ["__meta_kubernetes_pod_label_app_kubernetes_io_instance"],
                       "targetLabel": "release"}


def test_every_series_the_alerts_read_carries_the_release_and_they_group_by_it():
    """Two releases in one namespace: every series an alert reads from the project's programs is scraped
    by a monitor of the chart that adds `release` (the pods' app.kubernetes.io/instance), and every
    aggregation and match of such an alert keeps it, so one release's figures never hide or merge
    with the other's. kube-state-metrics' restarts carry no release: that alert is per pod."""
    objects = render([CHART / "ci" / "monitoring-values.yaml"])
    (pm,) = by_kind(objects, "PodMonitor").values()
    (sm,) = by_kind(objects, "ServiceMonitor").values()
    relabelled = set()
    if all(RELEASE_RELABELLING in e.get("relabelings", []) for e in pm["spec"]["podMetricsEndpoints"]):
        relabelled |= set(next(e for e in pm["spec"]["selector"]["matchExpressions"]
                               if e["key"] == "app.kubernetes.io/component")["values"])
    if all(RELEASE_RELABELLING in e.get("relabelings", []) for e in sm["spec"]["endpoints"]):
        relabelled.add(sm["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"])
    # The pods carry the label the monitors read.
    for d in by_kind(objects, "Deployment").values():
        assert d["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/instance"] == "th"
    component = _component_of_metrics()
    component["up"] = "any"  # a target's own series: the labels of whichever monitor scraped it
    for rule in rendered_rules(ONE_POOL):
        expr = rule["expr"]
        names = set(re.findall(r"\b(?:taskherd_[a-z0-9_]+|up|kube_[a-z0-9_]+)\b", expr))
        if names <= EXTERNAL - {"up"}:
            continue
        for name in names & set(component):
            assert component[name] in relabelled or component[name] == "any", (rule.get("alert"), name)
        if "up" in names:
            assert {"worker", "exporter", "operator"} <= relabelled
        for labels in re.findall(r"\b(?:by|on)\s*\(([^)]*)\)", expr):
            assert "release" in {label.strip() for label in labels.split(",")}, (rule.get("alert"), labels)
        if "absent(" in expr:
            assert 'release="th"' in expr and 'namespace="jobs"' in expr, expr
    recorded = [r for r in rendered_rules(ONE_POOL) if "record" in r]
    assert recorded and all(r["labels"]["release"] == "th" for r in recorded)


def _exporter_runs(values: dict) -> bool:
    return any(o["kind"] == "Deployment" and o["metadata"]["labels"].get("app.kubernetes.io/component") == "exporter"
               for o in render(values=values))


@pytest.mark.parametrize("values", [
    ONE_POOL,
    {**ONE_POOL, "exporter": {"enabled": False}},
    {**BROKER, "operator": {"enabled": False}, "workerPools": [
        {"name": "fixed", "app": "a", "queues": ["r"], "replicas": 1, "autoscaling": {"enabled": False}}]},
    {**BROKER, "workerPools": [{"name": "fixed", "app": "a", "queues": ["r"], "replicas": 1,
                                "autoscaling": {"enabled": False}}]},
    {**BROKER, "exporter": {"enabled": False}, "workerPools": [
        {"name": "fixed", "app": "a", "queues": ["r"], "replicas": 1, "autoscaling": {"enabled": False}}]},
], ids=["exporter", "no-exporter", "no-operator", "fixed-pool", "fixed-pool-no-exporter"])
def test_the_missing_exporter_rules_exist_exactly_when_the_release_runs_the_exporter(values):
    """The PrometheusRule's absent() rules mirror exporter-deployment.yaml's condition: without an
    exporter they would page for ever; with one, they are what catches its pod not running."""
    absent = {r["alert"] for r in rendered_rules(values) if "absent(" in r.get("expr", "")}
    expected = {"TaskherdExporterDown", "TaskherdExporterFailing"} if _exporter_runs(values) else set()
    assert absent == expected


def _alert(name: str, labels: dict, annotations: dict) -> dict:
    return {"exp_labels": {"severity": "warning", **labels}, "exp_annotations": annotations}


def test_two_releases_in_one_namespace_and_a_missing_exporter_with_the_rendered_rules(tmp_path):
    """promtool on the PrometheusRules of two releases, a and b, in one namespace, both with a queue
    `orders` (a's WorkerPool pages at 5 dead letters, b's at 2): their recorded series do not collide
    and each release pages at its own threshold. b's exporter pod is evicted at 3m and not replaced
    (Pending: no target, no series at all): TaskherdExporterDown and TaskherdExporterFailing fire for
    b after their `for`, while a's exporter, up and polling, keeps them quiet for a; b's dead-letter
    page, meanwhile, stays up on its last figures."""
    files, recorded = [], {}
    for release, threshold in (("a", 5), ("b", 2)):
        values = {**BROKER, "workerPools": [{"name": "fast", "app": "a", "queues": ["orders"],
                                             "autoscaling": {"deadLetter": {"threshold": threshold}}}]}
        values = {**values, "monitoring": {"prometheusRule": {"enabled": True}}}
        (rule,) = by_kind(render(values=values, release=release), "PrometheusRule").values()
        groups = rule["spec"]["groups"]
        recorded[release] = {(r["record"], tuple(sorted(r["labels"].items())))
                             for g in groups for r in g["rules"] if "record" in r}
        # The file's alerts are the same rules in both PrometheusRules (each evaluates every
        # namespace); promtool refuses two identical rules writing one ALERTS series, so b's
        # PrometheusRule contributes what is its own: the group of its values.
        if release == "b":
            groups = [g for g in groups if g["name"] == "taskherd-values"]
        path = tmp_path / f"{release}.yaml"
        path.write_text(yaml.safe_dump({"groups": groups}))
        files.append(str(path))
    assert recorded["a"] and recorded["b"]
    assert not recorded["a"] & recorded["b"], "two releases record the same series: duplicate samples"
    by_name = {r["alert"]: r["annotations"] for r in ALERTS}
    down, failing, dead = (by_name[n] for n in ("TaskherdExporterDown", "TaskherdExporterFailing",
                                                 "TaskherdDeadLetterQueue"))

    def exporter(release: str, values: str, dlq: str) -> list[dict]:
        pod = f'namespace="jobs",release="{release}",pod="{release}-taskherd-exporter-1"'
        return [{"series": f'up{{{pod},container="taskherd-exporter"}}', "values": values},
                {"series": f"taskherd_exporter_poll_success{{{pod}}}", "values": values},
                {"series": f"taskherd_exporter_last_poll_timestamp_seconds{{{pod}}}",
                 "values": "0+60x12" if "stale" not in values else "0+60x2 stale"},
                {"series": f'taskherd_dlq_messages{{{pod},queue="orders",dlq="orders.dlq"}}', "values": dlq}]

    page = {"labels": {"severity": "warning", "namespace": "jobs", "release": "b", "queue": "orders",
                       "dlq": "orders.dlq"},
            "annotations": {"summary": "Dead-letter queue orders.dlq holds 2 message(s)",
                            "description": dead["description"].replace("{{ $labels.namespace }}", "jobs")
                            .replace("{{ $labels.queue }}", "orders"),
                            "runbook_url": dead["runbook_url"]}}
    exporter_down = {
        "labels": {"severity": "warning", "namespace": "jobs", "release": "b", "container": "taskherd-exporter"},
        "annotations": {"summary": "No queue exporter of release b in jobs is scraped",
                        "description": down["description"], "runbook_url": down["runbook_url"]}}
    exporter_failing = {
        "labels": {"severity": "warning", "namespace": "jobs", "release": "b"},
        "annotations": {"summary": "No queue exporter of release b in jobs serves queue figures",
                        "description": failing["description"].replace("{{ $labels.namespace }}", "jobs"),
                        "runbook_url": failing["runbook_url"]}}

    def expect(at: str, alertname: str, *alerts: dict) -> dict:
        return {"eval_time": at, "alertname": alertname,
                "exp_alerts": [{"exp_labels": a["labels"], "exp_annotations": a["annotations"]} for a in alerts]}

    spec = {"rule_files": files, "evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        "input_series": exporter("a", "1x12", "3x12") + exporter("b", "1x2 stale", "2x2 stale"),
        "alert_rule_test": [
            expect("6m", "TaskherdDeadLetterQueue", page),
            # b's exporter is gone since 3m: pending, then firing after 5 minutes of no series at all
            expect("7m", "TaskherdExporterDown"), expect("7m", "TaskherdExporterFailing"),
            expect("9m", "TaskherdExporterDown", exporter_down),
            expect("9m", "TaskherdExporterFailing", exporter_failing),
            expect("9m", "TaskherdDeadLetterQueue", page),
        ]}]}
    test_file = tmp_path / "test.yaml"
    test_file.write_text(yaml.safe_dump(spec))
    result = subprocess.run([promtool(), "test", "rules", str(test_file)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
