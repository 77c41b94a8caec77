"""Properties of the pure scaling decision (taskherd.operator.scaling)."""
from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import assume, example, given, settings, strategies as st

from taskherd.operator.policy import ScalingPolicy
from taskherd.operator.scaling import (AGE_SETTLE_SECONDS, Observation, Recommendation, Throughput, WorkSample,
                                       desired_replicas, estimate_throughput, prune_history)

NOW = 1_000_000.0


@st.composite
def policies(draw) -> ScalingPolicy:
    lo = draw(st.integers(0, 5))
    return ScalingPolicy(
        min_replicas=lo,
        max_replicas=draw(st.integers(max(lo, 1), 30)),
        target_depth_per_worker=draw(st.integers(1, 20)),
        max_oldest_message_age_seconds=draw(st.one_of(st.none(), st.integers(1, 120).map(float))),
        scale_down_stabilization_seconds=draw(st.sampled_from([0.0, 15.0, 60.0, 300.0])),
    )


throughputs = st.builds(Throughput, arrival_rate=st.floats(0, 200), service_seconds=st.floats(0, 60),
                        slots_per_worker=st.integers(1, 8))
observations = st.builds(
    Observation,
    ready=st.integers(0, 500), unacked=st.integers(0, 100),
    oldest_message_age_seconds=st.one_of(st.none(), st.floats(0, 1000)),
    throughput=st.one_of(st.none(), throughputs),
)
histories = st.lists(st.builds(Recommendation, at=st.floats(NOW - 1000, NOW - 0.001),
                               replicas=st.integers(0, 40), age_triggered=st.booleans(),
                               sustained=st.one_of(st.none(), st.integers(0, 40))), max_size=8)


@settings(deadline=None)  # a shared 2-core machine: no per-example deadline
@given(policies(), st.one_of(st.none(), observations), st.integers(0, 40), st.integers(0, 40), histories)
def test_never_outside_min_max(policy, observation, current, busy, history):
    decision = desired_replicas(policy, observation, current, busy, history, NOW)
    assert policy.min_replicas <= decision.replicas <= policy.max_replicas, decision


@settings(deadline=None)  # a shared 2-core machine: no per-example deadline
@given(policies(), observations, st.integers(0, 40), st.integers(0, 40), histories)
def test_never_below_busy_workers(policy, observation, current, busy, history):
    decision = desired_replicas(policy, observation, current, busy, history, NOW)
    assert decision.replicas >= min(busy, policy.max_replicas), decision


@settings(deadline=None)  # a shared 2-core machine: no per-example deadline
@given(policies(), observations, st.integers(0, 40), st.integers(0, 40), histories)
def test_scale_up_goes_in_one_step_to_the_needed_count(policy, observation, current, busy, history):
    needed = min(policy.max_replicas, math.ceil(observation.depth / policy.target_depth_per_worker))
    assume(current <= policy.max_replicas and needed > current)
    decision = desired_replicas(policy, observation, current, busy, history, NOW)
    assert decision.replicas >= needed, decision


@st.composite
def under_target_with_old_message(draw):
    """A pool whose depth per worker is under target, with more messages than workers."""
    current = draw(st.integers(1, 29))
    target = draw(st.integers(2, 20))
    policy = ScalingPolicy(min_replicas=draw(st.integers(0, current)), max_replicas=draw(st.integers(current + 1, 30)),
                           target_depth_per_worker=target,
                           max_oldest_message_age_seconds=float(draw(st.integers(1, 120))),
                           scale_down_stabilization_seconds=draw(st.sampled_from([0.0, 60.0, 300.0])))
    depth = draw(st.integers(current + 1, current * target))
    return policy, current, depth


@settings(deadline=None)  # a shared 2-core machine: no per-example deadline
@given(under_target_with_old_message(), st.floats(1.01, 50), histories)
def test_old_message_scales_up_even_under_the_depth_target(case, over, history):
    policy, current, depth = case
    history = [r for r in history if not (r.age_triggered and r.at > NOW - AGE_SETTLE_SECONDS)]
    observation = Observation(ready=depth, unacked=0,
                              oldest_message_age_seconds=policy.max_oldest_message_age_seconds * over)
    assert math.ceil(depth / policy.target_depth_per_worker) <= current  # under target by depth alone
    decision = desired_replicas(policy, observation, current, 0, history, NOW)
    assert decision.replicas > current, decision
    assert "oldest message" in decision.reason
    assert decision.recommendation.age_triggered


