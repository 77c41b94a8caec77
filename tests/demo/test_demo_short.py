"""`make demo` in its short form, on the real cluster: the demo is also a test.

It runs the driver exactly as `make demo DEMO_SHORT=1` does (the cluster the e2e helpers pick, the
in-cluster services of e2e/services, the chart with examples/shop/values.yaml) and passes only if
the demo's own verdict does: nothing lost, nothing charged twice, the poison paged, the pool up and
back down. Then `make demo-down` runs, as after any demo, and nothing of the demo may be left: no
release or namespace, no page still firing in Alertmanager.
"""
import json
import struct
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]

from e2e.demo.config import NAMESPACE
from e2e.lib import cluster as clusters
from e2e.services import access, deploy


def run_driver(*args: str, timeout: float) -> subprocess.CompletedProcess:
    """`python -m e2e.demo ARGS` as make runs it."""
    return subprocess.run([sys.executable, "-m", "e2e.demo", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


def firing_demo_alerts(cluster: clusters.Cluster) -> list[dict]:
    deployed = deploy.current(cluster)
    assert deployed is not None, "the in-cluster services are gone: the demo must leave them running"
    with access.reach(cluster, deployed, log=lambda _: None) as host:
        r = httpx.get(f"{host.alertmanager}/api/v2/alerts", timeout=10,
                      params={"filter": f'namespace="{NAMESPACE}"', "active": "true"})
        r.raise_for_status()
        return [a for a in r.json() if a["status"]["state"] == "active"]


@pytest.mark.cluster
@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_short_demo_verdict_passes_and_demo_down_leaves_nothing(tmp_path):
    try:
        run = run_driver("run", "--short", "--runs-dir", str(tmp_path), timeout=1100)
    finally:
        down = run_driver("down", timeout=300)
    output = run.stdout + run.stderr
    summaries = list(tmp_path.glob("*/summary.json"))
    assert summaries, f"the demo wrote no summary.json (exit {run.returncode}):\n{output[-6000:]}"
    summary = json.loads(summaries[0].read_text())
    assert run.returncode == 0 and summary["ok"], (
        f"demo failed (exit {run.returncode}): {summary.get('error')} "
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
    assert "The verdict" in run.stdout and "PASS" in run.stdout
    assert "reached through the API server's port-forward" in run.stdout and "socat" not in output

    # `make demo-down` afterwards: the demo's release, namespace and page are gone
    assert down.returncode == 0, f"demo down failed ({down.returncode}):\n{down.stdout[-3000:]}{down.stderr[-3000:]}"
    cluster = clusters.resolve()
    r = cluster.kubectl("get", "namespace", NAMESPACE, check=False)
    assert r.returncode != 0 and "NotFound" in r.stderr, f"namespace {NAMESPACE} is still there: {r.stdout}"
    assert firing_demo_alerts(cluster) == []
