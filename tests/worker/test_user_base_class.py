"""A task with a base class of the app's own — ``@app.task(base=DatabaseTask)`` where
``DatabaseTask(celery.Task)``, as Celery's guide writes it — keeps taskherd's promises. Celery makes
that class the task's only base: before, such a task failed once on a transient error and was acked
(gone), never reached the DLQ on a permanent one, and a message killing its worker looped for ever.
Found by a newcomer's app written from the docs."""

import celery
from celery import Celery, shared_task
from celery.utils.imports import symbol_by_name
from celery.worker.request import Request

from e2e.lib.waiting import wait_for
from taskherd.worker import Task, configure
from taskherd.worker.components.task_class import tasks_without
from worker_support import core_env, dead_letters


class DatabaseTask(celery.Task):
    def __call__(self, *args, **kwargs):
        self.calls = getattr(self, "calls", 0) + 1
        return super().__call__(*args, **kwargs)


class AlreadyTaskherd(Task):
    pass


def test_a_base_class_of_the_apps_own_gets_taskherds_task_first(redis_url):
    app = Celery("user-base", broker=redis_url, set_as_current=False)
    configure(app, queues=["user-base"])

    @app.task(bind=True, base=DatabaseTask, name="user.charge")
    def _charge(self, order_id):
        return order_id

    @app.task(base=DatabaseTask, name="user.refund")
    def _refund(order_id):
        return order_id

    @app.task(base=AlreadyTaskherd, name="user.ship")
    def _ship(order_id):
        return order_id

    @shared_task(base=DatabaseTask, name="user.shared")
    def _shared(order_id):
        return order_id

    class ByClass(celery.Task):
        name = "user.by_class"

        def run(self):
            return None

    app.register_task(ByClass())
    charge, refund, ship, shared = (app.tasks[f"user.{name}"] for name in ("charge", "refund", "ship", "shared"))
    for task in (charge, refund, shared):
        assert isinstance(task, Task) and isinstance(task, DatabaseTask), type(task).__mro__
        mro = type(task).__mro__
        assert mro.index(Task) < mro.index(DatabaseTask), "taskherd's __call__ and Request come first"
        assert type(task).Request == Task.Request
    assert type(charge).__mro__[1] is type(refund).__mro__[1], "one combined class per base"
    assert type(ship).__mro__[1] is AlreadyTaskherd, "a taskherd subclass is used as it is"
    assert charge.apply(args=("o1",)).get() == "o1" and charge.calls == 1, "the base's __call__ still runs"
    assert tasks_without(app, Task) == ["user.by_class"], "what is still not a taskherd Task is named"

    # configure() a second time (a producer and a worker importing one module) changes nothing.
    configure(app, queues=["user-base"])

    @app.task(base=DatabaseTask, name="user.later")
    def _later():
        return None

    assert type(app.tasks["user.later"]).__mro__[1] is type(refund).__mro__[1]


class TimeoutRequest(Request):
    """Celery's guide: a Request of one's own, for on_timeout/on_failure hooks in the main process."""


class WithItsOwnRequest(celery.Task):
    Request = TimeoutRequest


def test_a_base_class_with_a_request_of_its_own_keeps_it_after_taskherds(redis_url):
    app = Celery("user-request", broker=redis_url, set_as_current=False)
    configure(app, queues=["user-request"])

    @app.task(base=WithItsOwnRequest, name="user.timed")
    def _timed():
        return None

    request = symbol_by_name(type(app.tasks["user.timed"]).Request)
    mro = request.__mro__
    assert mro.index(symbol_by_name(Task.Request)) < mro.index(TimeoutRequest), "taskherd's hooks run, then its own"


def test_a_task_with_a_base_class_of_its_own_retries_dead_letters_and_bounds_poison(
        broker_url, record_url, recorded, producer, unique_name, worker_factory):
    env = core_env(broker_url, unique_name, record_url, max_retries=3, max_deliveries=2, counter_url="")
    worker = worker_factory("apps.core_app", queues=[unique_name], env=env, concurrency=1)
    flaky = producer.send_task("core.based_flaky", args=("flaky",), queue=unique_name)
    invalid = producer.send_task("core.based_validation", args=("invalid",), queue=unique_name)
    poison = producer.send_task("core.based_kill_worker", args=("poison",), queue=unique_name)

    letters = wait_for("two envelopes", lambda: dead_letters(broker_url, unique_name), timeout=90,
                       until=lambda found: len(found) >= 2)
    wait_for("the flaky task's retry", lambda: recorded("flaky:on_success"), timeout=30)
    assert [value for _, _, value in recorded("flaky")] == ["0", "1"], "the transient error was retried once"
    by_id = {letter.envelope.task_id: letter.envelope for letter in letters}
    assert by_id[invalid.id].reason == "permanent-error" and len(recorded("invalid")) == 1
    assert by_id[poison.id].reason == "killed-worker" and len(recorded("poison")) == 2
    assert flaky.id not in by_id
    assert "are not taskherd Tasks" not in worker.log()
