"""The harness on a real cluster: a failing test's namespace reported and removed, the namespaces of
runs that are gone removed when a session starts, images seen the moment the runtime has them."""
from __future__ import annotations

import logging
import socket
import subprocess
import sys
import uuid

import pytest

from e2e.lib import cluster as clusterlib
from e2e.lib import kind as kindlib
from e2e.lib.pytest_plugin import OWNER_ANNOTATION, TEST_LABEL, remove_leftovers, this_owner

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

#: Read at import, before pytester gives the inner runs a HOME of their own.
TASKHERD_HOME = clusterlib.taskherd_home()


def namespace_phase(cluster: clusterlib.Cluster, name: str) -> str:
    r = cluster.kubectl("get", "namespace", name, "-o", "jsonpath={.status.phase}", check=False)
    return r.stdout if r.returncode == 0 else "gone"


def test_a_failing_test_reports_its_namespace_pods_events_and_logs_then_the_namespace_goes(
        cluster, pytester, tmp_path, monkeypatch):
    marker = tmp_path / "namespace"
    monkeypatch.setenv("TASKHERD_HOME", str(TASKHERD_HOME))  # this run's binaries and cluster
    pytester.makepyfile(f"""
        import json

        def test_fails_with_a_pod_running(cluster, namespace, test_image):
            image, pull = test_image
            cluster.apply(json.dumps({{"apiVersion": "v1", "kind": "Pod", "metadata": {{"name": "talker"}},
                "spec": {{"terminationGracePeriodSeconds": 1, "containers": [{{
                    "name": "main", "image": image, "imagePullPolicy": pull,
                    "command": ["bash", "-c", "echo said-by-the-pod; exec sleep infinity"]}}]}}}}), namespace)
            cluster.wait("the pod's first log line", lambda: cluster.kubectl("-n", namespace, "logs", "talker").stdout, 90)
            open({str(marker)!r}, "w").write(namespace)
            assert False, "failing on purpose"
    """)
    result = pytester.runpytest("-p", "e2e.lib.pytest_plugin")
    result.assert_outcomes(failed=1)
    namespace = marker.read_text()
    result.stdout.fnmatch_lines([f"*- namespace {namespace}: pods, events, logs -*", "*talker*Running*"])
    result.stdout.fnmatch_lines(["*Started*container main*"])  # the events
    result.stdout.fnmatch_lines([f"$ kubectl -n {namespace} logs talker -c main", "said-by-the-pod"])
    cluster.wait(f"namespace {namespace} deleted after the test", lambda: namespace_phase(cluster, namespace), 60,
                 until=lambda phase: phase in ("Terminating", "gone"))


def test_a_session_removes_the_namespaces_of_runs_that_are_gone_and_keeps_running_ones(cluster):
    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    suffix = uuid.uuid4().hex[:6]
    owners = {f"harness-gone-{suffix}": f"{socket.gethostname()}/{finished.stdout.strip()}.1",
              f"harness-running-{suffix}": this_owner()}
    try:
        for name, owner in owners.items():
            cluster.create_namespace(name, {TEST_LABEL: "harness-test"}, {OWNER_ANNOTATION: owner})
        removed = remove_leftovers(cluster)
        assert f"harness-gone-{suffix}" in removed and f"harness-running-{suffix}" not in removed
        assert namespace_phase(cluster, f"harness-gone-{suffix}") in ("Terminating", "gone")
        assert namespace_phase(cluster, f"harness-running-{suffix}") == "Active"
    finally:
        for name in owners:
            cluster.delete_namespace(name)


def containerd_command(cluster: clusterlib.Cluster, node: str) -> list[str]:
    """`ctr` on the k8s.io namespace of a node's containerd (the CRI's images)."""
    if cluster.source == "local":
        return ["ctr", "--address", str(clusterlib.local_containerd_socket()), "-n", "k8s.io"]
    return ["docker", "exec", node, "ctr", "-n", "k8s.io"]


def test_an_image_is_present_the_moment_containerd_has_it(cluster):
    """Regression: the chart tests once read the nodes' `status.images`, which the kubelet fills in on
    a later status update, and failed with "images … are not in the cluster" seconds after the images
    were imported. The CRI answers at once."""
    if cluster.source == "explicit":
        pytest.skip("an explicit cluster's container runtime is not reachable from here: "
                    "require_images waits on the nodes' status.images there")
    base = clusterlib.versions()["BASE_IMAGE"]
    fresh = f"taskherd.local/cri-check-{uuid.uuid4().hex[:8]}:test"
    nodes = cluster.node_names()
    with pytest.raises(clusterlib.ImagesMissing, match=fresh):
        cluster.require_images([fresh])
    try:
        for node in nodes:
            subprocess.run([*containerd_command(cluster, node), "images", "tag", base, fresh],
                           check=True, capture_output=True, timeout=60, env=kindlib.docker_env())
        cluster.require_images([base, fresh])  # no wait: the tag was made a moment ago
        lagging = clusterlib.missing_images([fresh], cluster.node_status_images())
        logging.getLogger(__name__).info("right after the tag, the nodes' status.images lacked it: %s", lagging)
    finally:
        for node in nodes:
            subprocess.run([*containerd_command(cluster, node), "images", "rm", fresh], capture_output=True, timeout=60,
                           env=kindlib.docker_env())
