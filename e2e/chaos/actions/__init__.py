"""The vocabulary of the fault files: each action injects one kind of fault and knows how it ends.

An action is a small class with

- `check(target, params) -> problems`: pure, run when a fault file is read (spec.parse), so a
  typo in a parameter is refused before anything runs;
- `inject(ctx, target, params) -> Injection`: does the fault and returns at once (or when the
  fault is over, for faults that are one event, like a restart), with a `recover` callable that
  ends the fault — heals a partition, uncordons a node — or waits until the system has taken the
  consequence (a liveness restart, a rollout). The runner calls it after the file's `duration`.

Adding a fault that needs a new kind of action: a class here (or in a module beside it), added to
ACTIONS. Adding one that reuses an action: a YAML file in e2e/chaos/faults/, nothing else.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from e2e.lib import cluster as clusters
from e2e.lib.waiting import wait_for

from ..deploy import Release
from ..nodes import NodeAccess, NodeAccessError
from ..observe import Observer, Snapshot
from ..workload import Producer, TaskSpec
from ..world import Services

Log = Callable[[str], None]


class ActionError(RuntimeError):
    """The fault could not be injected (or its end not reached); the message says what was seen."""


@dataclass
class Context:
    """What an action may touch: the cluster, the app's release, the services, the watch."""

    cluster: clusters.Cluster
    release: Release
    services: Services
    observer: Observer
    producer: Producer
    run_dir: Path
    log: Log
    #: extra tasks for the fault itself (poison), numbered apart from the load
    poison: Callable[[str, int], list[TaskSpec]]
    _nodes: NodeAccess | None = None

    @property
    def nodes(self) -> NodeAccess:
        if self._nodes is None:
            self._nodes = NodeAccess(self.cluster)
        return self._nodes

    @property
    def namespace(self) -> str:
        return self.release.namespace

    @property
    def broker(self) -> str:
        return self.release.tenancy.broker

    def snapshot(self) -> Snapshot:
        return self.observer.latest


@dataclass
class Injection:
    what: str  #: one line for the narration and the report
    recover: Callable[[], None] | None = None
    #: what the fault did and what followed it, for summary.json and the expectations
    evidence: dict[str, Any] = field(default_factory=dict)


class Action:
    name: str = ""
    targets: tuple[str, ...] = ()
    #: parameter -> (valid values as text, check)
    params: Mapping[str, tuple[str, Callable[[Any], bool]]] = {}

    def check(self, target: str, params: Mapping[str, Any]) -> list[str]:
        problems = []
        if target not in self.targets:
            problems.append(f"target: {target!r} is not one {self.name} can hit (valid: {', '.join(self.targets)})")
        for key, value in params.items():
            if key not in self.params:
                problems.append(f"{key}: not a parameter of {self.name} (valid: {', '.join(self.params) or 'none'})")
            elif not self.params[key][1](value):
                problems.append(f"{key}: {value!r} is not valid for {self.name} (valid: {self.params[key][0]})")
        return problems

    def inject(self, ctx: Context, target: str, params: Mapping[str, Any]) -> Injection:
        raise NotImplementedError


def seconds(low: float, high: float) -> tuple[str, Callable[[Any], bool]]:
    return (f"a number of seconds from {low:g} to {high:g}",
            lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and low <= v <= high)


def count(low: int, high: int) -> tuple[str, Callable[[Any], bool]]:
    return (f"a whole number from {low} to {high}", lambda v: isinstance(v, int) and not isinstance(v, bool)
            and low <= v <= high)


def one_of(*values: Any) -> tuple[str, Callable[[Any], bool]]:
    return (", ".join(map(str, values)), lambda v: v in values)


# --- targets shared by several actions ---------------------------------------------------------------

def busiest_worker(ctx: Context, timeout: float = 60) -> str:
    """The ready worker running the most tasks right now (waiting, bounded, for one to be busy)."""
    return wait_for("a ready worker running a task", lambda: ctx.observer.wait_tick().busiest_worker(), timeout, 0.5)


def workers(ctx: Context, target: str) -> list[str]:
    """busiest-worker, half-workers (the busiest first, at least one left out) or all-workers."""
    snap = ctx.observer.wait_tick()
    ready = snap.ready_workers()
    if not ready:
        raise ActionError(f"no ready worker in {ctx.namespace} to aim {target} at")
    by_load = sorted(ready, key=lambda pod: -snap.in_flight.get(pod, 0))
    if target == "busiest-worker":
        return [busiest_worker(ctx)]
    if target == "half-workers":
        if len(ready) < 2:
            raise ActionError(f"half-workers needs two ready workers, {ctx.namespace} has {ready}")
        return by_load[:len(ready) // 2]
    return by_load


def worker_node(ctx: Context, *, avoid: Mapping[str, str] | None = None) -> str:
    """The node whose ledger workers run the most tasks right now, then the one with the most
    workers — on kind a worker node, never the control plane. (By workers alone, a node of new,
    still idle workers was lost while the tasks ran on the other: nothing to take away.) Nodes in
    `avoid` (node -> why) are passed over; if every node running workers is one of them, the fault
    cannot be aimed and says why."""
    snap = ctx.observer.wait_tick()
    weight: dict[str, tuple[int, int]] = {}
    for pod in snap.live_workers():
        node = pod["spec"].get("nodeName")
        if node:
            tasks, workers = weight.get(node, (0, 0))
            weight[node] = (tasks + snap.in_flight.get(pod["metadata"]["name"], 0), workers + 1)
    if not weight:
        raise ActionError(f"no ledger worker is scheduled on a node in {ctx.namespace}")
    avoid = avoid or {}
    allowed = [n for n in sorted(weight) if n not in avoid]
    if not allowed:
        raise ActionError("every node running ledger workers is ruled out: " +
                          "; ".join(f"{n}: {avoid[n]}" for n in sorted(weight)))
    return max(allowed, key=lambda n: weight[n])


def wait_workers_ready(ctx: Context, what: str, timeout: float) -> Snapshot:
    """Until every live worker is Ready and there are as many as the WorkerPool wants."""
    def settled() -> Snapshot | None:
        snap = ctx.observer.wait_tick()
        desired = snap.pool_status.get("desiredReplicas")
        live, ready = snap.live_workers(), snap.ready_workers()
        return snap if live and len(ready) == len(live) and desired in (None, len(live)) else None
    return wait_for(what, settled, timeout, 1)


def now() -> float:
    return time.time()


from .network import Partition  # noqa: E402  (the actions import the helpers above)
from .nodes import DrainNode, LoseNode, RestartKubelet  # noqa: E402
from .pods import DeletePod, KillProcess  # noqa: E402
from .poison import SendPoison  # noqa: E402
from .release import HelmUpgrade, OperatorScaleDown  # noqa: E402
from .services import DeadLetterQueueUnwritable, RestartService  # noqa: E402

ACTIONS: dict[str, Action] = {a.name: a for a in (
    KillProcess(), DeletePod(), SendPoison(), OperatorScaleDown(), HelmUpgrade(), RestartService(), Partition(),
    DeadLetterQueueUnwritable(), RestartKubelet(), DrainNode(), LoseNode())}

__all__ = ["ACTIONS", "Action", "ActionError", "Context", "Injection", "NodeAccessError"]
