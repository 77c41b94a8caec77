"""Reaction time from a backlog spike to the scale call: taskherd's operator vs KEDA + HPA defaults.

One harness, one simulated clock, the same traces for both:
- taskherd: `taskherd.operator.scaling.desired_replicas` (the real decision function) called at
  each poll (pollIntervalSeconds, default 5 s, random phase) plus the scheduler tick (0.25 s);
  "+ early notice" also counts the ready messages every second between polls, on a clock of its
  own, and polls on the next tick when they outgrow the pool (the real
  `taskherd.operator.early_notice.outgrows`, as the operator does on both brokers);
- KEDA + HPA, modelled from their documented defaults: KEDA polls its scaler every 30 s
  (pollingInterval) and alone does 0 -> 1 (activation); above 1 the HPA syncs every 15 s
  (--horizontal-pod-autoscaler-sync-period) with desired = ceil(metric / target) (AverageValue),
  a 10 % tolerance, no scale-up stabilisation and its default scale-up policies (max of +100 %
  and +4 pods per 15 s). The Redis scaler's metric is the list length: ready messages only.

Scenarios (target 5 messages per worker, max 50):
  cold   0 workers, 200 messages arrive at once            -> needs 40
  warm   2 workers busy, 200 messages arrive at once         -> needs 40
  age    4 workers, 12 slow messages (3 per worker, under target) whose oldest passes the
         30 s maxOldestMessageAgeSeconds at the spike       -> needs more workers (age rule)

Reported: time from the spike to the first scale call, and to the needed count, median and p95
over `--runs` random poll phases. Target: taskherd's first call within one poll interval.

    .venv/bin/python bench/operator_reaction.py [--runs 2000] [--poll 5]
"""
from __future__ import annotations

import argparse
import math
import random
import statistics
from dataclasses import dataclass
from typing import Callable

from taskherd.operator.early_notice import PROBE_SECONDS, outgrows
from taskherd.operator.policy import ScalingPolicy
from taskherd.operator.scaling import Observation, desired_replicas, prune_history

TICK = 0.25
KEDA_POLL, HPA_SYNC, HPA_TOLERANCE = 30.0, 15.0, 0.1
TARGET, MAX = 5, 50
HORIZON = 600.0


@dataclass
class Scenario:
    name: str
    start_replicas: int
    needed: int
    #: observation at time t (t >= 0 is after the spike); replicas does not change the trace
    #: (reaction, not drain, is measured).
    observe: Callable[[float], Observation]


def scenarios() -> list[Scenario]:
    def burst(t: float) -> Observation:
        return Observation(ready=200, unacked=0, oldest_message_age_seconds=max(t, 0.0)) if t >= 0 else \
            Observation(ready=0, unacked=0)

    def warm(t: float) -> Observation:
        return Observation(ready=200, unacked=2, oldest_message_age_seconds=max(t, 0.0)) if t >= 0 else \
            Observation(ready=0, unacked=2)

    def slow(t: float) -> Observation:
        # 12 messages, 4 running: the oldest waiting one crosses the 30 s limit at t = 0
        return Observation(ready=8, unacked=4, oldest_message_age_seconds=30.0 + t)

    return [Scenario("cold (0 -> 40)", 0, 40, burst), Scenario("warm (2 -> 40)", 2, 40, warm),
            Scenario("age (4 -> more)", 4, 5, slow)]


