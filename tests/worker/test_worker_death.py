"""Worker death: a killed prefork child's task comes back; a task that kills its worker every time
is dead-lettered after max_deliveries while the rest of the queue keeps flowing."""
import os
import time
import signal

import pytest
import redis

from e2e.lib.waiting import wait_for
from worker_support import core_env, dead_letters


def test_sigkill_of_a_prefork_child_mid_task_redelivers_the_task(
        broker_url, record_url, recorded, producer, unique_name, worker_factory):
    # Redis: a short visibility_timeout (12 s, above the 10 s hard limit) so that, if the message
    # were only recoverable by kombu's restore sweep, it would still come back within the test.
    # (Measured: with reject_on_worker_lost Celery requeues it at once, see the assertion below.)
    env = core_env(broker_url, unique_name, record_url, soft_time_limit=8, time_limit=10,
                   visibility_timeout=12)
    worker = worker_factory("apps.core_app", queues=[unique_name], env=env, concurrency=1)
    producer.send_task("core.slow", args=("job", 2.0), queue=unique_name)

    wait_for("the task to start", lambda: recorded("job:start"), timeout=30)
    (_, child, _), = recorded("job:start")
    assert child in worker.child_pids()
    os.kill(child, signal.SIGKILL)

    wait_for("the task to run again and finish", lambda: recorded("job:done"), timeout=60)
    starts = recorded("job:start")
    assert len(starts) == 2, "the killed run was not acknowledged: the message came back once"
    assert starts[1][1] != child, "it ran again in a fresh child"
    assert len(recorded("job:done")) == 1
    print(f"redelivered {starts[1][0] - starts[0][0]:.2f}s after the first start")
    assert starts[1][0] - starts[0][0] < 10, "redelivered promptly (requeued on worker loss)"
    assert "WorkerLostError" in worker.log()
    assert dead_letters(broker_url, unique_name) == []


@pytest.mark.parametrize("counted_by", ["message or broker", "redis counter"])
def test_task_killing_its_worker_every_time_is_dead_lettered_after_n_deliveries(
        counted_by, broker_url, record_url, recorded, producer, unique_name, worker_factory):
    """Counted by the message or the broker (Redis: the count FastRecovery's restores carry;
    RabbitMQ classic queues: the copy the worker publishes with the count), or by a Redis counter
    (Redis without FastRecovery, RabbitMQ with delivery_counter_url): the same exact bound."""
    knobs = {"counter_url": ""} if counted_by == "message or broker" else {"fast_recovery": 0}
    env = core_env(broker_url, unique_name, record_url, max_deliveries=3, **knobs)
    worker = worker_factory("apps.core_app", queues=[unique_name], env=env, concurrency=2)
    poison = producer.send_task("core.kill_worker", args=("poison",), queue=unique_name)
    for i in range(100):
        producer.send_task("core.record", args=("normal", str(i)), queue=unique_name)

    wait_for("100 normal tasks to complete", lambda: len(recorded("normal")), timeout=120, equals=100)
    (letter,) = wait_for("the poison envelope", lambda: dead_letters(broker_url, unique_name), timeout=60)
    assert len(recorded("poison")) == 3, "it ran max_deliveries=3 times, never a 4th"
    assert sorted(int(v) for _, _, v in recorded("normal")) == list(range(100))
    env = letter.envelope
    assert env.reason == "killed-worker" and env.task_id == poison.id and env.attempts == 3
    assert "killed its worker 3 times" in env.detail
    counters = redis.Redis.from_url(record_url).keys("taskherd:deliveries:*")
    assert counters == [], "first deliveries are not counted and redelivery counters are cleaned up"
    source = "header" if counted_by == "message or broker" else "counter"
    assert f"2 earlier deliveries without an outcome (counted by {source})" in worker.log()


@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
@pytest.mark.parametrize("broker_url", ["rabbitmq"], indirect=True)
def test_a_countdown_task_held_through_worker_restarts_runs_once_and_is_not_taken_for_poison(
        queue_type, broker_url, record_url, recorded, unique_name, worker_factory):
    """On RabbitMQ a worker holds an ETA message unacknowledged until its ETA; every warm shutdown
    (a deploy, a drain, a scale-down) hands it back. Those returns are no deaths: the task never
    ran. Counted, a countdown outlived max_deliveries restarts and was dead-lettered as
    `killed-worker` without ever running (and a quorum queue's x-delivery-limit would drop it)."""
    from celery import Celery
    from taskherd.worker import configure

    q = unique_name
    producer = Celery("producer", broker=broker_url, set_as_current=False)
    configure(producer, queues=[q], queue_type=queue_type, max_deliveries=2)
    env = core_env(broker_url, q, record_url, queue_type=queue_type, max_deliveries=2, counter_url="")
    held = producer.send_task("core.record", args=("eta", "ran"), queue=q, countdown=40)
    sent_at = time.time()
    for restart in range(3):  # more returns than max_deliveries=2 allows deaths
        worker = worker_factory("apps.core_app", queues=[q], concurrency=1, env=env)
        worker.wait_for_log(held.id, timeout=30)  # received: held until its ETA
        assert worker.stop() == 0
    worker = worker_factory("apps.core_app", queues=[q], concurrency=1, env=env)
    (run,) = wait_for("the countdown task to run", lambda: recorded("eta"), timeout=90)
    assert run[0] >= sent_at + 40 - 1, "it ran at its ETA, not before"
    time.sleep(2)  # a second run, if there were one, would show up here
    assert len(recorded("eta")) == 1 and dead_letters(broker_url, q) == []
    assert "uncounted (its ETA is ahead)" not in worker.log(), "every copy was published"
    producer.close()
