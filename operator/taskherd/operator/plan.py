"""What one poll of one WorkerPool should do, decided from what it observed (pure, clock in the snapshot).

`plan()` turns a `Snapshot` (everything the observe step read) and the pool's `PoolMemory` into a
`Plan`: the scale change, the pod-deletion-cost annotations, the Events and the pages to send.
The apply step carries the plan out and reports an `Outcome`; `settle()` (settle.py) then folds
the outcome into the status and the memory kept for the next poll. Neither performs any I/O.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

from taskherd.queues.stats import AGE_FROM_PUBLISH_COUNTER

from .child_deaths import ChildDeaths, child_death_entries, describe
from .deletion_cost import PodBusyness, annotations_to_change, busy_count, deletion_costs
from .kube import Scale
from .paging import Page, PagingState, step
from .pause import Pause
from .policy import PoolSpec
from .scaling import Decision, Observation, Recommendation, desired_replicas, prune_history
from .status import Conditions
from .terminations import recent_terminations, termination_key
from .throughput import WorkCounters, reading_due

#: pods and their Events are read for the termination report at most this often (and a steady
#: pool's throughput counters with them: throughput.STEADY_READING_SECONDS).
TERMINATIONS_EVERY_SECONDS = 30.0


@dataclass(frozen=True)
class Problem:
    """Why something could not be read: `reason` is CamelCase (a condition reason and Event reason)."""

    reason: str
    message: str


@dataclass(frozen=True, kw_only=True)
class Snapshot:
    """Everything one poll read, before anything was decided."""

    body: Mapping[str, Any]
    now: float
    spec: PoolSpec | None = None
    spec_problem: Problem | None = None
    #: the pause annotations, read (pause.py).
    pause: Pause | None = None
    observation: Observation | None = None
    broker_problem: Problem | None = None
    scale: Scale | None = None
    scale_problem: Problem | None = None
    #: every worker pod's busyness and throughput counters; read only when needs_busyness says so.
    busyness: tuple[PodBusyness, ...] | None = None
    #: the busyness was needed but the pods could not be listed.
    busyness_unreadable: bool = False
    #: pod name -> its pod-deletion-cost annotation as found.
    cost_annotations: Mapping[str, str | None] = field(default_factory=dict)
    #: worker pods and their Events, when the termination report was due and could be read.
    pods: tuple[Mapping[str, Any], ...] | None = None
    pod_events: tuple[Mapping[str, Any], ...] = ()
    #: running pod name -> the pool-child deaths its worker counted, read with the pods or the busyness
    child_deaths: Mapping[str, tuple[ChildDeaths, ...]] = field(default_factory=dict)
    #: what could not be read, by kind (the `kind` label of taskherd_operator_errors_total).
    errors: tuple[str, ...] = ()
    #: another WorkerPool scales this pool's target (scheduler.PoolScheduler finds it): this one
    #: observes, reports and pages, and does not scale (reason ScaleTargetConflict).
    conflict: Problem | None = None

    @property
    def namespace(self) -> str:
        return self.body["metadata"]["namespace"]

    @property
    def name(self) -> str:
        return self.body["metadata"]["name"]

    @property
    def previous_status(self) -> Mapping[str, Any]:
        return self.body.get("status") or {}


@dataclass
class PoolMemory:
    """What one pool's polls keep between polls (lost on restart, on purpose: a new leader first
    watches a whole stabilisation window before scaling down)."""

    history: list[Recommendation] = field(default_factory=list)
    paging: PagingState | None = None  # None: not yet loaded from the status
    last_scale_time: str | None = None
    last_scale_reason: str | None = None
    terminations: list[dict[str, Any]] = field(default_factory=list)
    terminations_read_at: float = -math.inf
    #: the workers' counters at each busyness reading: the throughput Little's law needs
    work: WorkCounters = field(default_factory=WorkCounters)

    def loaded(self, status: Mapping[str, Any]) -> "PoolMemory":
        """On the first poll, what the status remembers (pages sent, last scale, terminations)."""
        if self.paging is not None:
            return self
        return replace(self, paging=PagingState.from_status(status.get("deadLetterAlert")),
                       last_scale_time=status.get("lastScaleTime"), last_scale_reason=status.get("lastScaleReason"),
                       terminations=list(status.get("recentTerminations") or []))

    def terminations_due(self, now: float) -> bool:
        return now - self.terminations_read_at >= TERMINATIONS_EVERY_SECONDS


@dataclass(frozen=True)
class EventSpec:
    type: str  # Normal | Warning
    reason: str
    message: str


@dataclass(frozen=True)
class ScaleChange:
    replicas_before: int
    replicas: int
    reason: str

    def describe(self) -> str:
        return f"{self.replicas_before} -> {self.replicas}: {self.reason}"

    def event(self) -> EventSpec:
        """The HPA's Event for a rescale, so that `kubectl describe` reads the same."""
        return EventSpec("Normal", "SuccessfulRescale", f"New size: {self.replicas}; reason: {self.reason}")


