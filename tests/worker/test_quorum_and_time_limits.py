"""RabbitMQ quorum queues get the same dead-lettering; a hard time limit is dead-lettered too."""
import time

import httpx
import pytest
from urllib.parse import unquote, urlsplit

from e2e.lib.waiting import wait_for
from worker_support import core_env, dead_letters


def _queue_info(api_url: str, amqp_url: str, name: str) -> dict:
    vhost = unquote(urlsplit(amqp_url).path.lstrip("/"))
    api = urlsplit(api_url)
    response = httpx.get(f"{api.scheme}://{api.hostname}:{api.port}/api/queues/{vhost}/{name}",
                         auth=(api.username, api.password), timeout=10)
    response.raise_for_status()
    return response.json()


@pytest.mark.parametrize("broker_url", ["rabbitmq"], indirect=True)
def test_quorum_queue_retries_and_dead_letters(broker_url, record_url, recorded, unique_name,
                                               worker_factory, rabbitmq_api_url):
    from celery import Celery
    from taskherd.worker import configure

    q = unique_name
    producer = Celery("producer", broker=broker_url, set_as_current=False)
    configure(producer, queues=[q], queue_type="quorum", delivery_counter_url=record_url, max_deliveries=5)
    env = core_env(broker_url, q, record_url, queue_type="quorum", max_retries=2, backoff_base=0.5, jitter="max")
    worker_factory("apps.core_app", queues=[q], concurrency=1, env=env)

    transient = producer.send_task("core.always_transient", args=("q-attempts",), queue=q)
    permanent = producer.send_task("core.validation", args=("q-runs", 0), queue=q)
    letters = wait_for("two envelopes in the quorum DLQ", lambda: dead_letters(broker_url, q), timeout=60,
                       until=lambda letters: len(letters) == 2)
    by_id = {letter.task_id: letter.envelope for letter in letters}
    assert by_id[transient.id].reason == "retries-exhausted" and by_id[transient.id].attempts == 3
    assert by_id[permanent.id].reason == "permanent-error" and by_id[permanent.id].attempts == 1
    assert len(recorded("q-attempts")) == 3 and len(recorded("q-runs")) == 1

    work = _queue_info(rabbitmq_api_url, broker_url, q)
    assert work["type"] == "quorum"
    assert work["arguments"]["x-dead-letter-exchange"] == ""
    assert work["arguments"]["x-dead-letter-routing-key"] == f"{q}.dlq"
    assert work["arguments"]["x-delivery-limit"] == 5
    dlq = _queue_info(rabbitmq_api_url, broker_url, f"{q}.dlq")
    assert dlq["type"] == "quorum" and dlq["durable"] is True
    producer.close()


def test_hard_time_limit_is_dead_lettered(broker_url, record_url, recorded, producer, unique_name,
                                          worker_factory):
    env = core_env(broker_url, unique_name, record_url, soft_time_limit=1, time_limit=2)
    worker = worker_factory("apps.core_app", queues=[unique_name], concurrency=1, env=env)
    stuck = producer.send_task("core.ignores_soft_limit", args=("stuck",), queue=unique_name)
    (letter,) = wait_for("the envelope", lambda: dead_letters(broker_url, unique_name), timeout=30)
    env = letter.envelope
    assert env.reason == "hard-time-limit" and env.task_id == stuck.id and env.args == ["stuck"]
    assert env.exception_type == "billiard.exceptions.TimeLimitExceeded" and env.attempts == 1
    assert env.headers["id"] == stuck.id and "args" not in env.headers and "delivery_info" not in env.headers
    producer.send_task("core.record", args=("after", "ok"), queue=unique_name)
    wait_for("the next task", lambda: recorded("after"), timeout=30)
    assert len(recorded("stuck")) == 1, "not redelivered after the hard limit"
    assert "Hard time limit (2.0s) exceeded" in worker.log()


@pytest.mark.parametrize("counter", ["no Redis", "delivery_counter_url"])
@pytest.mark.parametrize("broker_url", ["rabbitmq"], indirect=True)
def test_on_quorum_queues_x_delivery_count_dead_letters_before_the_delivery_limit(
        counter, broker_url, record_url, recorded, unique_name, worker_factory):
    """The broker counts: x-delivery-count bounds a poison message with taskherd's envelope after
    max_deliveries runs, before the queue's x-delivery-limit would dead-letter it natively; a
    configured Redis counter is not asked."""
    from celery import Celery
    from taskherd.worker import configure

    q = unique_name
    producer = Celery("producer", broker=broker_url, set_as_current=False)
    configure(producer, queues=[q], queue_type="quorum", max_deliveries=2)
    env = core_env(broker_url, q, record_url, queue_type="quorum", max_deliveries=2,
                   **({"counter_url": ""} if counter == "no Redis" else {}))
    worker = worker_factory("apps.core_app", queues=[q], concurrency=1, env=env)
    poison = producer.send_task("core.kill_worker", args=("poison",), queue=q)
    producer.send_task("core.record", args=("normal", "ok"), queue=q)

    (letter,) = wait_for("the envelope", lambda: dead_letters(broker_url, q), timeout=90)
    assert letter.kind == "envelope" and letter.envelope.reason == "killed-worker"
    assert letter.task_id == poison.id and len(recorded("poison")) == 2
    assert "1 earlier deliveries without an outcome (counted by x-delivery-count)" in worker.log()
    wait_for("the normal task", lambda: recorded("normal"), timeout=30)
    producer.close()


