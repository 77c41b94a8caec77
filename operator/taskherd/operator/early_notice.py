"""Between two polls of a pool, a cheap count of its ready messages (pure; the scheduler runs it).

A burst on a quiet pool waits for the operator's next poll before any pod starts: up to
pollIntervalSeconds (5 s by default), which on bench/autoscaling.py's burst trace was most of what
separated taskherd's p99 wait from 1/5 of KEDA's. Polling every pool every second would cost five
times the operator's CPU (a poll reads the ages, the unacknowledged messages, the DLQs, the
workers). Instead, every PROBE_SECONDS the scheduler counts the ready messages of every pool
whose poll is not due anyway, with one round trip per broker for all its pools (on Redis one
command, 3-5 ms of CPU for 1,000 pools; on RabbitMQ pipelined passive declares over AMQP, ~5 ms
for 1,000 queues, because the management API's figures are up to 5 s old:
taskherd.queues.rabbitmq_counts), and brings a pool's poll forward when those messages alone
already ask the depth rule for more workers than the pool has. The poll then decides as always
(scaling.desired_replicas): the count only changes when it runs.

While a burst grows, a pool is brought forward again at each count that finds it outgrown (as if
polled every second): each such poll scales up, so there are at most maxReplicas of them.
Not counted: paused pools, pools at maxReplicas, pools whose spec is invalid, and pools whose
last poll could not read the queues or the target or scale it (PollResult.replicas is None:
bringing that poll forward would only fail again sooner).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Mapping, Sequence

from .pause import pause_from
from .policy import BrokerSpec, PoolSpec, ScalingPolicy

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


def candidate(spec: PoolSpec | None, annotations: Mapping[str, Any] | None, *, namespace: str,
              replicas: int | None) -> Candidate | None:
    """A pool (its parsed spec, None when invalid) as a Candidate, or None when counting its
    messages could not change anything (module docstring). The scheduler also leaves out the pools
    whose poll runs or is due within PROBE_SECONDS: they read the queues themselves."""
    if spec is None or replicas is None:
        return None
    if not spec.broker.queues or replicas >= spec.scaling.max_replicas:
        return None
    if pause_from(annotations) is not None:
        return None
    return Candidate(namespace, spec.broker, spec.scaling, replicas)
