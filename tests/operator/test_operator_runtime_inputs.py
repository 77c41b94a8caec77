"""What one pool's user-written input does at run time: a steady dead-letter alert whatever the
poll interval, pause annotations read as KEDA reads them (and never a failed poll), two pools on
one scale target (only the oldest scales it), and the scheduler's interval from the validated spec."""
from __future__ import annotations

import asyncio
import math
from datetime import datetime

import pytest

from fakes import Clock, FakeBroker, FakeKube, PolledPool, make_deps, pool_body
from taskherd.operator import scheduler as scheduler_module
from taskherd.operator.early_notice import candidate
from taskherd.operator.paging import ENDS_AT_RESEND_INTERVALS, PagingState, step
from taskherd.operator.pause import MAX_PAUSED_REPLICAS, PAUSED_REPLICAS, pause_from
from taskherd.operator.policy import DEFAULT_POLL_INTERVAL_SECONDS, parse_spec
from taskherd.operator.scaling import Observation
from taskherd.operator.scheduler import PoolScheduler, poll_interval


def condition(status, type_):
    return next(c for c in status["conditions"] if c["type"] == type_)


def ready(status):
    cond = condition(status, "Ready")
    return cond["status"], cond["reason"]


def epoch(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


# --- 1. the dead-letter alert does not lapse between polls -------------------------------------

@pytest.mark.parametrize("poll", [1.0, 30.0, 60.0, 299.0, 300.0])
@pytest.mark.parametrize("resend", [10.0, 60.0, 600.0])
def test_a_steady_dead_letter_condition_is_a_steady_alert_whatever_the_poll_interval(poll, resend):
    state, expires, t = PagingState(), None, 0.0
    for _ in range(40):
        if expires is not None:
            assert expires > t, f"the alert lapsed at {expires} before the poll at {t}"
        state, pages = step(state, {"q.dlq": 5}, threshold=1, resend_interval=resend, now=t, poll_interval=poll)
        for page in pages:
            assert page.kind in ("fire", "resend")
            assert page.ends_at == t + ENDS_AT_RESEND_INTERVALS * max(resend, poll)
            expires = page.ends_at
        t += poll


def test_a_step_refuses_a_poll_interval_that_is_no_interval():
    for bad in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="poll_interval"):
            step(PagingState(), {}, threshold=1, resend_interval=60, now=0, poll_interval=bad)


@pytest.mark.parametrize("resend", [None, 10])
def test_polled_every_300_seconds_the_posted_alert_never_lapses(resend):
    """The probe's pool: pollIntervalSeconds 300 and an Alertmanager; with the default resend (60 s)
    endsAt was 240 s ahead of a 300 s poll (60 s of every 300 without an alert), with 10 s 40 s."""
    posts = []
    clock = Clock()
    deps = make_deps(FakeKube(replicas={"workers": 1}),
                     FakeBroker(Observation(ready=0, unacked=0, dead_letters={"celery.dlq": 3})),
                     posts=posts, clock=clock)
    dead_letter = {"alertmanagerUrl": "http://am:9093"}
    if resend is not None:
        dead_letter["resendIntervalSeconds"] = resend
    pool = PolledPool(deps, pool_body(minReplicas=1, pollIntervalSeconds=300, deadLetter=dead_letter))
    sent = []
    for _ in range(12):  # an hour of polls, 300 s apart
        before = len(posts)
        pool.poll()
        assert len(posts) == before + 1, "fired, then re-sent at every poll (the resend interval is shorter)"
        sent.append(clock.t)
        clock.t += 300
    ends = [epoch(body[0]["endsAt"]) for _, body in posts]
    for i in range(len(ends) - 1):
        assert ends[i] > sent[i + 1], f"post {i} (endsAt {ends[i]}) lapsed before the next post at {sent[i + 1]}"
    assert ends[0] - sent[0] == ENDS_AT_RESEND_INTERVALS * 300


def test_a_status_whose_paging_times_are_no_times_neither_crashes_nor_silences_the_alert():
    restored = PagingState.from_status({
        "a.dlq": {"since": 100.0, "lastSentAt": math.inf, "depth": 3},   # never "due" again before
        "b.dlq": {"since": 100.0, "lastSentAt": math.nan, "depth": 3},
        "c.dlq": {"since": 100.0, "lastSentAt": 1e12, "depth": 3},        # a send far in the future
        "d.dlq": {"since": math.nan, "depth": 3},                         # no start: fired afresh
        "e.dlq": ["not", "a", "mapping"],
        "f.dlq": {"since": True, "depth": 3},
        "g.dlq": {"since": 100.0, "depth": math.inf},
    })
    assert sorted(restored.firing) == ["a.dlq", "b.dlq", "c.dlq"]
    _, pages = step(restored, {f"{q}.dlq": 3 for q in "abc"}, threshold=1, resend_interval=60, now=130)
    assert sorted((p.queue, p.kind) for p in pages) == [("a.dlq", "resend"), ("b.dlq", "resend"),
                                                        ("c.dlq", "resend")]
    assert PagingState.from_status(["a list"]) == PagingState()


