"""The one bounded wait (e2e/lib/waiting.py), on a fake clock: what it returns, what it logs while
it waits, and what it says when it gives up."""
import logging

import pytest

from e2e.lib.waiting import WaitTimeout, wait_for


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def observations(*values):
    """An observe function returning `values` one call after another (the last one from then on)."""
    seen = list(values)
    return lambda: seen.pop(0) if len(seen) > 1 else seen[0]


def test_returns_the_first_value_that_meets_the_target_and_logs_current_against_target(caplog):
    clock = FakeClock()
    caplog.set_level(logging.INFO, logger="taskherd.e2e.wait")
    value = wait_for("ready workers", observations(0, 1, 1, 2, 3), timeout=60, interval=5, equals=2,
                     progress_every=10, clock=clock, sleep=clock.sleep)
    assert value == 2 and clock.now == 15
    progress = [r.getMessage() for r in caplog.records]
    assert progress[0] == "waiting for ready workers (want 2): now 0 (0s of 60s)"
    assert progress[1] == "waiting for ready workers (want 2): now 1 (10s of 60s)"
    assert progress[-1] == "ready workers: 2 after 15s"


def test_truthy_by_default_and_until_for_any_condition():
    clock = FakeClock()
    assert wait_for("a dead letter", observations([], [], ["letter"]), 10, clock=clock, sleep=clock.sleep) == ["letter"]
    assert wait_for("three runs", observations(1, 2, 3, 4), 10, until=lambda n: n >= 3,
                    clock=clock, sleep=clock.sleep) == 3


def test_gives_up_at_the_timeout_naming_what_it_awaited_and_what_it_last_saw():
    clock = FakeClock()
    calls = []

    def observe():
        calls.append(clock.now)
        return len(calls)

    with pytest.raises(WaitTimeout) as info:
        wait_for("ready workers", observe, timeout=3, interval=1, equals=10, explain=lambda: "pods: a, b",
                 clock=clock, sleep=clock.sleep)
    assert str(info.value) == "timed out after 3s waiting for ready workers (want 10); last seen: 4\npods: a, b"
    assert calls == [0, 1, 2, 3]  # bounded: one look per interval, the last one at the deadline
    assert isinstance(info.value, AssertionError)  # a test that times out fails; it does not error


def test_ignored_exceptions_count_as_not_yet_others_end_the_wait_at_once():
    clock = FakeClock()

    def not_there_yet():
        raise LookupError("pod p not found")

    with pytest.raises(WaitTimeout) as info:
        wait_for("pod p", not_there_yet, timeout=2, ignoring=(LookupError,), clock=clock, sleep=clock.sleep)
    assert "last seen: LookupError('pod p not found')" in str(info.value)
    assert isinstance(info.value.__cause__, LookupError)

    clock = FakeClock()
    with pytest.raises(LookupError):
        wait_for("pod p", not_there_yet, timeout=2, clock=clock, sleep=clock.sleep)
    assert clock.now == 0


def test_equals_and_until_together_are_refused():
    with pytest.raises(TypeError, match="equals= or until="):
        wait_for("x", lambda: 1, 1, equals=1, until=bool)
