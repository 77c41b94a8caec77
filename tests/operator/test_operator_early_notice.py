"""The early notice: between polls, a burst on a pool brings its poll forward (early_notice.py).

The rule and the choice of pools are pure; the scheduler runs them against in-memory fakes; the
count itself against the REAL Redis, where it must agree with what a poll reads, and the REAL
RabbitMQ, where it must see a burst the management API does not show yet."""
from __future__ import annotations

import asyncio

import pytest
from celery import Celery

from fakes import FakeBroker, FakeKube, make_deps, pool_body
from e2e.lib.waiting import wait_for
from taskherd.operator.broker import LISTING_MAX_AGE_SECONDS, BrokerObserver
from taskherd.operator.early_notice import PROBE_SECONDS, candidate, outgrows
from taskherd.operator.policy import BrokerSpec, InvalidSpec, ScalingPolicy, parse_spec
from taskherd.operator.scaling import Observation
from taskherd.operator.scheduler import PoolScheduler
from taskherd.queues.redis import inspect_redis
from test_operator_services import SecretKube

POLICY = ScalingPolicy(min_replicas=0, max_replicas=10, target_depth_per_worker=5)


@pytest.mark.parametrize("ready, replicas, expected", [
    (0, 0, False),     # nothing waits
    (1, 0, True),      # a pool at zero: one message asks for a worker
    (10, 2, False),    # 10 messages at 5 per worker: the 2 workers there are
    (11, 2, True),     # one more: 3 workers
    (500, 10, False),  # at maxReplicas: a poll could not add any
])
def test_a_count_brings_a_poll_forward_only_when_the_depth_rule_asks_for_more(ready, replicas, expected):
    assert outgrows(ready, replicas, POLICY) is expected


def choose(body=None, **kwargs):
    body = body or pool_body()
    try:
        spec = parse_spec(body["spec"])
    except InvalidSpec:
        spec = None
    args = dict(namespace="ns", replicas=2)
    args.update(kwargs)
    return candidate(spec, body["metadata"].get("annotations"), **args)


def test_only_pools_whose_count_could_change_something_are_counted():
    found = choose()
    assert (found.namespace, found.broker.queues, found.replicas) == ("ns", ("celery",), 2)
    paused = pool_body()
    paused["metadata"]["annotations"] = {"taskherd.io/paused": "true"}
    rabbit = pool_body(broker={"type": "rabbitmq", "secretRef": {"name": "broker"}, "queues": ["celery"]})
    assert choose(rabbit).broker.type == "rabbitmq"
    not_counted = {
        "replicas not read, or its last poll failed": choose(replicas=None),
        "paused": choose(paused),
        "at maxReplicas": choose(replicas=10),
        "invalid spec": choose(pool_body(minReplicas=20)),
    }
    assert {why: found for why, found in not_counted.items() if found is not None} == {}


class Counts:
    """The early notice's count, as the observer would answer it."""

    def __init__(self, ready: int = 0):
        self.ready, self.asked = ready, []

    async def __call__(self, pools):
        self.asked.append([(namespace, broker.queues) for namespace, broker in pools])
        return [self.ready for _ in pools]


class Scheduled:
    """One pool in a PoolScheduler on a clock the test moves, with the early notice's count."""

    def __init__(self, kube: FakeKube, broker: FakeBroker, counts: Counts, **spec):
        self.t = 0.0
        self.scheduler = PoolScheduler(deps=make_deps(kube, broker), monotonic=lambda: self.t, ready_counts=counts)
        self.scheduler.upsert(pool_body(**spec))

    async def tick(self, at: float) -> None:
        """What the scheduler's loop does at `at`: due polls, the count, and the polls it brought forward."""
        self.t = at
        await asyncio.gather(*self.scheduler.start_due())
        probe = self.scheduler.start_probe()
        if probe:
            await probe
        await asyncio.gather(*self.scheduler.start_due())