def test_age_scale_up_does_not_compound_while_new_workers_start():
    policy = ScalingPolicy(min_replicas=1, max_replicas=50, target_depth_per_worker=100,
                           max_oldest_message_age_seconds=10)
    observation = Observation(ready=40, unacked=2, oldest_message_age_seconds=25)
    first = desired_replicas(policy, observation, 2, 2, [], NOW)
    assert first.replicas == 5  # 2 workers * 25s/10s, rounded up
    again = desired_replicas(policy, observation, first.replicas, 2, [first.recommendation], NOW + 5)
    assert again.replicas == 5, "pods still starting must not be counted as 'not enough' again"
    later = desired_replicas(policy, observation, 5, 2, [first.recommendation], NOW + AGE_SETTLE_SECONDS + 1)
    assert later.replicas > 5


@settings(deadline=None)  # a shared 2-core machine: no per-example deadline
@given(policies(), observations, st.integers(0, 40), st.integers(0, 40), histories)
def test_scale_down_only_after_the_window_and_to_its_highest_recommendation(policy, observation, current, busy,
                                                                           history):
    """Held: a whole recommendation, or only its sustained part when the throughput was known."""
    assume(current <= policy.max_replicas)
    decision = desired_replicas(policy, observation, current, busy, history, NOW)
    if decision.replicas < current:
        window = policy.scale_down_stabilization_seconds
        if window > 0:
            assert any(r.at <= NOW - window for r in history), "history must cover the whole window"
        in_window = [r.held for r in history if r.at > NOW - window]
        assert decision.replicas >= min(max(in_window, default=0), current)


@settings(deadline=None)  # a shared 2-core machine: no per-example deadline
@given(policies(), observations, throughputs, st.integers(0, 40), st.integers(0, 40), histories)
# a scale-down held because the oldest message's age is unknown still records what the arrivals need
@example(ScalingPolicy(min_replicas=0, max_replicas=2, target_depth_per_worker=1, max_oldest_message_age_seconds=1.0,
                       scale_down_stabilization_seconds=0.0),
         Observation(ready=1, unacked=0), Throughput(arrival_rate=0.0, service_seconds=0.0, slots_per_worker=1),
         2, 0, [])
def test_never_below_the_workers_the_arrivals_keep_busy(policy, observation, throughput, current, busy, history):
    observation = Observation(ready=observation.ready, unacked=observation.unacked,
                              oldest_message_age_seconds=observation.oldest_message_age_seconds, throughput=throughput)
    decision = desired_replicas(policy, observation, current, busy, history, NOW)
    assert decision.replicas >= min(policy.max_replicas, throughput.workers_needed), decision
    assert decision.recommendation.sustained == max(policy.min_replicas,
                                                    min(policy.max_replicas, throughput.workers_needed))


def test_a_drained_backlog_releases_its_workers_without_waiting_for_the_window():
    """40 workers drained a burst; the arrivals keep 2 busy. With the throughput known the window
    holds those 2, not the 40; without it, it holds 40 as the HPA would."""
    policy = ScalingPolicy(min_replicas=1, max_replicas=40, target_depth_per_worker=5)
    steady = Throughput(arrival_rate=3.0, service_seconds=1.2, slots_per_worker=2)  # 1.8 busy slots x 2 = 2 workers
    burst = [Recommendation(NOW - 400, 2, sustained=2), Recommendation(NOW - 60, 40, sustained=2)]
    drained = Observation(ready=0, unacked=3, throughput=steady)
    decision = desired_replicas(policy, drained, 40, 2, burst, NOW)
    assert decision.replicas == 2, decision
    assert "keep 2 workers of 2 slots busy" in decision.reason
    held = desired_replicas(policy, Observation(ready=0, unacked=3), 40, 2,
                            [Recommendation(r.at, r.replicas) for r in burst], NOW)
    assert held.replicas == 40, held


