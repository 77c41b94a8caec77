"""The alert rules the chart ships, tested with promtool on the file the PrometheusRule includes."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from chart_support import CHART

HERE = Path(__file__).parent
RULES = CHART / "files" / "prometheus-rules.yaml"


def promtool() -> str:
    path = shutil.which("promtool")
    if not path:
        pytest.fail("promtool not found: `make chart-test-prereqs` installs Debian's prometheus package")
    return path


def test_rules_file_is_valid():
    result = subprocess.run([promtool(), "check", "rules", str(RULES)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 5 rules found" in result.stdout


def test_alerts_fire_when_they_should_and_stay_quiet_otherwise():
    result = subprocess.run([promtool(), "test", "rules", "rules_test.yaml"], cwd=HERE,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
