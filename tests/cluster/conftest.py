"""Fixtures for tests that need a Kubernetes cluster (marker `cluster`).

The cluster is chosen by e2e/lib/cluster.py: an explicit kubeconfig, else kind, else the local
cluster of `make cluster`. An unreachable cluster FAILS the tests with the exact error (and the
tail of `make cluster`'s output), it never skips them.
"""
from __future__ import annotations

import logging
import sys
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
    """(image, pullPolicy) for the smoke tests' pods: a Debian image with a shell and python3."""
    return k8s.test_image()


@pytest.fixture
def namespace(k8s, request) -> str:
    """A fresh namespace for one test, labelled for cleanup, deleted afterwards."""
    name = k8s.create_test_namespace("smoke", request.node.name, {TEST_LABEL: TEST_LABEL_VALUE})
    yield name
    k8s.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)
