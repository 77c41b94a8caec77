"""A run of the matrix: the faults asked for, on the brokers asked for, on the cluster resolved.

The ledger is installed once per broker (and once more on the RabbitMQ cluster for the faults that
need quorum queues) and serves every scenario of that broker; a scenario that fails leaves a fresh
installation to the next one, so one broken fault cannot fail the rest. Installations are removed
at the end, and with them the run's vhosts, databases and Redis databases; the chaos services stay
for the next run.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, Iterable

from e2e.lib import cluster as clusters

from .images import pinned
from .report import Outcome
from .runner import Installation, Scenario, capabilities, missing
from .spec import FaultSpec
from .world import services

Log = Callable[[str], None]


def needs_quorum(spec: FaultSpec) -> bool:
    return "rabbitmq-cluster" in spec.requires


def schedule(specs: Iterable[FaultSpec], brokers: Iterable[str]) -> list[tuple[str, bool, FaultSpec]]:
    """(broker, on the RabbitMQ cluster, spec) in run order: broker by broker, the cluster's last."""
    specs = list(specs)
    order = []
    for broker in brokers:
        for quorum in (False, True):
            order += [(broker, quorum, s) for s in specs if broker in s.brokers and needs_quorum(s) == quorum]
    return order


def run(cluster: clusters.Cluster, specs: list[FaultSpec], *, brokers: tuple[str, ...], run_dir: Path, log: Log,
        named: bool = False, seed: int | None = None, keep: bool = False) -> list[Outcome]:
    """Every scheduled scenario's Outcome. A fault the cluster cannot host is excluded with the
    reason — or failed with it when it was asked for by name (`named`). `keep` leaves the last
    installation in place to look at (`python -m e2e.chaos down` removes it)."""
    caps = capabilities(cluster)
    planned = schedule(specs, brokers)
    outcomes: list[Outcome] = []
    runnable = []
    for broker, quorum, spec in planned:
        reason = missing(spec, caps)
        if reason:
            outcomes.append(Outcome(spec.name, spec.fault_class, broker, "failed" if named else "excluded",
                                    reason=reason, failures=[reason] if named else []))
        else:
            runnable.append((broker, quorum, spec))
    if not runnable:
        return outcomes
    log(f"{len(runnable)} scenario(s) on the {cluster.source} cluster ({cluster.kubeconfig}); "
        f"{len(outcomes)} excluded; run folder {run_dir}")
    images = pinned(cluster, log)
    with services(cluster, quorum=any(q for _, q, _ in runnable), log=log) as deployed:
        current: Installation | None = None
        try:
            for broker, quorum, spec in runnable:
                if current is None or (current.broker, current.quorum) != (broker, quorum):
                    if current is not None:
                        current.remove()
                    current = Installation(cluster, deployed, run_dir, log, broker=broker, quorum=quorum,
                                           images=images)
                started = time.monotonic()
                try:
                    outcome, current.release = Scenario(spec, current.get(), deployed, run_dir, log, seed=seed).run()
                except Exception as exc:  # noqa: BLE001 - the run goes on; the matrix shows the error
                    reason = f"{type(exc).__name__}: {exc}"
                    log(f"   ERROR: {spec.name} on {broker}: {reason}")
                    outcome = Outcome(spec.name, spec.fault_class, broker, "failed", reason=reason[:500],
                                      failures=[reason[:2000]], scenario_seconds=round(time.monotonic() - started, 1))
                outcomes.append(outcome)
                if not outcome.ok:
                    if outcome.folder:
                        current.save_namespace(Path(outcome.folder))
                    if not keep:
                        current.replace()
        finally:
            if current is not None and not keep:
                current.remove()
    return outcomes
