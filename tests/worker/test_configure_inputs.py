"""configure() refuses bad input with a ProfileError naming the setting as written, its value and the
valid range, instead of crashing (OverflowError, TypeError, AttributeError) or accepting a value that
fails later inside a worker. Pure in-process: no broker is contacted (the URLs point at port 1)."""
from __future__ import annotations

import dataclasses
import itertools
import random

import pytest
from celery import Celery

from taskherd.worker import profile as profile_module
MAX_SECONDS = 7 * 24 * 3600  # a week: the bound of every duration keyword (as of its variable)
from taskherd.worker.components.delayed import DelayedMessages
from taskherd.worker.components.drain import Drain
from taskherd.worker.components.heartbeat import Heartbeat
from taskherd.worker.components.recovery import FastRecovery
from taskherd.worker.components.timer_heap import TimerHeap
from taskherd.worker.profile import ProfileError, Settings, configure

REDIS = "redis://127.0.0.1:1/0"
AMQP = "amqp://u:p@127.0.0.1:1//"
BROKERS = pytest.mark.parametrize("broker", [REDIS, AMQP], ids=["redis", "rabbitmq"])
_apps = itertools.count()


@pytest.fixture(autouse=True)
def _no_taskherd_environment(monkeypatch):
    """The pod's TASKHERD_* variables override configure()'s arguments: none may leak in."""
    import os

    for name in list(os.environ):
        if name.startswith("TASKHERD_") or name.startswith("CELERY_"):
            monkeypatch.delenv(name)


def _app(broker: str) -> Celery:
    return Celery(f"test-configure-inputs-{next(_apps)}", broker=broker)


def _refused(broker: str, **kwargs) -> str:
    with pytest.raises(ProfileError) as caught:
        configure(_app(broker), **kwargs)
    return str(caught.value)


# -- 1. huge and unbounded durations -------------------------------------------------------------

SECONDS_SETTINGS = ["soft_time_limit", "time_limit", "visibility_timeout", "broker_heartbeat", "backoff_base",
                    "backoff_cap", "rabbitmq_consumer_timeout"]


@BROKERS
@pytest.mark.parametrize("setting", SECONDS_SETTINGS)
@pytest.mark.parametrize("value", [10**400, -10**400, 10**5000], ids=["1e400", "-1e400", "1e5000"])
def test_a_huge_int_duration_is_refused_not_an_overflow(broker, setting, value):
    # math.isfinite(10**400) raised OverflowError; repr(10**5000) raises ValueError (4300 digits)
    message = _refused(broker, **{setting: value})
    assert f"{setting}=<an int of " in message and "valid: " in message


@BROKERS
@pytest.mark.parametrize("setting", ["soft_time_limit", "time_limit", "backoff_base", "backoff_cap"])
def test_a_duration_past_a_week_is_refused_with_the_range(broker, setting):
    message = _refused(broker, **{setting: 1e10})
    assert f"{setting}=10000000000.0 is more than {MAX_SECONDS} (a week) (valid: 0 < {setting} <= {MAX_SECONDS})" \
        in message


def test_the_broker_timeouts_and_the_heartbeat_have_their_own_bounds():
    # they must outlast time_limit + backoff_cap (a week each): the chart's visibility timeout takes 30 days
    assert "visibility_timeout=2592001 is more than 2592000 (30 days)" in _refused(REDIS, visibility_timeout=2592001)
    assert "rabbitmq_consumer_timeout=10000000000.0 is more than 2592000 (30 days)" in _refused(
        AMQP, rabbitmq_consumer_timeout=1e10)
    # AMQP negotiates the heartbeat in 16 bits: py-amqp fails to pack a larger one
    assert "broker_heartbeat=65536 is more than 65535" in _refused(AMQP, broker_heartbeat=65536)


