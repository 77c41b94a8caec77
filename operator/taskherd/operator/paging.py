"""Dead-letter paging as a pure state machine: which pages to send, given the DLQ depths and the clock.

Per dead-letter queue:
- depth >= threshold while not firing  -> FIRE once (status condition, one Warning Event, one POST);
- still firing, last POST >= resend interval ago -> RESEND (POST only: Alertmanager forgets an
  alert whose endsAt passed, so a firing alert is re-sent well before that, as Prometheus does);
- depth < threshold while firing -> RESOLVE once (POST with endsAt = now);
- depth unknown (broker unreachable) -> no transition; a firing alert keeps being re-sent.
At most one page per queue per step and, while firing, at most one POST per resend interval:
never a flood. The state is plain data so it can live in the WorkerPool's status and survive an
operator restart without paging twice.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Literal, Mapping

#: endsAt of a firing alert = last send + this many resend intervals (Prometheus uses 4).
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
        for queue, item in (data or {}).items():
            try:
                firing[queue] = FiringQueue(float(item["since"]), None if item.get("lastSentAt") is None
                                            else float(item["lastSentAt"]), int(item.get("depth", 0)))
            except (KeyError, TypeError, ValueError):
                continue  # a hand-edited status must not stop the operator
        return cls(firing)


@dataclass(frozen=True)
class Page:
    kind: PageKind
    queue: str
    depth: int
    starts_at: float
    ends_at: float


def step(state: PagingState, dead_letters: Mapping[str, int] | None, *, threshold: int,
         resend_interval: float, now: float) -> tuple[PagingState, list[Page]]:
    if threshold < 1:
        raise ValueError(f"threshold={threshold!r} is invalid: must be >= 1")
    if resend_interval <= 0:
        raise ValueError(f"resend_interval={resend_interval!r} is invalid: must be > 0")
    expires = now + ENDS_AT_RESEND_INTERVALS * resend_interval
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
            due = current.last_sent is None or now - current.last_sent >= resend_interval
            firing[queue] = FiringQueue(current.since, now if due else current.last_sent, depth)
            if due:
                pages.append(Page("resend", queue, depth, current.since, expires))
    return PagingState(firing), pages
