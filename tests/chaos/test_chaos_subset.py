"""The short chaos subset `make test` runs: the faults marked `subset: true` — one of every fault
class — on one broker (TASKHERD_CHAOS_BROKER, default redis), each judged by the ledger exactly as
`make chaos` judges it. The full matrix is `make chaos` (docs/chaos.md).

The ledger is installed once for the module, in a namespace of the harness (its pods, events and
logs are attached to a failing test's report), and reinstalled after a failing scenario. A fault
this cluster cannot host fails with the reason.
"""
from __future__ import annotations

import datetime as dt
import os

import pytest

from e2e.chaos import spec
from e2e.chaos.images import pinned
from e2e.chaos.runner import Installation, Scenario, capabilities, missing
from e2e.chaos.world import services
from e2e.lib.pytest_plugin import create_test_namespace

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

BROKER = os.environ.get("TASKHERD_CHAOS_BROKER", "redis")
SUBSET = [s for s in spec.load_all() if s.subset and BROKER in s.brokers]
RUNS = spec.FAULTS_DIR.parents[2] / "runs"


@pytest.fixture(scope="module")
def chaos(cluster, request):
    """(services, installation, run folder) for the module; the installation is removed at the end."""
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    run_dir = RUNS / f"chaos-test-{stamp}"
    images = pinned(cluster, print)
    with services(cluster, quorum=False, log=print) as deployed:
        installation = Installation(
            cluster, deployed, run_dir, print, broker=BROKER, quorum=False, images=images,
            make_namespace=lambda broker, quorum: create_test_namespace(
                cluster, request, labels={"pod-security.kubernetes.io/enforce": "restricted"}))
        try:
            yield deployed, installation, run_dir
        finally:
            installation.remove()


@pytest.mark.parametrize("fault", SUBSET, ids=[s.name for s in SUBSET])
def test_fault_is_survived(cluster, chaos, fault):
    deployed, installation, run_dir = chaos
    reason = missing(fault, capabilities(cluster))
    if reason:
        pytest.fail(f"{fault.name} cannot run on this cluster: {reason}", pytrace=False)
    try:
        outcome, installation.release = Scenario(fault, installation.get(), deployed, run_dir, print).run()
    except BaseException:
        installation.replace()
        raise
    if not outcome.ok:
        installation.replace()
    assert outcome.ok, (f"{fault.name} on {BROKER}: " + "; ".join(outcome.failures)
                        + f"\n(summary.json and timeline.png in {outcome.folder})")
    assert outcome.lost == outcome.duplicated == outcome.unexpected == 0
    assert outcome.sent and outcome.recovery_seconds is not None

