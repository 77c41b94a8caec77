"""Node-level faults on the multi-node kind cluster, with the primitives of e2e/lib/kind.py that the
chaos suite uses: a worker node lost without warning, and a worker node drained under a
PodDisruptionBudget. In both, the work moves to the surviving worker.

Needs the kind cluster (E2E_CLUSTER=kind, `make kind-cluster`): on any other cluster these tests fail
saying so; deselect them with `-m 'not kind'`.
"""
from __future__ import annotations

import json
import threading
import time

import pytest

from e2e.lib import cluster as clusterlib
from e2e.lib import kind as kindlib

pytestmark = [pytest.mark.cluster, pytest.mark.kind, pytest.mark.slow, pytest.mark.timeout(600)]

APP = "spread"
#: How long a pod stays bound to a node that stopped reporting: the default (300 s, set by the
#: DefaultTolerationSeconds admission plugin) is shortened so that the test sees the move quickly.
EVICTION_SECONDS = 5


@pytest.fixture(scope="module")
def workers(cluster) -> list[str]:
    if cluster.source != "kind":
        pytest.fail(f"node faults need the multi-node kind cluster, this is the {cluster.source} cluster: run "
                    "with E2E_CLUSTER=kind (make kind-cluster), or deselect with -m 'not kind'", pytrace=False)
    names = kindlib.nodes("worker")
    if len(names) < 2:
        pytest.fail(f"node faults need two worker nodes, the kind cluster has {names}", pytrace=False)
    return names


def deploy(cluster, namespace: str, image: tuple[str, str], replicas: int) -> None:
    tolerations = [{"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": EVICTION_SECONDS}
                   for key in ("node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready")]
    cluster.apply(json.dumps({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": APP},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": APP}},
            "template": {
                "metadata": {"labels": {"app": APP}},
                "spec": {
                    "terminationGracePeriodSeconds": 1,
                    "tolerations": tolerations,
                    "topologySpreadConstraints": [{
                        "maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                        "whenUnsatisfiable": "ScheduleAnyway", "labelSelector": {"matchLabels": {"app": APP}}}],
                    "containers": [{"name": "app", "image": image[0], "imagePullPolicy": image[1],
                                    "command": ["sleep", "infinity"]}],
                },
            },
        },
    }), namespace=namespace)
    cluster.kubectl("-n", namespace, "rollout", "status", f"deployment/{APP}", "--timeout=120s", timeout=150)


def placement(cluster, namespace: str) -> dict[str, list[str]]:
    """Ready, not terminating pods of the app by node."""
    out: dict[str, list[str]] = {}
    for pod in cluster.kubectl_json("-n", namespace, "get", "pods", "-l", f"app={APP}")["items"]:
        ready = any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions", []))
        if ready and not pod["metadata"].get("deletionTimestamp"):
            out.setdefault(pod["spec"]["nodeName"], []).append(pod["metadata"]["name"])
    return out


def all_ready_on(cluster, namespace: str, node: str, count: int) -> bool:
    now = placement(cluster, namespace)
    return list(now) == [node] and len(now[node]) == count


def test_lost_node_work_moves_to_the_surviving_worker(cluster, namespace, test_image, workers):
    deploy(cluster, namespace, test_image, replicas=2)
    before = placement(cluster, namespace)
    lost = next(n for n in workers if n in before)
    survivor = next(n for n in workers if n != lost)
    t0 = time.monotonic()
    kindlib.lose_node(lost)
    try:
        clusterlib.wait_for(f"node {lost} NotReady", lambda: not kindlib.node_ready(cluster, lost),
                            timeout=120, interval=2)
        noticed = time.monotonic() - t0
        clusterlib.wait_for(f"both replicas ready on {survivor}, none on {lost}",
                            lambda: all_ready_on(cluster, namespace, survivor, 2), timeout=120, interval=2)
        print(f"node {lost} lost: NotReady after {noticed:.0f} s, both replicas ready on {survivor} "
              f"after {time.monotonic() - t0:.0f} s")
    finally:
        kindlib.restore_node(cluster, lost)


def test_drain_honours_the_pod_disruption_budget(cluster, namespace, test_image, workers):
    drained, other = workers[0], workers[1]
    # Both replicas on the node to drain: with the other worker cordoned they have nowhere else.
    cluster.kubectl("cordon", other)
    try:
        deploy(cluster, namespace, test_image, replicas=2)
    finally:
        kindlib.uncordon(cluster, other)
    assert list(placement(cluster, namespace)) == [drained]
    cluster.apply(json.dumps({
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": APP},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": APP}}},
    }), namespace=namespace)
    clusterlib.wait_for("the PDB to allow one disruption", lambda: cluster.kubectl_json(
        "-n", namespace, "get", "pdb", APP).get("status", {}).get("disruptionsAllowed") == 1, timeout=30, interval=1)

    ready_counts = []
    stop = threading.Event()

    def watch_ready() -> None:
        while not stop.is_set():
            ready_counts.append(sum(len(v) for v in placement(cluster, namespace).values()))
            time.sleep(0.3)

    watcher = threading.Thread(target=watch_ready, daemon=True)
    watcher.start()
    try:
        output = kindlib.drain(cluster, drained, f"app={APP}", timeout=240)
    finally:
        stop.set()
        watcher.join(timeout=10)
        kindlib.uncordon(cluster, drained)
    assert "disruption budget" in output, f"no eviction was held back by the PDB; drain said:\n{output}"
    assert min(ready_counts) >= 1, f"ready replicas fell to {min(ready_counts)} during the drain"
    clusterlib.wait_for(f"both replicas ready on {other}", lambda: all_ready_on(cluster, namespace, other, 2),
                        timeout=60, interval=1)
