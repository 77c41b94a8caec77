"""What the pool's Secret holds is judged before anything connects: a value that cannot be the
pool's broker is a SecretValueInvalid condition naming the key, what is wrong and what is valid,
with no password in it; the observer never inspects it (a rabbitmq pool given a Redis URL was
inspected as Redis)."""
from __future__ import annotations

import asyncio

import pytest

from fakes import FakeKube
from taskherd.operator.broker import BrokerObserver, ObservationError
from taskherd.operator.policy import BrokerSpec

AMQP = "amqp://shop:hunter2@rabbit:5672/shop"
REDIS = "redis://:hunter2@redis:6379/0"


class SecretKube(FakeKube):
    def __init__(self, data: dict[str, str]) -> None:
        super().__init__()
        self.data = data

    async def read_secret(self, namespace, name):
        return dict(self.data)  # a new dict per read, as the API server's client returns


def observe(kind: str, data: dict[str, str], management_url_key: str | None = None):
    inspected = []

    def inspect(url, queues, *, management_url, global_keyprefix):
        inspected.append(url)
        return {}

    spec = BrokerSpec(type=kind, secret_name="broker", management_url_key=management_url_key, queues=("mail",))
    with pytest.raises(ObservationError) as info:
        asyncio.run(BrokerObserver(kube=SecretKube(data), inspect=inspect)("shop", spec))
    assert inspected == [], "a value the Secret cannot hold was inspected"
    return info.value


@pytest.mark.parametrize("kind,data,says", [
    ("redis", {"url": "http://redis:6379/0"}, "key 'url' = 'http://redis:6379/0' is not a broker URL: scheme 'http'"),
    ("redis", {"url": "redis://:hunter2@redis:99999/0"}, "(valid: a port in 1..65535)"),
    ("redis", {"url": "redis://redis:6379/cache"}, "the Redis database 'cache' is not a number"),
    ("redis", {"url": ""}, "key 'url' = '' is not a broker URL (valid: a redis://, rediss:// or amqp:// URL"),
    ("redis", {"url": "redis-host:6379"}, "is not a broker URL (valid: a redis://"),
    ("redis", {"url": "redis://a:6379/0; redis://b:6379/0"}, "whitespace in it (valid: a URL without spaces"),
    # a base64 password's '/' unescaped: urllib reads "hunter2" as the port; not shown
    ("rabbitmq", {"url": "amqp://shop:hunter2/a+b==@rabbit:5672/shop"},
     "key 'url' = 'amqp://shop:***@rabbit:5672/shop' is not a broker URL: a '/', '?' or '#' in the user or password"),
    ("redis", {"url": AMQP}, "key 'url' holds a rabbitmq URL but spec.broker.type is 'redis' "
                             "(valid: a redis URL, or spec.broker.type: rabbitmq)"),
    ("rabbitmq", {"url": REDIS}, "key 'url' holds a redis URL but spec.broker.type is 'rabbitmq'"),
    # brokers Celery reaches but the operator's clients cannot: every poll failed on them
    ("redis", {"url": "sentinel://:hunter2@s1:26379;sentinel://s2:26379"},
     "key 'url' = 'sentinel://:***@s1:26379': the operator cannot observe a sentinel:// broker"),
    ("redis", {"url": "redis://a:6379/0;redis+socket:///run/redis.sock"},
     "'redis+socket:///run/redis.sock': the operator cannot observe a redis+socket:// broker"),
    ("rabbitmq", {"url": "librabbitmq://shop:hunter2@rabbit:5672/shop"},
     "(valid: redis://, rediss://, amqp://, amqps://, pyamqp://)"),
])
def test_a_broker_url_that_cannot_be_the_pools_broker_is_named_with_what_is_valid(kind, data, says):
    error = observe(kind, data)
    assert error.reason == "SecretValueInvalid"
    assert str(error).startswith("Secret shop/broker: ") and says in str(error), str(error)
    assert "hunter2" not in str(error)


