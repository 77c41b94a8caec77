"""The dead-letter paging state machine (taskherd.operator.paging) and its payloads."""
from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from taskherd.operator.alerts import ALERT_NAME, alertmanager_alert, webhook_body
from taskherd.operator.paging import ENDS_AT_RESEND_INTERVALS, PagingState, step

QUEUES = ["a.dlq", "b.dlq"]
depth_maps = st.one_of(st.none(), st.fixed_dictionaries({q: st.integers(0, 20) for q in QUEUES}))
traces = st.lists(st.tuples(st.floats(0.5, 90), depth_maps, st.booleans()), max_size=60)


def run(trace, threshold, resend):
    state, t, log = PagingState(), 0.0, []
    for dt, depths, delivered in trace:
        t += dt
        state, pages = step(state, depths, threshold=threshold, resend_interval=resend, now=t)
        for page in pages:
            log.append((t, page, depths))
            if not delivered:
                state = state.unsent(page.queue)
    return state, log


@settings(deadline=None)  # a shared 2-core machine: no per-example deadline
@given(traces, st.integers(1, 10), st.sampled_from([30.0, 60.0]))
def test_one_fire_and_one_resolve_per_episode(trace, threshold, resend):
    _, log = run(trace, threshold, resend)
    for queue in QUEUES:
        kinds = [p.kind for _, p, _ in log if p.queue == queue and p.kind != "resend"]
        # fire, resolve, fire, resolve ... never two fires or two resolves in a row
        assert all(k == ("fire" if i % 2 == 0 else "resolve") for i, k in enumerate(kinds)), kinds


@settings(deadline=None)  # a shared 2-core machine: no per-example deadline
@given(traces, st.integers(1, 10), st.sampled_from([30.0, 60.0]))
def test_pages_follow_the_threshold(trace, threshold, resend):
    _, log = run(trace, threshold, resend)
    for _, page, depths in log:
        if page.kind == "fire":
            assert depths is not None and depths[page.queue] >= threshold
        if page.kind == "resolve":
            assert depths is not None and depths[page.queue] < threshold


@settings(deadline=None)  # a shared 2-core machine: no per-example deadline
@given(traces, st.integers(1, 10), st.sampled_from([30.0, 60.0]))
def test_never_a_flood_delivered_posts_are_spaced_by_the_resend_interval(trace, threshold, resend):
    # every page delivered: within one firing episode, posts are at least `resend` apart
    trace = [(dt, depths, True) for dt, depths, _ in trace]
    _, log = run(trace, threshold, resend)
    for queue in QUEUES:
        last = None
        for t, page, _ in log:
            if page.queue != queue:
                continue
            if page.kind == "fire":
                last = t
            elif page.kind == "resend":
                assert t - last >= resend
                last = t


@settings(deadline=None)  # a shared 2-core machine: no per-example deadline
@given(traces, st.integers(1, 10), st.sampled_from([30.0, 60.0]))
def test_a_firing_alert_is_resent_before_alertmanager_would_expire_it(trace, threshold, resend):
    trace = [(dt, depths, True) for dt, depths, _ in trace]
    state, t, expires = PagingState(), 0.0, {}
    for dt, depths, _ in trace:
        t += dt
        state, pages = step(state, depths, threshold=threshold, resend_interval=resend, now=t)
        for page in pages:
            expires[page.queue] = page.ends_at
            if page.kind != "resolve":
                assert page.ends_at == t + ENDS_AT_RESEND_INTERVALS * resend
        for queue in state.firing:  # polls come at most 90 s apart here: the alert never lapses
            assert expires[queue] > t


def test_a_failed_post_is_retried_next_step_without_a_second_fire():
    state, pages = step(PagingState(), {"q.dlq": 5}, threshold=1, resend_interval=60, now=0)
    assert [p.kind for p in pages] == ["fire"]
    state = state.unsent("q.dlq")
    state, pages = step(state, {"q.dlq": 5}, threshold=1, resend_interval=60, now=5)
    assert [p.kind for p in pages] == ["resend"]
    state, pages = step(state, {"q.dlq": 5}, threshold=1, resend_interval=60, now=10)
    assert pages == []


def test_unknown_depth_keeps_firing_and_never_resolves():
    state, _ = step(PagingState(), {"q.dlq": 3}, threshold=2, resend_interval=60, now=0)
    state, pages = step(state, None, threshold=2, resend_interval=60, now=61)
    assert [p.kind for p in pages] == ["resend"] and state.alerting
    state, pages = step(state, {"q.dlq": 1}, threshold=2, resend_interval=60, now=62)
    assert [p.kind for p in pages] == ["resolve"] and not state.alerting
    assert pages[0].ends_at == 62


def test_a_queue_removed_from_the_spec_resolves():
    state, _ = step(PagingState(), {"q.dlq": 3}, threshold=1, resend_interval=60, now=0)
    state, pages = step(state, {}, threshold=1, resend_interval=60, now=1)
    assert [p.kind for p in pages] == ["resolve"]


def test_state_survives_a_restart_through_the_status():
    state, _ = step(PagingState(), {"q.dlq": 3}, threshold=1, resend_interval=60, now=100)
    restored = PagingState.from_status(state.to_status())
    assert restored == state
    _, pages = step(restored, {"q.dlq": 3}, threshold=1, resend_interval=60, now=130)
    assert pages == [], "a restarted operator must not page again"
    assert PagingState.from_status({"q.dlq": {"oops": 1}}) == PagingState()


@pytest.mark.parametrize("bad", [{"threshold": 0, "resend_interval": 60}, {"threshold": 1, "resend_interval": 0}])
def test_invalid_arguments_name_the_key(bad):
    with pytest.raises(ValueError, match=next(iter(k for k, v in bad.items() if v in (0,)))):
        step(PagingState(), {}, now=0, **bad)


def test_alertmanager_payload_has_the_labels_and_times():
    _, [page] = step(PagingState(), {"q.dlq": 7}, threshold=5, resend_interval=60, now=1_700_000_000)
    alert = alertmanager_alert(page, pool="p", namespace="ns", severity="critical", threshold=5)
    assert alert["labels"] == {"alertname": ALERT_NAME, "pool": "p", "namespace": "ns", "queue": "q.dlq",
                               "severity": "critical"}
    assert alert["startsAt"] == "2023-11-14T22:13:20Z" and alert["endsAt"] == "2023-11-14T22:17:20Z"
    body = webhook_body(page, pool="p", namespace="ns", severity="critical", threshold=5)
    assert body["status"] == "firing" and body["depth"] == 7
