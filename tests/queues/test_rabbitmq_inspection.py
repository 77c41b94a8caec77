"""Queue inspection on RabbitMQ (management API) against real classic and quorum queues."""
from __future__ import annotations

import time
import uuid

import pytest
from celery import Celery
from kombu import Exchange, Queue

from e2e.lib.waiting import wait_for
from taskherd.queues import BrokerUnreachable, inspect_queues
from taskherd.queues.stats import AGE_FROM_HEAD_TIMESTAMP, AGE_FROM_PUBLISH_COUNTER
from taskherd.worker.components import publish_stamps

#: The management statistics refresh every 5 s; a new quorum queue reports nothing for ~10 s.
STATS_WAIT = 40


@pytest.fixture
def stamped():
    publish_stamps.connect()
    yield
    publish_stamps.disconnect()


def declared_app(amqp_url: str, queue: str, queue_type: str) -> Celery:
    app = Celery(broker=amqp_url)
    app.conf.task_queues = [Queue(queue, Exchange(queue), routing_key=queue,
                                  queue_arguments={"x-queue-type": queue_type})]
    return app


def poll(amqp_url, api, queues, until, timeout=STATS_WAIT):
    return wait_for(f"the management API's figures of {queues}",
                    lambda: inspect_queues(amqp_url, queues, management_url=api), until=until,
                    timeout=timeout, interval=1)


@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
def test_ready_consumers_and_head_age(amqp_url, rabbitmq_api_url, unique_name, queue_type, stamped):
    queue = unique_name
    app = declared_app(amqp_url, queue, queue_type)
    with app.connection_for_write() as conn:
        Queue(queue, Exchange(queue), routing_key=queue,
              queue_arguments={"x-queue-type": queue_type})(conn.default_channel).declare()
    # Observed empty before the publish: the history the quorum estimate brackets from.
    poll(amqp_url, rabbitmq_api_url, [queue], lambda s: True)
    before = time.time()
    for _ in range(3):
        app.send_task("t.x", queue=queue)
    after = time.time()
    app.close()
    # A classic queue's head timestamp comes with the management API's next statistics (every 5 s;
    # later on a loaded machine); until then the age is the publish-counter estimate.
    expected_method = AGE_FROM_HEAD_TIMESTAMP if queue_type == "classic" else AGE_FROM_PUBLISH_COUNTER
    poll(amqp_url, rabbitmq_api_url, [queue],
         lambda s: s[queue].ready == 3 and s[queue].oldest_age_method == expected_method)
    time.sleep(2)
    now = time.time()
    stats = inspect_queues(amqp_url, [queue], management_url=rabbitmq_api_url, now=now)[queue]
    assert (stats.ready, stats.unacked, stats.consumers, stats.depth) == (3, 0, 0, 3)
    true_age_range = (now - after, now - before)
    assert stats.oldest_age_method == expected_method
    if queue_type == "classic":
        # The AMQP timestamp has whole-second resolution (truncated): up to 1 s older.
        assert true_age_range[0] - 0.01 <= stats.oldest_age_seconds <= true_age_range[1] + 1.0
    else:
        assert stats.oldest_age_error_seconds < 10, "poll every second: the bracket should be tight"
        low, high = stats.oldest_age_seconds - stats.oldest_age_error_seconds, \
            stats.oldest_age_seconds + stats.oldest_age_error_seconds
        assert low <= true_age_range[1] and true_age_range[0] <= high, (stats, true_age_range)


def test_unacked_and_consumers_while_a_worker_runs(amqp_url, rabbitmq_api_url, unique_name, worker_factory):
    queue = unique_name
    env = {"TEST_BROKER_URL": amqp_url, "TEST_QUEUE": queue, "TEST_RECOVERY": "1"}  # a no-op on RabbitMQ
    worker_factory("apps.recovery_app", queues=[queue], env=env, concurrency=1)
    app = Celery(broker=amqp_url)
    for _ in range(3):
        app.send_task("recovery.hold", args=(uuid.uuid4().hex, 40), queue=queue)
    app.close()
    stats = poll(amqp_url, rabbitmq_api_url, [queue],
                 lambda s: (s[queue].ready, s[queue].unacked, s[queue].consumers) == (2, 1, 1))[queue]
    assert stats.depth == 3
    assert stats.oldest_unacked_age_seconds is None  # the API has no delivery times