def test_soft_time_limit_is_dead_lettered_not_retried(broker_url, record_url, recorded, producer, unique_name,
                                                      worker_factory):
    env = core_env(broker_url, unique_name, record_url, soft_time_limit=1, time_limit=5)
    worker_factory("apps.core_app", queues=[unique_name], concurrency=1, env=env)
    slow = producer.send_task("core.slow", args=("slow", 4), queue=unique_name)
    (letter,) = wait_for("the envelope", lambda: dead_letters(broker_url, unique_name), timeout=30)
    assert letter.envelope.reason == "soft-time-limit" and letter.task_id == slow.id
    assert letter.envelope.exception_type.endswith("SoftTimeLimitExceeded")
    assert len(recorded("slow:start")) == 1 and recorded("slow:done") == []


@pytest.mark.parametrize("broker_url", ["redis"], indirect=True)
def test_a_hard_time_limit_is_not_dead_lettered_by_a_worker_whose_delivery_was_taken_back(
        broker_url, record_url, recorded, producer, unique_name, worker_factory):
    # On kind, a worker partitioned from Redis lost its lease; its running task went back to the
    # queue and another worker ran it and dead-lettered it for its real reason. When the first one's
    # child then met its hard time limit, that worker dead-lettered the task a second time, as
    # `hard-time-limit`. Here the delivery is taken back as a restore and a re-pop leave it:
    # another worker owns it.
    import redis

    from taskherd.worker.components import recovery

    env = core_env(broker_url, unique_name, record_url, soft_time_limit=1, time_limit=2)
    worker = worker_factory("apps.core_app", queues=[unique_name], concurrency=1, env=env)
    producer.send_task("core.ignores_soft_limit", args=("taken",), queue=unique_name)
    wait_for("the task running", lambda: recorded("taken"), timeout=30)
    client = redis.Redis.from_url(broker_url)
    (tag,) = client.hkeys(recovery.OWNER_KEY)
    client.hset(recovery.OWNER_KEY, tag, "another-worker.1.0000")
    wait_for("the worker's word on it", lambda: "not dead-lettered here" in worker.log(), timeout=30)
    assert dead_letters(broker_url, unique_name) == []
    assert client.hget(recovery.OWNER_KEY, tag) == b"another-worker.1.0000", "the new holder's entry was removed"
    assert client.hexists("unacked", tag), "the fenced ack removed kombu's entry of the new holder"
    producer.send_task("core.record", args=("after", "ok"), queue=unique_name)
    wait_for("the next task", lambda: recorded("after"), timeout=30)


@pytest.mark.parametrize("broker_url", ["redis"], indirect=True)
@pytest.mark.parametrize("task,outcome", [("core.fails_after", "dead-lettered"), ("core.transient_after", "retried")])
def test_a_failure_is_not_retried_or_dead_lettered_by_a_child_whose_delivery_was_taken_back(
        broker_url, record_url, recorded, producer, unique_name, worker_factory, task, outcome):
    # The pool child's side of the test above (seen on kind: a partitioned worker's task failed
    # after another worker had taken it over, and both dead-lettered it). The child was forked
    # before the lease existed and its main process may have changed identity since: it must ask
    # for the identity the delivery was taken under.
    import redis

    from taskherd.worker.components import recovery

    env = core_env(broker_url, unique_name, record_url, backoff_base=0.1, jitter="max")
    worker = worker_factory("apps.core_app", queues=[unique_name], concurrency=1, env=env)
    producer.send_task(task, args=("taken", 3), queue=unique_name)
    wait_for("the task running", lambda: recorded("taken"), timeout=30)
    client = redis.Redis.from_url(broker_url)
    (tag,) = client.hkeys(recovery.OWNER_KEY)
    client.hset(recovery.OWNER_KEY, tag, "another-worker.1.0000")
    wait_for("the child's word on it", lambda: f"not {outcome} here" in worker.log(), timeout=30)
    producer.send_task("core.record", args=("after", "ok"), queue=unique_name)
    wait_for("the next task", lambda: recorded("after"), timeout=30)
    time.sleep(2)  # a retry published here would have run by now (its countdown: 0.1 s)
    assert dead_letters(broker_url, unique_name) == []
    assert len(recorded("taken")) == 1, "it ran again here: a retry was published"
    assert client.hget(recovery.OWNER_KEY, tag) == b"another-worker.1.0000", "the new holder's entry was removed"
    assert client.hexists("unacked", tag), "the ack removed kombu's entry of the new holder"
