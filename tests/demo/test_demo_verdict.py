"""The demo's verdict on fabricated ledgers: every broken promise is named, a clean run passes."""
from e2e.demo.verdict import Attempt, DeadLetter, Observed, PodLife, Sent, busy_removals, judge

SENT = Sent(charges=("c1", "c2", "c3"), poison=("bad1",), memory_hogs=("r1",))
ALL_FAULTS = dict(min_replicas=1, max_replicas_seen=4, final_replicas=1, oom_kills=1)


def attempt(key, worker="w1", start=0.0, end=1.0, task_id=None):
    return Attempt(task_id=task_id or f"id-{key}", key=key, task_name="shop.charge", worker=worker,
                   started_at=start, finished_at=end)


def clean(**overrides) -> Observed:
    base = dict(
        effects={"c1": 1, "c2": 1, "c3": 1},
        attempts=(attempt("c1"), attempt("c2", end=None), attempt("c2", start=5, end=6), attempt("c3")),
        dead_letters=(DeadLetter("shop.charge", "bad1", "permanent: ValidationError", 1),
                      DeadLetter("shop.build_report", "r1", "killed its worker 3 times", 3)),
        alerts=({"labels": {"alertname": "TaskherdDeadLetters"}},),
        pods=(PodLife("w1", 0), PodLife("w2", 0, 3.0, "killed"), PodLife("w3", 0, 20.0, "scale-down")),
        **ALL_FAULTS,
    )
    base.update(overrides)
    return Observed(**base)


def test_clean_run_passes_and_counts_attempts():
    v = judge(SENT, clean())
    assert v.ok, v.failures
    assert v.tasks_sent == 5
    assert v.effects_recorded_once == 3
    assert v.attempts_per_task == {1: 2, 2: 1}
    assert v.interrupted_attempts == 1
    assert v.attempts_cut_by_kills == 0  # the unfinished attempt ran on w1, which was not killed
    assert v.pods_killed == 1 and v.pods_removed_by_scale_down == 1
    assert [d["key"] for d in v.dlq] == ["bad1", "r1"]


def test_lost_charge_is_named():
    v = judge(SENT, clean(effects={"c1": 1, "c3": 1}))
    assert v.lost == ["c2"]
    assert any(f.startswith("lost: 1 charge(s)") and "c2" in f for f in v.failures)


def test_duplicate_effect_is_named_with_its_count():
    v = judge(SENT, clean(effects={"c1": 1, "c2": 2, "c3": 1}))
    assert v.duplicated == {"c2": 2}
    assert any("c2×2" in f for f in v.failures)


def test_valid_charge_in_dlq_is_not_lost_but_fails():
    dead = clean().dead_letters + (DeadLetter("shop.charge", "c2", "retries exhausted", 6),)
    v = judge(SENT, clean(effects={"c1": 1, "c3": 1}, dead_letters=dead))
    assert v.lost == []
    assert any("should succeed" in f and "c2 (retries exhausted)" in f for f in v.failures)


def test_poison_that_takes_effect_or_misses_the_dlq_fails():
    v = judge(SENT, clean(effects={"c1": 1, "c2": 1, "c3": 1, "bad1": 1}, dead_letters=()))
    text = "\n".join(v.failures)
    assert "must not take effect: bad1" in text
    assert "not in the dead-letter queue" in text and "bad1, r1" in text


def test_missing_page_scale_and_faults_fail_each_with_its_reason():
    v = judge(SENT, clean(alerts=(), max_replicas_seen=1, final_replicas=3, oom_kills=0, pods=()))
    text = "\n".join(v.failures)
    assert "Alertmanager received no page" in text
    assert "never scaled up" in text
    assert "did not scale back down to minReplicas 1: 3 replica(s)" in text
    assert "never hit the memory limit" in text
    assert "no worker pod was killed" in text


def test_short_run_can_waive_fault_checks():
    v = judge(Sent(charges=("c1",)), clean(effects={"c1": 1}, attempts=(attempt("c1"),), dead_letters=(),
                                            alerts=(), pods=(), max_replicas_seen=1, oom_kills=0,
                                            expect=frozenset({"scale-down"})))
    assert v.ok, v.failures


def test_busy_pod_removed_while_an_idle_one_stays_is_caught():
    attempts = [attempt("c1", worker="busy", start=0, end=30), attempt("c2", worker="idle", start=0, end=2)]
    pods = [PodLife("busy", 0, 10, "scale-down"), PodLife("idle", 0)]
    assert busy_removals(pods, attempts) == ["busy"]
    # when every pod that stays is busy too, removing a busy one is the only choice
    attempts.append(attempt("c3", worker="idle", start=5, end=30))
    assert busy_removals(pods, attempts) == []


def test_killed_attempt_counts_as_running_until_its_redelivery_only():
    # the attempt on w1 died (no end); the task started again on w2 at t=4, so w1 is idle at t=10
    attempts = [attempt("c1", worker="w1", start=0, end=None, task_id="t1"),
                attempt("c1", worker="w2", start=4, end=5, task_id="t1")]
    pods = [PodLife("w1", 0, 10, "scale-down"), PodLife("w3", 0)]
    assert busy_removals(pods, attempts) == []


def test_a_removal_is_judged_on_what_the_scaler_could_have_seen():
    # "late" started its task 1.5 s before the removal; the operator's look (2 s old) saw it idle,
    # while "stays" was busy until just before: it picked the idle-looking pod, as promised
    attempts = [attempt("c1", worker="late", start=8.5, end=30), attempt("c2", worker="stays", start=0, end=9)]
    pods = [PodLife("late", 0, 10, "scale-down"), PodLife("stays", 0)]
    assert busy_removals(pods, attempts) == ["late"]
    assert busy_removals(pods, attempts, decision_lag=2) == []
    # busy all through the window while the other stayed idle all through it: caught
    attempts = [attempt("c1", worker="late", start=0, end=30), attempt("c2", worker="stays", start=0, end=5)]
    assert busy_removals(pods, attempts, decision_lag=2) == ["late"]
