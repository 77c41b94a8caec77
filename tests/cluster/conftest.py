"""Fixtures for tests that need a Kubernetes cluster (marker `cluster`).

The cluster is chosen by e2e/lib/cluster.py: an explicit kubeconfig, else kind, else the local
cluster of `make cluster`. An unreachable cluster FAILS the tests with the exact error (and the
tail of `make cluster`'s output), it never skips them.
"""
from __future__ import annotations

import logging
import os
import sys
import uuid
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))  # for e2e.lib

from e2e.lib import cluster as clusterlib  # noqa: E402

TEST_LABEL = "taskherd.io/test"
TEST_LABEL_VALUE = "cluster-smoke"


@pytest.fixture(scope="session")
def k8s() -> clusterlib.Cluster:
    logging.getLogger("taskherd.e2e").setLevel(logging.INFO)
    c = clusterlib.resolve()
    try:
        c.check_reachable()
    except clusterlib.ClusterUnavailable as e:
        pytest.fail(str(e), pytrace=False)
    # namespaces a previous, interrupted run left behind
    c.kubectl("delete", "namespace", "-l", f"{TEST_LABEL}={TEST_LABEL_VALUE}", "--wait=false",
              "--ignore-not-found", check=False)
    return c


@pytest.fixture(scope="session")
def test_image(k8s) -> tuple[str, str]:
    """(image, pullPolicy) for the smoke tests' pods: a Debian image with a shell and python3.
    Locally the debootstrap base imported by `make cluster`; elsewhere TASKHERD_TEST_IMAGE."""
    if os.environ.get("TASKHERD_TEST_IMAGE"):
        return os.environ["TASKHERD_TEST_IMAGE"], "IfNotPresent"
    return clusterlib.versions()["BASE_IMAGE"], "Never" if k8s.is_local else "IfNotPresent"


@pytest.fixture
def namespace(k8s, request) -> str:
    """A fresh namespace for one test, labelled for cleanup, deleted afterwards."""
    base = "".join(ch if ch.isalnum() else "-" for ch in request.node.name.lower())[:30].strip("-")
    name = f"smoke-{base}-{uuid.uuid4().hex[:6]}"
    k8s.apply(f"""
apiVersion: v1
kind: Namespace
metadata:
  name: {name}
  labels:
    {TEST_LABEL}: {TEST_LABEL_VALUE}
""")
    # the namespace's default ServiceAccount is created asynchronously; pods need it
    clusterlib.wait_for(f"default ServiceAccount in {name}",
                        lambda: k8s.kubectl("-n", name, "get", "sa", "default", check=False).returncode == 0,
                        timeout=60, interval=0.5)
    yield name
    k8s.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)
