"""Retries and the DLQ against a real worker: transient errors retry with growing delays, then
dead-letter; a validation error dead-letters after one attempt with a complete envelope."""
import socket
import time

from e2e.lib.waiting import wait_for
from worker_support import core_env, dead_letters, make_dlq_unwritable


def test_always_transient_failure_retries_max_retries_times_then_dead_letters(
        broker_url, record_url, recorded, producer, unique_name, worker_factory):
    # base 0.5 s, jitter pinned to the top of its interval: delays 0.5, 1, 2 s.
    env = core_env(broker_url, unique_name, record_url, max_retries=3, backoff_base=0.5, jitter="max")
    worker_factory("apps.core_app", queues=[unique_name], env=env, concurrency=1)
    result = producer.send_task("core.always_transient", args=("attempts",), queue=unique_name)

    letters = wait_for("the DLQ envelope", lambda: dead_letters(broker_url, unique_name), timeout=60)
    attempts = [when for when, _, _ in recorded("attempts")]
    assert len(attempts) == 4, "1 run + exactly max_retries=3 retries"
    gaps = [b - a for a, b in zip(attempts, attempts[1:])]
    for gap, expected in zip(gaps, [0.5, 1.0, 2.0]):
        assert expected - 0.05 <= gap <= expected + 3.0, (gaps, "delays follow base * 2**retry")
    assert gaps[0] < gaps[1] < gaps[2], f"delays must grow: {gaps}"

    (letter,) = letters
    env = letter.envelope
    assert env.reason == "retries-exhausted" and env.task_id == result.id and env.attempts == 4
    assert env.exception_type == "builtins.ConnectionResetError"
    assert env.first_failure_at == attempts[0] or abs(env.first_failure_at - attempts[0]) < 0.5
    assert env.last_failure_at >= attempts[-1]
    time.sleep(1)
    assert len(recorded("attempts")) == 4, "no attempt after dead-lettering"


def test_validation_error_dead_letters_after_one_attempt_with_the_envelope(
        broker_url, record_url, recorded, producer, unique_name, worker_factory):
    env = core_env(broker_url, unique_name, record_url, max_retries=3)
    worker = worker_factory("apps.core_app", queues=[unique_name], env=env, concurrency=1,
                            hostname=f"{unique_name}@envelope-host")
    before = time.time()
    result = producer.send_task("core.validation", args=("runs", -5), kwargs={"currency": "USD"},
                                queue=unique_name, headers={"x-tenant": "acme"})
    (letter,) = wait_for("the DLQ envelope", lambda: dead_letters(broker_url, unique_name), timeout=30)
    time.sleep(1.5)  # would a retry have happened by now? (none must)
    assert [value for _, _, value in recorded("runs")] == ["0"], "exactly one attempt"

    env = letter.envelope
    assert env.reason == "permanent-error"
    assert env.detail == "ValueError is permanent: not retried"
    assert env.task == "core.validation"
    assert env.task_id == result.id
    assert env.args == ["runs", -5]
    assert env.kwargs == {"currency": "USD"}
    assert env.headers["id"] == result.id and env.headers["task"] == "core.validation"
    assert env.headers["x-tenant"] == "acme", "custom headers are kept"
    assert env.headers["retries"] == 0
    assert env.exception_type == "builtins.ValueError"
    assert env.exception_message == "amount must be positive, got -5"
    assert "Traceback (most recent call last)" in env.traceback and "core_app.py" in env.traceback
    assert env.attempts == 1
    assert before <= env.first_failure_at == env.last_failure_at <= env.dead_lettered_at <= time.time()
    assert env.hostname == f"{unique_name}@envelope-host".replace("%h", socket.gethostname())
    assert env.queue == unique_name and env.routing_key == unique_name
    assert env.raw_body_b64 is None and env.version == 1
    assert letter.kind == "envelope" and letter.ref == result.id
    assert "dead-lettered" in worker.log()


def test_a_dlq_that_cannot_be_written_loses_nothing(
        broker_url, record_url, recorded, producer, unique_name, worker_factory):
    """If the envelope cannot be published the original is requeued, not acked; once the DLQ is
    writable again the task is dead-lettered with its real reason."""
    q = unique_name
    repair = make_dlq_unwritable(broker_url, f"{q}.dlq")
    worker = worker_factory("apps.core_app", queues=[q], concurrency=1, env=core_env(broker_url, q, record_url))
    result = producer.send_task("core.validation", args=("unwritable", 1), queue=q)

    wait_for("the task to come back twice", lambda: len(recorded("unwritable")) >= 3, timeout=30)
    assert "could not dead-letter" in worker.log()
    repair()
    (letter,) = wait_for("the envelope after repair", lambda: dead_letters(broker_url, q), timeout=30)
    assert letter.envelope.task_id == result.id
    assert letter.envelope.reason == "permanent-error", "requeues after a failed publish are not worker deaths"


