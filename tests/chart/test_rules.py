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
    recorded = {(r["record"], r["labels"].get("queue")): (r["expr"], r["labels"]["namespace"])
                for r in groups["taskherd-values"]}
    # The autoscaled pool's queues page at its threshold; the fixed pool has no WorkerPool (so none).
    assert recorded == {("taskherd:dead_letter_threshold", "orders"): ("vector(5)", "jobs"),
                        ("taskherd:dead_letter_threshold", "emails"): ("vector(5)", "jobs"),
                        ("taskherd:workerpools", None): ("vector(1)", "jobs")}
    spec = tmp_path / "rules.yaml"
    spec.write_text(yaml.safe_dump(rule["spec"]))
    result = subprocess.run([promtool(), "check", "rules", str(spec)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