def test_a_burst_between_polls_is_scaled_for_within_a_probe_not_at_the_next_poll():
    kube, broker, counts = FakeKube(replicas={"workers": 0}), FakeBroker(Observation(ready=0, unacked=0)), Counts()

    pool = Scheduled(kube, broker, counts, pollIntervalSeconds=60)

    async def scenario():

        async def tick(at, ready=None):
            if ready is not None:
                counts.ready, broker.observation = ready, Observation(ready=ready, unacked=0)
            await pool.tick(at)

        await tick(0.0)  # the first poll: nothing waits, the pool stays at zero
        await tick(1.0)  # nothing counted
        assert kube.scale_calls == [] and len(counts.asked) == 2
        await tick(2.0, ready=23)  # the burst is counted, and its poll runs now instead of at t=60
        assert kube.scale_calls == [5]
        await tick(3.0)  # 23 messages need the 5 workers there are: no poll
        await tick(4.0, ready=40)  # the burst grows: polled again
        assert kube.scale_calls == [5, 8]
        await tick(5.0, ready=400)
        assert kube.scale_calls == [5, 8, 10]
        await tick(6.0)  # at maxReplicas: not counted any more

    asyncio.run(scenario())
    assert counts.asked == [[("ns", ("celery",))]] * 6, counts.asked  # t = 0 (after its poll) to 5, not 6
    scraped = {sample.name: sample.value for family in pool.scheduler.deps.metrics.early_polls.collect()
               for sample in family.samples if sample.labels == {"namespace": "ns", "workerpool": "pool"}}
    assert scraped["taskherd_operator_early_polls_total"] == 3, "each poll the early notice brought forward is counted (t = 2, 4, 5)"


def test_a_pool_whose_poll_is_due_within_a_count_is_not_counted():
    counts = Counts(ready=23)

    async def scenario():
        pool = Scheduled(FakeKube(replicas={"workers": 0}), FakeBroker(Observation(ready=0, unacked=0)), counts,
                         pollIntervalSeconds=PROBE_SECONDS)
        for at in range(5):
            await pool.tick(float(at))

    asyncio.run(scenario())
    assert counts.asked == [], "polled every PROBE_SECONDS: its polls read the queues themselves"


def test_a_pool_whose_scale_call_failed_is_left_to_its_regular_polls():
    kube, counts, failures = FakeKube(replicas={"workers": 0}), Counts(ready=23), []

    async def refused(namespace, target, replicas):
        failures.append(replicas)
        raise RuntimeError("403 Forbidden")

    async def scenario():
        kube.set_scale = refused
        pool = Scheduled(kube, FakeBroker(Observation(ready=23, unacked=0)), counts, pollIntervalSeconds=60)
        for at in range(4):
            await pool.tick(float(at))

    asyncio.run(scenario())
    assert failures == [5] and counts.asked == [], "one poll, at t=0; no count brings the failing one forward"


def test_the_count_is_what_a_poll_reads_on_a_real_redis_in_one_command_per_broker(redis_url, unique_name):
    first, second, prefixed = unique_name + "-a", unique_name + "-b", unique_name + "-p"
    app = Celery(broker=redis_url)
    for priority in (0, 3, 5, 9, None):  # every priority list of the queue
        app.send_task("t.noop", queue=first, priority=priority)
    app.send_task("t.noop", queue=second)
    app.close()
    prefix_app = Celery(broker=redis_url, broker_transport_options={"global_keyprefix": "tenant:"})
    for _ in range(3):
        prefix_app.send_task("t.noop", queue=prefixed)
    prefix_app.close()

    observer = BrokerObserver(kube=SecretKube(redis_url))
    pools = [("ns", BrokerSpec(type="redis", secret_name="s", queues=(first, second))),
             ("ns", BrokerSpec(type="redis", secret_name="s", queues=(second,), dead_letter_queues=(first,))),
             ("ns", BrokerSpec(type="redis", secret_name="s", queues=(prefixed,), global_keyprefix="tenant:")),
             ("ns", BrokerSpec(type="redis", secret_name="s", queues=(unique_name + "-empty",)))]
    client, commands = observer._redis_client(redis_url), []
    send = client.eval
    client.eval = lambda *args: commands.append(args) or send(*args)
    counts = asyncio.run(observer.ready_counts(pools))
    assert len(commands) == 2, "one command for the three pools without a key prefix, one for the prefixed"
    polled = inspect_redis(redis_url, [first, second])
    assert counts == [polled[first].ready + polled[second].ready, 1, 3, 0] == [6, 1, 3, 0]


