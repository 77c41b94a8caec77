"""The worker metrics' pure logic: one outcome per delivery, bounded task labels, the series created
at 0, the queue wait of a delayed message, and the folding of dead processes' gauge files."""
from __future__ import annotations

import datetime as dt
import time

import pytest
from celery import Celery
from celery.app.task import Context
from prometheus_client import CollectorRegistry, multiprocess

from taskherd import compat
from taskherd.worker import child_deaths
from taskherd.worker.components import metrics


def _outcomes(fresh: metrics.TaskMetrics) -> dict[tuple[str, str], float]:
    return {(s.labels["task"], s.labels["outcome"]): s.value for family in fresh.tasks.collect()
            for s in family.samples if s.name.endswith("_total")}


def _deliveries(fresh: metrics.TaskMetrics) -> dict[str, float]:
    return {s.labels["task"]: s.value for family in fresh.deliveries.collect()
            for s in family.samples if s.name.endswith("_total")}


class _Task:
    def __init__(self, name: str):
        self.name = name


@pytest.fixture
def fresh(monkeypatch):
    """The process's metrics replaced by a fresh registry's, the outcome bookkeeping emptied."""
    registry_metrics = metrics.TaskMetrics(registry=CollectorRegistry())
    monkeypatch.setattr(metrics, "_default", registry_metrics)
    monkeypatch.setattr(metrics, "_final_outcomes", {})
    monkeypatch.setattr(metrics, "_recording", True)
    return registry_metrics


# -- one outcome per delivery ----------------------------------------------------------------------
def test_a_dead_lettered_failure_counts_dead_lettered_only(fresh):
    """taskherd.worker.task dead-letters, then re-raises: Celery's task_failure follows in the
    same process. It counted `failed` as well: 6 failed tasks gave 12 outcomes."""
    metrics.delivery_received("shop.charge", "id-1")
    metrics.record_final_outcome("shop.charge", "id-1", "dead_lettered")
    metrics._on_failure(sender=_Task("shop.charge"), task_id="id-1")
    assert _outcomes(fresh) == {("shop.charge", "dead_lettered"): 1.0}
    assert sum(_deliveries(fresh).values()) - sum(_outcomes(fresh).values()) == 0


def test_a_hard_time_limit_signalled_twice_counts_once(fresh):
    """Celery 5.7 sends task_failure from Request.on_failure and again from on_timeout."""
    metrics.delivery_received("shop.slow", "id-2")
    metrics._on_failure(sender=_Task("shop.slow"), task_id="id-2")
    metrics._on_failure(sender=_Task("shop.slow"), task_id="id-2")
    assert _outcomes(fresh) == {("shop.slow", "failed"): 1.0}


def test_a_new_delivery_of_the_same_id_counts_its_own_outcome(fresh):
    for _ in range(2):  # redriven from the DLQ with its id, failing again
        metrics.delivery_received("shop.charge", "id-3")
        metrics.record_final_outcome("shop.charge", "id-3", "dead_lettered")
        metrics._on_failure(sender=_Task("shop.charge"), task_id="id-3")
    metrics.delivery_received("shop.charge", "id-3")
    metrics._on_failure(sender=_Task("shop.charge"), task_id="id-3")
    assert _outcomes(fresh) == {("shop.charge", "dead_lettered"): 2.0, ("shop.charge", "failed"): 1.0}
    assert _deliveries(fresh) == {"shop.charge": 3.0}


def test_a_run_in_the_pool_child_forgets_an_earlier_outcome_of_its_id(fresh):
    metrics.record_final_outcome("shop.charge", "id-4", "dead_lettered")
    task = _Task("shop.charge")
    task.request = Context({"id": "id-4"})
    metrics.task_started(task)
    metrics._on_failure(sender=task, task_id="id-4")
    assert _outcomes(fresh)[("shop.charge", "failed")] == 1.0


def test_the_remembered_outcomes_are_bounded(fresh, monkeypatch):
    monkeypatch.setattr(metrics, "_FINAL_OUTCOMES_KEPT", 10)
    for n in range(50):
        metrics.record_final_outcome("t", f"id-{n}", "dead_lettered")
    assert list(metrics._final_outcomes) == [f"id-{n}" for n in range(40, 50)]


