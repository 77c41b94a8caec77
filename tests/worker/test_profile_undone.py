"""Settings changed after configure() took the profile back without a word. A newcomer's
``app.conf.task_acks_late = False`` below configure(): a task whose pool child was SIGKILLed was
acknowledged and never ran again, while the log said its message went back to the queue. Now the
worker refuses to start, naming each setting as the user wrote it, what configure() set and why."""

import re

import celery
import pytest
from celery import Celery

from taskherd.worker import Task, configure
from taskherd.worker.components.broker_check import worker_option_findings
from taskherd.worker.profile_undone import undone_problem

from worker_support import core_env


def _undone(app):
    profile = app.taskherd_profile
    return undone_problem(app.conf, app.tasks, visibility_timeout=profile.visibility_timeout,
                          confirm_publish=profile.broker_is_amqp) or ""


def _refusal(worker_factory, broker_url, queue, undo, **kwargs) -> str:
    env = {**core_env(broker_url, queue, ""), "TEST_UNDO": undo}
    with pytest.raises(AssertionError, match=r"worker exited \(1\)") as exited:
        worker_factory("apps.undone_app", queues=[queue], concurrency=1, env=env, **kwargs)
    said = str(exited.value)
    return next((line for line in said.splitlines() if "Unrecoverable error: UnsafeBroker" in line), said[-3000:])


def test_acks_late_taken_back_by_the_app_or_a_task_is_refused_at_worker_start(broker_url, unique_name,
                                                                              worker_factory):
    refusal = _refusal(worker_factory, broker_url, unique_name, "acks_late")
    assert "settings changed after configure(app) take back what it set: app.conf.task_acks_late=False " \
           "(configure() set True: a task is acknowledged when it starts, so one whose worker process dies " \
           "(SIGKILL, OOM) is lost; tasks with acks_late=False: 'shop.sleep'" in refusal, refusal
    assert "fix: set app.conf settings before configure(app)" in refusal

    refusal = _refusal(worker_factory, broker_url, unique_name, "task_acks_late")
    assert "task 'shop.charge' acks_late=False (a task is acknowledged when it starts" in refusal, refusal
    assert "'shop.sleep'" not in refusal, "only the task that says so is named"
    assert "fix: drop the option from @app.task(...)" in refusal


def test_transport_options_replaced_after_configure_are_refused(broker_url, unique_name, worker_factory):
    refusal = _refusal(worker_factory, broker_url, unique_name, "transport_options")
    if broker_url.startswith("redis"):
        assert "broker_transport_options['visibility_timeout'] missing, so kombu's 3600 s applies " \
               "(configure() set 190.0:" in refusal, refusal
        assert "confirm_publish" not in refusal
    else:
        assert "broker_transport_options['confirm_publish'] missing (configure() set True: a retry" in refusal, refusal
        assert "visibility_timeout" not in refusal
    assert "fix: set broker_transport_options before configure(app), which adds its options to yours" in refusal


def test_a_prefetch_set_after_configure_is_named_as_written_not_as_a_flag(redis_url, unique_name, worker_factory):
    refusal = _refusal(worker_factory, redis_url, unique_name, "prefetch")
    assert "the worker runs with app.conf.worker_prefetch_multiplier=8, changed after configure(app), which " \
           "set 1: with late acks prefetched messages sit unacked" in refusal, refusal
    assert "--prefetch-multiplier" not in refusal
    # The flag, when it is the flag: named as such.
    refusal = _refusal(worker_factory, redis_url, unique_name, "", extra_args=["--prefetch-multiplier", "3"])
    assert "the worker runs with --prefetch-multiplier=3: with late acks" in refusal, refusal
    assert "(leave the option out: configure() set 1)" in refusal


def test_config_from_object_after_configure_gets_only_true_messages(redis_url, unique_name, worker_factory):
    """configure() before any broker URL, then config_from_object() on Redis: the broker URL refusal
    was joined by `--time-limit 0 … rabbitmq_consumer_timeout=1800.0` — no flag given, no RabbitMQ."""
    refusal = _refusal(worker_factory, redis_url, unique_name, "config_from_object")
    assert "configure(app) ran when the broker URL was none, but this worker connects to 'redis://" in refusal
    assert "rabbitmq" not in refusal.lower() and "--time-limit" not in refusal, refusal
    assert "the worker runs with no hard time limit (app.conf.task_time_limit=None, changed after configure(app), " \
           "which set 10)" in refusal
    assert "app.conf.task_acks_late=False" in refusal and "app.conf.task_reject_on_worker_lost=None" in refusal


def test_the_untouched_app_starts(broker_url, unique_name, worker_factory):
    worker = worker_factory("apps.undone_app", queues=[unique_name], concurrency=1,
                            env=core_env(broker_url, unique_name, ""))
    assert "refuses to start" not in worker.log()
    assert "take back what it set" not in worker.log()