def test_a_burst_on_rabbitmq_is_counted_at_once_and_the_poll_it_brings_forward_sees_it(amqp_url, unique_name):
    """Counted right after publishing, where the management API's figures (the broker's
    statistics) show it up to 5 s later: the count reads the queues themselves, over one AMQP
    connection for every pool of the broker; and the poll the count brings forward takes the
    counted ready messages over the API's older figures."""
    from kombu import Connection
    first, second = unique_name + "-a", unique_name + "-b"
    # a clock the test moves: once the listing reports the queues, it stands still, and the
    # listing read before the burst is the one every poll reads
    now = [1000.0]
    observer = BrokerObserver(kube=SecretKube(amqp_url), clock=lambda: now[0])
    management = {"management_url_key": "management-url"}
    pools = [("ns", BrokerSpec(type="rabbitmq", secret_name="s", queues=(first, second), **management)),
             ("ns", BrokerSpec(type="rabbitmq", secret_name="s", queues=(second,), **management)),
             ("ns", BrokerSpec(type="rabbitmq", secret_name="s", queues=(unique_name + "-never-declared",),
                               **management))]
    with Connection(amqp_url) as connection:
        channel = connection.channel()
        for queue in (first, second):
            channel.queue_declare(queue, durable=True, auto_delete=False)

        def reported():
            now[0] += LISTING_MAX_AGE_SECONDS
            return asyncio.run(observer(*pools[0]))
        before = wait_for("the management API to report the new queues", reported, timeout=30, interval=0.5,
                          until=lambda observation: not observation.pending_queues)
        assert before.ready == 0
        assert asyncio.run(observer.ready_counts(pools)) == [0, 0, None]
        for queue, n in ((first, 7), (second, 2)):
            for _ in range(n):
                # confirmed: the count, on a connection of its own, would otherwise race the publish
                channel.basic_publish_confirm(channel.prepare_message(b"{}"), routing_key=queue)
        assert asyncio.run(observer(*pools[0])).ready == 0, "the listing alone does not show the burst"
        assert asyncio.run(observer.ready_counts(pools)) == [9, 2, None]
        assert asyncio.run(observer(*pools[0])).ready == 9, "the poll takes the count"
    assert len(observer._counters) == 1, "one counter (one connection) for the broker's pools"


def test_counted_ready_messages_replace_the_management_apis_older_ones():
    from taskherd.queues.rabbitmq_counts import with_counted_ready
    from taskherd.queues.stats import AGE_FROM_HEAD_TIMESTAMP, QueueStats

    def stats(queue, ready, age=None, **kw):
        return QueueStats(queue=queue, ready=ready, unacked=1, consumers=2, oldest_age_seconds=age,
                          oldest_unacked_age_seconds=None, oldest_age_method=AGE_FROM_HEAD_TIMESTAMP if age else None,
                          oldest_age_error_seconds=1.0 if age else None, **kw)
    listed = {"burst": stats("burst", 0), "drained": stats("drained", 5, age=40.0), "same": stats("same", 3, age=9.0),
              "new": stats("new", 0, pending=True), "uncounted": stats("uncounted", 4, age=8.0)}
    fresher = with_counted_ready(listed, {"burst": 30, "drained": 0, "same": 3, "new": 6, "gone": None,
                                          "uncounted": None})
    assert fresher["burst"] == stats("burst", 30), "more ready: their age is not known yet"
    assert fresher["drained"] == stats("drained", 0), "none left: no head, no age"
    assert {q: fresher[q] for q in ("same", "new", "uncounted")} == {q: listed[q] for q in ("same", "new", "uncounted")}
    assert set(fresher) == set(listed)


def test_pools_whose_broker_does_not_answer_are_left_to_their_polls(redis_url, unique_name):
    rabbit = ("ns", BrokerSpec(type="rabbitmq", secret_name="s", queues=(unique_name,)))
    counts = asyncio.run(BrokerObserver(kube=SecretKube("amqp://guest:guest@127.0.0.1:1//")).ready_counts([rabbit]))
    assert counts == [None]
    unreachable = BrokerObserver(kube=SecretKube("redis://:hunter2@127.0.0.1:1/3"))
    missing_key = ("ns", BrokerSpec(type="redis", secret_name="s", secret_key="absent", queues=(unique_name,)))
    redis_pool = ("ns", BrokerSpec(type="redis", secret_name="s", queues=(unique_name,)))
    assert asyncio.run(unreachable.ready_counts([redis_pool, missing_key])) == [None, None]
