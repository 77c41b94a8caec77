"""Fixtures for the in-cluster services' cluster tests: the cluster the e2e suite resolves, the
services deployed there (e2e/services), and this host's way to them."""
from __future__ import annotations

import uuid

import pytest

from e2e.services import access, deploy

#: scratch services namespaces of these tests carry it, so a killed run's are found and removed
SCRATCH_LABEL = "taskherd.io/services-test"


@pytest.fixture(scope="session")
def services(cluster) -> deploy.Deployed:
    """The shared services (namespace taskherd-services), as the demo and the chaos suite use them."""
    return deploy.up(cluster, log=print)


@pytest.fixture(scope="session")
def host(cluster, services):
    """The URLs this host reaches the shared services at (tunnels for the session)."""
    with access.reach(cluster, services, log=print) as endpoints:
        yield endpoints


@pytest.fixture
def scratch_namespace(cluster) -> str:
    """A name for a services deployment of one test's own; removed afterwards (and leftovers of an
    interrupted run at the start)."""
    cluster.kubectl("delete", "namespace", "-l", f"{SCRATCH_LABEL}=true", "--wait=false", "--ignore-not-found",
                    check=False)
    name = f"services-test-{uuid.uuid4().hex[:6]}"
    cluster.apply(f"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {name}\n  labels:\n    {SCRATCH_LABEL}: 'true'\n")
    yield name
    deploy.down(cluster, namespace=name, log=print)
