"""Age of a queue's head from the broker's own history of its publish counter (pure).

For a queue without a head timestamp (RabbitMQ quorum queues always; classic queues whose head is
paged out, unstamped, or not in the statistics yet), reading the head message is not an option:
basic.get + requeue marks it redelivered and, on a quorum queue, counts against
``x-delivery-limit``. What the management API does keep is the history of the queue's cumulative
publish counter P: ``message_stats.publish_details.samples``, one (broker time, P) sample per 5 s
for the last 10 minutes and per 60 s for the last hour (the default retention policy). In a FIFO
queue the ready messages are the last ``ready`` ones published, so the head is message number
``k = P - ready + 1``:

- the first sample that shows P >= k says message k was published by that sample's time;
- the sample before it shows P < k; that value may be up to L old (channels report their
  counters every ``collect_statistics_interval``, 5 s, and the management collector samples them
  on its own 5 s tick: L = 10 s), so message k was published after that sample's time minus L.

We report the midpoint of that bracket and half its width as the error. When every sample of the
window already shows P >= k, the head predates the window: all we can say is "at least this old"
(``AGE_LOWER_BOUND``); the caller then asks for a longer window. When k < 1 the head was never
counted (it predates a counter reset, e.g. a node restart with durable messages, or it was
dead-lettered into the queue, or published on a channel that closed before the collector's first
tick, whose counters the broker then drops): its age is unknown and we say so (None), never "young".

Known biases: messages returned to the head (nack/requeue, a closed channel) are older than
message k, so the figure can be too young by how long they had been out; messages that entered
without a publish (dead-lettered into the queue) make it too old. Broker and caller clocks are
assumed to agree (NTP), as for any timestamp.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from .stats import AGE_FROM_PUBLISH_COUNTER, AGE_LOWER_BOUND

#: How stale a sampled counter may be: two default collect_statistics_interval periods (the
#: channel's report, then the collector's sample).
STATS_LAG_SECONDS = 10.0


@dataclass(frozen=True)
class AgeEstimate:
    age_seconds: float
    #: the true age lies within age_seconds ± this; None: a lower bound only.
    error_seconds: float | None
    method: str


def samples_of(publish_details: dict | None) -> list[tuple[float, int]]:
    """(broker time in seconds, counter) pairs from a management API ``*_details`` object."""
    points = []
    for item in (publish_details or {}).get("samples") or []:
        try:
            points.append((float(item["timestamp"]) / 1000.0, int(item["sample"])))
        except (KeyError, TypeError, ValueError):
            continue
    return points


def head_age(samples: Iterable[tuple[float, int]], *, published_total: int, ready: int, now: float,
             stats_lag_seconds: float = STATS_LAG_SECONDS) -> AgeEstimate | None:
    """How long the head of the queue has waited, from the counter's samples; None when unknown."""
    if ready <= 0:
        return None
    head = published_total - ready + 1
    if head < 1:
        return None
    points = sorted(samples)
    # Only the counter's current run counts: a value lower than the one before is a reset.
    epoch, before_epoch = 0, None
    for i in range(1, len(points)):
        if points[i][1] < points[i - 1][1]:
            epoch, before_epoch = i, points[i - 1][0]
    points = points[epoch:]
    if not points:
        return None
    first_at_head = next((i for i, (_, value) in enumerate(points) if value >= head), None)
    if first_at_head is None:  # the samples have not caught up with the counter we were given
        published_by, published_after = now, points[-1][0] - stats_lag_seconds
    elif first_at_head > 0:
        published_by, published_after = points[first_at_head][0], points[first_at_head - 1][0] - stats_lag_seconds
    elif before_epoch is not None:  # published after the reset, which came after the sample before it
        published_by, published_after = points[0][0], before_epoch - stats_lag_seconds
    else:
        return AgeEstimate(max(0.0, now - points[0][0]), None, AGE_LOWER_BOUND)
    midpoint = (published_after + published_by) / 2
    return AgeEstimate(max(0.0, now - midpoint), (published_by - published_after) / 2, AGE_FROM_PUBLISH_COUNTER)