# --- 2. pause annotations: ASCII digits, and never an exception out of the poll ----------------

@pytest.mark.parametrize("value", ["²", "٣", "１", "৩", "1" * 5000, "0x3", "+3", "3 3"])
def test_a_paused_replicas_value_of_other_digits_is_invalid_and_says_what_is_valid(value):
    pause = pause_from({PAUSED_REPLICAS: value})
    assert pause.replicas is None and pause.reason == "InvalidPauseAnnotation"
    assert f"annotation {PAUSED_REPLICAS}=" in pause.message
    assert f"must be a whole number of replicas 0-{MAX_PAUSED_REPLICAS}" in pause.message
    assert len(pause.message) < 300, "a long value is cut short"


@pytest.mark.parametrize("value,replicas", [("0", 0), ("007", 7), (" 12 ", 12), ("1000", 1000),
                                            ("0" * 3000 + "5", 5)])
def test_a_paused_replicas_value_of_ascii_digits_is_read(value, replicas):
    assert pause_from({PAUSED_REPLICAS: value}).replicas == replicas


def test_pause_annotations_that_are_no_mapping_are_no_pause():
    assert pause_from(["taskherd.io/paused"]) is None and pause_from("taskherd.io/paused") is None


def test_a_bad_pause_value_is_a_condition_not_a_failed_poll():
    kube = FakeKube(replicas={"workers": 3})
    deps = make_deps(kube, FakeBroker(Observation(ready=100, unacked=0)))
    body = pool_body()
    body["metadata"]["annotations"] = {PAUSED_REPLICAS: "²"}
    status = PolledPool(deps, body).poll()
    assert kube.scale_calls == [], "held at the current replicas"
    assert ready(status) == ("True", "Paused")
    cond = condition(status, "ScalingActive")
    assert cond["reason"] == "InvalidPauseAnnotation"
    assert f"{PAUSED_REPLICAS}='²' is invalid: must be a whole number of replicas 0-1000" in cond["message"]
    assert ("Warning", "InvalidPauseAnnotation") in [e[:2] for e in kube.posted_events]


def test_an_annotation_the_pause_reader_cannot_read_is_still_a_condition(monkeypatch):
    from taskherd.operator import observe as observe_module

    def broken(annotations):
        raise RuntimeError("a bug")

    monkeypatch.setattr(observe_module, "pause_from", broken)
    kube = FakeKube(replicas={"workers": 3})
    deps = make_deps(kube, FakeBroker(Observation(ready=100, unacked=0)))
    status = PolledPool(deps).poll()
    assert kube.scale_calls == []
    cond = condition(status, "ScalingActive")
    assert cond["reason"] == "InvalidPauseAnnotation" and PAUSED_REPLICAS in cond["message"]
    assert "0-1000" in cond["message"]


def test_the_early_notice_skips_a_pool_with_a_bad_pause_value():
    spec = parse_spec(pool_body()["spec"])
    assert candidate(spec, {PAUSED_REPLICAS: "²"}, namespace="ns", replicas=1) is None


@pytest.mark.parametrize("value", ["inf", "nan", 1e-9, 0.001, True, 10 ** 400, "30s", -5, 0, 301, None])
def test_the_scheduler_polls_an_invalid_interval_at_the_default_not_at_what_it_says(value):
    """The poll refuses the spec (InvalidSpec); the scheduler read the raw value: "inf" stopped the
    pool's polls for good, 1e-9 polled it at every tick, 10**400 raised out of the scheduler."""
    assert poll_interval(pool_body(pollIntervalSeconds=value)) == DEFAULT_POLL_INTERVAL_SECONDS


def test_the_scheduler_polls_a_valid_interval_as_the_spec_says():
    assert poll_interval(pool_body(pollIntervalSeconds=7)) == 7
    assert poll_interval(pool_body()) == DEFAULT_POLL_INTERVAL_SECONDS


# --- 3. two pools, one scale target ------------------------------------------------------------

