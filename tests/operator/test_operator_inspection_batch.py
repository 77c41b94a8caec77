"""The pools of one broker polled at the same time share one queue inspection
(inspection_batch.py), and an error still reaches only the pools it concerns."""
from __future__ import annotations

import asyncio

import pytest

from fakes import FakeKube
from taskherd.operator.broker import BrokerObserver, ObservationError
from taskherd.operator.inspection_batch import BrokerAddress, InspectionBatcher
from taskherd.operator.kube import NotFound
from taskherd.operator.policy import BrokerSpec
from taskherd.queues.stats import BrokerUnreachable, QueueStats

REDIS_A, REDIS_B = BrokerAddress("redis://a:6379/0"), BrokerAddress("redis://b:6379/0")


def stats(queue: str, ready: int = 1) -> QueueStats:
    return QueueStats(queue=queue, ready=ready, unacked=0, consumers=None, oldest_age_seconds=None,
                      oldest_unacked_age_seconds=None)


class RecordingInspect:
    """An inspection that records its calls and fails as told: `unreachable` (broker URLs) or
    `bad_queues` (a queue whose key the broker refuses, as a WRONGTYPE would)."""

    def __init__(self, *, unreachable=(), bad_queues=()):
        self.calls: list[tuple[BrokerAddress, list[str]]] = []
        self.unreachable, self.bad_queues = set(unreachable), set(bad_queues)

    async def __call__(self, address, queues):
        self.calls.append((address, list(queues)))
        await asyncio.sleep(0.01)  # a round trip: requests made meanwhile wait for the next call
        if address.url in self.unreachable:
            raise BrokerUnreachable(f"{address.url} refused")
        if self.bad_queues & set(queues):
            raise RuntimeError(f"WRONGTYPE {sorted(self.bad_queues & set(queues))}")
        return {q: stats(q, ready=len(q)) for q in queues}


async def ask(batcher, *requests):
    """Each (address, queues) asked at once, as the polls of one round do; results or errors."""
    return await asyncio.gather(*(batcher.inspect(a, q) for a, q in requests), return_exceptions=True)


def test_pools_of_one_broker_asking_together_are_inspected_in_one_call():
    inspect = RecordingInspect()
    one, two = asyncio.run(ask(InspectionBatcher(inspect), (REDIS_A, ["q1", "q1.dlq"]),
                               (REDIS_A, ["q2", "shared"])))
    assert inspect.calls == [(REDIS_A, ["q1", "q1.dlq", "q2", "shared"])]
    assert one == {"q1": stats("q1", 2), "q1.dlq": stats("q1.dlq", 6)}  # only its own queues
    assert two == {"q2": stats("q2", 2), "shared": stats("shared", 6)}


def test_a_queue_two_pools_watch_is_inspected_once():
    inspect = RecordingInspect()
    one, two = asyncio.run(ask(InspectionBatcher(inspect), (REDIS_A, ["jobs"]), (REDIS_A, ["jobs", "jobs.dlq"])))
    assert inspect.calls == [(REDIS_A, ["jobs", "jobs.dlq"])]
    assert one["jobs"] == two["jobs"]


def test_different_brokers_and_key_prefixes_are_inspected_separately():
    prefixed = BrokerAddress(REDIS_A.url, global_keyprefix="app1:")
    inspect = RecordingInspect()
    asyncio.run(ask(InspectionBatcher(inspect), (REDIS_A, ["q1"]), (REDIS_B, ["q2"]), (prefixed, ["q3"])))
    assert sorted(inspect.calls, key=repr) == sorted([(REDIS_A, ["q1"]), (REDIS_B, ["q2"]), (prefixed, ["q3"])],
                                                     key=repr)


def test_a_request_made_during_an_inspection_waits_for_the_next_one():
    """No pool is served figures read before it asked."""
    inspect = RecordingInspect()

    async def scenario():
        batcher = InspectionBatcher(inspect)
        first = asyncio.create_task(batcher.inspect(REDIS_A, ["q1"]))
        await asyncio.sleep(0.002)  # the first inspection is running
        late = [asyncio.create_task(batcher.inspect(REDIS_A, [q])) for q in ("q2", "q3")]
        return await first, await asyncio.gather(*late)

    first, late = asyncio.run(scenario())
    assert inspect.calls == [(REDIS_A, ["q1"]), (REDIS_A, ["q2", "q3"])]
    assert first == {"q1": stats("q1", 2)} and late == [{"q2": stats("q2", 2)}, {"q3": stats("q3", 2)}]


def test_an_unreachable_broker_fails_only_the_pools_of_that_broker():
    inspect = RecordingInspect(unreachable={REDIS_A.url})
    on_a1, on_a2, on_b = asyncio.run(ask(InspectionBatcher(inspect), (REDIS_A, ["q1"]), (REDIS_A, ["q2"]),
                                         (REDIS_B, ["q3"])))
    assert isinstance(on_a1, BrokerUnreachable) and isinstance(on_a2, BrokerUnreachable)
    assert on_b == {"q3": stats("q3", 2)}
    assert len(inspect.calls) == 2  # one per broker: the unreachable one is not asked again per pool


