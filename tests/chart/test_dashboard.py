"""The Grafana dashboard the chart ships (files/grafana-dashboard.json): every panel's query reads metrics
the project exports (names collected from the code) or a documented outside source, and it covers what
users look for: queue wait, replicas vs desired, dead letters, errors, operator and exporter health,
pool and queue variables, annotations for scale events and pages."""
from __future__ import annotations

import json
import re
import subprocess

import pytest
import yaml

from chart_support import CHART, exported_metric_names
from test_rules import promtool

DASHBOARD = json.loads((CHART / "files" / "grafana-dashboard.json").read_text())
#: Series from elsewhere, with where they come from (a panel reading them says so).
EXTERNAL = {"kube_deployment_spec_replicas": "kube-state-metrics",
            "kube_deployment_status_replicas_available": "kube-state-metrics",
            "kube_pod_container_status_restarts_total": "kube-state-metrics",
            "up": "Prometheus", "ALERTS": "Prometheus"}
METRIC = re.compile(r"\b(taskherd_[a-z0-9_]+|kube_[a-z0-9_]+|up|ALERTS)\s*[{\[(]")


def panels() -> list[dict]:
    out = []
    for panel in DASHBOARD["panels"]:
        out += [panel, *panel.get("panels", [])]
    return [p for p in out if p["type"] != "row"]


def metrics_of(expr: str) -> set[str]:
    return set(METRIC.findall(expr))


@pytest.mark.parametrize("panel", panels(), ids=lambda p: p["title"])
def test_every_panel_reads_metrics_the_project_exports(panel):
    exported = exported_metric_names()
    names = set()
    for target in panel["targets"]:
        found = metrics_of(target["expr"])
        assert found, f"{panel['title']}: no metric in {target['expr']!r}"
        names |= found
    unknown = names - exported - set(EXTERNAL)
    assert not unknown, f"{panel['title']} reads metrics nothing exports: {unknown}"
    assert names & exported, f"{panel['title']} reads no metric of the project"
    for source in {EXTERNAL[n] for n in names if n in EXTERNAL} - {"Prometheus"}:
        assert source in panel.get("description", ""), f"{panel['title']} does not say it needs {source}"


def test_annotations_read_exported_metrics_too():
    exported = exported_metric_names()
    names = {a["name"]: metrics_of(a["expr"]) for a in DASHBOARD["annotations"]["list"]}
    assert {"Scale events", "Dead-letter pages"} <= set(names)
    for name, found in names.items():
        assert found and not found - exported - set(EXTERNAL), (name, found)


def test_tasks_finished_never_count_retries():
    finished = [t["expr"] for p in panels() if "finished" in p["title"].lower() for t in p["targets"]]
    assert finished
    for expr in finished:
        for selector in re.findall(r"taskherd_tasks_total\{([^}]*)\}", expr):
            assert 'outcome!="retried"' in selector or (
                'outcome=~"' in selector and "retried" not in selector), expr


def test_it_covers_what_users_look_for_with_pool_and_queue_variables():
    exprs = " ".join(t["expr"] for p in panels() for t in p["targets"])
    for metric in ("taskherd_task_queue_wait_seconds_bucket", "kube_deployment_spec_replicas", "taskherd_dlq_messages",
                   "taskherd_exporter_poll_success", "taskherd_operator_errors_total", "taskherd_tasks_total"):
        assert metric in exprs, metric
    variables = {v["name"]: v for v in DASHBOARD["templating"]["list"]}
    assert {"namespace", "pool", "queue"} <= set(variables)
    assert variables["pool"]["multi"] and variables["queue"]["multi"]
    assert "$pool" in exprs and "$queue" in exprs
    ids = [p["id"] for p in DASHBOARD["panels"]]
    assert len(ids) == len(set(ids))


def test_every_project_metric_an_alert_reads_has_a_panel():
    """What pages must be visible: each of the project's metrics an alert of the rules file reads is
    shown by some panel (an alert on a figure nobody can see over time is hard to act on)."""
    from test_rules import ALERTS

    exprs = " ".join(t["expr"] for p in panels() for t in p["targets"])
    shown = metrics_of(exprs)
    exported = exported_metric_names()
    for rule in ALERTS:
        read = set(re.findall(r"\b(taskherd_[a-z0-9_]+)\b", rule["expr"])) & exported
        assert read <= shown, f"{rule['alert']} reads {read - shown}, which no panel shows"


def test_pool_child_deaths_have_a_panel_by_pool_and_cause():
    """An OOM kill of a pool process restarts nothing (the container lives on): only the worker's
    counter shows it, so the dashboard shows it by pool and cause, over a window, for the chosen pools."""
    (panel,) = [p for p in panels() if any("taskherd_pool_child_deaths_total" in t["expr"] for t in p["targets"])]
    (expr,) = [t["expr"] for t in panel["targets"]]
    by = re.search(r"sum by \(([^)]*)\)", expr)
    assert by and {label.strip() for label in by.group(1).split(",")} == {"pool", "cause"}, expr
    assert re.search(r"increase\(taskherd_pool_child_deaths_total\{[^}]*\}\[(\$__rate_interval|30m)\]\)", expr), expr
    assert 'namespace=~"$namespace"' in expr and 'pool=~"$pool"' in expr, expr
    assert panel["datasource"]["uid"] == "${datasource}"


def test_every_query_is_valid_promql(tmp_path):
    """promtool parses each query (Grafana's variables replaced by what Grafana sends for "All")."""
    def concrete(expr: str) -> str:
        return re.sub(r"\$\{?(namespace|pool|queue)(:regex)?\}?", ".+", expr)

    exprs = [t["expr"] for p in panels() for t in p["targets"]] + [a["expr"] for a in DASHBOARD["annotations"]["list"]]
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query_{i}", "expr": concrete(e)} for i, e in enumerate(exprs)]}]}
    path = tmp_path / "queries.yaml"
    path.write_text(yaml.safe_dump(rules))
    result = subprocess.run([promtool(), "check", "rules", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
