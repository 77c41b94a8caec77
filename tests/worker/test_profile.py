"""configure(): the settings it applies, and every invalid combination refused with a clear message."""
import os
import warnings

import pytest
from celery import Celery

from taskherd.worker import ProfileError, Task, configure
from taskherd.worker.profile import ProfileWarning, derived_visibility_timeout

REDIS = "redis://127.0.0.1:6390/1"
AMQP = "amqp://guest:guest@127.0.0.1:5682//"


def app_on(broker: str = REDIS, **conf) -> Celery:
    app = Celery("profile-test", broker=broker, set_as_current=False)
    app.conf.update(**conf)
    return app


def test_the_profile_applies_every_setting():
    app = app_on()
    profile = configure(app, soft_time_limit=50, time_limit=60, max_tasks_per_child=100,
                        max_memory_per_child_kb=200_000, broker_heartbeat=10, backoff_cap=30,
                        queues=["orders"])
    c = app.conf
    assert (c.task_acks_late, c.task_reject_on_worker_lost, c.task_acks_on_failure_or_timeout) == (True, True, True)
    assert c.worker_prefetch_multiplier == 1
    assert (c.task_soft_time_limit, c.task_time_limit) == (50, 60)
    assert (c.worker_max_tasks_per_child, c.worker_max_memory_per_child) == (100, 200_000)
    assert c.accept_content == ["json"] and c.result_accept_content == ["json"]
    assert c.task_serializer == c.result_serializer == c.event_serializer == "json"
    assert c.broker_heartbeat == 10
    assert c.worker_cancel_long_running_tasks_on_connection_loss is True
    # A broker outage must not make every worker exit (and be restarted) after 100 attempts.
    assert c.broker_connection_retry is True and c.broker_connection_max_retries is None
    # Redis: outlives the longest run plus the longest retry countdown, with a margin.
    assert c.broker_transport_options["visibility_timeout"] == profile.visibility_timeout
    assert profile.visibility_timeout == derived_visibility_timeout(time_limit=60, backoff_cap=30) >= 60 + 30 + 60
    (queue,) = c.task_queues
    assert queue.name == "orders" and queue.queue_arguments == {
        "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "orders.dlq"}
    assert c.task_default_queue == "orders"
    assert profile.dead_letter_queue_for("orders") == "orders.dlq"
    assert profile.delivery_counter_url == REDIS


def test_quorum_queues_get_a_delivery_limit_backstop():
    app = app_on(AMQP)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ProfileWarning)
        profile = configure(app, queue_type="quorum", max_deliveries=3, queues=["q"])
    (queue,) = app.conf.task_queues
    assert queue.queue_arguments["x-queue-type"] == "quorum"
    assert queue.queue_arguments["x-delivery-limit"] == 3
    assert profile.visibility_timeout is None  # RabbitMQ has none
    assert "visibility_timeout" not in app.conf.broker_transport_options
    # Every publish (a retry, a task sent by a task) is confirmed before the original is acknowledged.
    assert app.conf.broker_transport_options["confirm_publish"] is True


def test_user_transport_options_are_kept():
    app = app_on(broker_transport_options={"global_keyprefix": "p:"})
    configure(app, visibility_timeout=1000)
    assert app.conf.broker_transport_options == {"global_keyprefix": "p:", "visibility_timeout": 1000,
                                                 "socket_connect_timeout": 5.0, "unacked_mutex_expire": 10}
    own = app_on(broker_transport_options={"socket_connect_timeout": 30, "unacked_mutex_expire": 60})
    configure(own)
    assert own.conf.broker_transport_options["socket_connect_timeout"] == 30
    assert own.conf.broker_transport_options["unacked_mutex_expire"] == 60


def test_plain_app_task_gets_the_taskherd_task_class():
    app = app_on()

    @app.task(name="plain")
    def plain():
        return 1

    configure(app)

    @app.task(name="later")
    def later():
        return 2

    assert isinstance(app.tasks["plain"], Task) and isinstance(app.tasks["later"], Task)


def _error(**kwargs) -> str:
    broker = kwargs.pop("broker", REDIS)
    conf = kwargs.pop("conf", {})
    with pytest.raises(ProfileError) as caught:
        configure(app_on(broker, **conf), **kwargs)
    return str(caught.value)


def test_soft_limit_not_below_hard_limit():
    message = _error(soft_time_limit=60, time_limit=60)
    assert "soft_time_limit=60 must be less than time_limit=60" in message
    assert "valid: 0 < soft_time_limit < 60" in message


def test_visibility_timeout_not_above_hard_limit():
    message = _error(soft_time_limit=50, time_limit=60, visibility_timeout=60)
    assert "visibility_timeout=60 must be greater than time_limit=60" in message
    assert "valid: > 60" in message and "Redis redelivers a task that is still running" in message