def test_tasks_created_before_and_after_configure_are_judged_as_celery_resolved_them():
    """Celery copies app.conf into a task class when it creates it (at finalize for @app.task)."""
    # Defined before configure(), created lazily after the change: it took the change, named with it.
    app = Celery("lazy", broker="redis://127.0.0.1:1/0", set_as_current=False)

    @app.task(name="undone.lazy")
    def _lazy():
        pass

    configure(app, queues=["q"])
    app.conf.task_acks_late = False  # before anything finalizes the app
    said = _undone(app)
    assert "app.conf.task_acks_late=False (configure() set True" in said, said
    assert re.search(r"tasks with acks_late=False: [^)]*'undone.lazy'", said), "other tests' shared tasks join the list"
    assert "task 'undone.lazy'" not in said, "named once, with the setting it came from"

    # Created before configure() (the app finalized early): Celery's defaults, though app.conf is right now.
    app = Celery("early", broker="redis://127.0.0.1:1/0", set_as_current=False)

    @app.task(name="undone.early")
    def _early():
        pass

    app.finalize()
    configure(app, queues=["q"])

    @app.task(name="undone.after", acks_late=True)
    def _after():
        pass

    @app.task(name="undone.charge", reject_on_worker_lost=False, acks_on_failure_or_timeout=False)
    def _charge():
        pass

    said = _undone(app)
    assert "app.conf" not in said
    assert "task 'undone.early' acks_late=False (" in said and "task 'undone.early' reject_on_worker_lost=None (" in said
    assert "task 'undone.charge' reject_on_worker_lost=False (" in said
    assert "task 'undone.charge' acks_on_failure_or_timeout=False (a task killed at its hard time limit" in said
    assert "acks_on_failure=False" not in said, "derived by Celery from acks_on_failure_or_timeout: named once"
    assert "undone.after" not in said
    assert "a task created before configure(app) took the app's settings of then: create it after" in said


def test_every_setting_configure_relies_on_is_compared():
    app = Celery("all", broker="amqp://guest@127.0.0.1:1//", set_as_current=False)
    configure(app, queues=["q"], delivery_counter_url="redis://127.0.0.1:1/0")
    app.conf.update(task_reject_on_worker_lost=False, task_acks_on_timeout=False, accept_content=["json", "pickle"],
                    worker_cancel_long_running_tasks_on_connection_loss=False,
                    broker_transport_options={"confirm_publish": False})
    said = _undone(app)
    for named in ("app.conf.task_reject_on_worker_lost=False (configure() set True",
                  "app.conf.task_acks_on_timeout=False (configure() leaves it unset",
                  "app.conf.accept_content=['json', 'pickle'] (configure() set JSON only",
                  "app.conf.worker_cancel_long_running_tasks_on_connection_loss=False (configure() set True",
                  "broker_transport_options['confirm_publish']=False (configure() set True"):
        assert named in said, (named, said)
    assert said.count("take back what it set") == 1, "one message"


def test_worker_options_are_named_where_they_came_from():
    profile = configure(Celery("where", broker="redis://127.0.0.1:1/0", set_as_current=False),
                        soft_time_limit=8, time_limit=30)
    [from_conf] = worker_option_findings(time_limit=30, prefetch_multiplier=8, profile=profile, given={}).errors
    assert "app.conf.worker_prefetch_multiplier=8, changed after configure(app), which set 1" in from_conf
    [from_flag] = worker_option_findings(time_limit=30, prefetch_multiplier=8, profile=profile,
                                         given={"prefetch_multiplier": "--prefetch-multiplier"}).errors
    assert "the worker runs with --prefetch-multiplier=8:" in from_flag
    [from_env] = worker_option_findings(time_limit=900, prefetch_multiplier=1, profile=profile,
                                        given={"time_limit": "CELERY_WORKER_TIME_LIMIT"}).errors
    assert from_env.startswith("the worker runs with CELERY_WORKER_TIME_LIMIT=900, not below visibility_timeout=")
    [soft] = worker_option_findings(time_limit=30, soft_time_limit=40, prefetch_multiplier=1, profile=profile,
                                    given={"soft_time_limit": "--soft-time-limit"}).errors
    assert "(--soft-time-limit=40; configure()'s time_limit=30)" in soft
    assert worker_option_findings(time_limit=None, prefetch_multiplier=4, profile=profile, given={},
                                  judge_broker=False).errors == [
        "the worker runs with no hard time limit (app.conf.task_time_limit=None, changed after configure(app), which "
        "set 30): a task running longer than the broker's visibility or consumer timeout is delivered a second time "
        "while it still runs (valid: drop the change, or pass time_limit= to configure(), which checks it against "
        "the broker)"], "another broker than configure()'s: no rule that needs its limits"


class MyBase(celery.Task):
    flavour = "mine"

    def on_success(self, retval, task_id, args, kwargs):
        self.succeeded = retval


def test_the_apps_own_task_cls_is_kept_under_taskherds_task():
    """`Celery(task_cls=MyBase)` then configure(): app.Task lost MyBase, its attributes and hooks."""
    for each, task_cls in enumerate((MyBase, f"{__name__}:MyBase")):
        app = Celery("own-task-cls", broker="redis://127.0.0.1:1/0", task_cls=task_cls, set_as_current=False)
        configure(app, queues=["q"])

        @app.task(name=f"undone.add.{each}")
        def _add(x):
            return x

        add = app.tasks[f"undone.add.{each}"]
        assert isinstance(add, Task) and isinstance(add, MyBase), type(add).__mro__
        mro = type(add).__mro__
        assert mro.index(Task) < mro.index(MyBase), "taskherd's __call__ and Request come first"
        assert add.flavour == "mine"
        assert add.apply(args=(3,)).get() == 3 and add.succeeded == 3, "MyBase's on_success runs"
        configure(app, queues=["q"])  # a second time changes nothing
        assert MyBase in app.Task.__mro__ and Task in app.Task.__mro__
        app.close()
