"""The pod's environment (taskherd.contract) configures the profile and its components."""
import warnings

import pytest
from celery import Celery

from e2e.lib.waiting import wait_for
from taskherd import contract
from taskherd.worker import ProfileError, ProfileWarning, configure
from taskherd.worker.components import default_components, without
from taskherd.worker.components.heartbeat import Heartbeat
from taskherd.worker.components.metrics import Metrics
from worker_support import dead_letters


def test_the_pods_limits_override_the_apps_so_grace_period_and_worker_agree(monkeypatch, redis_url):
    monkeypatch.setenv("TASKHERD_SOFT_TIME_LIMIT", "50")
    monkeypatch.setenv("TASKHERD_TIME_LIMIT", "60")
    monkeypatch.setenv("TASKHERD_MAX_TASKS_PER_CHILD", "0")
    monkeypatch.setenv("TASKHERD_QUEUES", "orders, emails")
    monkeypatch.setenv("TASKHERD_BROKER_URL", redis_url)
    app = Celery("env-test", broker="redis://127.0.0.1:1/0")
    with pytest.warns(ProfileWarning, match="TASKHERD_TIME_LIMIT='60' overrides time_limit=300"):
        profile = configure(app, soft_time_limit=200, time_limit=300)
    assert (profile.soft_time_limit, profile.time_limit) == (50, 60)
    assert app.conf.task_time_limit == 60 and app.conf.task_soft_time_limit == 50
    assert profile.max_tasks_per_child is None  # 0 means no limit
    assert profile.queues == ("orders", "emails")
    assert app.conf.broker_url == redis_url  # the Secret's URL wins over the code's
    assert profile.visibility_timeout > profile.time_limit


def test_every_bad_variable_is_named_with_its_valid_range(monkeypatch, redis_url):
    monkeypatch.setenv("TASKHERD_TIME_LIMIT", "-5")
    monkeypatch.setenv("TASKHERD_MAX_MEMORY_PER_CHILD_KB", "lots")
    monkeypatch.setenv("TASKHERD_HEARTBEAT_INTERVAL", "0")
    monkeypatch.setenv("TASKHERD_METRICS_PORT", "70000")
    with pytest.raises(ProfileError) as error:
        configure(Celery("env-test", broker=redis_url))
    message = str(error.value)
    assert "TASKHERD_TIME_LIMIT='-5' is invalid: expected a number of seconds > 0" in message
    assert "TASKHERD_MAX_MEMORY_PER_CHILD_KB='lots' is invalid: expected a whole number of KiB >= 0" in message
    assert "TASKHERD_HEARTBEAT_INTERVAL='0' is invalid: expected a number of seconds > 0" in message
    assert "TASKHERD_METRICS_PORT='70000' is invalid: expected a port number 0-65535" in message


def test_empty_variables_count_as_unset():
    values, problems = contract.read(("TASKHERD_TIME_LIMIT", "TASKHERD_QUEUES"),
                                     {"TASKHERD_TIME_LIMIT": "", "TASKHERD_QUEUES": " "})
    assert values == {"TASKHERD_TIME_LIMIT": None, "TASKHERD_QUEUES": None} and problems == []


def test_a_broker_url_of_another_kind_than_the_charts_broker_type_is_refused(monkeypatch, redis_url):
    monkeypatch.setenv("TASKHERD_BROKER_TYPE", "rabbitmq")
    monkeypatch.setenv("TASKHERD_BROKER_URL", redis_url)
    with pytest.raises(ProfileError, match="TASKHERD_BROKER_TYPE='rabbitmq' but the broker URL is 'redis'"):
        configure(Celery("env-test"))


def test_an_unknown_setting_is_named_with_the_valid_ones(redis_url):
    with pytest.raises(ProfileError, match="configure\\(\\) has no setting 'time_limits' \\(valid: soft_time_limit"):
        configure(Celery("env-test", broker=redis_url), time_limits=30)


