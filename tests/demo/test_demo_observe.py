"""How the demo's observer tells a force-deleted pod from one the scale-down removed (fabricated pods)."""
from e2e.demo.observe import Observer, parse_time


def pod(name, created="2026-01-01T00:00:00Z", deleted=None, grace=None):
    meta = {"name": name, "creationTimestamp": created}
    if deleted:
        meta.update(deletionTimestamp=deleted, deletionGracePeriodSeconds=grace)
    return {"metadata": meta, "status": {}}


def test_removal_causes_and_times():
    o = Observer(cluster=None, database_url="", t0=0)
    t = parse_time("2026-01-01T00:01:00Z")
    o._track_lives([pod("a"), pod("b"), pod("c")], now=t)
    o.mark_killed("a", t + 1)
    # a vanished at once (force delete); b is terminating with a 45 s grace period: asked at +5 s
    o._track_lives([pod("b", deleted="2026-01-01T00:01:50Z", grace=45), pod("c")], now=t + 2)
    lives = {p.pod: p for p in o.pod_lives()}
    assert (lives["a"].cause, lives["a"].removed_at) == ("killed", t + 1)
    assert (lives["b"].cause, lives["b"].removed_at) == ("scale-down", t + 5)
    assert lives["c"].removed_at is None
    # b finally goes: its removal time stays the one first seen
    o._track_lives([pod("c")], now=t + 30)
    assert {p.pod: p for p in o.pod_lives()}["b"].removed_at == t + 5


def test_pods_already_leaving_before_the_watch_are_not_this_runs():
    o = Observer(cluster=None, database_url="", t0=0)
    o.watch_started = parse_time("2026-01-01T00:01:00Z")
    o._track_lives([pod("old", deleted="2026-01-01T00:01:30Z", grace=45), pod("new")], now=o.watch_started + 1)
    o._track_lives([pod("new")], now=o.watch_started + 30)
    assert [p.pod for p in o.pod_lives()] == ["new"]