def test_the_rate_rule_scales_up_before_a_queue_forms():
    policy = ScalingPolicy(min_replicas=1, max_replicas=40, target_depth_per_worker=5)
    ramp = Observation(ready=2, unacked=8, throughput=Throughput(arrival_rate=12.0, service_seconds=1.5,
                                                                 slots_per_worker=2))
    decision = desired_replicas(policy, ramp, 5, 5, [], NOW)
    assert decision.replicas == 9  # 12/s x 1.5 s = 18 busy slots = 9 workers; depth alone says 2
    assert decision.reason.startswith("arrivals 12.00/s x 1.50s per task keep 9 workers")


def test_throughput_from_depth_change_and_completions():
    samples = [WorkSample(at=NOW - 70, depth=0, completed=0, busy_seconds=0.0),
               WorkSample(at=NOW - 60, depth=10, completed=100, busy_seconds=150.0),
               WorkSample(at=NOW, depth=40, completed=700, busy_seconds=1050.0)]
    throughput = estimate_throughput(samples, slots_per_worker=2, now=NOW)
    assert throughput == Throughput(arrival_rate=(30 + 600) / 60, service_seconds=1.5, slots_per_worker=2)
    assert estimate_throughput(samples[:1], slots_per_worker=2, now=NOW) is None, "one sample is no rate"
    waking = [WorkSample(at=NOW - 300, depth=0, completed=0, busy_seconds=0.0),
              WorkSample(at=NOW - 200, depth=0, completed=10, busy_seconds=20.0),
              WorkSample(at=NOW - 30, depth=0, completed=10, busy_seconds=20.0),
              WorkSample(at=NOW, depth=90, completed=10, busy_seconds=20.0)]
    assert estimate_throughput(waking, slots_per_worker=2, now=NOW) == Throughput(
        arrival_rate=3.0, service_seconds=2.0, slots_per_worker=2), "service time from before the window"
    never = [WorkSample(at=NOW - 30, depth=5, completed=0, busy_seconds=0.0),
             WorkSample(at=NOW, depth=9, completed=0, busy_seconds=0.0)]
    assert estimate_throughput(never, slots_per_worker=2, now=NOW) is None, "no completion: no service time"


@pytest.mark.parametrize("field,value", [("arrival_rate", -1.0), ("service_seconds", float("nan")),
                                         ("slots_per_worker", 0)])
def test_invalid_throughput_names_the_field(field, value):
    fields = {"arrival_rate": 1.0, "service_seconds": 1.0, "slots_per_worker": 2, field: value}
    with pytest.raises(ValueError, match=f"Throughput\\({field}="):
        Throughput(**fields)


@settings(deadline=None)  # a shared 2-core machine: no per-example deadline
@given(policies(), observations, st.integers(0, 40), histories)
def test_zero_to_n_as_soon_as_work_appears(policy, observation, busy, history):
    assume(observation.depth > 0)
    decision = desired_replicas(policy, observation, 0, busy, history, NOW)
    assert decision.replicas >= 1


@settings(deadline=None)  # a shared 2-core machine: no per-example deadline
@given(policies(), observations, st.integers(1, 40), st.integers(0, 40), histories)
def test_n_to_zero_only_when_empty_and_idle(policy, observation, current, busy, history):
    decision = desired_replicas(policy, observation, current, busy, history, NOW)
    if decision.replicas == 0:
        assert observation.depth == 0 and busy == 0


@settings(deadline=None)  # a shared 2-core machine: no per-example deadline
@given(policies(), st.integers(0, 40), histories)
def test_unobservable_queues_hold_the_current_count(policy, current, history):
    decision = desired_replicas(policy, None, current, 0, history, NOW)
    assert decision.replicas == max(policy.min_replicas, min(policy.max_replicas, current))
    assert "could not be observed" in decision.reason


@settings(max_examples=60, deadline=None)
@given(st.sampled_from([15.0, 60.0, 300.0]), st.integers(2, 20), st.sampled_from([1.0, 5.0, 10.0]))
def test_an_emptied_pool_reaches_zero_exactly_one_window_after_the_last_work(window, start, poll):
    """Simulated polls: work until t=0, then empty and idle. Replicas hold for the whole window,
    then drop to zero in one step."""
    policy = ScalingPolicy(min_replicas=0, max_replicas=20, target_depth_per_worker=1,
                           scale_down_stabilization_seconds=window)
    busy_trace = Observation(ready=0, unacked=start)
    empty = Observation(ready=0, unacked=0)
    history: list[Recommendation] = []
    replicas, t = start, -window - 2 * poll
    while t <= 0:
        d = desired_replicas(policy, busy_trace, replicas, start, history, t)
        history = prune_history(history + [d.recommendation], t, window)
        replicas, t = d.replicas, t + poll
    last_work = t - poll
    assert replicas == start
    while t < last_work + window + 2 * poll:
        d = desired_replicas(policy, empty, replicas, 0, history, t)
        history = prune_history(history + [d.recommendation], t, window)
        if t - last_work < window:
            assert d.replicas == start, (t, d)
        replicas, t = d.replicas, t + poll
    assert replicas == 0