@pytest.mark.parametrize("management_url,says", [
    ("ftp://rabbit:15672", "not an http:// or https:// URL with a host"),
    ("rabbit:15672", "not an http:// or https:// URL with a host"),
    ("http://guest:hunter2@rabbit:0", "the port '0' is not a number in range (valid: a port from 1 to 65535)"),
    ("http://rabbit:15672/?vhost=shop", "a base URL has no ?query or #fragment"),
    ("http://rabbit :15672", "whitespace in it"),
    ("http://guest:hunter2/a=@rabbit:15672", "'http://guest:***@rabbit:15672' is not the management API's URL: a '/'"),
    ("http://rabbit:15672/\x01", "a control character in it"),
    ("http://rabbit:15672/%zz", "'%' only as %XX"),
])
def test_a_management_url_that_cannot_be_used_is_named_with_what_is_valid(management_url, says):
    error = observe("rabbitmq", {"url": AMQP, "management-url": management_url}, "management-url")
    assert error.reason == "SecretValueInvalid"
    assert "key 'management-url' = " in str(error) and says in str(error), str(error)
    assert "valid:" in str(error) and "hunter2" not in str(error)


def test_a_management_url_key_the_secret_lacks_is_missing_not_silently_the_default():
    error = observe("rabbitmq", {"url": AMQP}, "management-url")
    assert error.reason == "SecretKeyMissing"
    assert "has no key 'management-url' (spec.broker.secretRef.managementUrlKey; keys: ['url'])" in str(error)


def test_a_broker_url_key_the_secret_lacks_names_the_field_and_its_default():
    # 'url' is the default of spec.broker.secretRef.key: the user may never have written it
    error = observe("redis", {"broker-url": REDIS})
    assert error.reason == "SecretKeyMissing"
    assert ("Secret shop/broker has no key 'url' (spec.broker.secretRef.key, default 'url'; "
            "keys: ['broker-url'])") in str(error), str(error)


@pytest.mark.parametrize("kind,data", [
    ("redis", {"url": "rediss://:pw@redis:6380/2"}),
    ("rabbitmq", {"url": "amqps://shop:pw@rabbit:5671/shop", "management-url": "https://rabbit:15671/prefix/"}),
    # `kubectl create secret --from-file` keeps the file's last newline: read as the pods read it
    # (the contract strips an environment variable), not taken into a vhost or refused
    ("redis", {"url": "redis://:pw@redis:6379/0\n"}),
    ("rabbitmq", {"url": "amqp://shop:pw@rabbit:5672/shop\n", "management-url": "http://rabbit:15672\n"}),
])
def test_values_that_can_be_the_pools_broker_are_inspected(kind, data):
    inspected = []

    def inspect(url, queues, *, management_url, global_keyprefix):
        inspected.append((url, management_url))
        return {}

    spec = BrokerSpec(type=kind, secret_name="broker", queues=("mail",),
                      management_url_key="management-url" if "management-url" in data else None)
    asyncio.run(BrokerObserver(kube=SecretKube(data), inspect=inspect)("shop", spec))
    management_url = data.get("management-url")
    assert inspected == [(data["url"].strip(), management_url and management_url.strip())]


class Broker:
    """An inspection that answers only for the URLs that are up, as a real client would."""

    def __init__(self, up: set[str]) -> None:
        self.up = up
        self.asked: list[str] = []

    def __call__(self, url, queues, *, management_url, global_keyprefix):
        from taskherd.queues import QueueStats
        from taskherd.queues.stats import BrokerUnreachable
        self.asked.append(url)
        if url not in self.up:
            raise BrokerUnreachable(f"{url}: connection refused")
        return {q: QueueStats(q, ready=int(url[-1]) + 1, unacked=0, consumers=None, oldest_age_seconds=None,
                              oldest_unacked_age_seconds=None) for q in queues}


