"""The worker's start-up self-check against real brokers: a Redis that evicts keys is refused, one
without persistence or with CONFIG disabled is warned about, and on RabbitMQ the consumer timeout
the time limits were checked against is stated (3.10 does not let a client read it)."""

import pytest
from celery import Celery

from support.private_redis import private_redis
from taskherd.worker import ProfileError, configure

from worker_support import core_env


def test_a_redis_that_evicts_keys_is_refused(tmp_path, unique_name, worker_factory):
    with private_redis(tmp_path / "redis", "--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru") as (url, _):
        with pytest.raises(AssertionError, match=r"worker exited \(1\)") as exited:
            worker_factory("apps.core_app", queues=[unique_name], concurrency=1, env=core_env(url, unique_name, url))
    said = str(exited.value)
    assert "maxmemory-policy='allkeys-lru' evicts keys under memory pressure" in said, said[-3000:]
    assert "fix: CONFIG SET maxmemory-policy noeviction" in said


@pytest.mark.parametrize("policy", ["volatile-lru", "allkeys-random"])
def test_every_evicting_policy_is_refused_even_the_volatile_ones(tmp_path, policy):
    """volatile-* only evicts keys with a TTL: idempotency done-records and leases are such keys."""
    from taskherd.worker.components.broker_check import _read_redis, redis_findings

    with private_redis(tmp_path / "redis", "--maxmemory-policy", policy) as (url, _):
        info, save, unreadable = _read_redis(url)
    findings = redis_findings("test", info, save, unreadable=unreadable)
    assert [f"maxmemory-policy={policy!r}" in error for error in findings.errors] == [True]


def test_a_redis_without_persistence_starts_with_a_warning_and_one_with_aof_without(
        tmp_path, unique_name, worker_factory):
    with private_redis(tmp_path / "volatile") as (url, _):
        worker = worker_factory("apps.core_app", queues=[unique_name], concurrency=1, env=core_env(url, unique_name, url))
        assert "persistence is off (appendonly no, save '')" in worker.log()
        assert "fix: 'appendonly yes'" in worker.log()
        worker.stop()
    with private_redis(tmp_path / "durable", "--appendonly", "yes") as (url, _):
        worker = worker_factory("apps.core_app", queues=[unique_name], concurrency=1, env=core_env(url, unique_name, url))
        assert "taskherd broker check" not in worker.log()
        worker.stop()


def test_a_redis_that_refuses_config_is_warned_about_not_refused(tmp_path, unique_name, worker_factory):
    """Managed Redis services disable CONFIG: the snapshot schedule cannot be read."""
    with private_redis(tmp_path / "managed", "--rename-command", "CONFIG", "") as (url, _):
        worker = worker_factory("apps.core_app", queues=[unique_name], concurrency=1, env=core_env(url, unique_name, url))
        assert "appendonly is off and the snapshot schedule could not be read" in worker.log()
        worker.stop()


@pytest.mark.parametrize("broker_url", ["rabbitmq"], indirect=True)
def test_rabbitmq_states_the_consumer_timeout_it_assumed(broker_url, record_url, unique_name, worker_factory):
    worker = worker_factory("apps.core_app", queues=[unique_name], concurrency=1,
                            env=core_env(broker_url, unique_name, record_url))
    assert "RabbitMQ 3.10.8: its consumer_timeout cannot be read by a client" in worker.log()
    assert "assumes rabbitmq_consumer_timeout=1800s, above time_limit=30s" in worker.log()


@pytest.mark.parametrize("broker_url", ["rabbitmq"], indirect=True)
def test_a_hard_limit_at_or_above_rabbitmqs_consumer_timeout_is_refused(broker_url):
    app = Celery("long", broker=broker_url, set_as_current=False)
    with pytest.raises(ProfileError) as refused:
        configure(app, soft_time_limit=1700, time_limit=1800)
    assert "time_limit=1800 is not below rabbitmq_consumer_timeout=1800.0" in str(refused.value)
    with pytest.raises(ProfileError, match="time_limit=100 is not below rabbitmq_consumer_timeout=60"):
        configure(app, soft_time_limit=50, time_limit=100, rabbitmq_consumer_timeout=60)
    profile = configure(app, soft_time_limit=50, time_limit=100, backoff_cap=120, rabbitmq_consumer_timeout=200,
                        delivery_counter_url="redis://127.0.0.1:1/0")
    assert any("a retry waiting for its countdown" in w for w in profile.worker_warnings)
    configure(app, soft_time_limit=1700, time_limit=1800, rabbitmq_consumer_timeout=None,
              delivery_counter_url="redis://127.0.0.1:1/0")  # consumer_timeout disabled on the broker
    app.close()


