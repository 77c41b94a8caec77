"""Age of a queue's head from its cumulative publish counter, for queues with no head timestamp.

RabbitMQ quorum queues have no ``head_message_timestamp``, and the only way to read the head
message (basic.get + requeue) counts a delivery against ``x-delivery-limit`` and may reorder. What
the management API does give is ``message_stats.publish`` — how many messages were ever published
into the queue, P(t) — and ``messages_ready``. In a FIFO queue the ready messages are the last
``ready`` ones published, so the head is message number ``k = P - ready + 1``. If we remember when
we saw the counter at each value, message k was published between the last observation with
P < k and the first with P >= k: the head's age is known to within that bracket.

The counter we read at time t may be up to the management statistics lag L old
(``collect_statistics_interval``, 5 s by default), so the bracket is widened by L on its early
side: published in [last P<k − L, first P>=k]. We report its midpoint; the error is half its width
(about (poll interval + L) / 2 while messages keep arriving). Messages returned to the head
(nack/requeue, a closed channel) are older than message k: the estimate is then too young by at
most how long they had been out. Counter resets (queue re-declared, node restart) restart the
history. When the head predates our first observation we can only say "at least this old".
Pure and clock-injected: ``observe(key, now=..., published_total=..., ready=...)``.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass

from .stats import AGE_FROM_PUBLISH_COUNTER, AGE_LOWER_BOUND

#: Runs kept per queue: bounds memory if a queue never drains.
MAX_RUNS = 10_000
#: While a queue reads empty, observations younger than this are kept (statistics lag).
RECENT_WINDOW_SECONDS = 120.0


@dataclass
class _Run:
    """Observations that saw the counter at one value: first and last time it was seen there."""
    published_total: int
    first_seen: float
    last_seen: float


@dataclass(frozen=True)
class AgeEstimate:
    age_seconds: float
    error_seconds: float | None  # None: a lower bound only
    method: str


class PublishHistory:
    """Remembers (time, publish counter) runs per queue key across polls."""

    def __init__(self, *, stats_lag_seconds: float = 5.0) -> None:
        self.stats_lag_seconds = stats_lag_seconds
        self._runs: dict[object, list[_Run]] = {}
        self._lock = threading.Lock()

    def observe(self, key: object, *, now: float, published_total: int, ready: int) -> AgeEstimate | None:
        with self._lock:
            runs = self._runs.setdefault(key, [])
            if runs and published_total < runs[-1].published_total:
                runs.clear()  # the counter went backwards: a new queue or a restarted node
            if runs and runs[-1].published_total == published_total:
                runs[-1].last_seen = now
            else:
                runs.append(_Run(published_total, now, now))
            if ready <= 0:
                # Nothing waits — or the ready count lags the counter (a new quorum queue reports
                # no counts for ~10 s): keep a recent window so the next head can still be bracketed.
                recent = [run for run in runs[:-2] if now - run.last_seen <= RECENT_WINDOW_SECONDS]
                runs[:] = recent + runs[-2:]
                return None
            head = published_total - ready + 1
            index = next((i for i, run in enumerate(runs) if run.published_total >= head), len(runs) - 1)
            # Runs before the one just below the head are never needed again (the head only moves on).
            drop = max(index - 1, len(runs) - MAX_RUNS, 0)
            del runs[:drop]
            index = max(0, index - drop)
            published_by = runs[index].first_seen
            if index == 0:
                return AgeEstimate(max(0.0, now - published_by), None, AGE_LOWER_BOUND)
            published_after = runs[index - 1].last_seen - self.stats_lag_seconds
            midpoint = (published_after + published_by) / 2
            return AgeEstimate(max(0.0, now - midpoint), (published_by - published_after) / 2,
                               AGE_FROM_PUBLISH_COUNTER)


#: The history used when the caller passes none: inspect_queues is called periodically by the
#: operator and the exporter in one long-lived process each, so module state spans their polls.
DEFAULT_HISTORY = PublishHistory()