def test_a_database_error_wrapped_by_an_orm_is_retried_not_dead_lettered(
        broker_url, record_url, recorded, producer, unique_name, worker_factory):
    """Django and SQLAlchemy re-raise psycopg's OperationalError as their own: the classifier
    follows the wrapping (`raise … from …`) to the driver's transient error."""
    env = core_env(broker_url, unique_name, record_url, max_retries=2, backoff_base=0.1, backoff_cap=0.2)
    worker_factory("apps.core_app", queues=[unique_name], env=env, concurrency=1)
    task = producer.send_task("core.wrapped_db_error", args=("db",), queue=unique_name)
    (letter,) = wait_for("the envelope", lambda: dead_letters(broker_url, unique_name), timeout=60)
    assert letter.task_id == task.id and letter.envelope.exception_type == "apps.core_app.OperationalError"
    assert letter.envelope.reason == "retries-exhausted" and letter.envelope.attempts == 3
    assert len(recorded("db")) == 3


def test_a_key_whose_holder_died_is_taken_over_after_its_lease_not_dead_lettered(
        broker_url, record_url, recorded, producer, unique_name, worker_factory):
    """The holder is killed right after claiming its key; the redelivery meets the key in progress.
    Its retries wait for the lease (InProgress.retry_after) instead of spending the whole retry
    budget (3 retries of at most 0.2 s here) before a 10 s lease can expire (the redelivery of a
    killed child's message comes a few seconds after the kill)."""
    env = core_env(broker_url, unique_name, record_url, max_retries=3, backoff_base=0.1, backoff_cap=0.2,
                   lease_seconds=10)
    worker_factory("apps.core_app", queues=[unique_name], env=env, concurrency=1)
    task = producer.send_task("core.dies_after_claim", args=("held",), queue=unique_name)
    wait_for("the effect, after the lease expired", lambda: recorded("held"), timeout=60,
             explain=lambda: f"dead letters: {[l.envelope.reason for l in dead_letters(broker_url, unique_name)]}")
    assert task.id and dead_letters(broker_url, unique_name) == []
    assert [value for _, _, value in recorded("held")] == ["effect"]
    runs = recorded("held:runs")
    assert runs[-1][0] - runs[0][0] >= 9.5, "the run that took the key over came after the lease"


def test_a_task_of_its_own_autoretry_for_is_dead_lettered_when_celery_gives_up_saying_after_how_many(
        broker_url, record_url, recorded, producer, unique_name, worker_factory):
    """`autoretry_for=(KeyError,)`: Celery retries (its countdown, the task's max_retries=2); the last
    KeyError reaches taskherd, for which it is permanent. The envelope said "KeyError is permanent:
    not retried" after three runs; it now says which attempt it was."""
    env = core_env(broker_url, unique_name, record_url, max_retries=5)
    worker_factory("apps.core_app", queues=[unique_name], env=env, concurrency=1)
    result = producer.send_task("core.autoretry", args=("auto",), queue=unique_name)

    (letter,) = wait_for("the DLQ envelope", lambda: dead_letters(broker_url, unique_name), timeout=60)
    assert [value for _, _, value in recorded("auto")] == ["0", "1", "2"], "Celery's own 2 retries"
    env = letter.envelope
    assert env.task_id == result.id and env.reason == "permanent-error" and env.attempts == 3
    assert env.detail == "KeyError is permanent: not retried (attempt 3, after 2 retries)"


def test_a_task_whose_own_retries_run_out_is_dead_lettered_as_retries_exhausted(
        broker_url, record_url, recorded, producer, unique_name, worker_factory):
    """self.retry() with no exc= past max_retries raises MaxRetriesExceededError: it was dead-lettered
    as `permanent-error` ("MaxRetriesExceededError is permanent: not retried") though it was retried."""
    env = core_env(broker_url, unique_name, record_url)
    worker_factory("apps.core_app", queues=[unique_name], env=env, concurrency=1)
    result = producer.send_task("core.retries_itself", args=("own",), queue=unique_name)
    (letter,) = wait_for("the DLQ envelope", lambda: dead_letters(broker_url, unique_name), timeout=60)
    assert [value for _, _, value in recorded("own")] == ["0", "1", "2"]
    env = letter.envelope
    assert env.reason == "retries-exhausted" and env.task_id == result.id and env.attempts == 3
    assert "its own self.retry() gave up after 2 retries (the task's max_retries=2)" in env.detail
