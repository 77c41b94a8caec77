"""On Redis nothing is held unacknowledged longer than the visibility timeout allows: ETA/countdown
messages wait in the delay set, and a time limit at or above the visibility timeout is refused —
per call at publish, per task at worker start."""
import time

import pytest
import redis
from celery import Celery

from taskherd.worker import ProfileError, configure

from e2e.lib.waiting import wait_for
from worker_support import core_env

pytestmark = pytest.mark.parametrize("broker_url", ["redis"], indirect=True)


def test_countdown_tasks_wait_in_the_delay_set_and_run_once_each(broker_url, record_url, recorded, producer,
                                                                 unique_name, worker_factory):
    """Six 3 s tasks with countdown=2 on two workers, visibility timeout 8 s: held in one worker's
    memory they would be unacked for up to 2 + 18 s and kombu's sweep would hand them out again."""
    delayed_key = "taskherd.delayed"  # taskherd.worker.delayed.DELAYED_KEY
    client = redis.Redis.from_url(broker_url)
    env = core_env(broker_url, unique_name, record_url, soft_time_limit=5, time_limit=6, visibility_timeout=8,
                   backoff_cap=1, restore_sweep=1)
    for _ in range(2):
        worker_factory("apps.core_app", queues=[unique_name], env=env, concurrency=1)
    for i in range(6):
        producer.send_task("core.slow", args=(f"eta-{i}", 3), countdown=2, queue=unique_name)
    time.sleep(1)
    waiting = {"delay set": client.zcard(delayed_key), "unacked": client.hlen("unacked")}

    wait_for("all six tasks", lambda: all(recorded(f"eta-{i}:done") for i in range(6)), timeout=60)
    time.sleep(8 + 3)  # past the visibility timeout: a message restored by the sweep would run again by now
    starts = {i: len(recorded(f"eta-{i}:start")) for i in range(6)}
    assert starts == {i: 1 for i in range(6)}, f"runs per task: {starts}"
    assert waiting == {"delay set": 6, "unacked": 0}, "they waited in the delay set, held by no worker"
    assert client.zcard(delayed_key) == 0 and client.hlen("unacked") == 0 and client.llen(unique_name) == 0


def test_a_per_call_time_limit_at_or_above_the_visibility_timeout_is_refused_at_publish(broker_url):
    app = Celery("producer", broker=broker_url, set_as_current=False)
    configure(app, queues=["limits"], soft_time_limit=50, time_limit=60, visibility_timeout=100)

    @app.task(name="limits.own", time_limit=150)
    def own():
        pass

    with pytest.raises(ProfileError) as refused:
        app.send_task("limits.remote", time_limit=120, queue="limits")
    assert ("task 'limits.remote': time_limit=120 is not below visibility_timeout=100:" in str(refused.value)
            and "valid: time_limit < 100;" in str(refused.value))
    with pytest.raises(ProfileError, match="task 'limits.own': time_limit=150 is not below"):
        own.delay()
    with pytest.raises(ProfileError, match="time_limit=100 is not below"):
        own.apply_async(time_limit=100)
    with app.connection_for_write() as connection:
        connection.default_channel.client.delete("limits")
        own.apply_async(time_limit=90, soft_time_limit=80)  # below: published
        assert connection.default_channel.client.llen("limits") == 1
        connection.default_channel.client.delete("limits")
    app.close()


def test_a_task_whose_own_time_limit_reaches_the_visibility_timeout_stops_the_worker(
        broker_url, record_url, unique_name, worker_factory):
    env = core_env(broker_url, unique_name, record_url, soft_time_limit=20, time_limit=30, visibility_timeout=60,
                   task_time_limit=90)
    with pytest.raises(AssertionError, match=r"worker exited \(1\)") as exited:
        worker_factory("apps.core_app", queues=[unique_name], env=env, concurrency=1)
    assert ("task 'core.own_time_limit': time_limit=90.0 is not below visibility_timeout=60.0"
            in str(exited.value)), str(exited.value)[-3000:]