# -- bounded task labels ---------------------------------------------------------------------------
def test_a_task_label_is_a_registered_name_or_unknown():
    tasks = {"shop.charge": object()}
    assert metrics.task_label("shop.charge", tasks) == "shop.charge"
    for wire in ("shop.charge2", "x" * 10_000, None, ["shop.charge"], {"a": 1}, 5, b"shop.charge"):
        assert metrics.task_label(wire, tasks) == "unknown"
    assert metrics.task_label("shop.charge", None) == "unknown"


class _Message:
    def __init__(self, headers):
        self.headers = headers


class _Consumer:
    def __init__(self, tasks):
        self.app = type("App", (), {"tasks": tasks})()


def test_celery_rejections_count_an_outcome_and_a_delivery_under_a_bounded_name(fresh):
    """Without the BadMessages component Celery rejects what it cannot run (no request: no
    delivery counted); the name came from the wire."""
    consumer = _Consumer({"shop.charge": object()})
    metrics._on_unknown(sender=consumer, name="evil-" + "x" * 100)
    metrics._on_rejected(sender=consumer, message=_Message({"task": "made.up"}))
    metrics._on_rejected(sender=consumer, message=_Message({"task": "shop.charge"}))
    metrics._on_rejected(sender=consumer, message=_Message(None))
    assert _outcomes(fresh) == {("unknown", "rejected"): 3.0, ("shop.charge", "rejected"): 1.0}
    assert _deliveries(fresh) == {"unknown": 3.0, "shop.charge": 1.0}


def test_a_message_outcome_counts_its_delivery_only_when_asked(fresh):
    before = metrics.deliveries_seen()
    metrics.message_outcome("unknown", "dead_lettered", count_delivery=True)
    metrics.message_outcome("shop.charge", "dead_lettered", count_delivery=False)
    assert _deliveries(fresh) == {"unknown": 1.0}
    assert _outcomes(fresh) == {("unknown", "dead_lettered"): 1.0, ("shop.charge", "dead_lettered"): 1.0}
    assert metrics.deliveries_seen() == before + 1


# -- series at 0 from the start ----------------------------------------------------------------------
def test_the_known_series_are_created_at_zero_for_each_registered_task():
    app = Celery("zero-series", set_as_current=False)

    @app.task(name="shop.charge")
    def charge():
        pass

    @app.task(name="shop.refund")
    def refund():
        pass

    labelled = metrics.labelled_task_names(app)
    # (Celery shares every task made earlier in this process, @app.task included, with each app
    # that finalizes: in a full test run there are more; only ours are checked)
    assert {"shop.charge", "shop.refund"} <= set(labelled), labelled
    assert not [name for name in labelled if name.startswith("celery.")], "celery.* built-ins left out"
    names = ["shop.charge", "shop.refund"]
    fresh = metrics.TaskMetrics(registry=CollectorRegistry())
    created = metrics.create_known_series(fresh, names)
    outcomes = _outcomes(fresh)
    assert set(outcomes.values()) == {0.0}
    assert set(outcomes) == {(task, outcome) for task in names for outcome in metrics.OUTCOMES} | {
        ("unknown", "dead_lettered"), ("unknown", "rejected")}
    assert _deliveries(fresh) == {"shop.charge": 0.0, "shop.refund": 0.0, "unknown": 0.0}
    deaths = {(s.labels["task"], s.labels["cause"]): s.value for family in fresh.child_deaths.collect()
              for s in family.samples if s.name.endswith("_total")}
    assert deaths == {(task, cause): 0.0 for task in names for cause in ("OOMKilled", "SIGKILL", "SIGSEGV")}
    assert child_deaths.KNOWN_CAUSES == ("OOMKilled", "SIGKILL", "SIGSEGV")
    assert created == len(outcomes) + len(deaths) + 3
    last = [s for family in fresh.last_child_death.collect() for s in family.samples]
    assert last == [], "no death timestamp of 0: the operator reads a death from it"


# -- queue wait of a delayed message ---------------------------------------------------------------
def _iso(epoch: float) -> str:
    return dt.datetime.fromtimestamp(epoch, dt.timezone.utc).isoformat()