def test_an_error_of_one_pools_queue_reaches_only_that_pool():
    inspect = RecordingInspect(bad_queues={"broken"})
    good, bad, other = asyncio.run(ask(InspectionBatcher(inspect), (REDIS_A, ["q1"]), (REDIS_A, ["broken"]),
                                       (REDIS_A, ["q2"])))
    assert good == {"q1": stats("q1", 2)} and other == {"q2": stats("q2", 2)}
    assert isinstance(bad, RuntimeError) and "broken" in str(bad)
    assert inspect.calls[0] == (REDIS_A, ["q1", "broken", "q2"])  # then each pool alone
    assert sorted(queues for _, queues in inspect.calls[1:]) == [["broken"], ["q1"], ["q2"]]


def test_a_cancelled_poll_does_not_stop_the_others_of_its_batch():
    inspect = RecordingInspect()

    async def scenario():
        batcher = InspectionBatcher(inspect)
        removed = asyncio.create_task(batcher.inspect(REDIS_A, ["gone"]))
        kept = asyncio.create_task(batcher.inspect(REDIS_A, ["q1"]))
        await asyncio.sleep(0.002)
        removed.cancel()  # its WorkerPool was deleted while it waited
        return await kept, await batcher.inspect(REDIS_A, ["q2"])

    assert asyncio.run(scenario()) == ({"q1": stats("q1", 2)}, {"q2": stats("q2", 2)})


class Secrets(FakeKube):
    def __init__(self, secrets):
        super().__init__()
        self.secrets = secrets

    async def read_secret(self, namespace, name):
        if name not in self.secrets:
            raise NotFound(name)
        return self.secrets[name]


def broker(secret: str, *queues: str) -> BrokerSpec:
    return BrokerSpec(type="redis", secret_name=secret, queues=queues, dead_letter_queues=(f"{queues[0]}.dlq",))


def observe_together(observer, *brokers):
    async def all_at_once():
        return await asyncio.gather(*(observer("ns", b) for b in brokers), return_exceptions=True)
    return asyncio.run(all_at_once())


def test_the_observer_inspects_the_pools_of_one_redis_broker_in_one_call():
    calls = []

    def inspect(url, queues, *, management_url, global_keyprefix):
        calls.append((url, queues))
        return {q: stats(q, ready=3) for q in queues}

    kube = Secrets({"a": {"url": "redis://a/0"}, "also-a": {"url": "redis://a/0"}, "b": {"url": "redis://b/0"}})
    one, two, three = observe_together(BrokerObserver(kube=kube, inspect=inspect),
                                       broker("a", "q1"), broker("also-a", "q2"), broker("b", "q3"))
    assert sorted(calls) == [("redis://a/0", ["q1", "q1.dlq", "q2", "q2.dlq"]), ("redis://b/0", ["q3", "q3.dlq"])]
    assert (one.ready, one.dead_letters) == (3, {"q1.dlq": 3})
    assert (two.ready, two.dead_letters) == (3, {"q2.dlq": 3}) and three.ready == 3


def test_one_pools_missing_secret_does_not_fail_the_others_of_its_broker():
    def inspect(url, queues, *, management_url, global_keyprefix):
        return {q: stats(q) for q in queues}

    kube = Secrets({"a": {"url": "redis://a/0"}})
    found, missing = observe_together(BrokerObserver(kube=kube, inspect=inspect),
                                      broker("a", "q1"), broker("no-such-secret", "q2"))
    assert found.ready == 1
    assert isinstance(missing, ObservationError) and missing.reason == "SecretNotFound"


def test_rabbitmq_pools_polled_together_share_one_call():
    """A RabbitMQ inspection reads the vhost's listing (one GET a second for all its queues): the
    pools of one broker polled together share one call, as on Redis."""
    calls = []

    def inspect(url, queues, *, management_url, global_keyprefix):
        calls.append(queues)
        return {q: stats(q) for q in queues}

    kube = Secrets({"r": {"url": "amqp://r//", "api": "http://r:15672"}})
    specs = [BrokerSpec(type="rabbitmq", secret_name="r", management_url_key="api", queues=(q,)) for q in ("q1", "q2")]
    observe_together(BrokerObserver(kube=kube, inspect=inspect), *specs)
    assert calls == [["q1", "q2"]]


@pytest.mark.parametrize("error", [BrokerUnreachable("Redis at redis://:***@a/0: refused"), RuntimeError("WRONGTYPE")])
def test_a_failed_inspection_is_the_pools_observation_error(error):
    def inspect(url, queues, *, management_url, global_keyprefix):
        raise error

    kube = Secrets({"a": {"url": "redis://:hunter2@a/0"}})
    [failed] = observe_together(BrokerObserver(kube=kube, inspect=inspect), broker("a", "q1"))
    assert isinstance(failed, ObservationError) and failed.reason == "BrokerUnreachable"
    assert type(error).__name__ in str(failed) and "hunter2" not in str(failed)