def test_a_failover_list_is_observed_at_the_url_that_answers_as_kombu_connects():
    """'redis://a/1;redis://b/1' is a failover list (kombu tries the URLs in order); redis-py parsed
    the whole string as one URL — host a, database 0 — so a pool whose first broker was down (or
    whose queues live in database 1) read as empty and was scaled to its minimum."""
    first, second, third = "redis://:hunter2@a:6379/1", "redis://b:6379/2", "redis://c:6379/3"
    broker = Broker(up={second, third})
    observer = BrokerObserver(kube=SecretKube({"url": f"{first};{second};{third}"}), inspect=broker)
    spec = BrokerSpec(type="redis", secret_name="broker", queues=("mail",))

    assert asyncio.run(observer("shop", spec)).ready == 3  # the second answered
    assert broker.asked == [first, second]  # each URL alone, never the joined string
    assert asyncio.run(observer("shop", spec)).ready == 3
    assert broker.asked[2:] == [second]  # the one that answered is asked first, as kombu stays connected

    broker.up = {first, third}  # the second goes down: the next in order, then back to the first
    assert asyncio.run(observer("shop", spec)).ready == 4
    assert broker.asked[3:] == [second, third]

    broker.up = set()
    with pytest.raises(ObservationError) as info:  # none answers: the first one tried is named
        asyncio.run(observer("shop", spec))
    assert info.value.reason == "BrokerUnreachable" and "c:6379/3" in str(info.value)
    assert "hunter2" not in str(info.value)


def test_the_verdict_follows_the_secret_once_it_is_read_again():
    """Judged once per read of the Secret (every SECRET_TTL_SECONDS), not every poll: a Secret the
    user corrects is used at its next read, and until then every poll reports the same problem."""
    from taskherd.operator.broker import SECRET_TTL_SECONDS

    now = [0.0]
    inspected = []

    def inspect(url, queues, *, management_url, global_keyprefix):
        inspected.append(url)
        return {}

    kube = SecretKube({"url": AMQP})
    observer = BrokerObserver(kube=kube, inspect=inspect, clock=lambda: now[0])
    spec = BrokerSpec(type="redis", secret_name="broker", queues=("mail",))

    async def polls():
        errors = []
        for _ in range(2):
            with pytest.raises(ObservationError) as info:
                await observer("shop", spec)
            errors.append(info.value)
        kube.data = {"url": REDIS}  # corrected; read again once the cached copy is too old
        with pytest.raises(ObservationError):
            await observer("shop", spec)
        now[0] += SECRET_TTL_SECONDS
        await observer("shop", spec)
        return errors

    first, second = asyncio.run(polls())
    assert first is not second and str(first) == str(second) and first.reason == "SecretValueInvalid"
    assert inspected == [REDIS]


def test_the_secrets_and_verdicts_of_deleted_pools_are_forgotten():
    """Kept per Secret while a pool reads it: the entries of pools that went away (each a Secret's
    values and a verdict) are dropped, so an operator that saw thousands of pools come and go does
    not keep them all."""
    from taskherd.operator.broker import SECRET_TTL_SECONDS

    now = [0.0]
    kube = SecretKube({"url": REDIS})
    observer = BrokerObserver(kube=kube, inspect=lambda *a, **k: {}, clock=lambda: now[0])
    live = BrokerSpec(type="redis", secret_name="live", queues=("mail",))

    async def polls():
        for n in range(50):  # pools come and go, each with its own Secret
            await observer("shop", BrokerSpec(type="redis", secret_name=f"gone-{n}", queues=("mail",)))
            await observer("shop", live)
            now[0] += 5
        for _ in range(30):  # then only the live pool polls, every 5 s
            await observer("shop", live)
            now[0] += 5

    asyncio.run(polls())
    assert [name for _, name in observer._secrets] == ["live"]
    assert [key[1] for key in observer._judged] == ["live"]
    assert now[0] > 3 * SECRET_TTL_SECONDS
