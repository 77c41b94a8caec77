"""A task whose envelope cannot be published at the moment it fails is never lost: not when its
hard time limit killed it, not when its soft time limit expires during the publish, and not on a
quorum queue, where every return to the queue counts against x-delivery-limit."""
import pytest

from e2e.lib.waiting import wait_for
from worker_support import core_env, dead_letters, make_dlq_unwritable


def test_hard_time_limit_with_an_unwritable_dlq_puts_the_task_back(broker_url, record_url, recorded, producer,
                                                                   unique_name, worker_factory):
    """billiard records a hard-timed-out job's result (Celery acks) before the timeout handler runs:
    the envelope has to be published first, or the task is gone when the DLQ cannot be written."""
    q = unique_name
    repair = make_dlq_unwritable(broker_url, f"{q}.dlq")
    env = core_env(broker_url, q, record_url, soft_time_limit=1, time_limit=2)
    worker = worker_factory("apps.core_app", queues=[q], concurrency=1, env=env)
    stuck = producer.send_task("core.ignores_soft_limit", args=("stuck",), queue=q)

    wait_for("the timed-out task to come back (runs)", lambda: len(recorded("stuck")), until=lambda runs: runs >= 2,
             timeout=60)
    assert "could not dead-letter" in worker.log()
    repair()
    (letter,) = wait_for("the envelope after the repair", lambda: dead_letters(broker_url, q), timeout=60)
    assert letter.envelope.reason == "hard-time-limit" and letter.task_id == stuck.id


def test_soft_time_limit_during_a_failed_envelope_publish_puts_the_task_back(
        broker_url, record_url, recorded, producer, unique_name, worker_factory):
    """The task fails at 1.5 s; its envelope cannot be published, and the soft limit (2 s) expires
    in the pause before the message goes back. That SoftTimeLimitExceeded must not turn into an
    ordinary failure (acknowledged, no envelope)."""
    q = unique_name
    repair = make_dlq_unwritable(broker_url, f"{q}.dlq")
    env = core_env(broker_url, q, record_url, soft_time_limit=2, time_limit=10)
    worker = worker_factory("apps.core_app", queues=[q], concurrency=1, env=env)
    failing = producer.send_task("core.fails_after", args=("late", 1.5), queue=q)

    wait_for("the task to come back", lambda: len(recorded("late")), timeout=60, until=lambda runs: runs >= 2)
    assert "the soft time limit expired while an envelope was being published" in worker.log()
    repair()
    (letter,) = wait_for("the envelope after the repair", lambda: dead_letters(broker_url, q), timeout=60)
    assert letter.envelope.reason == "permanent-error" and letter.task_id == failing.id


@pytest.mark.parametrize("broker_url", ["rabbitmq"], indirect=True)
def test_on_a_quorum_queue_waiting_for_the_dlq_does_not_spend_the_delivery_limit(
        broker_url, record_url, recorded, unique_name, worker_factory):
    """x-delivery-limit=2: RabbitMQ would dead-letter natively (no envelope, at-most-once) after the
    third return. The message is put back by publishing it again instead, which is not a return."""
    from celery import Celery
    from taskherd.worker import configure

    q = unique_name
    producer = Celery("producer", broker=broker_url, set_as_current=False)
    configure(producer, queues=[q], queue_type="quorum", delivery_counter_url=record_url, max_deliveries=2)
    repair = make_dlq_unwritable(broker_url, f"{q}.dlq", queue_type="quorum")  # classic where quorum is wanted
    env = core_env(broker_url, q, record_url, queue_type="quorum", max_deliveries=2)
    worker_factory("apps.core_app", queues=[q], concurrency=1, env=env)
    task = producer.send_task("core.validation", args=("blocked", 1), queue=q)

    wait_for("five runs, past the delivery limit (runs)", lambda: len(recorded("blocked")),
             until=lambda runs: runs >= 5, timeout=60)
    assert dead_letters(broker_url, q) == [], "RabbitMQ dead-lettered it natively"
    repair()
    (letter,) = wait_for("the envelope after the repair", lambda: dead_letters(broker_url, q), timeout=60)
    assert letter.kind == "envelope" and letter.envelope.reason == "permanent-error" and letter.task_id == task.id
    producer.close()


def test_waiting_for_the_dlq_is_not_counted_as_killing_the_worker(broker_url, record_url, recorded, producer,
                                                                  unique_name, worker_factory):
    """max_deliveries=2: were each put-back a return to the queue, the delivery count would reach
    the budget and the task be dead-lettered `killed-worker` — a worker it never killed."""
    q = unique_name
    repair = make_dlq_unwritable(broker_url, f"{q}.dlq")
    env = core_env(broker_url, q, record_url, max_deliveries=2)
    worker_factory("apps.core_app", queues=[q], concurrency=1, env=env)
    task = producer.send_task("core.validation", args=("blocked", 1), queue=q)

    wait_for("five runs, past the delivery budget (runs)", lambda: len(recorded("blocked")),
             until=lambda runs: runs >= 5, timeout=60)
    repair()
    (letter,) = wait_for("the envelope after the repair", lambda: dead_letters(broker_url, q), timeout=60)
    assert letter.envelope.reason == "permanent-error" and letter.task_id == task.id
