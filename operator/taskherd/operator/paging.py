"""Dead-letter paging as a pure state machine: which pages to send, given the DLQ depths and the clock.

Per dead-letter queue:
- depth >= threshold while not firing  -> FIRE once (status condition, one Warning Event, one POST);
- still firing, last POST >= resend interval ago -> RESEND (POST only: Alertmanager forgets an
  alert whose endsAt passed, so a firing alert is re-sent well before that, as Prometheus does);
  a step happens only at a poll, so the next POST comes after max(resend interval, poll interval),
  and endsAt is that many intervals ahead: a steady condition is a steady alert whatever the poll
  interval;
- depth < threshold while firing -> RESOLVE once (POST with endsAt = now);
- depth unknown (broker unreachable) -> no transition; a firing alert keeps being re-sent.
At most one page per queue per step and, while firing, at most one POST per resend interval:
never a flood. The state is plain data so it can live in the WorkerPool's status and survive an
operator restart without paging twice.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Mapping

#: endsAt of a firing alert = last send + this many times the interval to the next send: the resend
#: interval, or the poll interval when polls are further apart (Prometheus uses 4).
ENDS_AT_RESEND_INTERVALS = 4

PageKind = Literal["fire", "resend", "resolve"]


@dataclass(frozen=True)
class FiringQueue:
    since: float
    #: None after a failed POST: due again on the next step.
    last_sent: float | None
    depth: int


@dataclass(frozen=True)
class PagingState:
    firing: Mapping[str, FiringQueue] = field(default_factory=dict)

    @property
    def alerting(self) -> bool:
        return bool(self.firing)

    def unsent(self, queue: str) -> "PagingState":
        """The POST for `queue` failed: send again on the next step (without a new Event)."""
        if queue not in self.firing:
            return self
        return PagingState({**self.firing, queue: replace(self.firing[queue], last_sent=None)})

    def to_status(self) -> dict[str, Any]:
        return {q: {"since": f.since, "lastSentAt": f.last_sent, "depth": f.depth} for q, f in self.firing.items()}

    @classmethod
    def from_status(cls, data: Mapping[str, Any] | None) -> "PagingState":
        firing = {}
        if not isinstance(data, Mapping):
            return cls()
        for queue, item in data.items():
            if not isinstance(item, Mapping):
                continue  # a hand-edited status must not stop the operator
            try:
                since, depth = _seconds(item["since"]), _count(item.get("depth", 0))
            except (KeyError, ValueError):
                continue
            try:  # a sent time that is no time: sent again on the next step, without a second Event
                last_sent = None if item.get("lastSentAt") is None else _seconds(item["lastSentAt"])
            except ValueError:
                last_sent = None
            firing[queue] = FiringQueue(since, last_sent, depth)
        return cls(firing)


def _seconds(value: Any) -> float:
    """A time the status holds: a finite number (not a bool, not text): NaN or infinity would
    never be due again, so the alert would never be re-sent."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{value!r} is not a time in seconds")
    return float(value)


def _count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{value!r} is not a count")
    return int(value)


@dataclass(frozen=True)
class Page:
    kind: PageKind
    queue: str
    depth: int
    starts_at: float
    ends_at: float


def step(state: PagingState, dead_letters: Mapping[str, int] | None, *, threshold: int,
         resend_interval: float, now: float, poll_interval: float | None = None) -> tuple[PagingState, list[Page]]:
    """`poll_interval`: how far apart the steps come (None: at least as often as the resend
    interval). A resend happens only at a step, so a firing alert's endsAt is
    ENDS_AT_RESEND_INTERVALS times the longer of the two ahead: it never lapses between steps."""
    if threshold < 1:
        raise ValueError(f"threshold={threshold!r} is invalid: must be >= 1")
    if not resend_interval > 0 or not math.isfinite(resend_interval):
        raise ValueError(f"resend_interval={resend_interval!r} is invalid: must be > 0")
    if poll_interval is not None and (not poll_interval > 0 or not math.isfinite(poll_interval)):
        raise ValueError(f"poll_interval={poll_interval!r} is invalid: must be > 0")
    expires = now + ENDS_AT_RESEND_INTERVALS * max(resend_interval, poll_interval or 0.0)
    firing = dict(state.firing)
    pages: list[Page] = []
    queues = set(firing) | set(dead_letters or {})
    for queue in sorted(queues):
        current = firing.get(queue)
        if dead_letters is None:
            depth = None
        elif queue in dead_letters:
            depth = dead_letters[queue]
        else:
            depth = 0  # the queue left the spec: whatever paged for it is over
        if current is None:
            if depth is not None and depth >= threshold:
                firing[queue] = FiringQueue(now, now, depth)
                pages.append(Page("fire", queue, depth, now, expires))
        elif depth is not None and depth < threshold:
            del firing[queue]
            pages.append(Page("resolve", queue, depth, current.since, now))
        else:
            depth = current.depth if depth is None else depth
            # a send "in the future" (a hand-edited status, another replica's clock) is no send:
            # waiting for it could let the alert lapse
            due = current.last_sent is None or not 0 <= now - current.last_sent < resend_interval
            firing[queue] = FiringQueue(current.since, now if due else current.last_sent, depth)
            if due:
                pages.append(Page("resend", queue, depth, current.since, expires))
    return PagingState(firing), pages