def test_dead_letter_queues_one_per_queue_and_never_a_work_queue(redis_url):
    app = Celery("env-test", broker=redis_url)
    profile = configure(app, queues=["orders", "mail"], dead_letter_queues=["orders-failed", "mail-failed"])
    assert profile.dead_letter_queue_for("mail") == "mail-failed"
    with pytest.raises(ProfileError) as error:
        configure(Celery("env-test", broker=redis_url), queues=["orders", "mail"], dead_letter_queues=["mail", "x"])
    assert "'mail' is a work queue and the dead-letter queue of 'orders'" in str(error.value)
    with pytest.raises(ProfileError, match="names 1 dead-letter queue\\(s\\) for 2 queue\\(s\\)"):
        configure(Celery("env-test", broker=redis_url), queues=["orders", "mail"], dead_letter_queues=["x"])


def test_components_come_from_the_environment_and_can_be_left_out_or_replaced(monkeypatch, redis_url, tmp_path):
    monkeypatch.setenv("TASKHERD_HEARTBEAT_INTERVAL", "2")
    monkeypatch.setenv("TASKHERD_HEARTBEAT_DIR", str(tmp_path))
    profile = configure(Celery("env-test", broker=redis_url))
    assert profile.component(Heartbeat) == Heartbeat(directory=str(tmp_path), interval=2.0)
    assert profile.component(Metrics).port == contract.WORKER_METRICS_PORT

    app = Celery("env-test", broker=redis_url)
    profile = configure(app, components=[*without(default_components(), Metrics), Metrics(port=9100)])
    assert profile.component(Metrics).port == 9100
    no_metrics = configure(Celery("env-test", broker=redis_url), components=without(default_components(), Metrics))
    assert no_metrics.component(Metrics) is None


def test_a_component_missing_what_it_needs_is_refused(redis_url):
    from taskherd.worker.components.drain import Drain

    with pytest.raises(ProfileError, match="Drain needs Heartbeat before it in the list"):
        configure(Celery("env-test", broker=redis_url), components=[Drain()])
    with pytest.raises(ProfileError, match="Heartbeat\\(interval=-1\\) must be a positive number of seconds"):
        configure(Celery("env-test", broker=redis_url), components=[Heartbeat(interval=-1)])


def test_configure_twice_installs_each_component_once(redis_url):
    from celery import signals

    app = Celery("env-test", broker=redis_url)
    configure(app)
    receivers = {name: len(getattr(signals, name).receivers) for name in
                 ("task_prerun", "task_postrun", "worker_init", "before_task_publish")}
    steps = {name: len(app.steps[name]) for name in ("worker", "consumer")}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # same settings: nothing to warn about
        configure(app)
    assert {name: len(getattr(signals, name).receivers) for name in receivers} == receivers
    assert {name: len(app.steps[name]) for name in ("worker", "consumer")} == steps


def test_the_charts_dead_letter_queues_are_where_the_worker_dead_letters(
        broker_url, record_url, unique_name, worker_factory):
    """A custom `deadLetterQueues` in the chart reaches the worker as TASKHERD_DEAD_LETTER_QUEUES: the
    envelope lands in the queue the operator and the alerts watch, not in `<queue>.dlq`."""
    failed = f"{unique_name}-failed"
    producer = Celery("producer", broker=broker_url, set_as_current=False)
    producer.conf.broker_connection_retry_on_startup = True
    configure(producer, queues=[unique_name], dead_letter_queues=[failed], delivery_counter_url=record_url)
    env = {"TEST_BROKER_URL": broker_url, "TEST_QUEUE": unique_name, "TEST_RECORD_URL": record_url,
           "TEST_COUNTER_URL": record_url, "TASKHERD_DEAD_LETTER_QUEUES": failed}
    worker_factory("apps.core_app", queues=[unique_name], env=env, concurrency=1)
    result = producer.send_task("core.validation", args=("runs", -5), queue=unique_name)
    (letter,) = wait_for(f"the envelope in {failed}", lambda: dead_letters(broker_url, unique_name, dlq=failed),
                         timeout=30)
    assert letter.envelope.task_id == result.id and letter.envelope.reason == "permanent-error"
    assert dead_letters(broker_url, unique_name) == [], f"nothing in {unique_name}.dlq"
    producer.close()


