"""The chaos suite's pure parts: the workload plan, steady state and settling, the matrix and the
docs update, the timeline — without a cluster."""
import random
from dataclasses import asdict

import pytest

from e2e.chaos import report
from e2e.chaos.checker import SentTask
from e2e.chaos.observe import Sample, Snapshot
from e2e.chaos.report import Outcome
from e2e.chaos.spec import Load
from e2e.chaos.steady import steady_problems, unsettled
from e2e.chaos.workload import OOM_MEGABYTES, Trickle, plan
from e2e.demo.timeline import Mark


def pod(name, ready=True, terminating=False, node="n1"):
    meta = {"name": name, **({"deletionTimestamp": "2026-12-01T00:00:00Z"} if terminating else {})}
    return {"metadata": meta, "spec": {"nodeName": node},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


# --- the workload ------------------------------------------------------------------------------

def test_the_plan_mixes_stores_paths_durations_and_places_the_poison():
    load = Load(tasks=40, outbox_share=0.5, durations=(0.2, 4.0), permanent=2, oom=1)
    tasks = plan("wk-ab", load, random.Random(7))
    assert [t.key for t in tasks] == [f"wk-ab-{i:05d}" for i in range(40)]
    assert sorted(t.kind for t in tasks if t.kind != "normal") == ["oom", "permanent", "permanent"]
    assert {t.store for t in tasks} == {"postgres", "redis"} and {t.path for t in tasks} == {"direct", "outbox"}
    assert {t.seconds for t in tasks} == {0.2, 4.0}
    oom = next(t for t in tasks if t.kind == "oom")
    assert oom.kwargs()["megabytes"] == OOM_MEGABYTES
    assert plan("wk-ab", load, random.Random(7)) == tasks  # seeded: the same scenario twice


def test_the_trickle_numbers_on_from_the_burst_on_the_path_asked():
    trickle = Trickle("wk-ab", Load(), random.Random(1), start=60)
    first, second = trickle.next("outbox"), trickle.next("direct")
    assert (first.key, first.path, first.kind) == ("wk-ab-00060", "outbox", "normal")
    assert (second.key, second.path) == ("wk-ab-00061", "direct")


# --- steady state and settling ----------------------------------------------------------------------

def test_steady_state_names_what_does_not_hold():
    snap = Snapshot(workers=[pod("w1"), pod("w2", ready=False), pod("w3", terminating=True)],
                    operators=[pod("op-a"), pod("op-b")], pool_status={"desiredReplicas": 3},
                    lease_holder="op-gone-1a2b3c")
    problems = steady_problems(["workers-ready", "queue-empty", "operator-leading", "outbox-empty"], snap,
                               queue_depth=4, outbox_pending=2, min_replicas=2)
    assert problems == [
        "workers-ready: 1 ready of 2 worker pods, the WorkerPool wants 3 (minReplicas 2)",
        "queue-empty: the work queue holds 4 message(s) (ready + unacked)",
        "operator-leading: the Lease holder 'op-gone-1a2b3c' is not a running operator pod",
        "outbox-empty: 2 outbox row(s) not yet relayed",
    ]
    calm = Snapshot(workers=[pod("w1"), pod("w2")], operators=[pod("op-a")], pool_status={"desiredReplicas": 2},
                    lease_holder="op-a-1a2b3c")
    assert steady_problems(["workers-ready", "queue-empty", "operator-leading", "outbox-empty"], calm,
                           queue_depth=0, outbox_pending=0, min_replicas=2) == []


def test_a_scale_down_is_over_only_at_the_minimum():
    three = Snapshot(workers=[pod("w1"), pod("w2"), pod("w3")], pool_status={"desiredReplicas": 3})
    assert steady_problems(["workers-ready", "pool-at-minimum"], three, queue_depth=0, outbox_pending=0,
                           min_replicas=2) == [
        "pool-at-minimum: 3 worker pod(s), the WorkerPool wants 3, not yet minReplicas 2"]
    two = Snapshot(workers=[pod("w1"), pod("w2")], pool_status={"desiredReplicas": 2})
    assert steady_problems(["pool-at-minimum"], two, queue_depth=0, outbox_pending=0, min_replicas=2) == []


def test_the_busiest_ready_worker_is_the_target():
    snap = Snapshot(workers=[pod("w1"), pod("w2"), pod("w3", ready=False)], in_flight={"w1": 1, "w2": 2, "w3": 5})
    assert snap.busiest_worker() == "w2"
    assert Snapshot(workers=[pod("w1")], in_flight={}).busiest_worker() is None


def test_settled_means_every_confirmed_task_has_its_outcome():
    def sent(key, kind="normal", confirmed=True):
        return SentTask(key, "id", kind, "postgres", "direct", confirmed)

    tasks = [sent("a"), sent("b"), sent("p", kind="permanent"), sent("q", kind="oom"), sent("u", confirmed=False)]
    assert unsettled(tasks, applied={"a"}, dead_lettered={"p"}) == ["b", "q"]
    assert unsettled(tasks, applied={"a"}, dead_lettered={"b", "p", "q"}) == []


# --- the report ------------------------------------------------------------------------------------

OUTCOMES = [
    Outcome("worker-sigkill", "worker-crash", "redis", "passed", lost=0, duplicated=0, unexpected=0, recovered=3,
            sent=80, attempts_p50=1, attempts_max=3, recovery_seconds=12.4),
    Outcome("worker-sigkill", "worker-crash", "rabbitmq", "failed", reason="lost: 1 task(s)", failures=["lost: 1 task(s)"],
            lost=1, duplicated=0, unexpected=0, recovered=2, sent=80, attempts_p50=1, attempts_max=2,
            recovery_seconds=None),
    Outcome("node-loss", "node", "redis", "excluded", reason="needs kind (E2E_CLUSTER=kind)"),
]


def test_the_matrix_shows_each_cell_and_the_failures():
    text = report.matrix_markdown(OUTCOMES, title="20261201 on the local cluster")
    assert "| worker-sigkill | worker-crash | pass · lost 0 · dup 0 · rec 3/80 · att 1/3 · 12 s | " \
           "**FAIL** · lost 1 · dup 0 · rec 2/80 · att 1/2 · – s |" in text
    assert "| node-loss | node | excluded: needs kind (E2E_CLUSTER=kind) | not in this file's brokers |" in text
    assert "2 scenario(s) ran, 1 failed, 1 excluded on this cluster" in text
    assert "- **worker-sigkill on rabbitmq**: lost: 1 task(s)" in text
    assert not OUTCOMES[1].ok and OUTCOMES[2].ok


def test_the_docs_matrix_is_replaced_between_its_markers(tmp_path):
    doc = tmp_path / "chaos.md"
    doc.write_text(f"intro\n{report.MATRIX_BEGIN}\nold\n{report.MATRIX_END}\nafter\n")
    report.update_docs("new table\n", doc)
    assert doc.read_text() == f"intro\n{report.MATRIX_BEGIN}\nnew table\n{report.MATRIX_END}\nafter\n"
    doc.write_text("no markers")
    with pytest.raises(ValueError, match="no matrix markers"):
        report.update_docs("x", doc)


def test_the_timeline_is_drawn_with_the_fault_window(tmp_path):
    samples = [Sample(t=t, depth=max(0, 30 - t), oldest_age_seconds=t / 2, dlq_depth=int(t > 10), replicas=2,
                      ready_replicas=1 if 5 < t < 15 else 2, desired_replicas=2, in_flight=4, restarts=0)
               for t in range(0, 30, 2)]
    path = report.draw_timeline(tmp_path, samples, [Mark(1, "load", "60 tasks"), Mark(5, "fault", "kill"),
                                                    Mark(20, "recovered", "recovered")], [(5, 15, "kill")],
                                title="unit")
    assert path.stat().st_size > 10_000


def test_a_matrix_from_several_runs_keeps_the_latest_of_each_scenario_and_shows_what_did_not_run():
    first, retried = asdict(OUTCOMES[1]), {**asdict(OUTCOMES[1]), "status": "passed", "lost": 0, "failures": []}
    outcomes = report.outcomes_from_summaries([{"outcome": asdict(OUTCOMES[0])}, {"outcome": first},
                                               {"outcome": retried}])
    assert [(o.fault, o.broker, o.status) for o in outcomes] == [("worker-sigkill", "redis", "passed"),
                                                                 ("worker-sigkill", "rabbitmq", "passed")]
    not_run = Outcome("rabbitmq-quorum-node-kill", "broker", "rabbitmq", "not run")
    text = report.matrix_markdown([*outcomes, not_run], title="t")
    assert "| rabbitmq-quorum-node-kill | broker | not in this file's brokers | not run |" in text
    assert "2 scenario(s) ran, 0 failed, 0 excluded on this cluster, 1 not run." in text
    assert not not_run.ok