@dataclass(frozen=True)
class Delivery:
    """Where and how the pages of this pool go, as the spec says (the operator may add a default
    Alertmanager); no target at all means condition and Event only."""

    alertmanager_url: str | None
    webhook_url: str | None
    severity: str
    threshold: int


@dataclass
class Plan:
    memory: PoolMemory
    conditions: Conditions
    decision: Decision | None = None
    scale: ScaleChange | None = None
    #: pod name -> pod-deletion-cost to write before the scale-down.
    deletion_costs: Mapping[str, int] = field(default_factory=dict)
    events: list[EventSpec] = field(default_factory=list)
    pages: list[Page] = field(default_factory=list)
    delivery: Delivery | None = None
    #: status fields known before anything is applied.
    status: dict[str, Any] = field(default_factory=dict)


@dataclass
class Outcome:
    """What the apply step managed to do."""

    scaled: bool = False
    scale_error: str | None = None
    #: dead-letter queue -> why its page was not delivered.
    undelivered: dict[str, str] = field(default_factory=dict)
    delivered: int = 0
    #: error kinds (the `kind` label of taskherd_operator_errors_total).
    errors: list[str] = field(default_factory=list)


def decide(spec: PoolSpec, pause: Pause | None, observation: Observation | None, current_replicas: int,
           busy_workers: int, memory: PoolMemory, now: float) -> Decision:
    """The replicas to ask for: the pause annotation's, or the autoscaling decision."""
    if pause is not None:
        held = current_replicas if pause.replicas is None else pause.replicas
        return Decision(held, pause.message)
    return desired_replicas(spec.scaling, observation, current_replicas, busy_workers, memory.history, now)


def needs_busyness(spec: PoolSpec, pause: Pause | None, observation: Observation | None, current_replicas: int,
                   memory: PoolMemory, now: float) -> bool:
    """Whether this poll reads the worker pods: their busyness (busy pods must not go in a
    scale-down) and their throughput counters (Little's law: which of the workers the window
    would hold the arrivals still need), when throughput.reading_due says so. Paused: only for a
    scale-down."""
    decision = decide(spec, pause, observation, current_replicas, 0, memory, now)
    if pause is not None:
        return decision.replicas < current_replicas
    depth = observation.depth if observation is not None else 0
    # A steady pool is read with the terminations report (the same cadence): one request per pod.
    return reading_due(decision, current_replicas, depth, memory.terminations_read_at, now)


