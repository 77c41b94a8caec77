"""A fault file, read and checked: the declarative half of the suite (pure; no cluster needed).

Each file in e2e/chaos/faults/ describes one experiment the way Chaos Mesh and Litmus do — what is
done to what, when, for how long, the steady state before and after, and what must hold:

    name: worker-sigkill
    class: worker-crash
    summary: the busiest worker's main process is killed with SIGKILL mid-task
    brokers: [redis, rabbitmq]
    requires: [node-access]            # what the cluster must offer (REQUIREMENTS)
    fault:
      action: kill-process             # one of e2e/chaos/actions.py ACTIONS
      target: busiest-worker           # one of TARGETS
      signal: KILL                     # action parameters
    trigger: {inFlight: 2}             # inject once this holds (TRIGGERS)
    duration: 0                        # seconds the fault is held before it is healed
    load: {tasks: 60, oom: 1}          # the workload (Load), every field optional
    steadyState:
      before: [workers-ready, queue-empty, operator-leading]
      after: [workers-ready, queue-empty, operator-leading]
    expect: [attempts-interrupted]     # evidence that the fault bit (EXPECTATIONS)
    recoverySeconds: 180               # bound on fault end -> steady state again
    subset: true                       # part of the short run in `make test`

Every scenario is judged by the ledger invariants (no lost, no duplicated, no unexpected task,
DLQ = the poison sent) whatever the file says; `expect` adds the fault's own evidence. A bad file
is refused with every problem, each naming the key as written and what is valid.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import yaml

FAULTS_DIR = Path(__file__).resolve().parent / "faults"

BROKERS = ("redis", "rabbitmq")
#: what an action can be aimed at
TARGETS = ("busiest-worker", "half-workers", "all-workers", "operator-leader", "broker", "broker-node",
           "postgres", "store", "dead-letter-queue", "release", "pool", "worker-node", "none")
#: what a cluster may lack, and how the runner checks it (e2e/chaos/cluster_caps.py)
REQUIREMENTS = ("node-access", "nodes>1", "kind", "rabbitmq-cluster")
#: when the fault is injected, once the load runs
TRIGGERS = ("inFlight", "afterSeconds", "scalingUp", "scalingDown")
STEADY_STATES = ("workers-ready", "queue-empty", "operator-leading", "outbox-empty", "pool-at-minimum")
#: fault-specific evidence the runner checks after the ledger invariants
EXPECTATIONS = ("attempts-interrupted", "ran-elsewhere", "container-restarted", "pod-replaced", "scaled-up",
                "scaled-down", "idle-first", "rolled-out", "leader-changed", "poison-dead-lettered", "pods-moved")
#: the poison kinds the workload can send, and the DLQ reason each must end with
POISON_REASONS = {"permanent": "permanent-error", "oom": "killed-worker", "socket-wedge": "hard-time-limit"}


class SpecError(ValueError):
    """A fault file is invalid; the message lists every problem, each naming its key."""


@dataclass(frozen=True)
class Load:
    """The workload of one scenario. Durations are drawn from `durations` (seconds, equally likely)."""

    #: tasks sent in the burst that starts the scenario
    tasks: int = 60
    #: tasks per second sent after the burst, until the fault is healed (continuous load)
    rate: float = 1.0
    #: share of tasks published through the transactional outbox (the rest directly)
    outbox_share: float = 0.5
    durations: tuple[float, ...] = (0.2, 0.5, 1.0, 2.0, 4.0)
    #: poison tasks among them: invalid input (DLQ after one attempt), a memory hog, a socket wedge
    permanent: int = 1
    oom: int = 0
    socket_wedge: int = 0

    def poison(self) -> dict[str, int]:
        return {"permanent": self.permanent, "oom": self.oom, "socket-wedge": self.socket_wedge}


@dataclass(frozen=True)
class Fault:
    action: str
    target: str
    #: the action's own parameters (signal, seconds, …), checked by the action
    params: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class FaultSpec:
    name: str
    fault_class: str
    summary: str
    fault: Fault
    brokers: tuple[str, ...] = BROKERS
    requires: tuple[str, ...] = ()
    trigger: tuple[str, float] = ("inFlight", 2)
    duration: float = 0.0
    load: Load = Load()
    before: tuple[str, ...] = ("workers-ready", "queue-empty", "operator-leading")
    after: tuple[str, ...] = ("workers-ready", "queue-empty", "operator-leading", "outbox-empty")
    expect: tuple[str, ...] = ()
    recovery_seconds: float = 240.0
    subset: bool = False
    path: Path | None = None

    def expected_dead_letters(self) -> dict[str, int]:
        """DLQ reason -> how many envelopes of the poison sent must carry it."""
        return {POISON_REASONS[kind]: n for kind, n in self.load.poison().items() if n}


_TOP_KEYS = {"name", "class", "summary", "brokers", "requires", "fault", "trigger", "duration", "load",
             "steadyState", "expect", "recoverySeconds", "subset"}
_LOAD_KEYS = {"tasks": "tasks", "rate": "rate", "outboxShare": "outbox_share", "durations": "durations",
              "permanent": "permanent", "oom": "oom", "socketWedge": "socket_wedge"}


def _one_of(problems: list[str], where: str, value: Any, valid: tuple[str, ...]) -> None:
    if value not in valid:
        problems.append(f"{where}: {value!r} is not one of {', '.join(valid)}")


def _list_of(problems: list[str], where: str, value: Any, valid: tuple[str, ...]) -> tuple[str, ...]:
    if not isinstance(value, list):
        problems.append(f"{where}: {value!r} must be a list of {', '.join(valid)}")
        return ()
    for item in value:
        _one_of(problems, f"{where}[{value.index(item)}]", item, valid)
    return tuple(value)


def _number(problems: list[str], where: str, value: Any, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        problems.append(f"{where}: {value!r} must be a number from {low:g} to {high:g}")
        return low
    return float(value)


def _load(problems: list[str], raw: Any) -> Load:
    if raw is None:
        return Load()
    if not isinstance(raw, dict):
        problems.append(f"load: {raw!r} must be a mapping with keys {', '.join(_LOAD_KEYS)}")
        return Load()
    values: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in _LOAD_KEYS:
            problems.append(f"load.{key}: unknown key (valid: {', '.join(_LOAD_KEYS)})")
        elif key == "durations":
            ok = isinstance(value, list) and value and all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= 15 for v in value)
            if not ok:
                problems.append(f"load.durations: {value!r} must be a non-empty list of seconds from 0 to 15 "
                                "(the soft time limit is 20 s)")
            else:
                values["durations"] = tuple(float(v) for v in value)
        elif key in ("rate", "outboxShare"):
            values[_LOAD_KEYS[key]] = _number(problems, f"load.{key}", value, 0, 50 if key == "rate" else 1)
        else:
            values[_LOAD_KEYS[key]] = int(_number(problems, f"load.{key}", value, 0, 20_000))
    return Load(**values)


def _trigger(problems: list[str], raw: Any) -> tuple[str, float]:
    if not (isinstance(raw, dict) and len(raw) == 1):
        problems.append(f"trigger: {raw!r} must be a mapping with one of {', '.join(TRIGGERS)}")
        return ("afterSeconds", 0)
    [(kind, value)] = raw.items()
    _one_of(problems, "trigger", kind, TRIGGERS)
    if kind in ("scalingUp", "scalingDown"):
        if value is not True:
            problems.append(f"trigger.{kind}: {value!r} must be true")
        return (kind, 1)
    return (kind, _number(problems, f"trigger.{kind}", value, 0, 600))


def parse(raw: Any, *, path: Path | None = None) -> FaultSpec:
    """The FaultSpec of a fault file's content; SpecError listing every problem otherwise."""
    from .actions import ACTIONS  # the actions check their own parameters

    where = f"{path.name}: " if path else ""
    if not isinstance(raw, dict):
        raise SpecError(f"{where}a fault file is a mapping with keys {', '.join(sorted(_TOP_KEYS))}")
    problems: list[str] = [f"{key}: unknown key (valid: {', '.join(sorted(_TOP_KEYS))})"
                           for key in raw if key not in _TOP_KEYS]
    for key in ("name", "class", "summary", "fault"):
        if key not in raw:
            problems.append(f"{key}: required")
    name = raw.get("name", "")
    if not (isinstance(name, str) and name.replace("-", "").isalnum() and name.islower()):
        problems.append(f"name: {name!r} must be lower-case letters, digits and '-'")
    elif path is not None and path.stem != name:
        problems.append(f"name: {name!r} must match the file name {path.name}")
    fault_raw = raw.get("fault") or {}
    fault = Fault(action="", target="none")
    if not isinstance(fault_raw, dict):
        problems.append(f"fault: {fault_raw!r} must be a mapping with action, target and the action's parameters")
    else:
        action, target = fault_raw.get("action"), fault_raw.get("target", "none")
        params = {k: v for k, v in fault_raw.items() if k not in ("action", "target")}
        _one_of(problems, "fault.action", action, tuple(ACTIONS))
        _one_of(problems, "fault.target", target, TARGETS)
        if action in ACTIONS:
            problems += [f"fault.{p}" for p in ACTIONS[action].check(target, params)]
        fault = Fault(action=action or "", target=target, params=params)
    steady = raw.get("steadyState") or {}
    if not isinstance(steady, dict) or set(steady) - {"before", "after"}:
        problems.append(f"steadyState: {steady!r} must be a mapping with keys before, after")
        steady = {}
    spec = FaultSpec(
        name=name if isinstance(name, str) else "",
        fault_class=str(raw.get("class", "")),
        summary=" ".join(str(raw.get("summary", "")).split()),
        fault=fault,
        brokers=_list_of(problems, "brokers", raw.get("brokers", list(BROKERS)), BROKERS),
        requires=_list_of(problems, "requires", raw.get("requires", []), REQUIREMENTS),
        trigger=_trigger(problems, raw.get("trigger", {"inFlight": 2})),
        duration=_number(problems, "duration", raw.get("duration", 0), 0, 600),
        load=_load(problems, raw.get("load")),
        before=_list_of(problems, "steadyState.before", steady.get("before", list(FaultSpec.before)), STEADY_STATES),
        after=_list_of(problems, "steadyState.after", steady.get("after", list(FaultSpec.after)), STEADY_STATES),
        expect=_list_of(problems, "expect", raw.get("expect", []), EXPECTATIONS),
        recovery_seconds=_number(problems, "recoverySeconds", raw.get("recoverySeconds", 240), 10, 1800),
        subset=raw.get("subset", False) is True,
        path=path,
    )
    if not spec.brokers:
        problems.append("brokers: at least one of " + ", ".join(BROKERS))
    if spec.trigger[0] == "scalingUp" and "pool-at-minimum" not in spec.before:
        # A pool still scaled up by the scenario before (or at maxReplicas) has no scale-up left to
        # make, and the trigger would wait in vain.
        problems.append("steadyState.before: a scalingUp trigger needs pool-at-minimum, so the pool has room "
                        "to scale up when the load begins")
    if problems:
        raise SpecError(f"{where}" + "; ".join(problems))
    return spec


def load_file(path: Path) -> FaultSpec:
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise SpecError(f"{path.name}: not valid YAML: {exc}") from None
    return parse(raw, path=path)


def load_all(directory: Path = FAULTS_DIR) -> list[FaultSpec]:
    """Every fault file, in name order; SpecError naming every bad file and its problems."""
    specs, problems = [], []
    for path in sorted(directory.glob("*.yaml")):
        try:
            specs.append(load_file(path))
        except SpecError as exc:
            problems.append(str(exc))
    if problems:
        raise SpecError("\n".join(problems))
    return specs


def select(specs: list[FaultSpec], names: list[str] | None) -> list[FaultSpec]:
    """The specs named (in the order given), all when `names` is empty; SpecError for an unknown name."""
    if not names:
        return specs
    by_name = {s.name: s for s in specs}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise SpecError(f"unknown fault(s) {unknown}: valid are {', '.join(by_name)}")
    return [by_name[n] for n in names]