def test_durations_at_their_bounds_are_accepted():
    profile = configure(_app(REDIS), soft_time_limit=MAX_SECONDS - 1, time_limit=MAX_SECONDS,
                        backoff_base=MAX_SECONDS, backoff_cap=MAX_SECONDS, broker_heartbeat=65535,
                        components=[FastRecovery(heartbeat_interval=1, timeout=MAX_SECONDS)])
    assert profile.time_limit == MAX_SECONDS
    configure(_app(AMQP), time_limit=MAX_SECONDS, soft_time_limit=60, rabbitmq_consumer_timeout=2592000)


@pytest.mark.parametrize("value", [10**400, 1e10], ids=["huge-int", "past-a-week"])
@pytest.mark.parametrize("component, field", [
    (lambda v: Heartbeat(interval=v), "Heartbeat(interval="),
    (lambda v: FastRecovery(heartbeat_interval=v), "FastRecovery(heartbeat_interval="),
    (lambda v: FastRecovery(timeout=v), "FastRecovery(timeout="),
    (lambda v: DelayedMessages(interval=v), "DelayedMessages(interval="),
    (lambda v: TimerHeap(interval=v), "TimerHeap(interval="),
    (lambda v: Drain(poll=v), "Drain(poll="),
], ids=["heartbeat", "recovery-interval", "recovery-timeout", "delayed", "timer-heap", "drain"])
def test_a_component_duration_is_bounded(component, field, value):
    # Event.wait(1e10) raises OverflowError in FastRecovery's lease thread; a heartbeat every 1e10 s
    # never lets liveness fail
    made = component(value)
    problems = made.problems()
    assert len(problems) == 1 and problems[0].startswith(field)
    assert f"is longer than {MAX_SECONDS} seconds (a week)" in problems[0] and "(valid: " in problems[0]
    components = [Heartbeat(), made] if isinstance(made, Drain) else [made]
    assert field in _refused(REDIS, components=components)


@BROKERS
def test_a_delivery_limit_past_what_amqp_encodes_is_refused(broker):
    # x-delivery-limit = max_deliveries on quorum queues: py-amqp cannot pack an int past 64 bits
    assert "max_deliveries=" in _refused(broker, max_deliveries=2**63, queue_type="quorum")


# -- 2. wrongly typed arguments ------------------------------------------------------------------

@BROKERS
@pytest.mark.parametrize("queues", [5, 1.5, object()], ids=["int", "float", "object"])
def test_queues_that_are_not_a_list_are_refused_by_name(broker, queues):
    assert "queues=" in _refused(broker, queues=queues)


@BROKERS
@pytest.mark.parametrize("components, said", [
    (5, "components=5 is not a list of components"),
    ("abc", "components='abc' is not a list of components"),
    ([1], "components[0]=1 is not a component"),
    ([Heartbeat(), "Drain"], "components[1]='Drain' is not a component"),
    ([Heartbeat], "components[0]=Heartbeat is a class, not a component (valid: an instance, Heartbeat())"),
], ids=["int", "str", "list-of-int", "list-with-str", "class"])
def test_components_that_are_not_component_instances_are_refused_by_name(broker, components, said):
    message = _refused(broker, components=components)
    assert said in message


def test_every_problem_is_reported_together_with_a_bad_components_argument():
    message = _refused(REDIS, components=5, queues=5, time_limit="300")
    assert "components=5" in message and "queues=5" in message and "time_limit='300'" in message


# -- 3. every setting has a rule; backoff_rng ------------------------------------------------------

def test_every_setting_has_a_field_rule():
    without = [f.name for f in dataclasses.fields(Settings) if f.name not in profile_module._FIELD_RULES]
    assert without == []


@BROKERS
@pytest.mark.parametrize("rng", [5, "random", random.Random(3), random.uniform],
                         ids=["int", "str", "Random-instance", "needs-arguments"])
def test_a_backoff_rng_backoff_delay_cannot_call_is_refused(broker, rng):
    # backoff_delay calls rng() with no argument; before, the first retry raised TypeError
    assert "backoff_rng=" in _refused(broker, backoff_rng=rng)


def test_a_backoff_rng_that_backoff_delay_can_call_is_accepted():
    seeded = random.Random(3)
    profile = configure(_app(REDIS), backoff_rng=seeded.random)
    assert profile.backoff_rng == seeded.random
    assert configure(_app(REDIS), backoff_rng=lambda: 0.5).backoff_rng() == 0.5