def plan(snapshot: Snapshot, memory: PoolMemory) -> Plan:
    now, spec = snapshot.now, snapshot.spec
    memory = memory.loaded(snapshot.previous_status)
    conditions = Conditions(snapshot.previous_status.get("conditions"), now,
                            snapshot.body["metadata"].get("generation"))
    result = Plan(memory=memory, conditions=conditions,
                  status={"observedGeneration": snapshot.body["metadata"].get("generation")})
    if spec is None:
        problem = snapshot.spec_problem or Problem("InvalidSpec", "the spec could not be read")
        conditions.set("Ready", False, problem.reason, problem.message)
        result.events += warnings(conditions, "Ready")
        return result

    observation = snapshot.observation
    if observation is not None:
        conditions.set("BrokerReachable", True, "Observed",
                       f"inspected {len(spec.broker.queues)} queues and "
                       f"{len(spec.broker.dead_letter_queues)} dead-letter queues")
    else:
        problem = snapshot.broker_problem or Problem("BrokerUnreachable", "the queues could not be observed")
        conditions.set("BrokerReachable", False, problem.reason, problem.message)
    if snapshot.scale is not None:
        conditions.set("ScaleTargetFound", True, "Found", spec.target.describe(snapshot.namespace))
    else:
        problem = snapshot.scale_problem or Problem("FailedGetScale", "the scale could not be read")
        conditions.set("ScaleTargetFound", False, problem.reason, problem.message)
    result.events += warnings(conditions, "BrokerReachable", "ScaleTargetFound")

    if snapshot.conflict is not None:
        _plan_conflict(result, snapshot)
    elif snapshot.scale is not None:
        _plan_scale(result, spec, snapshot, memory)
    if snapshot.pods is not None or snapshot.child_deaths:
        _plan_terminations(result, snapshot)
    _plan_pages(result, spec, observation, now)
    if observation is not None:
        result.status.update(
            observedDepth=observation.depth, readyMessages=observation.ready, unackedMessages=observation.unacked,
            oldestMessageAgeSeconds=None if observation.oldest_message_age_seconds is None
            else int(observation.oldest_message_age_seconds),
            oldestMessageAge=age_text(observation),
            deadLetterDepth=observation.dead_letter_depth, deadLetterQueues=dict(observation.dead_letters))
    return result


def age_text(observation: Observation) -> str | None:
    """The oldest message's age for people: `40s` measured, `~40s` estimated, `>=40s` known only
    from below, `unknown` when messages wait and nothing is known; None when none waits."""
    age = observation.oldest_message_age_seconds
    if observation.ready == 0 or (age is None and not observation.age_known_only_from_below):
        return None
    if observation.age_known_only_from_below:  # whole seconds, rounded down: "at least" must hold
        return f">={int(age)}s" if age else "unknown"
    return f"~{int(age)}s" if observation.oldest_message_age_method == AGE_FROM_PUBLISH_COUNTER else f"{int(age)}s"


def _plan_scale(result: Plan, spec: PoolSpec, snapshot: Snapshot, memory: PoolMemory) -> None:
    scale, now, pause = snapshot.scale, snapshot.now, snapshot.pause
    if snapshot.busyness is not None:
        busy = busy_count(snapshot.busyness)
    elif snapshot.busyness_unreadable:
        busy = scale.replicas  # never remove what we cannot prove idle
    else:
        busy = 0  # not needed, or a target whose scale names no pods: its own controller picks
    observation = snapshot.observation
    if snapshot.busyness is not None and observation is not None:
        result.memory = replace(result.memory, work=memory.work.read(snapshot.busyness, observation.depth, now))
    throughput = result.memory.work.throughput(now)
    if observation is not None and throughput is not None:
        observation = replace(observation, throughput=throughput)
    decision = decide(spec, pause, observation, scale.replicas, busy, memory, now)
    result.decision = decision
    if pause is not None:  # autoscaling resumes with a fresh stabilisation window
        result.memory = replace(result.memory, history=[])
    elif decision.recommendation is not None:
        result.memory = replace(result.memory, history=prune_history(
            memory.history + [decision.recommendation], now, spec.scaling.scale_down_stabilization_seconds))
    if decision.replicas < scale.replicas and snapshot.busyness is not None:
        result.deletion_costs = annotations_to_change(deletion_costs(snapshot.busyness), snapshot.cost_annotations)
    if decision.replicas != scale.replicas:
        result.scale = ScaleChange(scale.replicas, decision.replicas, decision.reason)
    result.status.update(currentReplicas=scale.current_replicas, desiredReplicas=decision.replicas)
    if snapshot.busyness is not None:
        result.status["busyWorkers"] = busy


