"""Metrics scraped over HTTP from a prefork worker (c=2, children recycled) match what was run."""
import time

import httpx
import redis
from celery import Celery
from prometheus_client.parser import text_string_to_metric_families

from e2e.lib.services import free_port
from e2e.lib.waiting import wait_for
from taskherd.worker.components import publish_stamps

QUEUE_WAIT = 5.0  # the stamped tasks claim to have been published this long ago


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def value(samples, name, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_metrics_match_the_ledger(redis_url, unique_name, worker_factory, tmp_path):
    port = free_port()
    env = {"TEST_BROKER_URL": redis_url, "TEST_LEDGER_URL": redis_url, "TEST_QUEUE": unique_name,
           "TASKHERD_HEARTBEAT_DIR": str(tmp_path / "heartbeat"), "TASKHERD_HEARTBEAT_INTERVAL": "0.5",
           "TEST_METRICS_PORT": str(port), "TEST_MAX_TASKS_PER_CHILD": "3"}
    worker = worker_factory("apps.runtime_app", queues=[unique_name], env=env, concurrency=2)
    first_children = set(worker.child_pids())
    # The test stamps (or leaves unstamped) on purpose; the stamping hook, process-wide once any
    # earlier test in this process called configure(), would restamp every message with "now".
    publish_stamps.disconnect()
    producer = Celery(broker=redis_url)

    def send(name, *args, stamped=True):
        headers = {"taskherd_published_at": time.time() - QUEUE_WAIT} if stamped else {}
        producer.send_task(name, args=args, queue=unique_name, headers=headers)

    for i in range(3):
        send("runtime.sleep", f"s{i}", 0.2)
    send("runtime.sleep", "unstamped", 0.2, stamped=False)
    send("runtime.fail", "f0")
    send("runtime.fail", "f1")
    send("runtime.retry_once", "r0")
    send("runtime.record", "d0", "dead_lettered")
    send("runtime.record", "j0", "rejected")
    # Ledger: 4 + 2 + 2 (retry) + 2 executions; every outcome below is one the test caused.
    expected_outcomes = {
        ("runtime.sleep", "succeeded"): 4, ("runtime.fail", "failed"): 2,
        ("runtime.retry_once", "retried"): 1, ("runtime.retry_once", "succeeded"): 1,
        ("runtime.record", "dead_lettered"): 1, ("runtime.record", "rejected"): 1,
        ("runtime.record", "succeeded"): 2,
    }
    executions = {"runtime.sleep": 4, "runtime.fail": 2, "runtime.retry_once": 2, "runtime.record": 2}

    ledger = redis.Redis.from_url(redis_url)
    wait_for("all tasks run (executions, tasks done)",
             lambda: (sum(int(ledger.get(k) or 0) for k in ledger.keys("runs:*")), ledger.llen("done")),
             equals=(sum(executions.values()), 4), timeout=30)

    def settled():
        samples = scrape(port)
        done = sum(v for (name, _), v in samples.items() if name == "taskherd_tasks_total")
        return samples if done == sum(expected_outcomes.values()) else None

    samples = wait_for("outcomes counted", settled, timeout=15)
    outcomes = {(dict(labels)["task"], dict(labels)["outcome"]): v  # the series created at 0 left out
                for (name, labels), v in samples.items() if name == "taskherd_tasks_total" and v}
    assert outcomes == expected_outcomes
    for task, count in executions.items():
        assert value(samples, "taskherd_task_deliveries_total", task=task) == count, task
        assert value(samples, "taskherd_task_runtime_seconds_count", task=task) == count, task
        assert value(samples, "taskherd_tasks_in_flight", task=task) == 0, task
    assert 4 * 0.2 <= value(samples, "taskherd_task_runtime_seconds_sum", task="runtime.sleep") < 4 * 0.2 + 2
    # Only the three stamped messages have a queue wait, each at least QUEUE_WAIT.
    assert value(samples, "taskherd_task_queue_wait_seconds_count", task="runtime.sleep") == 3
    assert 3 * QUEUE_WAIT <= value(samples, "taskherd_task_queue_wait_seconds_sum", task="runtime.sleep") < 3 * QUEUE_WAIT + 15
    assert value(samples, "taskherd_task_queue_wait_seconds_count", task="runtime.fail") == 2
    # The heartbeat as a timestamp (its age is time() minus it), and the versions that run.
    assert 0 <= time.time() - value(samples, "taskherd_heartbeat_timestamp_seconds") < 3
    (build,) = [labels for (name, labels), v in samples.items() if name == "taskherd_build_info" and v == 1]
    assert dict(build)["celery"].startswith("5.") and dict(build)["version"]
    # Its slots, for the operator's throughput estimate (Little's law): the prefork concurrency.
    assert value(samples, "taskherd_worker_slots") == 2
    # The operator asks for its few series only (prometheus_client's ?name[]= filter), from the
    # multiprocess files and the worker's own series alike.
    wanted = ["taskherd_tasks_in_flight", "taskherd_task_runtime_seconds_count", "taskherd_worker_slots",
              "taskherd_build_info"]
    filtered = httpx.get(f"http://127.0.0.1:{port}/metrics", params=[("name[]", n) for n in wanted], timeout=5).text
    assert {s.name for f in text_string_to_metric_families(filtered) for s in f.samples} == set(wanted)
    assert len(filtered) < len(httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text) / 4
    # The pool recycled children (max 3 tasks each): their counts survived them.
    assert not first_children & set(worker.child_pids()), "no child was replaced: the test proves less than it says"
    # ... folded into one archive file per type: no file of a dead child is left to read at each scrape.
    directory = tmp_path / "heartbeat" / "prometheus" / f"worker-{worker.pid}"
    # The processes alive BEFORE a scrape: a child recycled after it (its third task just ended)
    # keeps its files until the next scrape, and is in this set.
    live = {worker.pid, *worker.child_pids()}
    scrape(port)
    files = sorted(path.name for path in directory.iterdir())
    assert {"counter_archive.db", "histogram_archive.db"} <= set(files), files
    leftovers = [name for name in files if name[:-3].split("_")[-1].isdigit()
                 and int(name[:-3].split("_")[-1]) not in live]
    assert not leftovers, leftovers
    producer.close()