def test_the_queue_wait_of_a_delayed_message_starts_when_it_became_due():
    now = 1_700_000_100.0
    stamp = now - 12.0  # published with countdown=10, run 2 s after it fell due
    eta = _iso(stamp + 10.0)
    assert metrics.queue_wait(Context({"taskherd_published_at": stamp, "eta": eta}), now=now) == pytest.approx(2.0)
    # parked in the Redis delay set: the ETA travels as taskherd_eta, on the request or in its headers
    assert metrics.queue_wait(Context({"taskherd_published_at": stamp, "taskherd_eta": eta}),
                              now=now) == pytest.approx(2.0)
    assert metrics.queue_wait(Context({"taskherd_published_at": stamp, "headers": {"taskherd_eta": eta}}),
                              now=now) == pytest.approx(2.0)
    # an ETA already past when it was published does not shorten the wait
    assert metrics.queue_wait(Context({"taskherd_published_at": stamp, "eta": _iso(stamp - 60)}),
                              now=now) == pytest.approx(12.0)
    # no stamp: no observation, ETA or not
    assert metrics.queue_wait(Context({"eta": eta}), now=now) is None


def test_a_naive_eta_is_read_in_the_apps_time_zone_as_celery_reads_it():
    now = time.time()
    naive = dt.datetime.fromtimestamp(now - 1.0, dt.timezone.utc).replace(tzinfo=None).isoformat()
    waited = metrics.queue_wait(Context({"taskherd_published_at": now - 30, "eta": naive}), now=now,
                                timezone=dt.timezone.utc)
    assert waited == pytest.approx(1.0, abs=0.01)


@pytest.mark.parametrize("eta", ["tomorrow", "2024-13-45T99:00:00", 5, ["x"], {"a": 1}, "9999-12-31T23:59:59+00:00"[:-6]
                                 + "+99:00", float("nan"), True])
def test_an_unreadable_eta_falls_back_to_the_publish_stamp_and_never_raises(eta):
    now = 1_700_000_100.0
    assert metrics.queue_wait(Context({"taskherd_published_at": now - 3, "eta": eta}), now=now) == pytest.approx(3.0)


def test_task_started_observes_the_wait_after_the_countdown(fresh):
    task = _Task("shop.charge")
    published = time.time() - 10.5
    task.request = Context({"id": "x", "taskherd_published_at": published, "eta": _iso(published + 10.0)})
    assert metrics.task_started(task) is not None
    (sample,) = [s for family in fresh.queue_wait.collect() for s in family.samples if s.name.endswith("_sum")]
    assert 0.4 <= sample.value < 2.0, "the 10 s countdown counted as queue wait"


# -- dead processes' gauge files fold ---------------------------------------------------------------
def test_dead_processes_gauge_files_fold_into_one_archive_per_mode(tmp_path, monkeypatch):
    monkeypatch.setattr(metrics, "_pid_alive", lambda pid: pid == 1)
    key = compat.metric_key("last", "last", ["task"], ["a"], "l")

    def write(name: str, value: float, timestamp: float = 0.0) -> None:
        file = compat.metric_file_writer(str(tmp_path / name))
        file.write_value(key, value, timestamp)
        file.close()

    for pid, value in ((1, 5.0), (101, 7.0), (102, 3.0)):
        write(f"gauge_max_{pid}.db", value)
        write(f"gauge_min_{pid}.db", value)
        write(f"gauge_sum_{pid}.db", value)
        write(f"gauge_mostrecent_{pid}.db", value, timestamp=1000.0 + value)
        write(f"gauge_all_{pid}.db", value)
    write("gauge_max_103.db", 9.0)

    assert metrics.compact_dead_processes(str(tmp_path)) == 4 * 2 + 1  # "all" keeps a series per pid
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == sorted(["gauge_max_1.db", "gauge_max_archive.db", "gauge_min_1.db", "gauge_min_archive.db",
                            "gauge_sum_1.db", "gauge_sum_archive.db", "gauge_mostrecent_1.db",
                            "gauge_mostrecent_archive.db", "gauge_all_1.db", "gauge_all_101.db",
                            "gauge_all_102.db"])

    def archived(mode: str) -> float:
        (_, value, timestamp, _), = compat.read_metric_file(str(tmp_path / f"gauge_{mode}_archive.db"))
        return value

    assert (archived("max"), archived("min"), archived("sum"), archived("mostrecent")) == (9.0, 3.0, 10.0, 7.0)
    write("gauge_max_104.db", 2.0)  # a later death folds into the same archive
    assert metrics.compact_dead_processes(str(tmp_path)) == 1
    assert archived("max") == 9.0
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=str(tmp_path))
    (gauge,) = [f for f in registry.collect() if f.name == "last"]
    assert gauge.samples  # the collector reads the archives