def taskherd_run(s: Scenario, poll: float, rng: random.Random, *, early: bool = False) -> tuple[float, float]:
    policy = ScalingPolicy(min_replicas=0, max_replicas=MAX, target_depth_per_worker=TARGET,
                           max_oldest_message_age_seconds=30.0, scale_down_stabilization_seconds=300.0)
    # Polls run at phase + k*poll, each noticed within one scheduler tick.
    t = -poll * 20 + rng.uniform(0, poll) + rng.uniform(0, TICK)
    count = t + rng.uniform(0, PROBE_SECONDS)  # the early notice's own clock
    replicas, history = s.start_replicas, []
    first = reached = math.inf
    while t < HORIZON:
        decision = desired_replicas(policy, s.observe(t), replicas, min(replicas, 4), history, t)
        history = prune_history(history + [decision.recommendation], t, 300.0)
        if decision.replicas > replicas and t >= 0:
            first = min(first, t)
        replicas = decision.replicas if t >= 0 else replicas
        if replicas >= s.needed and t >= 0:
            reached = min(reached, t)
            break
        due = t + poll
        while early and count < due:
            # counted only while the poll is due later than the next count (the scheduler's rule)
            if due - count > PROBE_SECONDS and outgrows(s.observe(count).ready, replicas, policy):
                due = count + TICK
            count += PROBE_SECONDS
        t = due
    return first, reached


def keda_hpa_run(s: Scenario, rng: random.Random) -> tuple[float, float]:
    keda_phase, hpa_phase = rng.uniform(0, KEDA_POLL), rng.uniform(0, HPA_SYNC)
    events = sorted([(keda_phase + k * KEDA_POLL, "keda") for k in range(int(HORIZON / KEDA_POLL) + 1)]
                    + [(hpa_phase + k * HPA_SYNC, "hpa") for k in range(int(HORIZON / HPA_SYNC) + 1)])
    replicas = s.start_replicas
    first = reached = math.inf
    for t, who in events:
        metric = s.observe(t).ready  # list length: ready messages only
        new = replicas
        if who == "keda" and replicas == 0 and metric > 0:
            new = 1  # activation
        elif who == "hpa" and replicas >= 1:
            ratio = (metric / TARGET) / replicas
            if abs(ratio - 1) > HPA_TOLERANCE:
                desired = math.ceil(metric / TARGET)
                limit = max(replicas * 2, replicas + 4)  # default scale-up policies per 15 s
                new = max(1, min(desired, limit, MAX)) if desired > replicas else replicas
        if new > replicas:
            first = min(first, t)
        replicas = new
        if replicas >= s.needed:
            reached = min(reached, t)
            break
    return first, reached


def summary(values: list[float]) -> str:
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return "never"
    q = statistics.quantiles(finite, n=20)[-1] if len(finite) > 1 else finite[0]
    never = f", never in {len(values) - len(finite)}/{len(values)}" if len(finite) < len(values) else ""
    return f"{statistics.median(finite):6.1f} s (p95 {q:5.1f}){never}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--poll", type=float, default=5.0)
    args = parser.parse_args()
    rng = random.Random(7)
    print(f"reaction to a backlog spike, {args.runs} random poll phases, target {TARGET}/worker, max {MAX}")
    print(f"{'scenario':<17} {'':<22} {'taskherd (poll ' + format(args.poll, 'g') + ' s)':<30} "
          f"{'+ early notice':<30} {'KEDA 30 s + HPA 15 s':<30} ratio (median, early notice)")
    ok = True
    for s in scenarios():
        ours = [taskherd_run(s, args.poll, rng) for _ in range(args.runs)]
        early = [taskherd_run(s, args.poll, rng, early=True) for _ in range(args.runs)]
        theirs = [keda_hpa_run(s, rng) for _ in range(args.runs)]
        for label, index in (("first scale call", 0), ("needed count", 1)):
            a, e, b = [r[index] for r in ours], [r[index] for r in early], [r[index] for r in theirs]
            finite_b = [v for v in b if math.isfinite(v)]
            ratio = (f"{statistics.median(finite_b) / statistics.median(e):5.1f}x" if finite_b
                     else "KEDA never reacts")
            print(f"{s.name:<17} {label:<22} {summary(a):<30} {summary(e):<30} {summary(b):<30} {ratio}")
        worst_first = max(r[0] for r in ours)
        ok &= worst_first <= args.poll + TICK
    print(f"target: every taskherd first call within one poll interval (+{TICK} s tick): "
          f"{'MET' if ok else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
