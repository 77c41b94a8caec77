"""The operator's observation and paging against the REAL services on loopback: Redis, RabbitMQ
(management API) and Alertmanager (v2 API)."""
from __future__ import annotations

import asyncio
import base64
import json
import os
import time
import urllib.parse
import urllib.request

import pytest
from celery import Celery

from e2e.lib.waiting import wait_for
from fakes import FakeKube
from taskherd.operator.alerts import HttpPoster, deliver
from taskherd.operator.broker import BrokerObserver, ObservationError
from taskherd.operator.paging import PagingState, step
from taskherd.operator.policy import BrokerSpec
from taskherd.queues.stats import AGE_FROM_HEAD_TIMESTAMP, AGE_FROM_PUBLISH_COUNTER, AGE_FROM_STAMP
from taskherd.worker.components import publish_stamps


class SecretKube(FakeKube):
    """The broker Secret, as the chart would create it."""

    def __init__(self, url: str):
        super().__init__()
        self.data = {"url": url, "management-url": os.environ.get("TASKHERD_RABBITMQ_API_URL", "")}

    async def read_secret(self, namespace, name):
        return self.data


def publish(url: str, queue: str, count: int, *, age: float) -> None:
    # The stamps below fake an old backlog; the stamping hook (process-wide once any test in this
    # process called configure()) would overwrite them with "now".
    publish_stamps.disconnect()
    app = Celery(broker=url)
    for i in range(count):
        app.send_task("t.noop", args=(i,), queue=queue, headers={"taskherd_published_at": time.time() - age},
                      timestamp=int(time.time() - age))  # what the PublishStamps component sets
    app.close()


def test_observer_reads_depth_age_and_dead_letters_from_a_real_broker(broker_url, unique_name):
    queue = unique_name
    publish(broker_url, queue, 7, age=40)
    publish(broker_url, f"{queue}.dlq", 2, age=5)
    observer = BrokerObserver(kube=SecretKube(broker_url))
    rabbit = broker_url.startswith("amqp")
    spec = BrokerSpec(type="rabbitmq" if rabbit else "redis", secret_name="s",
                      management_url_key="management-url" if rabbit else None,
                      queues=(queue,), dead_letter_queues=(f"{queue}.dlq",))
    stamped = AGE_FROM_HEAD_TIMESTAMP if rabbit else AGE_FROM_STAMP

    # The broker's own signal that it reports the messages' stamps: the head timestamp on RabbitMQ
    # (its statistics arrive in steps on a fresh node), the stamp itself on Redis.
    observation = wait_for(f"the broker to report the head timestamp of {queue} (how the age is known)",
                           lambda: asyncio.run(observer("ns", spec)), timeout=60, interval=1,
                           until=lambda o: o.oldest_message_age_method == stamped)
    assert observation.ready == 7 and observation.unacked == 0
    assert observation.dead_letters == {f"{queue}.dlq": 2}
    assert not observation.oldest_message_age_is_lower_bound
    assert 35 <= observation.oldest_message_age_seconds < 120


def management_document(amqp_url: str, queue: str) -> dict:
    from taskherd.queues.rabbitmq import vhost_of

    api = urllib.parse.urlsplit(os.environ["TASKHERD_RABBITMQ_API_URL"])
    vhost = urllib.parse.quote(vhost_of(amqp_url), safe="")
    request = urllib.request.Request(f"http://{api.hostname}:{api.port}/api/queues/{vhost}/{queue}")
    token = base64.b64encode(f"{api.username}:{api.password}".encode()).decode()
    request.add_header("Authorization", f"Basic {token}")
    with urllib.request.urlopen(request, timeout=5) as response:
        return json.load(response)