class StatusKube(FakeKube):
    """Records each pool's status by name."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.by_pool: dict[str, dict] = {}

    async def patch_pool_status(self, namespace, name, status):
        await super().patch_pool_status(namespace, name, status)
        self.by_pool[name] = status


def named(name, created=None, **spec):
    body = pool_body(**spec)
    body["metadata"]["name"] = name
    if created:
        body["metadata"]["creationTimestamp"] = created
    return body


async def run_rounds(scheduler, t, seconds, step=1.0):
    end = t[0] + seconds
    while t[0] < end:
        await asyncio.gather(*scheduler.start_due())
        t[0] += step


def test_two_pools_on_one_target_do_not_fight_the_oldest_scales_it():
    async def scenario():
        kube = StatusKube(replicas={"workers": 1})
        deps = make_deps(kube, FakeBroker(Observation(ready=30, unacked=0)))
        t = [0.0]
        scheduler = PoolScheduler(deps=deps, monotonic=lambda: t[0])
        # "zeta" is older: it scales to 30/5 = 6; "alpha" (first by name) would scale to 30/2 = 15, capped at maxReplicas 10
        scheduler.upsert(named("zeta", "2026-01-01T00:00:00Z", pollIntervalSeconds=5, targetDepthPerWorker=5))
        scheduler.upsert(named("alpha", "2026-02-01T00:00:00Z", pollIntervalSeconds=5,
                               targetDepthPerWorker=2))
        await run_rounds(scheduler, t, 30)
        calls = list(kube.scale_calls)
        alpha, zeta = kube.by_pool["alpha"], kube.by_pool["zeta"]

        scheduler.remove("ns", "zeta")  # the conflict ends: alpha scales, at once
        await asyncio.gather(*scheduler.start_due())
        return calls, alpha, zeta, list(kube.scale_calls), kube.by_pool["alpha"]

    calls, alpha, zeta, after, resumed = asyncio.run(scenario())
    assert calls == [6], "only the oldest pool scaled the target: no flapping between 6 and 10"
    assert ready(zeta)[0] == "True"
    assert ready(alpha) == ("False", "ScaleTargetConflict")
    message = condition(alpha, "Ready")["message"]
    assert "spec.scaleTargetRef.name 'workers'" in message and "WorkerPool ns/zeta" in message
    assert condition(alpha, "ScalingActive")["reason"] == "ScaleTargetConflict"
    assert alpha.get("desiredReplicas") is None, "no desire of its own while it does not scale"
    assert after == [6, 10], "alpha scales once the conflict is over, without waiting for its interval"
    assert ready(resumed) == ("True", "ScalingUp")
    assert condition(resumed, "ScalingActive")["status"] == "True"


def test_the_pool_that_scales_a_shared_target_is_the_oldest_else_the_first_by_name():
    async def scenario(bodies):
        kube = StatusKube(replicas={"workers": 1})
        deps = make_deps(kube, FakeBroker(Observation(ready=0, unacked=0)))
        scheduler = PoolScheduler(deps=deps, monotonic=lambda: 0.0)
        for body in bodies:
            scheduler.upsert(body)
        await asyncio.gather(*scheduler.start_due())
        return sorted(name for name, status in kube.by_pool.items() if ready(status)[1] != "ScaleTargetConflict")

    assert asyncio.run(scenario([named("b"), named("a"), named("c")])) == ["a"]
    assert asyncio.run(scenario([named("a", "2026-03-01T00:00:00Z"), named("b", "2026-01-01T00:00:00Z"),
                                 named("c")])) == ["b"]


def test_pools_on_different_targets_namespaces_or_kinds_do_not_conflict():
    bodies = [named("a"), named("b", scaleTargetRef={"name": "other"}),
              named("c", scaleTargetRef={"name": "workers", "kind": "StatefulSet"})]
    elsewhere = named("d")
    elsewhere["metadata"]["namespace"] = "ns2"
    scheduler = PoolScheduler(deps=make_deps(FakeKube(), FakeBroker()), monotonic=lambda: 0.0)
    for body in bodies + [elsewhere]:
        scheduler.upsert(body)
    assert [scheduler.conflict(entry) for entry in scheduler.pools.values()] == [None] * 4


def test_a_pool_that_retargets_leaves_the_conflict_and_the_other_resumes():
    scheduler = PoolScheduler(deps=make_deps(FakeKube(), FakeBroker()), monotonic=lambda: 0.0)
    scheduler.upsert(named("a"))
    scheduler.upsert(named("b"))
    b = scheduler.pools[("ns", "b")]
    assert scheduler.conflict(b).reason == "ScaleTargetConflict"
    scheduler.upsert(named("a", scaleTargetRef={"name": "elsewhere"}))
    assert scheduler.conflict(b) is None
    scheduler.upsert(named("a"))
    assert scheduler.conflict(b) is not None and scheduler.conflict(scheduler.pools[("ns", "a")]) is None
    scheduler.upsert(named("a", maxReplicas="ten"))  # an invalid spec names no target: b scales
    assert scheduler.conflict(b) is None


def test_the_conflict_index_stays_linear_at_a_thousand_pools(monkeypatch):
    """1,000 pools on distinct targets and 1,000 on one target: finding who scales what costs a
    few comparisons per pool, not one per pair."""
    calls = [0]
    seniority = scheduler_module._seniority

    def counting(body):
        calls[0] += 1
        return seniority(body)

    monkeypatch.setattr(scheduler_module, "_seniority", counting)
    scheduler = PoolScheduler(deps=make_deps(FakeKube(), FakeBroker()), monotonic=lambda: 0.0)
    for i in range(1000):
        scheduler.upsert(named(f"own-{i:04}", scaleTargetRef={"name": f"w{i}"}))
        scheduler.upsert(named(f"shared-{i:04}", f"2026-01-01T00:{i // 60 % 60:02}:{i % 60:02}Z"))
    conflicts = [scheduler.conflict(entry) for entry in scheduler.pools.values()]
    assert sum(c is not None for c in conflicts) == 999
    assert "WorkerPool ns/shared-0000 (and 998 more)" in next(c for c in conflicts if c).message
    assert calls[0] < 10 * 2000, calls[0]