def test_dlq_depth_and_missing_queue(amqp_url, rabbitmq_api_url, unique_name):
    dlq = unique_name + ".dlq"
    from kombu import Connection, Producer

    with Connection(amqp_url) as conn:
        Queue(dlq, routing_key=dlq)(conn.default_channel).declare()
        producer = Producer(conn)
        for i in range(4):
            producer.publish({"i": i}, routing_key=dlq)
    stats = poll(amqp_url, rabbitmq_api_url, [dlq, unique_name + ".never"], lambda s: s[dlq].ready == 4)
    assert stats[dlq].ready == 4
    never = stats[unique_name + ".never"]
    assert (never.ready, never.unacked, never.oldest_age_seconds) == (0, 0, None)


def test_management_url_is_derived_from_the_amqp_url():
    from taskherd.queues.rabbitmq import management_url_for, vhost_of

    assert management_url_for("amqp://u:p@rabbit.ns:5672/v") == "http://u:p@rabbit.ns:15672"
    assert vhost_of("amqp://u:p@h:5672//") == "/"
    assert vhost_of("amqp://u:p@h:5672/") == "/"
    assert vhost_of("amqp://u:p@h:5672/t-%2Fx") == "t-/x"


def test_unreachable_management_api_raises_broker_unreachable(amqp_url):
    with pytest.raises(BrokerUnreachable, match="127.0.0.1:1"):
        inspect_queues(amqp_url, ["q"], management_url="http://u:p@127.0.0.1:1")


def test_a_vhost_listing_answers_as_the_queues_own_documents(amqp_url, rabbitmq_api_url, unique_name, stamped):
    """The operator's listing (one GET for the vhost, at most once per max_age_seconds): the same
    figures as each queue's own document — a stamped classic queue, a quorum queue whose age
    needs its publish history (asked for on its own still), a missing queue — and, within
    max_age_seconds, the last listing's."""
    from taskherd.queues.rabbitmq import VhostListing, inspect_rabbitmq

    classic, quorum, missing = unique_name, unique_name + "-q", unique_name + ".never"
    for queue, queue_type in ((classic, "classic"), (quorum, "quorum")):
        app = declared_app(amqp_url, queue, queue_type)
        with app.connection_for_write() as conn:
            Queue(queue, Exchange(queue), routing_key=queue,
                  queue_arguments={"x-queue-type": queue_type})(conn.default_channel).declare()
        poll(amqp_url, rabbitmq_api_url, [queue], lambda s: True)
        for _ in range(3):
            app.send_task("t.x", queue=queue)
        app.close()
    queues = [classic, quorum, missing]
    poll(amqp_url, rabbitmq_api_url, queues, lambda s: s[classic].ready == 3 and s[quorum].ready == 3)

    now, clock = time.time(), [0.0]
    listing = VhostListing(max_age_seconds=1.0, clock=lambda: clock[0])
    listed = inspect_rabbitmq(amqp_url, queues, management_url=rabbitmq_api_url, now=now, listing=listing)
    own = inspect_rabbitmq(amqp_url, queues, management_url=rabbitmq_api_url, now=now)
    for queue in queues:
        assert (listed[queue].ready, listed[queue].unacked, listed[queue].consumers, listed[queue].oldest_age_method) \
            == (own[queue].ready, own[queue].unacked, own[queue].consumers, own[queue].oldest_age_method)
        if own[queue].oldest_age_seconds is not None:
            assert abs(listed[queue].oldest_age_seconds - own[queue].oldest_age_seconds) <= 5
    # the quorum queue's age came from its own document's publish history (the listing has none)
    assert listed[quorum].oldest_age_method == AGE_FROM_PUBLISH_COUNTER
    assert listed[classic].oldest_age_seconds is not None

    app = declared_app(amqp_url, classic, "classic")
    app.send_task("t.x", queue=classic)
    app.close()
    poll(amqp_url, rabbitmq_api_url, [classic], lambda s: s[classic].ready == 4)
    within = inspect_rabbitmq(amqp_url, [classic], management_url=rabbitmq_api_url, listing=listing)
    assert within[classic].ready == 3, "within max_age_seconds: the last listing"
    clock[0] += 1.0
    after = inspect_rabbitmq(amqp_url, [classic], management_url=rabbitmq_api_url, listing=listing)
    assert after[classic].ready == 4