# -- 4. queue names RabbitMQ cannot declare --------------------------------------------------------

def test_a_work_queue_whose_derived_dlq_is_over_255_bytes_is_refused_on_rabbitmq():
    message = _refused(AMQP, queues=["q" * 253])
    assert repr("q" * 253) in message and "255 bytes" in message and "at most 251 bytes" in message


@pytest.mark.parametrize("name", ["q" * 256, "é" * 128], ids=["ascii", "two-byte-utf8"])
def test_a_work_queue_over_255_utf8_bytes_is_refused_on_rabbitmq(name):
    message = _refused(AMQP, queues=["orders", name])
    assert repr(name) in message and "256 bytes" in message and "255 bytes" in message


def test_an_explicit_dlq_over_255_bytes_is_refused_on_rabbitmq():
    message = _refused(AMQP, queues=["orders"], dead_letter_queues=["d" * 300])
    assert message.count("dead_letter_queues:") == 1 and "300 bytes" in message


def test_queue_names_within_255_bytes_are_accepted_on_rabbitmq():
    profile = configure(_app(AMQP), queues=["q" * 251, "é" * 125])
    assert profile.dead_letter_queue_for("q" * 251) == "q" * 251 + ".dlq"


def test_long_queue_names_stay_accepted_on_redis():
    # a Redis queue is a key: a long name works there
    assert configure(_app(REDIS), queues=["q" * 300]).queues == ("q" * 300,)


@BROKERS
def test_a_queue_name_that_cannot_be_encoded_is_refused(broker):
    # a lone surrogate: py-amqp and redis-py raise UnicodeEncodeError at the first declare or push
    assert "cannot be encoded in UTF-8" in _refused(broker, queues=["orders\udc80"])


@BROKERS
def test_a_queue_name_with_an_invisible_format_character_is_refused(broker):
    # "emails\u200b" looks like "emails": workers would wait on a queue the producers never send to
    message = _refused(broker, queues=["emails\u200b"])
    assert "holds U+200B (ZERO WIDTH SPACE), an invisible format character" in message, message


def test_a_long_queue_from_the_environment_names_the_variable(monkeypatch):
    monkeypatch.setenv("TASKHERD_QUEUES", "q" * 253)
    message = _refused(AMQP)
    assert "255 bytes" in message and "TASKHERD_QUEUES=" in message


# -- 5. delivery counter URLs redis-py cannot use ------------------------------------------------

@BROKERS
@pytest.mark.parametrize("url", ["sentinel://h:1", "redis+socket:///tmp/s", "amqp://h:5672//", "h:6379"])
def test_a_delivery_counter_url_redis_py_cannot_use_is_refused(broker, url):
    message = _refused(broker, delivery_counter_url=url)
    assert f"delivery_counter_url={url!r} must be a redis:// URL" in message and "rediss://, or unix://" in message


def test_a_delivery_counter_url_from_the_environment_names_the_variable(monkeypatch):
    monkeypatch.setenv("TASKHERD_DELIVERY_COUNTER_URL", "sentinel://h:1")
    message = _refused(AMQP)
    assert "TASKHERD_DELIVERY_COUNTER_URL='sentinel://h:1'" in message and "rediss://, or unix://" in message


def test_a_refused_delivery_counter_url_keeps_its_password_out_of_the_message():
    message = _refused(AMQP, delivery_counter_url="sentinel://user:s3cret@h:1")
    assert "s3cret" not in message and "delivery_counter_url='sentinel://user:***@h:1'" in message


@pytest.mark.parametrize("url", ["redis://h:6379/0", "rediss://h:6380/1", "unix:///tmp/redis.sock?db=2",
                                 "REDIS://h:6379"])
def test_the_delivery_counter_urls_redis_py_takes_are_accepted(url):
    import redis

    redis.Redis.from_url(url)  # what the counter does with it (no connection yet)
    assert configure(_app(AMQP), delivery_counter_url=url).delivery_counter_url == url