def _plan_conflict(result: Plan, snapshot: Snapshot) -> None:
    """Another pool scales this pool's target: no decision, no scale. ScalingActive=False makes
    Ready=False with the same reason (settle._set_ready); the next poll without the conflict
    decides again, with a fresh stabilisation window as after a pause."""
    conflict = snapshot.conflict
    result.conditions.set("ScalingActive", False, conflict.reason, conflict.message)
    result.events += warnings(result.conditions, "ScalingActive")
    if result.memory.history:
        result.memory = replace(result.memory, history=[])
    # no desire of its own: a desiredReplicas left from before would say otherwise (None drops it)
    result.status["desiredReplicas"] = None
    if snapshot.scale is not None:
        result.status["currentReplicas"] = snapshot.scale.current_replicas


def _plan_terminations(result: Plan, snapshot: Snapshot) -> None:
    """The termination report, and a Warning Event for each pool child's death it lists for the first
    time (the kubelet's own Events already tell of container terminations)."""
    before = {termination_key(t) for t in result.memory.terminations}
    report = recent_terminations(snapshot.pods or (), snapshot.pod_events, result.memory.terminations,
                                 pool_children=child_death_entries(snapshot.child_deaths))
    # Only the whole report (pods and their Events) restarts its cadence; deaths read with the
    # busyness alone do not.
    read_at = snapshot.now if snapshot.pods is not None else result.memory.terminations_read_at
    if (read_at, report) != (result.memory.terminations_read_at, result.memory.terminations):
        # most polls change nothing here: a copy of the memory is a tenth of a poll's CPU
        result.memory = replace(result.memory, terminations_read_at=read_at, terminations=report)
    for entry in reversed(report):  # oldest first, as they happened
        if entry.get("process") and termination_key(entry) not in before:
            result.events.append(EventSpec("Warning", *describe(entry)))


def _plan_pages(result: Plan, spec: PoolSpec, observation: Observation | None, now: float) -> None:
    dl = spec.dead_letter
    state, pages = step(result.memory.paging or PagingState(),
                        None if observation is None else observation.dead_letters,
                        threshold=dl.threshold, resend_interval=dl.resend_interval_seconds, now=now,
                        # the scheduler's interval (scheduler.poll_interval): resends come no sooner
                        poll_interval=spec.poll_interval_seconds)
    if state != result.memory.paging:
        result.memory = replace(result.memory, paging=state)
    result.pages = pages
    result.delivery = Delivery(alertmanager_url=dl.alertmanager_url, webhook_url=dl.webhook_url,
                               severity=dl.severity, threshold=dl.threshold)
    for page in pages:
        if page.kind == "fire":
            result.events.append(EventSpec("Warning", "DeadLetterThreshold",
                                           f"dead-letter queue {page.queue} holds {page.depth} messages "
                                           f"(threshold {dl.threshold})"))
        elif page.kind == "resolve":
            result.events.append(EventSpec("Normal", "DeadLetterResolved",
                                           f"dead-letter queue {page.queue} is below the threshold "
                                           f"({page.depth} < {dl.threshold})"))


def warnings(conditions: Conditions, *types: str) -> list[EventSpec]:
    """One Warning Event when a condition turns False (not on every poll while it stays False)."""
    return [EventSpec("Warning", conditions.get(t)["reason"], conditions.get(t)["message"])
            for t in types if conditions.newly(t, "False")]
