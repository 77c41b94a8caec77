"""checkov over everything the chart renders (all ci/ scenarios, CRDs included): no failure,
and every waiver written down with its reason."""
from __future__ import annotations

import json
import re
import subprocess

import pytest
import yaml

from chart_support import CHART, CI_VALUES, TASKHERD_HOME, helm, template_args

# checkov pins many libraries of its own: it lives in its own venv (mk/chart.mk builds it).
CHECKOV = TASKHERD_HOME / "venv-checkov" / "bin" / "checkov"
CONFIG = CHART / ".checkov.yaml"


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> dict:
    if not CHECKOV.exists():
        pytest.fail(f"checkov not found at {CHECKOV}: run `make chart-test-prereqs`")
    out = tmp_path_factory.mktemp("rendered")
    for values in CI_VALUES:
        rendered = helm(*template_args([values]), "--include-crds").stdout
        (out / f"{values.stem}.yaml").write_text(rendered)
    result = subprocess.run([str(CHECKOV), "-d", str(out), "--config-file", str(CONFIG), "-o", "json"],
                            capture_output=True, text=True, timeout=300)
    data = json.loads(result.stdout)
    (report,) = [r for r in (data if isinstance(data, list) else [data]) if r["check_type"] == "kubernetes"]
    return report


def test_checkov_finds_no_failure(report):
    failures = [f"{c['check_id']} {c['check_name']}: {c['resource']} ({c['file_path']})"
                for c in report["results"]["failed_checks"]]
    assert failures == []
    assert report["summary"]["parsing_errors"] == 0
    # It really scanned the chart: every scenario's objects, hundreds of checks.
    assert report["summary"]["resource_count"] >= 40
    assert report["summary"]["passed"] >= 500


def test_every_waiver_has_a_reason(report):
    # Global waivers: each skip-check entry in .checkov.yaml comes right after a comment naming it.
    text = CONFIG.read_text()
    for check in yaml.safe_load(text)["skip-check"]:
        comment = re.search(rf"((?:^ *#.*\n)+) *- {check}\n", text, re.M)
        assert comment and check in comment.group(1), f"{check} is waived in .checkov.yaml without a reason"
    # Per-object waivers (annotations): each carries its reason, and only two objects have them: the
    # operator (its API token) and the `helm test` pod (no probes on a pod that runs once).
    for c in report["results"]["skipped_checks"]:
        assert c["check_result"].get("suppress_comment"), f"{c['check_id']} on {c['resource']} has no reason"
        assert c["resource"].endswith(("-operator", "-test")), c["resource"]
