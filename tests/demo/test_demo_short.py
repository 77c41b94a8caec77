"""`make demo` in its short form, on the real cluster: the demo is also a test.

It runs the driver exactly as `make demo DEMO_SHORT=1` does (the cluster the e2e helpers pick, the
services on this host, the chart with examples/shop/values.yaml) and passes only if the demo's own
verdict does: nothing lost, nothing charged twice, the poison paged, the pool up and back down.
"""
import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.cluster
@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_short_demo_verdict_passes(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "e2e.demo", "run", "--short", "--runs-dir", str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=1100)
    output = proc.stdout + proc.stderr
    summaries = list(tmp_path.glob("*/summary.json"))
    assert summaries, f"the demo wrote no summary.json (exit {proc.returncode}):\n{output[-6000:]}"
    summary = json.loads(summaries[0].read_text())
    assert proc.returncode == 0 and summary["ok"], (
        f"demo failed (exit {proc.returncode}): {summary.get('error')} "
        f"{(summary.get('verdict') or {}).get('failures')}\n{output[-6000:]}")

    verdict = summary["verdict"]
    assert verdict["lost"] == [] and verdict["duplicated"] == {}
    assert verdict["tasks_sent"] >= 60 and verdict["effects_recorded_once"] >= 60
    assert verdict["pods_killed"] >= 1 and verdict["interrupted_attempts"] >= 1
    assert {d["reason"].split(":")[0] for d in verdict["dlq"]} >= {"permanent-error"}
    assert verdict["alerts"] >= 1
    assert verdict["max_replicas_seen"] > verdict["final_replicas"]
    png = Path(summary["timeline"]).read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", png[16:24])[0] >= 1000
    assert "The verdict" in proc.stdout and "PASS" in proc.stdout