def test_an_operator_started_against_an_old_backlog_does_not_believe_it_is_young(amqp_url, unique_name):
    """A quorum queue has no head timestamp. Its backlog was published before the observer
    existed; the first observation must still place it in time (the broker keeps the history of
    its publish counter), not report it as new."""
    from kombu import Connection, Exchange, Producer, Queue

    queue = unique_name

    def ready_and_published():
        doc = management_document(amqp_url, queue)
        return doc.get("messages_ready"), (doc.get("message_stats") or {}).get("publish")

    with Connection(amqp_url) as conn:
        Queue(queue, Exchange(queue), routing_key=queue,
              queue_arguments={"x-queue-type": "quorum"})(conn.default_channel).declare()
        producer = Producer(conn)
        published_at = time.time()
        for i in range(5):
            producer.publish({"i": i}, exchange=queue, routing_key=queue)
        # Wait on the management API itself (not through the observer, which must see it first
        # below) until it reports both the count (from the queue) and the publish counter (from the
        # channel). The connection stays open meanwhile, as an application's producer pool does:
        # the management plugin collects a channel's counters every 5 s, and a channel closed
        # before its first collection can take its counters with it (seen once in CI).
        wait_for(f"RabbitMQ to report the 5 messages of {queue} and their publish counter (ready, published)",
                 ready_and_published, equals=(5, 5), timeout=60, interval=1)
    time.sleep(max(0.0, published_at + 25 - time.time()))

    observer = BrokerObserver(kube=SecretKube(amqp_url))
    spec = BrokerSpec(type="rabbitmq", secret_name="s", management_url_key="management-url", queues=(queue,))
    observation = asyncio.run(observer("ns", spec))
    waited = time.time() - published_at
    assert observation.ready == 5
    assert observation.oldest_message_age_method == AGE_FROM_PUBLISH_COUNTER, observation
    assert observation.oldest_message_age_seconds >= waited - 10, (observation, waited)


def test_a_failover_list_whose_first_broker_is_down_is_observed_at_the_next(redis_url, unique_name):
    """The Secret the workers read, 'redis://down…;redis://up…/N' (kombu connects to the first that
    answers): the operator read the whole string as one URL and reported the pool's broker down."""
    queue = unique_name
    publish(redis_url, queue, 4, age=30)
    down = "redis://:hunter2@127.0.0.1:1" + redis_url[redis_url.rindex("/"):]  # nothing listens on port 1
    observer = BrokerObserver(kube=SecretKube(f"{down};{redis_url}"))
    spec = BrokerSpec(type="redis", secret_name="s", queues=(queue,))
    for _ in range(2):  # the second poll goes straight to the URL that answered
        observation = asyncio.run(observer("ns", spec))
        assert observation.ready == 4 and observation.oldest_message_age_seconds >= 25, observation


def test_an_unreachable_broker_raises_a_redacted_observation_error(unique_name):
    observer = BrokerObserver(kube=SecretKube("redis://:hunter2@127.0.0.1:1/3"))
    spec = BrokerSpec(type="redis", secret_name="s", queues=(unique_name,))
    with pytest.raises(ObservationError) as info:
        asyncio.run(observer("ns", spec))
    assert "hunter2" not in str(info.value) and str(info.value)


def _alerts(base: str, pool: str) -> list[dict]:
    query = urllib.parse.quote(f'pool="{pool}"')
    with urllib.request.urlopen(f"{base}/api/v2/alerts?filter={query}", timeout=5) as response:
        return json.load(response)


def test_real_alertmanager_receives_the_page_and_its_resolution(unique_name):
    base = os.environ.get("TASKHERD_ALERTMANAGER_URL")
    if not base:
        pytest.fail("TASKHERD_ALERTMANAGER_URL is not set: run through `make test`")
    pool = unique_name

    async def send(depth: int, now: float, state: PagingState) -> PagingState:
        state, pages = step(state, {"jobs.dlq": depth}, threshold=3, resend_interval=60, now=now)
        for page in pages:
            await deliver(page, alertmanager_url=base, webhook_url=None, poster=HttpPoster(), pool=pool,
                          namespace="default", severity="warning", threshold=3)
        return state

    state = asyncio.run(send(5, time.time(), PagingState()))
    firing = _alerts(base, pool)
    assert len(firing) == 1 and firing[0]["status"]["state"] == "active"
    assert firing[0]["labels"]["queue"] == "jobs.dlq" and firing[0]["labels"]["severity"] == "warning"
    asyncio.run(send(0, time.time(), state))
    # the resolution (endsAt = now) must clear the alert
    wait_for("the resolved alert gone from Alertmanager", lambda: _alerts(base, pool), equals=[], timeout=10,
             interval=0.5)
