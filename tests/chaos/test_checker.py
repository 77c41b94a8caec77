"""The checker's verdict on fabricated ledgers: each violation it exists to catch, and the cases that
must not count as one (an indeterminate publish, a documented duplicate envelope)."""
from e2e.chaos.checker import Attempt, DeadLetter, SentTask, check, effect_counts


def sent(key, kind="normal", confirmed=True, store="postgres", path="direct"):
    return SentTask(key=key, task_id=f"id-{key}", kind=kind, store=store, path=path, confirmed=confirmed)


def attempt(key, pod="w-1", finished=True, at=100.0):
    return Attempt(key=key, task_id=f"id-{key}", pod=pod, started_at=at, finished_at=at + 1 if finished else None,
                   outcome="SUCCESS" if finished else None)


def test_a_clean_run_passes_with_its_histogram_and_recovered_tasks():
    tasks = [sent("k-1"), sent("k-2", store="redis"), sent("k-3", path="outbox"), sent("p-1", kind="permanent")]
    effects = effect_counts(["k-1", "k-3"], [], ["k-2"])
    attempts = [attempt("k-1"), attempt("k-2", pod="w-1", finished=False), attempt("k-2", pod="w-2", at=110),
                attempt("k-3"), attempt("p-1")]
    result = check(tasks, effects, attempts, [DeadLetter("p-1", "permanent-error", 1)])
    assert result.ok, result.failures
    assert result.recovered == ["k-2"]
    assert result.attempts_histogram == {1: 2, 2: 1}
    assert (result.attempts_p50, result.attempts_max, result.interrupted_attempts) == (1, 2, 1)
    assert result.dead_letters == {"permanent-error": 1}


def test_a_confirmed_task_without_effect_or_dead_letter_is_lost():
    result = check([sent("k-1"), sent("k-2")], {"k-1": 1}, [], [])
    assert result.lost == ["k-2"]
    assert any(f.startswith("lost: 1 task") for f in result.failures)


def test_a_task_in_the_dlq_is_not_lost_but_is_a_surprise():
    result = check([sent("k-1")], {}, [], [DeadLetter("k-1", "retries-exhausted", 25)])
    assert result.lost == []
    assert result.dlq_surprises == ["k-1 is in the DLQ as ['retries-exhausted'] but should have succeeded"]


def test_a_surprise_says_who_dead_lettered_the_task_and_when():
    """The envelope's pod and times are what lead to the worker's log of the attempt."""
    letter = DeadLetter("k-1", "hard-time-limit", 1, context="by ledger-abc at 01:02:03, first failure 01:02:03: "
                        "exceeded its hard time limit (30s)")
    result = check([sent("k-1")], {}, [], [letter])
    assert result.dlq_surprises == ["k-1 is in the DLQ as ['hard-time-limit'] but should have succeeded (by ledger-abc "
                                    "at 01:02:03, first failure 01:02:03: exceeded its hard time limit (30s))"]
    assert not result.ok


def test_an_indeterminate_publish_may_or_may_not_take_effect():
    unknown = [sent("k-1", confirmed=False), sent("k-2", confirmed=False)]
    result = check(unknown, {"k-1": 1}, [], [])
    assert result.ok, result.failures
    assert (result.indeterminate, result.lost, result.unexpected) == (2, [], [])


def test_a_retried_publish_counts_once_and_confirmed_if_any_try_was():
    result = check([sent("k-1", confirmed=False), sent("k-1")], {}, [], [])
    assert (result.sent, result.confirmed, result.lost) == (1, 1, ["k-1"])


def test_effects_applied_twice_are_duplicated_whichever_store():
    effects = effect_counts(["k-1"], ["k-1"], ["k-2", "k-2", "k-2"])
    result = check([sent("k-1"), sent("k-2", store="redis")], effects, [], [])
    assert result.duplicated == {"k-1": 2, "k-2": 3}
    assert any(f.startswith("duplicated: 2 task") for f in result.failures)


def test_an_effect_never_sent_or_of_a_poison_task_is_unexpected():
    tasks = [sent("k-1"), sent("p-1", kind="permanent")]
    result = check(tasks, {"k-1": 1, "p-1": 1, "ghost": 1}, [], [DeadLetter("p-1", "permanent-error")])
    assert result.unexpected == ["ghost", "p-1"]
    assert not result.ok


def test_poison_must_be_dead_lettered_for_its_own_reason():
    tasks = [sent("p-1", kind="oom"), sent("p-2", kind="socket-wedge"), sent("p-3", kind="permanent")]
    dlq = [DeadLetter("p-1", "killed-worker", 5), DeadLetter("p-2", "soft-time-limit")]
    result = check(tasks, {}, [], dlq)
    assert result.dlq_surprises == [
        "p-2 (socket-wedge) is in the DLQ as ['soft-time-limit'], want hard-time-limit",
        "p-3 (permanent) is not in the DLQ (want reason permanent-error)",
    ]


def test_a_duplicate_envelope_is_reported_not_failed():
    tasks = [sent("p-1", kind="permanent")]
    result = check(tasks, {}, [], [DeadLetter("p-1", "permanent-error"), DeadLetter("p-1", "permanent-error")])
    assert result.ok and result.dlq_duplicates == ["p-1"]


def test_nothing_sent_is_a_failure_not_a_pass():
    assert check([], {}, [], []).failures == ["nothing was sent: the scenario had no load"]