def test_the_workers_own_time_limit_and_prefetch_options_are_checked_like_configures(
        broker_url, record_url, unique_name, worker_factory):
    """`celery worker --time-limit … --prefetch-multiplier …` override the profile. A newcomer's
    `--time-limit 600` on Redis (visibility timeout 74 s) started without a word; now the worker
    refuses what configure() would have refused, and only warns on RabbitMQ about the prefetch."""
    from taskherd.worker.components.broker_check import worker_option_findings

    env = core_env(broker_url, unique_name, record_url, soft_time_limit=8, time_limit=10,
                   visibility_timeout=30)
    refused = "--time-limit=600.0, not below " + ("visibility_timeout=30.0" if broker_url.startswith("redis")
                                                   else "rabbitmq_consumer_timeout=1800.0")
    options = ["--time-limit", "600" if broker_url.startswith("redis") else "1800", "--prefetch-multiplier", "4"]
    if broker_url.startswith("amqp"):
        refused = refused.replace("600.0", "1800.0")
    with pytest.raises(AssertionError, match=r"worker exited \(1\)") as exited:
        worker_factory("apps.core_app", queues=[unique_name], concurrency=1, env=env, extra_args=options)
    said = str(exited.value)
    assert refused in said, said[-3000:]
    refusal = next(line for line in said.splitlines() if "refuses to start" in line)
    assert ("--prefetch-multiplier=4" in refusal) == broker_url.startswith("redis"), "an error on Redis only"
    assert "--prefetch-multiplier=4" in said, "a warning on RabbitMQ"

    # A soft limit not below the hard one (the profile's 10 s), from the command line.
    with pytest.raises(AssertionError, match=r"worker exited \(1\)") as exited:
        worker_factory("apps.core_app", queues=[unique_name], concurrency=1, env=env,
                       extra_args=["--soft-time-limit", "12"])
    assert "soft time limit of 12.0 s, not below its hard time limit of 10.0 s" in str(exited.value)

    # Options equal to the profile's (the chart passes --time-limit too) start as before.
    worker = worker_factory("apps.core_app", queues=[unique_name], concurrency=1, env=env,
                            extra_args=["--time-limit", "10", "--soft-time-limit", "8"])
    assert "refuses to start" not in worker.log()
    amqp = configure(Celery("options", broker=broker_url), queues=[unique_name], rabbitmq_consumer_timeout=None) \
        if broker_url.startswith("amqp") else None
    if amqp is not None:
        found = worker_option_findings(time_limit=0, prefetch_multiplier=2, profile=amqp)
        assert found.errors == [] and "--prefetch-multiplier=2" in found.warnings[0], \
            "no consumer timeout on the broker: no hard limit is fine; the prefetch is a warning"


def test_a_broker_url_set_after_configure_is_refused_at_worker_start(broker_url, record_url, unique_name,
                                                                     worker_factory):
    """configure() reads the URL once: set later, the worker consumed from one broker and sent its
    dead letters to Celery's default amqp://localhost (found by a newcomer: no error, a poison task
    cycling for ever)."""
    env = {**core_env(broker_url, unique_name, record_url), "TEST_BROKER_URL": "", "TEST_LATE_BROKER_URL": broker_url}
    with pytest.raises(AssertionError, match=r"worker exited \(1\)") as exited:
        worker_factory("apps.core_app", queues=[unique_name], concurrency=1, env=env)
    said = str(exited.value)
    assert "configure(app) ran when the broker URL was none, but this worker connects to" in said, said[-3000:]
    assert "call configure(app) after the broker URL is set" in said


def test_the_broker_url_findings():
    from taskherd.worker.components.broker_check import broker_url_findings

    url = "amqp://user:secret@rabbit:5672/shop"
    assert broker_url_findings(configured=url, connecting=url).errors == []
    [unset] = broker_url_findings(configured="", connecting=None).errors
    assert unset.startswith("no broker URL is set (Celery would connect to its default")
    [moved] = broker_url_findings(configured=url, connecting="redis://:pw@cache:6379/0").errors
    assert "was 'amqp://user:***@rabbit:5672/shop', but this worker connects to 'redis://:***@cache:6379/0'" in moved
    assert "secret" not in moved and "pw@" not in moved


@pytest.mark.parametrize("soft,hard,refused", [(8, 10, False), (10, 10, True), (40, 30, True), (None, 30, False)])
def test_a_soft_time_limit_not_below_the_hard_one_is_refused(soft, hard, refused):
    """`--soft-time-limit 40` with a hard limit of 30 started without a word: the task is killed
    before its soft limit could ask it to stop (configure() refuses the same of its settings)."""
    from taskherd.worker.components.broker_check import worker_option_findings

    profile = configure(Celery("soft", broker="redis://127.0.0.1:1/0"), soft_time_limit=8, time_limit=30)
    errors = worker_option_findings(time_limit=hard, soft_time_limit=soft, prefetch_multiplier=1,
                                    profile=profile).errors
    assert bool(errors) == refused, errors
    if refused:
        assert f"soft time limit of {soft!r} s, not below its hard time limit of {hard!r} s" in errors[0]
        assert f"(valid: 0 < --soft-time-limit < {hard!r})" in errors[0]


@pytest.mark.parametrize("broker_url", ["redis"], indirect=True)
def test_a_consumed_queue_the_profile_does_not_list_is_refused(broker_url, record_url, unique_name, worker_factory):
    """`configure(queues=["main"])` and a worker run with `-Q main,extra`: 'extra' had no DLQ of its
    own, and a task failing there was dead-lettered into main's DLQ as if it came from 'main' (a
    redrive sent it there)."""
    env = core_env(broker_url, unique_name, record_url)
    with pytest.raises(AssertionError, match=r"worker exited \(1\)") as exited:
        worker_factory("apps.core_app", queues=[unique_name, f"{unique_name}-extra"], concurrency=1, env=env)
    assert (f"the worker consumes ['{unique_name}-extra'] (its -Q/--queues, or app.conf.task_queues without -Q), not "
            f"in configure(queues=['{unique_name}']): such a queue has no dead-letter queue of its own") in str(exited.value)
