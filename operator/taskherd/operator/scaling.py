"""How many workers a pool needs: a pure function of what was observed, with the clock injected.

`desired_replicas()` decides; the caller applies the result through the Deployment's scale
subresource and appends `decision.recommendation` to the history it passes next time.

Rules (each one a property test in tests/operator/test_operator_scaling.py):
- depth (ready + unacked) needs ceil(depth / targetDepthPerWorker) workers; scale-up goes there in
  one step, and 0 -> N happens on the first poll that sees work;
- an oldest waiting message older than maxOldestMessageAgeSeconds adds workers even when the
  depth per worker is under target, in proportion to how far over the limit it is (as the HPA
  does for any metric), at most once per settle window so that pods still starting are not
  counted as "not enough" again (compounding would run straight to maxReplicas); while such a
  message waits, no worker is removed;
- scale-down goes to the highest recommendation of the stabilisation window (the HPA's rule),
  only once the history covers the whole window, and never below the busy workers;
- N -> 0 only when the queues are empty and no worker is busy;
- an age known only from below ("at least 7 s") is never read as young: above the limit it
  scales up like a known age; under it, or unknown, it blocks any scale-down while messages wait;
- queues whose figures the broker has not reported yet hold the current count;
- the result is always within [minReplicas, maxReplicas];
- when the workers' throughput is known (``Observation.throughput``: arrival rate, mean service
  time, slots per worker), Little's law gives the workers the arrivals keep busy,
  ceil(rate x service time / slots): the pool never goes below that, and it is the only part of
  a recommendation the stabilisation window holds. Workers added for a backlog are released once
  it is gone instead of being held for the whole window; the workers steady work needs are held
  as before. Without throughput, every recommendation is held, as the HPA does.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from .policy import ScalingPolicy

#: After an age-triggered scale-up, the age rule waits this long before adding more workers.
AGE_SETTLE_SECONDS = 30.0


@dataclass(frozen=True, kw_only=True)
class Throughput:
    """What the workers' own counters say about the work (Little's law: busy slots = rate x time)."""

    #: messages arriving per second, over the recent past (see estimate_throughput)
    arrival_rate: float
    #: mean seconds a task holds a worker slot
    service_seconds: float
    #: tasks one worker runs at once (its concurrency)
    slots_per_worker: int

    def __post_init__(self) -> None:
        for name in ("arrival_rate", "service_seconds"):
            value = getattr(self, name)
            if not (value >= 0 and math.isfinite(value)):
                raise ValueError(f"Throughput({name}={value!r}) must be a finite number >= 0")
        if not (isinstance(self.slots_per_worker, int) and self.slots_per_worker >= 1):
            raise ValueError(f"Throughput(slots_per_worker={self.slots_per_worker!r}) must be an integer >= 1")

    @property
    def workers_needed(self) -> int:
        """Workers the arrivals alone keep busy: ceil(rate x service time / slots per worker)."""
        busy_slots = self.arrival_rate * self.service_seconds
        return math.ceil(busy_slots / self.slots_per_worker - 1e-9)


@dataclass(frozen=True)
class WorkSample:
    """Cumulative counters of a pool at one instant, for estimate_throughput."""

    at: float
    #: ready + unacknowledged messages
    depth: int
    #: tasks finished so far (monotonic: the sum over workers of their completed-task counters)
    completed: int
    #: seconds of work those tasks took, summed (the runtime histogram's sum over workers)
    busy_seconds: float


#: estimate_throughput's default window: long enough to smooth one burst, short enough to follow a ramp.
THROUGHPUT_WINDOW_SECONDS = 60.0


def estimate_throughput(samples: Sequence[WorkSample], *, slots_per_worker: int, now: float,
                        window: float = THROUGHPUT_WINDOW_SECONDS) -> Throughput | None:
    """Arrival rate over the last ``window`` seconds of ``samples`` (oldest first; arrivals = depth
    change + completions) and mean service time over the same window, or over all of ``samples``
    when no task finished in it (a pool just scaled up from zero has run nothing lately). None
    without two samples in the window or without any completion to time."""
    recent = [s for s in samples if now - window <= s.at <= now]
    if len(recent) < 2 or recent[-1].at <= recent[0].at:
        return None
    first, last = recent[0], recent[-1]
    arrivals = max(0, (last.depth - first.depth) + (last.completed - first.completed))
    timed = (first, last) if last.completed > first.completed else (samples[0], samples[-1])
    completed = timed[1].completed - timed[0].completed
    if completed <= 0:
        return None
    service = max(0.0, timed[1].busy_seconds - timed[0].busy_seconds) / completed
    return Throughput(arrival_rate=arrivals / (last.at - first.at), service_seconds=service,
                      slots_per_worker=slots_per_worker)


@dataclass(frozen=True, kw_only=True)
class Observation:
    """The queues of one pool at one instant (summed over its queues)."""

    ready: int
    unacked: int
    #: age of the oldest READY message over all queues; None when none waits (or, with ready > 0,
    #: when nothing is known about it: the same as a lower bound of 0).
    oldest_message_age_seconds: float | None = None
    #: the oldest message has waited AT LEAST oldest_message_age_seconds: the broker could only
    #: bound it from below (taskherd.queues' AGE_LOWER_BOUND, an unstamped message, ...).
    oldest_message_age_is_lower_bound: bool = False
    #: how the age was measured (taskherd.queues.stats AGE_*); None when unknown.
    oldest_message_age_method: str | None = None
    #: dead-letter queue -> messages in it; None while the broker has not reported it.
    dead_letters: Mapping[str, int | None] = field(default_factory=dict)
    #: queues whose figures the broker has not reported yet (their counts are unknown, not 0).
    pending_queues: tuple[str, ...] = ()
    #: the workers' throughput, when their metrics were read; None: the depth and age rules alone.
    throughput: Throughput | None = None

    @property
    def depth(self) -> int:
        return self.ready + self.unacked

    @property
    def dead_letter_depth(self) -> int:
        return sum(d for d in self.dead_letters.values() if d is not None)

    @property
    def age_known_only_from_below(self) -> bool:
        return self.ready > 0 and (self.oldest_message_age_is_lower_bound or self.oldest_message_age_seconds is None)


@dataclass(frozen=True)
class Recommendation:
    """What one poll recommended before stabilisation; the history is a list of these."""

    at: float
    replicas: int
    age_triggered: bool = False
    #: the workers steady work needs (Little's law), when the throughput was known: the part of
    #: this recommendation a scale-down stabilisation window holds. None: all of it.
    sustained: int | None = None

    @property
    def held(self) -> int:
        """What this recommendation keeps during the scale-down stabilisation window."""
        return self.replicas if self.sustained is None else self.sustained


@dataclass(frozen=True)
class Decision:
    replicas: int
    reason: str
    #: to append to the history (None when nothing could be observed).
    recommendation: Recommendation | None = None


def _clamp(value: int, policy: ScalingPolicy) -> int:
    return max(policy.min_replicas, min(policy.max_replicas, value))


def _age_ratio(policy: ScalingPolicy, observation: Observation) -> float | None:
    limit, age = policy.max_oldest_message_age_seconds, observation.oldest_message_age_seconds
    if limit is None or age is None or observation.ready == 0 or age <= limit:
        return None
    return age / limit  # a lower bound over the limit is over the limit


def _age_in_doubt(policy: ScalingPolicy, observation: Observation) -> str | None:
    """Why a scale-down cannot be justified: messages wait and their age may be over the limit."""
    limit = policy.max_oldest_message_age_seconds
    if limit is None or not observation.age_known_only_from_below:
        return None
    age = observation.oldest_message_age_seconds
    if age is not None and age > limit:
        return None  # known to be over the limit: the age rule already acts on it
    known = "unknown" if not age else f"at least {int(age)}s, perhaps more"
    return f"the oldest message's age is {known} (limit {limit:g}s)"


def _needed(policy: ScalingPolicy, observation: Observation, current: int,
            history: Sequence[Recommendation], now: float) -> tuple[int, str, bool]:
    depth = observation.depth
    by_depth = math.ceil(depth / policy.target_depth_per_worker)
    why = (f"depth {depth} (ready {observation.ready}, unacked {observation.unacked}) needs {by_depth} "
           f"at {policy.target_depth_per_worker} per worker")
    ratio = _age_ratio(policy, observation)
    if ratio is None:
        return by_depth, why, False
    settling = any(r.age_triggered and now - AGE_SETTLE_SECONDS < r.at <= now for r in history)
    # Capped by the messages waiting (more workers than messages do not help), but never below
    # the workers there are: an oldest message over the limit is no time to remove any.
    by_age = current if settling else max(current, min(depth, max(current + 1, math.ceil(current * ratio))))
    if by_age > by_depth:
        at_least = "at least " if observation.oldest_message_age_is_lower_bound else ""
        return by_age, (f"oldest message waited {at_least}{int(observation.oldest_message_age_seconds)}s > "
                        f"{policy.max_oldest_message_age_seconds:g}s limit, needs {by_age}"), not settling
    return by_depth, why, False


def _littles_law(throughput: Throughput) -> str:
    return (f"arrivals {throughput.arrival_rate:.2f}/s x {throughput.service_seconds:.2f}s per task keep "
            f"{throughput.workers_needed} workers of {throughput.slots_per_worker} slots busy")


def prune_history(history: Sequence[Recommendation], now: float, window: float) -> list[Recommendation]:
    """Keep what the next decision needs: the window, plus the newest record older than it
    (which proves that the history covers the whole window)."""
    window = max(window, AGE_SETTLE_SECONDS)
    inside = [r for r in history if r.at > now - window]
    before = [r for r in history if r.at <= now - window]
    return ([max(before, key=lambda r: r.at)] if before else []) + inside


def desired_replicas(policy: ScalingPolicy, observation: Observation | None, current_replicas: int,
                     busy_workers: int, history: Sequence[Recommendation], now: float) -> Decision:
    current = current_replicas
    if observation is None:
        held = _clamp(current, policy)
        return Decision(held, f"queues could not be observed: holding {held}")
    if observation.pending_queues:
        held = _clamp(current, policy)
        return Decision(held, f"the broker has not reported {', '.join(observation.pending_queues)} yet: "
                              f"holding {held}")
    need, why, age_triggered = _needed(policy, observation, current, history, now)
    sustained = None
    if observation.throughput is not None:
        steady = observation.throughput.workers_needed
        # Busy workers are never removed (below), but not held for a window either: during a
        # backlog every worker is busy, and holding them all is what this rule avoids.
        sustained = _clamp(steady, policy)
        if steady > need:
            need, why = steady, _littles_law(observation.throughput)
    if busy_workers > need:
        need, why = busy_workers, f"{why}; {busy_workers} workers are busy"
    recommendation = Recommendation(now, _clamp(need, policy), age_triggered, sustained)
    target = recommendation.replicas
    if target != need:
        why = f"{why}; clamped to [{policy.min_replicas}, {policy.max_replicas}]"
    if target >= current or current > policy.max_replicas:
        return Decision(target, why, recommendation)
    doubt = _age_in_doubt(policy, observation)
    if doubt is not None:
        # Recorded as held at `current`, with what the arrivals alone need: that figure is observed,
        # not in doubt, and the window must not hold a backlog's workers on its account.
        return Decision(current, f"{why}; holding {current}: {doubt}",
                        dataclasses.replace(recommendation, replicas=current))
    # Scale-down: the highest recommendation of the window wins, and only a history that covers
    # the whole window may lower anything (a restarted operator first watches for one window).
    window = policy.scale_down_stabilization_seconds
    since = now - window
    if window > 0 and not any(r.at <= since for r in history):
        return Decision(current, f"{why}; holding {current} until {window:g}s of history cover the "
                                 f"stabilisation window", recommendation)
    in_window = [r for r in history if r.at > since]
    stabilised = min(max([target] + [r.held for r in in_window]), current)
    if stabilised == current:
        return Decision(current, f"{why}; holding {current}: stabilisation window ({window:g}s) "
                                 f"recommended {current} or more", recommendation)
    if stabilised < min(max([target] + [r.replicas for r in in_window]), current):
        return Decision(stabilised, f"{why}; the window ({window:g}s) holds only the {stabilised} worker(s) "
                                    f"the arrivals need (Little's law)", recommendation)
    return Decision(stabilised, f"{why}; stable for {window:g}s", recommendation)
