"""How an observer tells a force-deleted pod from one the scale-down removed, and when each was
asked to go (fabricated pods; e2e.lib.pod_lives serves the demo's and the chaos suite's observers)."""
from e2e.lib.pod_lives import parse_time, track


def pod(name, created="2026-01-01T00:00:00Z", deleted=None, grace=None):
    meta = {"name": name, "creationTimestamp": created}
    if deleted:
        meta.update(deletionTimestamp=deleted, deletionGracePeriodSeconds=grace)
    return {"metadata": meta, "status": {}}


def test_removal_causes_and_times():
    lives, killed = {}, {}
    t = parse_time("2026-01-01T00:01:00Z")
    track(lives, [pod("a"), pod("b"), pod("c")], t, killed=killed)
    killed["a"] = t + 1
    # a vanished at once (force delete); b is terminating with a 45 s grace period: asked at +5 s
    track(lives, [pod("b", deleted="2026-01-01T00:01:50Z", grace=45), pod("c")], t + 2, killed=killed)
    assert (lives["a"].cause, lives["a"].removed_at) == ("killed", t + 1)
    assert (lives["b"].cause, lives["b"].removed_at) == ("scale-down", t + 5)
    assert lives["c"].removed_at is None
    # b finally goes: its removal time stays the one first seen
    track(lives, [pod("c")], t + 30, killed=killed)
    assert lives["b"].removed_at == t + 5


def test_pods_already_leaving_before_the_watch_are_not_this_runs():
    lives = {}
    started = parse_time("2026-01-01T00:01:00Z")
    track(lives, [pod("old", deleted="2026-01-01T00:01:30Z", grace=45), pod("new")], started + 1, killed={},
          watch_started=started)
    track(lives, [pod("new")], started + 30, killed={}, watch_started=started)
    assert list(lives) == ["new"]


def test_without_a_watch_start_every_pod_seen_counts():
    lives = {}
    track(lives, [pod("leaving", deleted="2026-01-01T00:01:30Z", grace=45)], parse_time("2026-01-01T00:01:00Z"),
          killed={})
    assert lives["leaving"].cause == "scale-down"