def test_pickle_accepted_is_refused():
    message = _error(accept_content=["json", "pickle"])
    assert "accept_content=['json', 'pickle'] accepts non-JSON content ['pickle']" in message
    assert "valid: ['json']" in message
    message = _error(conf={"accept_content": ["application/x-python-serialize"]})
    assert "accept_content=['application/x-python-serialize'] is not JSON (valid: 'json')" in message
    message = _error(conf={"task_serializer": "pickle"})
    assert "task_serializer='pickle' is not JSON" in message
    message = _error(conf={"result_serializer": "yaml"})
    assert "result_serializer='yaml' is not JSON" in message


def test_prefetch_above_one_is_an_error_on_redis():
    message = _error(prefetch_multiplier=4)
    assert "prefetch_multiplier=4 with late acks" in message
    assert "Redis redelivers them after visibility_timeout" in message and "valid: 1" in message
    assert "prefetch_multiplier=0 must be an integer >= 1" in _error(prefetch_multiplier=0)


def configure_silently(app: Celery, **settings):
    """configure() itself warns nothing (producers call it too): a warning here fails the test."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", ProfileWarning)
        return configure(app, **settings)


def test_prefetch_above_one_is_a_warning_on_rabbitmq_for_its_workers():
    app = app_on(AMQP)
    profile = configure_silently(app, prefetch_multiplier=4, delivery_counter_url=REDIS)
    assert profile.prefetch_multiplier == 4 and app.conf.worker_prefetch_multiplier == 4
    assert any("prefetch_multiplier=4 with late acks" in w for w in profile.worker_warnings)


def test_rabbitmq_needs_no_redis_the_broker_counts_deliveries():
    profile = configure_silently(app_on(AMQP))
    assert profile.delivery_counter_url is None
    assert not any("delivery_counter_url" in w for w in profile.worker_warnings)


def test_every_problem_is_reported_at_once():
    with pytest.raises(ProfileError) as caught:
        configure(app_on(), soft_time_limit=0, time_limit=-1, max_retries=-1, backoff_base=0,
                  max_deliveries=0, queue_type="stream", dead_letter_queue="dlq", broker_heartbeat=-5,
                  max_tasks_per_child=0)
    problems = caught.value.problems
    expected = ["time_limit=-1 must be > 0", "soft_time_limit=0 must be > 0", "max_retries=-1",
                "backoff_base=0 must be > 0", "max_deliveries=0", "queue_type='stream' must be one of",
                "dead_letter_queue='dlq' must contain '{queue}'", "broker_heartbeat=-5",
                "max_tasks_per_child=0"]
    for fragment in expected:
        assert any(fragment in p for p in problems), (fragment, problems)
    assert _error(backoff_base=10, backoff_cap=5).count("backoff_cap=5 must be >= backoff_base=10") == 1


def test_queues_the_app_already_declares_keep_their_routing():
    from kombu import Exchange, Queue

    app = app_on(task_queues=[Queue("orders", Exchange("shop", type="topic"), routing_key="orders.#"),
                              Queue("reports")], task_default_queue="orders")
    configure(app, queues=["orders"])
    orders, reports = app.conf.task_queues
    assert (orders.exchange.name, orders.routing_key) == ("shop", "orders.#")
    assert orders.queue_arguments["x-dead-letter-routing-key"] == "orders.dlq"
    assert reports.name == "reports" and not reports.queue_arguments
    assert app.conf.task_default_queue == "orders"


def test_the_source_queue_is_found_from_the_delivery_info():
    from kombu import Exchange, Queue
    from taskherd.worker.task import queue_of

    app = app_on(task_queues=[Queue("orders", Exchange("shop", type="topic"), routing_key="orders.#"),
                              Queue("mail")])
    profile = configure(app, queues=["orders", "mail"])
    assert queue_of(app, profile, {"exchange": "", "routing_key": "mail"}) == "mail"
    assert queue_of(app, profile, {"exchange": "shop", "routing_key": "orders.eu"}) == "orders"
    assert queue_of(app, profile, {}) == "orders"


#: (setting, value, what the error says): values of the wrong type or not finite, each refused by
#: its own name with the valid range (a str for a float was a TypeError traceback; True, inf, nan
#: and a bare str for a list were accepted and broke the worker later).
WRONG_ALONE = [
    ("time_limit", "300", "time_limit='300' must be > 0 seconds (valid: a finite int or float); got a str"),
    ("soft_time_limit", True, "soft_time_limit=True must be > 0 seconds (valid: a finite int or float); got a bool"),
    ("time_limit", float("inf"), "time_limit=inf must be > 0 seconds (valid: a finite int or float)"),
    ("time_limit", 1e309, "time_limit=inf must be > 0 seconds"),
    ("time_limit", -0.0, "time_limit=-0.0 must be > 0 seconds"),
    ("visibility_timeout", float("nan"), "visibility_timeout=nan must be > 0 seconds"),
    ("broker_heartbeat", "30", "broker_heartbeat='30' must be >= 0 seconds (0 disables it"),
    ("backoff_cap", float("inf"), "backoff_cap=inf must be > 0 seconds"),
    ("max_retries", True, "max_retries=True must be an integer >= 0 (not a bool); got a bool"),
    ("max_deliveries", 2.0, "max_deliveries=2.0 must be an integer >= 1"),
    ("prefetch_multiplier", True, "prefetch_multiplier=True must be an integer >= 1"),
    ("max_tasks_per_child", True, "max_tasks_per_child=True must be None (no limit) or an integer >= 1"),
    ("queues", "orders", "queues='orders' must be a list of queue names, e.g. ['orders'], or None"),
    ("queues", ["orders", ""], "queues=['orders', ''] must be a list of queue names"),
    ("queues", ["orders", "orders"], "queues=['orders', 'orders'] names 'orders' more than once"),
    ("dead_letter_queue", "{queue}.{dlq}", "dead_letter_queue='{queue}.{dlq}' is not a valid pattern"),
    ("accept_content", "json", "accept_content='json' must be a list of content types (valid: ['json'])"),
    ("delivery_counter_url", "redis://:99999", "delivery_counter_url='redis://:99999' must be a redis:// URL "
                                               "with a port in 1..65535"),
    ("transient_errors", [ValueError()], "transient_errors=[ValueError()] must be a list of exception classes"),
]


@pytest.mark.parametrize("setting,value,says", WRONG_ALONE, ids=[f"{s}={v!r}" for s, v, _ in WRONG_ALONE])
def test_a_value_of_the_wrong_type_or_not_finite_is_refused_by_name(setting, value, says):
    message = _error(**{setting: value})
    assert says in message
    assert message.count(f"{setting}=") == 1, "reported once, not again by each rule that combines it"


def test_rabbitmq_consumer_timeout_that_is_not_a_finite_number_is_refused():
    for value in (True, float("inf"), "1800"):
        assert f"rabbitmq_consumer_timeout={value!r} must be a number of seconds > 0, or None" in _error(
            broker=AMQP, rabbitmq_consumer_timeout=value)


@pytest.mark.parametrize("broker", ["redis", "rabbitmq"])
def test_per_call_limits_the_worker_could_not_honour_are_refused_at_publish_on_both_brokers(broker):
    """`apply_async(soft_time_limit=50)` under a 30 s hard limit was published and ran (killed
    before it was asked to stop); `time_limit='x'` was published and dead-lettered by the worker."""
    url = os.environ["TASKHERD_REDIS_URL" if broker == "redis" else "TASKHERD_AMQP_URL"]
    app = Celery("producer", broker=url, set_as_current=False)
    configure(app, queues=["limits"], soft_time_limit=20, time_limit=30)

    @app.task(name="limits.own_hard", time_limit=25)
    def own_hard():
        pass

    cases = [
        (dict(soft_time_limit=50), "task 'limits.remote': soft_time_limit=50 is not below its hard time limit 30 "
                                   "(valid: 0 < soft_time_limit < 30)"),
        (dict(time_limit=40, soft_time_limit=40), "soft_time_limit=40 is not below its hard time limit 40"),
        (dict(time_limit="x"), "task 'limits.remote': time_limit='x' is not a number of seconds (valid: a number > 0"),
        (dict(soft_time_limit=-1), "soft_time_limit=-1 is not a number of seconds"),
        # a run longer than the broker lets a delivery go unacknowledged: delivered again while it runs
        (dict(time_limit=3600), "task 'limits.remote': time_limit=3600 is not below rabbitmq_consumer_timeout=1800.0"
                                if broker == "rabbitmq" else
                                "task 'limits.remote': time_limit=3600 is not below visibility_timeout="),
    ]
    for options, says in cases:
        with pytest.raises(ProfileError) as refused:
            app.send_task("limits.remote", queue="limits", **options)
        assert says in str(refused.value), (options, str(refused.value))
    with pytest.raises(ProfileError, match="soft_time_limit=26 is not below its hard time limit 25"):
        own_hard.apply_async(soft_time_limit=26)  # the task's own hard limit
    app.close()


def test_a_wait_longer_than_rabbitmq_lets_a_worker_hold_the_message_is_refused_at_publish():
    """A worker takes an ETA message at once and holds it unacknowledged until it has run; RabbitMQ
    closes the channel of a delivery held longer than consumer_timeout and delivers every task of
    that channel again, running ones included: `apply_async(countdown=7200)` was published silently."""
    import datetime as dt

    from taskherd.worker.profile import wait_problem

    app = Celery("producer", broker=os.environ["TASKHERD_AMQP_URL"], set_as_current=False)
    configure(app, queues=["limits"], soft_time_limit=20, time_limit=30)
    with pytest.raises(ProfileError, match=r"task 'limits.remote': countdown=7200 waits 7200 s, not below "
                                           r"rabbitmq_consumer_timeout - time_limit = 1800 - 30 = 1770 s: .* "
                                           r"\(valid: a wait under 1770 s"):
        app.send_task("limits.remote", queue="limits", countdown=7200)
    in_two_hours = dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=2)
    with pytest.raises(ProfileError, match=r"eta=.* waits 7200 s"):
        app.send_task("limits.remote", queue="limits", eta=in_two_hours)
    app.close()
    assert wait_problem("t", 1769, None, consumer_timeout=1800, time_limit=30) is None
    assert wait_problem("t", None, dt.datetime.now(dt.timezone.utc), consumer_timeout=1800, time_limit=30) is None
