"""The chart <-> worker contract: the pod's TASKHERD_* environment configures the profile."""
import pytest
from celery import Celery

from taskherd.worker import ProfileError, configure
from taskherd.worker.environment import settings_from_env


def test_the_pods_limits_override_the_apps_so_grace_period_and_worker_agree(monkeypatch, redis_url):
    monkeypatch.setenv("TASKHERD_SOFT_TIME_LIMIT", "50")
    monkeypatch.setenv("TASKHERD_TIME_LIMIT", "60")
    monkeypatch.setenv("TASKHERD_MAX_TASKS_PER_CHILD", "0")
    monkeypatch.setenv("TASKHERD_QUEUES", "orders, emails")
    monkeypatch.setenv("TASKHERD_BROKER_URL", redis_url)
    app = Celery("env-test", broker="redis://127.0.0.1:1/0")
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
    with pytest.raises(ProfileError) as error:
        configure(Celery("env-test", broker=redis_url))
    message = str(error.value)
    assert "TASKHERD_TIME_LIMIT='-5' is invalid: expected a number of seconds > 0" in message
    assert "TASKHERD_MAX_MEMORY_PER_CHILD_KB='lots' is invalid: expected a whole number of KiB >= 0" in message


def test_empty_variables_count_as_unset():
    values, problems = settings_from_env({"TASKHERD_TIME_LIMIT": "", "TASKHERD_QUEUES": " "})
    assert values == {} and problems == []


def test_configure_twice_installs_each_runtime_part_once(redis_url):
    from celery import signals

    app = Celery("env-test", broker=redis_url)
    configure(app)
    receivers = {name: len(getattr(signals, name).receivers) for name in
                 ("task_prerun", "task_postrun", "worker_init", "before_task_publish")}
    configure(app)
    assert {name: len(getattr(signals, name).receivers) for name in receivers} == receivers
    assert "taskherd.worker.metrics" in app.taskherd_installed
