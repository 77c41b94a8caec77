"""The runtime installers alongside taskherd's reliability profile, configured through the environment."""
from datetime import datetime, timedelta, timezone

import celery
import httpx
from celery import Celery

from e2e.lib.services import free_port
from e2e.lib.waiting import wait_for
from runtime.helpers import probe


def test_probes_and_metrics_work_on_a_profiled_app(redis_url, unique_name, worker_factory, tmp_path):
    heartbeat_dir, port = tmp_path / "heartbeat", free_port()
    env = {"TEST_BROKER_URL": redis_url, "TEST_QUEUE": unique_name, "TASKHERD_HEARTBEAT_DIR": str(heartbeat_dir),
           "TASKHERD_HEARTBEAT_INTERVAL": "1", "TASKHERD_METRICS_PORT": str(port),
           "TASKHERD_METRICS_ADDR": "127.0.0.1"}
    worker_factory("apps.runtime_profile_app", queues=[unique_name], env=env, concurrency=2)
    for kind in ("startup", "liveness", "readiness"):
        code, output = probe(kind, heartbeat_dir)
        assert code == 0, output
    producer = Celery(broker=redis_url)
    producer.send_task("runtime_profile.add", args=(2, 3), queue=unique_name)
    producer.send_task("runtime_profile.refuse", queue=unique_name)
    producer.send_task("runtime_profile.plain", queue=unique_name)
    # Celery drops an expired message before it becomes a delivery (no task_received): not counted.
    producer.send_task("runtime_profile.add", args=(0, 0), queue=unique_name,
                       expires=datetime.now(timezone.utc) - timedelta(minutes=1))
    producer.send_task("runtime_profile.add", args=(4, 4), queue=unique_name, expires=3600)  # runs

    def counted():
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        # every registered task's series exist from the start at 0: the ones counted are the others
        return [line for line in text.splitlines() if line.startswith("taskherd_tasks_total{")
                and not line.endswith(" 0.0")]

    # A permanent failure is dead-lettered: its one outcome is dead_lettered (not also failed).
    lines = wait_for("the tasks' outcomes counted", counted, timeout=20, until=lambda found: len(found) == 3)
    assert sorted(lines) == [
        'taskherd_tasks_total{outcome="dead_lettered",task="runtime_profile.refuse"} 1.0',
        'taskherd_tasks_total{outcome="succeeded",task="runtime_profile.add"} 2.0',
        'taskherd_tasks_total{outcome="succeeded",task="runtime_profile.plain"} 1.0']
    # Each run timed once and out of flight: the taskherd Tasks time themselves, the plain one is
    # timed by Celery's signals (connected because it is there), and neither counts twice. Each
    # delivery is counted once too: by taskherd's Request, or for the plain task (Celery's Request)
    # by the task_received signal; the expired message not at all.
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    for task, runs in (("add", 2), ("refuse", 1), ("plain", 1)):
        assert f'taskherd_task_runtime_seconds_count{{task="runtime_profile.{task}"}} {runs}.0' in text, task
        assert f'taskherd_tasks_in_flight{{task="runtime_profile.{task}"}} 0.0' in text, task
        assert f'taskherd_task_deliveries_total{{task="runtime_profile.{task}"}} {runs}.0' in text, task
    producer.close()


def test_a_metrics_port_already_taken_is_said_by_the_variables_that_set_it(redis_url, unique_name, worker_factory,
                                                                           tmp_path):
    """Two workers on one host with the default port: the second served no probes, and said only
    "Signal handler … raised: OSError(98, 'Address already in use')"."""
    import socket

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    env = {"TEST_BROKER_URL": redis_url, "TEST_QUEUE": unique_name, "TASKHERD_HEARTBEAT_DIR": str(tmp_path / "hb"),
           "TASKHERD_METRICS_PORT": str(port), "TASKHERD_METRICS_ADDR": "127.0.0.1"}
    try:
        worker = worker_factory("apps.runtime_profile_app", queues=[unique_name], env=env, concurrency=1)
        said = wait_for("the worker to say why", worker.log, timeout=20, until=lambda log: "cannot serve" in log)
    finally:
        taken.close()
    line = next(line for line in said.splitlines() if "cannot serve /metrics" in line)
    assert f"127.0.0.1:{port}" in line and "Address already in use" in line and "TASKHERD_METRICS_PORT" in line, line


def _connected() -> set[str]:
    """The per-task signals the Metrics component's receivers are connected to (by dispatch_uid)."""
    from celery import signals

    return {signal.name for signal in (signals.task_prerun, signals.task_postrun, signals.task_received)
            if any(key[0] == f"taskherd.metrics.{signal.name}" for key, _ in signal.receivers)}


def test_per_task_signals_are_dispatched_only_for_tasks_that_do_not_time_themselves():
    """Celery dispatches task_prerun/task_postrun (the tracer) and task_received (the strategy), a
    few µs each per task, only when they have a receiver: with every task a taskherd Task (which
    times itself, and whose Request counts its delivery), the worker connects none."""
    from taskherd.worker.components import metrics
    from taskherd.worker.profile import configure

    app = Celery("only_taskherd_tasks", set_as_current=False)
    configure(app, queues=["q"])

    @app.task(name="only.add")
    def add(x: int, y: int) -> int:
        return x + y

    class Plain(celery.Task):
        name = "only.plain"

        def run(self) -> None:
            return None

    assert {"task_prerun", "task_postrun"} <= _connected(), "connected at install, decided at worker_init"
    try:
        metrics._per_task_signals(app)
        assert not _connected(), "no receiver is needed: every task times itself and counts its deliveries"
    finally:
        app.register_task(Plain())
        metrics._per_task_signals(app)  # and back, for the tests after this one in this process
    assert _connected() == {"task_prerun", "task_postrun", "task_received"}


def test_a_delivery_is_counted_once_whichever_way_it_is_counted(monkeypatch):
    """taskherd's Request counts its delivery itself; the task_received receiver, connected for the
    tasks of other Request classes, passes over the requests that did."""
    from prometheus_client import CollectorRegistry

    from taskherd.worker.components import metrics
    from taskherd.worker.task import Request

    monkeypatch.setattr(metrics, "_default", metrics.TaskMetrics(registry=CollectorRegistry()))
    monkeypatch.setattr(metrics, "_recording", True)

    def deliveries(task: str) -> float:
        return metrics.default_metrics().value("deliveries", task).get()

    class Ours:  # a request of taskherd's Request class, as the receiver sees it
        name, counts_its_delivery = "ours.task", Request.counts_its_delivery

    class Plain:  # a request of Celery's own Request class
        name = "plain.task"

    metrics.delivery_received("ours.task")  # what taskherd's Request.__init__ does
    metrics._on_received(request=Ours())
    metrics._on_received(request=Plain())
    assert (deliveries("ours.task"), deliveries("plain.task")) == (1.0, 1.0)