@pytest.mark.parametrize("env,says,named", [
    ({"TASKHERD_SOFT_TIME_LIMIT": "300"}, "soft_time_limit=300.0 must be less than time_limit=300 (valid: 0 < "
                                          "soft_time_limit < 300)", "TASKHERD_SOFT_TIME_LIMIT='300'"),
    ({"TASKHERD_TIME_LIMIT": "200", "TASKHERD_SOFT_TIME_LIMIT": "100", "TASKHERD_VISIBILITY_TIMEOUT": "150"},
     "visibility_timeout=150.0 must be greater than time_limit=200.0",
     "TASKHERD_TIME_LIMIT='200', TASKHERD_VISIBILITY_TIMEOUT='150'"),
    ({"TASKHERD_QUEUES": "orders,orders"}, "queues=['orders', 'orders'] names 'orders' more than once",
     "TASKHERD_QUEUES='orders,orders'"),
    # a component's own rule (FastRecovery), set by its variables
    ({"TASKHERD_RECOVERY_TIMEOUT": "1"}, "FastRecovery(timeout=1.0) must be at least twice heartbeat_interval=1.0",
     "TASKHERD_RECOVERY_TIMEOUT='1'"),
    ({"TASKHERD_RECOVERY_HEARTBEAT_INTERVAL": "10"}, "FastRecovery(timeout=4.0) must be at least twice "
                                                     "heartbeat_interval=10.0", "TASKHERD_RECOVERY_HEARTBEAT_INTERVAL='10'"),
])
def test_a_contradiction_the_environment_made_names_the_variables_as_written(monkeypatch, redis_url, env, says,
                                                                             named):
    """Legal alone, contradictory together: the user wrote TASKHERD_*, so the error says which."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ProfileError) as error:
        configure(Celery("env-test", broker=redis_url))
    assert f"{says}" in str(error.value)
    assert f"[from the environment: {named}]" in str(error.value)


@pytest.mark.parametrize("name,value,says", [
    ("TASKHERD_BROKER_TYPE", "Redis", "TASKHERD_BROKER_TYPE='Redis' is invalid: expected redis or rabbitmq"),
    ("TASKHERD_BROKER_URL", "redis://:hunter2@127.0.0.1:99999/0",
     "TASKHERD_BROKER_URL='redis://:***@127.0.0.1:99999/0' is invalid: Port out of range"),
    ("TASKHERD_DELIVERY_COUNTER_URL", "redis://127.0.0.1:6390/counts", "the Redis database 'counts' is not a number"),
    ("TASKHERD_TIME_LIMIT", "1e309", "TASKHERD_TIME_LIMIT='1e309' is invalid: expected a number of seconds > 0"),
    ("TASKHERD_VISIBILITY_TIMEOUT", "nan", "TASKHERD_VISIBILITY_TIMEOUT='nan' is invalid"),
    ("TASKHERD_MAX_TASKS_PER_CHILD", "true", "TASKHERD_MAX_TASKS_PER_CHILD='true' is invalid: expected a whole number"),
])
def test_a_bad_variable_is_refused_by_name_and_never_printed_with_its_password(monkeypatch, redis_url, name, value,
                                                                               says):
    monkeypatch.setenv(name, value)
    with pytest.raises(ProfileError) as error:  # TASKHERD_BROKER_TYPE='Redis' was a KeyError
        configure(Celery("env-test", broker=redis_url))
    assert says in str(error.value) and "hunter2" not in str(error.value)


@pytest.mark.parametrize("name,value,says", [
    ("TASKHERD_BROKER_URL", "http://example.com", "scheme 'http' is not a broker taskherd runs on (valid: redis, "),
    ("TASKHERD_BROKER_URL", "redis://:hunter2@a:6379/0;ftp://b", "scheme 'ftp' is not a broker taskherd runs on"),
    ("TASKHERD_BROKER_URL", "redis://:hunter2@a:6379/0; redis://b:6379/0", "whitespace in it"),
    ("TASKHERD_BROKER_URL", "amqp://shop:hunter2/a+b==@rabbit:5672/shop",
     "TASKHERD_BROKER_URL='amqp://shop:***@rabbit:5672/shop' is invalid: a '/', '?' or '#' in the user or password"),
    ("TASKHERD_ALERTMANAGER_URL", "ftp://am", "not an http:// or https:// URL with a host"),
    ("TASKHERD_ALERTMANAGER_URL", "http://am:9093/?team=ops", "a base URL has no ?query or #fragment"),
    ("TASKHERD_ALERTMANAGER_URL", "http://am:0", "the port '0' is not a number in range (valid: a port from 1 to 65535)"),
    ("TASKHERD_METRICS_ADDR", "not an address", "expected an IP address or host name to listen on"),
    ("TASKHERD_LEASE_NAME", "Bad_Lease!", "expected a Lease name (a lowercase RFC 1123 subdomain"),
    ("TASKHERD_WATCH_NAMESPACES", "Shop,dev", "expected a comma-separated list of namespaces (lowercase RFC 1123"),
])
def test_a_variable_outside_what_its_reader_can_use_is_refused_when_read(name, value, says):
    """Accepted before, they failed later or never: a worker consuming nothing from an http:// broker,
    the operator paging an ftp:// Alertmanager, a probe server that never listened."""
    from taskherd import contract

    values, problems = contract.read((name,), {name: value})
    assert values == {} and len(problems) == 1 and problems[0].startswith(f"{name}=")
    assert says in problems[0] and "hunter2" not in problems[0], problems[0]


