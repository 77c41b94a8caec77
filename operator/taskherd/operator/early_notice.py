"""Between two polls of a Redis pool, a cheap count of its ready messages (pure; the scheduler runs it).

A burst on a quiet pool waits for the operator's next poll before any pod starts: up to
pollIntervalSeconds (5 s by default), which on bench/autoscaling.py's burst trace was most of what
separated taskherd's p99 wait from 1/5 of KEDA's. Polling every pool every second would cost five
times the operator's CPU (a poll reads the ages, the unacknowledged messages, the DLQs, the
workers). Instead, every PROBE_SECONDS the scheduler counts the ready messages of every Redis pool
whose poll is not due anyway, with one Redis command per broker for all its pools (3 ms of CPU
for 1,000 pools), and brings a pool's poll forward when those messages alone already ask the
depth rule for more workers than the pool has. The poll then decides as always
(scaling.desired_replicas): the count only changes when it runs.

Not counted: RabbitMQ pools (their count is an HTTP request per queue, what a poll costs), paused
pools, pools at maxReplicas, pools whose spec is invalid or whose replicas no poll has read yet.
A pool is brought forward at most once per poll interval, so a scale-up that keeps failing costs
at most twice its polls.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Mapping, Sequence

from .pause import pause_from
from .policy import BrokerSpec, InvalidSpec, ScalingPolicy, parse_spec_cached

#: how often the ready messages are counted.
PROBE_SECONDS = 1.0

#: (namespace, broker) of each pool -> its ready messages, None where not counted.
ReadyCountsFn = Callable[[Sequence[tuple[str, BrokerSpec]]], Awaitable[list[int | None]]]


def outgrows(ready: int, replicas: int, policy: ScalingPolicy) -> bool:
    """Whether `ready` messages alone ask the depth rule for more than `replicas` workers, and the
    pool may still grow. Ready is at most the depth a poll sees (ready + unacknowledged), so a
    poll brought forward by this scales up, unless the messages left in between."""
    return replicas < policy.max_replicas and math.ceil(ready / policy.target_depth_per_worker) > replicas


@dataclass(frozen=True)
class Candidate:
    """A pool whose ready messages are worth counting now."""

    namespace: str
    broker: BrokerSpec
    policy: ScalingPolicy
    #: the target's replicas after the pool's last poll
    replicas: int


def candidate(body: Mapping[str, Any], *, replicas: int | None, next_due: float,
              brought_forward_at: float, interval: float, now: float) -> Candidate | None:
    """The pool `body` as a Candidate, or None when counting its messages could not change
    anything (module docstring)."""
    if replicas is None or next_due - now < PROBE_SECONDS or now - brought_forward_at < interval:
        return None
    if pause_from((body.get("metadata") or {}).get("annotations")) is not None:
        return None
    try:
        spec = parse_spec_cached(body.get("spec") or {})
    except InvalidSpec:
        return None
    if spec.broker.type != "redis" or not spec.broker.queues or replicas >= spec.scaling.max_replicas:
        return None
    return Candidate((body.get("metadata") or {}).get("namespace", ""), spec.broker, spec.scaling, replicas)
