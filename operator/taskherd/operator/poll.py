"""One poll of one WorkerPool: observe -> plan -> apply, then the status.

The thin imperative shell around the pure modules: `observe` only reads, `plan` (plan.py) and
`settle` (settle.py) only decide, `apply` and `report` only write. Every side effect goes through
an injected dependency, so the whole cycle runs in tests against in-memory fakes, and a dry-run
`Kube` makes the operator log what it would do instead of doing it. Failures never escape as
exceptions: an unreachable broker, a missing target or a failed page becomes a status condition,
and the next poll tries again.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from .alerts import Poster
from .apply import apply, report
from .broker import ObserveFn
from .busyness import BusynessReader
from .child_deaths import ChildDeathReader
from .kube import Kube
from .metrics import OperatorMetrics
from .observe import observe
from .plan import PoolMemory, Problem, plan
from .settle import settle

log = logging.getLogger("taskherd.operator")


@dataclass(kw_only=True)
class Deps:
    kube: Kube
    observe: ObserveFn
    busyness: BusynessReader
    poster: Poster
    metrics: OperatorMetrics
    clock: Callable[[], float] = time.time
    #: reads the pool-child deaths a worker pod counted; None: not read
    child_deaths: ChildDeathReader | None = None
    #: used when a pool's spec names no alert target.
    default_alertmanager_url: str | None = None


@dataclass
class PollResult:
    """What one poll did, for the scheduler's summary line."""

    #: what the next poll of this pool starts from.
    memory: PoolMemory
    #: the status as stored after this poll (None when the write failed: keep the old one).
    status: dict[str, Any] | None
    scaled: bool = False
    paged: int = 0
    errors: list[str] = field(default_factory=list)
    #: the target's replicas after this poll (None when the queues or the target could not be
    #: read, or the target not scaled)
    replicas: int | None = None


async def poll_once(body: dict[str, Any], memory: PoolMemory, deps: Deps, *,
                    conflict: Problem | None = None) -> PollResult:
    """One poll of the pool `body`, starting from what the previous poll left in `memory`;
    `conflict`: another pool scales its target (the scheduler's finding), so it does not."""
    started = time.perf_counter()
    snapshot = await observe(body, memory, deps, conflict=conflict)
    planned = plan(snapshot, memory)
    outcome = await apply(snapshot, planned, deps)
    status, kept, events = settle(snapshot, planned, outcome)
    errors = list(snapshot.errors) + outcome.errors + await report(snapshot, planned.events + events, status, deps)

    pool = (snapshot.namespace, snapshot.name)
    for kind in errors:
        deps.metrics.errors.labels(*pool, kind).inc()
    if planned.decision is not None and snapshot.scale is not None:
        before, after = snapshot.scale.replicas, planned.decision.replicas
        deps.metrics.decisions.labels(*pool, "up" if after > before else "down" if after < before else "hold").inc()
    deps.metrics.poll_seconds.labels(*pool).observe(time.perf_counter() - started)
    where = f"{snapshot.namespace}/{snapshot.name}"
    if outcome.scaled:
        log.info("%s: scaled %s", where, planned.scale.describe())
    if planned.conditions.transitions:
        log.info("%s: %s", where, "; ".join(planned.conditions.transitions))
    # What the early notice compares a count with; None after a poll that could not read the
    # queues or the target, or could not scale it: no poll is brought forward to fail again.
    replicas = (None if {"broker", "scale"} & set(errors) or snapshot.scale is None
                else planned.scale.replicas if planned.scale is not None else snapshot.scale.replicas)
    return PollResult(memory=kept, status=None if "status" in errors else status, scaled=outcome.scaled,
                      paged=outcome.delivered, errors=errors, replicas=replicas)