@pytest.mark.parametrize("name,value", [
    ("TASKHERD_BROKER_URL", "amqp://u:p@rabbit:5672//"), ("TASKHERD_BROKER_URL", "sentinel://s1:26379;sentinel://s2"),
    ("TASKHERD_ALERTMANAGER_URL", "https://am.monitoring.svc:9093/prefix"), ("TASKHERD_METRICS_ADDR", "::"),
    ("TASKHERD_METRICS_ADDR", "127.0.0.1"), ("TASKHERD_METRICS_ADDR", "worker-0.local"),
    ("TASKHERD_LEASE_NAME", "th-taskherd-operator"), ("TASKHERD_WATCH_NAMESPACES", "shop, dev-2"),
])
def test_what_a_user_writes_for_those_variables_still_reads(name, value):
    from taskherd import contract

    assert contract.read((name,), {name: value})[1] == []


def test_a_metrics_address_given_in_code_is_checked_too(redis_url):
    from taskherd.worker.components.metrics import Metrics

    with pytest.raises(ProfileError, match=r"Metrics\(address='not an address'\) is not an address to listen on"):
        configure(Celery("addr", broker=redis_url), components=[Metrics(address="not an address")])


def test_a_misspelled_variable_is_warned_about_at_worker_start_with_the_name_it_was_meant_to_be(monkeypatch,
                                                                                               redis_url):
    """TASKHERD_SOFT_TIMELIMIT=9999 changed nothing and said nothing."""
    from taskherd import contract

    environ = {"TASKHERD_SOFT_TIMELIMIT": "9999", "TASKHERD_WATCH_NAMESPACE": "other",
               "TASKHERD_SOFT_TIME_LIMIT": "20", "TASKHERD_HOME": "/tmp", "TASKHERD_SERVICES_DIR": "/x"}
    warnings = contract.misspelled(environ)
    assert [w.split(" is not")[0] for w in warnings] == ["TASKHERD_SOFT_TIMELIMIT", "TASKHERD_WATCH_NAMESPACE"]
    assert "did you mean TASKHERD_SOFT_TIME_LIMIT?" in warnings[0]
    monkeypatch.setenv("TASKHERD_TIMELIMIT", "10")
    profile = configure(Celery("typo", broker=redis_url))
    assert any("TASKHERD_TIMELIMIT is not a taskherd variable and is ignored: did you mean TASKHERD_TIME_LIMIT?" in w
               for w in profile.worker_warnings), profile.worker_warnings


@pytest.mark.parametrize("url,says", [
    # the app reads its own variable (os.environ["BROKER_URL"]) from a Secret made from a file: kombu
    # would take the newline into the vhost (an AMQP access refused, far from the cause)
    ("amqp://shop:hunter2@127.0.0.1:5672/shop\n", "broker_url=amqp://…: it ends with a newline (a Secret made from a file"),
    ("redis://:hunter2@127.0.0.1:6379/0 ", "broker_url=redis://…: whitespace in it (valid: a URL without spaces"),
])
def test_an_apps_own_broker_url_with_whitespace_is_refused_saying_where_it_came_from(url, says):
    with pytest.raises(ProfileError) as error:
        configure(Celery("env-test", broker=url))
    assert says in str(error.value) and "hunter2" not in str(error.value)
