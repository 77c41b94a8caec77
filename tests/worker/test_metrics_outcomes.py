"""A real worker's outcome counts against what happened: each finished delivery counts exactly one
outcome (retries aside), messages the worker dead-letters before Celery sees a task included, under
a bounded task label; deliveries − outcomes = 0; a countdown is no queue wait; every registered
task's counters exist at 0 from the start (Prometheus's increase() sees the first of each)."""
from __future__ import annotations

import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from e2e.lib.services import free_port
from e2e.lib.waiting import wait_for
from worker_support import core_env, dead_letters

COUNTDOWN = 4.0


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def by_label(samples, name: str, *labels: str) -> dict[tuple[str, ...], float]:
    return {tuple(dict(key)[label] for label in labels): value for (sample, key), value in samples.items()
            if sample == name}


def test_each_delivery_counts_one_outcome(broker_url, record_url, recorded, producer, unique_name,
                                          worker_factory):
    port = free_port()
    env = {**core_env(broker_url, unique_name, record_url, soft_time_limit=1, time_limit=2),
           "TASKHERD_METRICS_PORT": str(port)}
    worker = worker_factory("apps.core_app", queues=[unique_name], concurrency=2, env=env)

    start = wait_for("the first scrape", lambda: scrape(port), timeout=15)
    outcomes_at_start = by_label(start, "taskherd_tasks_total", "task", "outcome")
    assert outcomes_at_start[("core.validation", "dead_lettered")] == 0  # present from the start, at 0
    assert outcomes_at_start[("core.record", "failed")] == 0
    assert outcomes_at_start[("unknown", "dead_lettered")] == 0
    assert not any(task.startswith("celery.") for task, _ in outcomes_at_start)
    assert set(outcomes_at_start.values()) == {0.0}
    deaths_at_start = by_label(start, "taskherd_pool_child_deaths_total", "task", "cause")
    assert {deaths_at_start[("core.kill_worker", cause)] for cause in ("OOMKilled", "SIGKILL", "SIGSEGV")} == {0.0}

    send = producer.send_task
    for i in range(3):                                                   # N = 3 succeed
        send("core.record", args=(f"ok{i}", "ok"), queue=unique_name)
    send("core.record", args=("later", "ok"), queue=unique_name, countdown=COUNTDOWN)  # succeeds, delayed
    for i in range(2):                                                   # M = 2 fail permanently
        send("core.validation", args=(f"bad{i}", -1), queue=unique_name)
    send("nope.unknown_one", queue=unique_name)                          # K = 2 unknown tasks
    send("nope.unknown_two", queue=unique_name)
    send("core.slow", args=(), queue=unique_name)                        # invalid: no arguments
    send("core.based_flaky", args=("flaky",), queue=unique_name)         # one retry, then success
    send("core.ignores_soft_limit", args=("stuck",), queue=unique_name)  # hard time limit

    expected = {("core.record", "succeeded"): 4, ("core.validation", "dead_lettered"): 2,
                ("unknown", "dead_lettered"): 2, ("core.slow", "dead_lettered"): 1,
                ("core.based_flaky", "retried"): 1, ("core.based_flaky", "succeeded"): 1,
                ("core.ignores_soft_limit", "dead_lettered"): 1}
    deliveries = {"core.record": 4, "core.validation": 2, "unknown": 2, "core.slow": 1, "core.based_flaky": 2,
                  "core.ignores_soft_limit": 1}

    wait_for("the six dead letters", lambda: len(dead_letters(broker_url, unique_name)), equals=6, timeout=60,
             explain=worker.tail)
    wait_for("the delayed and the retried task", lambda: (len(recorded("later")), len(recorded("flaky"))),
             equals=(1, 2), timeout=60, explain=worker.tail)

    def counted():
        samples = scrape(port)
        return samples if sum(by_label(samples, "taskherd_tasks_total", "task", "outcome").values()) >= sum(
            expected.values()) else None

    wait_for("the outcomes on /metrics", counted, timeout=30, explain=worker.tail)
    time.sleep(1.5)  # any second count (a task_failure after the dead letter) has landed by now
    samples = scrape(port)
    outcomes = {key: value for key, value in by_label(samples, "taskherd_tasks_total", "task", "outcome").items()
                if value}
    assert outcomes == expected
    counted_deliveries = {task: value for (task,), value in
                          by_label(samples, "taskherd_task_deliveries_total", "task").items() if value}
    assert counted_deliveries == deliveries
    assert sum(counted_deliveries.values()) - sum(outcomes.values()) == 0
    labels = {task for task, _ in by_label(samples, "taskherd_tasks_total", "task", "outcome")}
    assert not any(task.startswith("nope.") for task in labels), "a task name from the wire became a label"

    # The countdown is no queue wait: 4 stamped core.record runs, none waited the 4 s.
    wait_count = samples[("taskherd_task_queue_wait_seconds_count", (("task", "core.record"),))]
    wait_sum = samples[("taskherd_task_queue_wait_seconds_sum", (("task", "core.record"),))]
    assert wait_count == 4
    assert wait_sum < COUNTDOWN * 0.6, f"the {COUNTDOWN}s countdown counted as queue wait ({wait_sum}s)"