@pytest.mark.parametrize("depth,expected", [(0, 1), (1, 1), (10, 1), (11, 2), (95, 10), (1000, 10)])
def test_depth_per_worker_examples(depth, expected):
    policy = ScalingPolicy(min_replicas=1, max_replicas=10, target_depth_per_worker=10)
    decision = desired_replicas(policy, Observation(ready=depth, unacked=0), 1, 0, [], NOW)
    assert decision.replicas == expected
    assert f"depth {depth}" in decision.reason


def test_prune_keeps_one_record_older_than_the_window():
    history = [Recommendation(NOW - s, 1) for s in (900, 400, 301, 200, 10)]
    kept = prune_history(history, NOW, 300)
    assert [NOW - r.at for r in kept] == [301, 200, 10]


@settings(deadline=None)  # a shared 2-core machine: no per-example deadline
@given(policies(), st.integers(1, 120), st.integers(1, 500), st.integers(0, 100),
       st.one_of(st.none(), st.floats(0, 1000)), st.integers(0, 40), st.integers(0, 40), histories)
def test_an_age_known_only_from_below_never_lets_a_limited_pool_shrink(policy, limit, ready, unacked, at_least,
                                                                      current, busy, history):
    """"At least 7 s" (or "unknown") is not "7 s": while messages wait, a pool with an age limit
    never scales down on the belief that they are young."""
    policy = dataclasses.replace(policy, max_oldest_message_age_seconds=float(limit))
    current = min(current, policy.max_replicas)
    observation = Observation(ready=ready, unacked=unacked, oldest_message_age_seconds=at_least,
                              oldest_message_age_is_lower_bound=True)
    decision = desired_replicas(policy, observation, current, busy, history, NOW)
    assert decision.replicas >= max(current, policy.min_replicas), decision


def test_a_lower_bound_over_the_limit_scales_up_like_a_measured_age():
    policy = ScalingPolicy(min_replicas=1, max_replicas=20, target_depth_per_worker=100,
                           max_oldest_message_age_seconds=30)
    observation = Observation(ready=50, unacked=0, oldest_message_age_seconds=90,
                              oldest_message_age_is_lower_bound=True)
    decision = desired_replicas(policy, observation, 2, 0, [], NOW)
    assert decision.replicas == 6 and "waited at least 90s > 30s" in decision.reason


def test_a_lower_bound_under_the_limit_holds_instead_of_scaling_down():
    policy = ScalingPolicy(min_replicas=0, max_replicas=20, target_depth_per_worker=10,
                           max_oldest_message_age_seconds=30, scale_down_stabilization_seconds=0)
    young_or_not = Observation(ready=3, unacked=0, oldest_message_age_seconds=7, oldest_message_age_is_lower_bound=True)
    decision = desired_replicas(policy, young_or_not, 5, 0, [], NOW)
    assert decision.replicas == 5
    assert "holding 5: the oldest message's age is at least 7s, perhaps more (limit 30s)" in decision.reason
    measured = Observation(ready=3, unacked=0, oldest_message_age_seconds=7)
    assert desired_replicas(policy, measured, 5, 0, [], NOW).replicas == 1


def test_queues_the_broker_has_not_reported_yet_hold_the_count():
    policy = ScalingPolicy(min_replicas=0, max_replicas=20, target_depth_per_worker=10,
                           scale_down_stabilization_seconds=0)
    observation = Observation(ready=0, unacked=0, pending_queues=("emails",))
    decision = desired_replicas(policy, observation, 4, 0, [], NOW)
    assert decision.replicas == 4 and decision.reason == "the broker has not reported emails yet: holding 4"
