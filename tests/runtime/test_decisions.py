"""Pure decisions of the probes, the drain and the metrics: no worker, no broker."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from taskherd.pod import prestop, probe
from taskherd.worker.components import drain, metrics

NOW = 1_000_000.0


def record(**overrides):
    base = {"format": 1, "written_at": NOW - 1, "interval_seconds": 5.0, "pid": 42, "started_at": NOW - 100,
            "broker": {"state": "connected", "since": NOW - 90}, "draining_since": None, "active": []}
    return {**base, **overrides}


def task(started_ago: float, time_limit: float | None):
    return {"id": "abc", "name": "app.slow", "started_at": NOW - started_ago, "time_limit": time_limit}


def test_liveness_passes_with_a_fresh_heartbeat_and_a_long_task_within_its_limit():
    verdict = probe.liveness(record(active=[task(3000, 3600)]), now=NOW)
    assert verdict.ok, verdict.reason


def test_liveness_fails_when_the_heartbeat_is_older_than_six_intervals_by_default():
    assert probe.liveness(record(written_at=NOW - 29), now=NOW).ok
    verdict = probe.liveness(record(written_at=NOW - 31), now=NOW)
    assert not verdict.ok and "31.0s old (limit 30s)" in verdict.reason


def test_liveness_threshold_can_be_given():
    assert not probe.liveness(record(written_at=NOW - 3), now=NOW, max_age=2).ok


def test_liveness_fails_when_a_task_outlived_its_hard_limit_plus_margin():
    assert probe.liveness(record(active=[task(125, 100)]), now=NOW, task_margin=30).ok
    verdict = probe.liveness(record(active=[task(131, 100)]), now=NOW, task_margin=30)
    assert not verdict.ok and "app.slow[abc]" in verdict.reason and "hard limit 100s" in verdict.reason


def test_a_task_without_hard_limit_never_fails_liveness():
    assert probe.liveness(record(active=[task(10**6, None)]), now=NOW).ok


def test_a_broker_outage_fails_readiness_but_not_liveness():
    down = record(broker={"state": "disconnected", "since": NOW - 12})
    assert probe.liveness(down, now=NOW).ok
    verdict = probe.readiness(down, now=NOW)
    assert not verdict.ok and verdict.reason == "broker disconnected for 12s"


def test_readiness_fails_while_draining_and_passes_when_connected():
    assert probe.readiness(record(), now=NOW).ok
    assert not probe.readiness(record(draining_since=NOW - 2), now=NOW).ok


def test_startup_needs_a_heartbeat_and_refuses_an_unknown_format():
    assert not probe.startup(None, now=NOW).ok
    assert probe.startup(record(), now=NOW).ok
    assert not probe.startup(record(format=99), now=NOW).ok


@pytest.mark.parametrize("argv, message", [
    (["sideways"], "probe kind must be one of"),
    (["liveness", "--max-age", "soon"], "--max-age='soon' is not a number"),
    (["liveness", "--max-age", "0"], "must be a positive number"),
    (["liveness", "--bogus", "1"], "unknown option '--bogus'"),
])
def test_probe_usage_errors_name_the_option(argv, message, capsys):
    assert probe.main(argv) == 2
    assert message in capsys.readouterr().err


def test_probe_reports_a_corrupt_heartbeat_file(tmp_path, capsys):
    (tmp_path / "heartbeat.json").write_text("{half")
    assert probe.main(["liveness", "--dir", str(tmp_path)]) == 1
    assert "not valid JSON" in capsys.readouterr().out


def test_the_probe_imports_neither_celery_nor_kombu(tmp_path):
    # -S: only the probe's own imports. An installed wheel (the worker image) adds nothing at start-up,
    # but the development venv's editable-install finders import pathlib and re in every interpreter.
    worker_root = Path(__file__).resolve().parents[2] / "worker"
    done = subprocess.run([sys.executable, "-S", "-X", "importtime", "-m", "taskherd.cli", "probe", "liveness",
                           "--dir", str(tmp_path)], capture_output=True, text=True, timeout=30,
                          env={"PYTHONPATH": str(worker_root), "PATH": os.environ.get("PATH", "")})
    imported = {line.split("|")[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time")}
    # importlib.import_module (the CLI's lazy dispatch) hides the probe's own line; its import shows.
    assert "taskherd.pod.shared_files" in imported and "liveness failed" in done.stdout
    heavy = {name for name in imported if name.split(".")[0] in ("celery", "kombu", "prometheus_client", "redis",
                                                                   "dataclasses", "typing", "argparse", "json", "re")}
    assert not heavy, f"the probe imports {sorted(heavy)}"


def test_drain_state_follows_acknowledgement_then_idleness():
    requested = NOW - 5
    assert prestop.drain_state(record(), requested_at=requested, now=NOW)[0] == "waiting"
    # A drain of an earlier request does not count as acknowledging this one.
    assert prestop.drain_state(record(draining_since=requested - 1), requested_at=requested, now=NOW)[0] == "waiting"
    busy = record(draining_since=requested + 0.1, active=[task(10, 100)])
    assert prestop.drain_state(busy, requested_at=requested, now=NOW) == ("draining", "1 task(s) still running: app.slow[abc]")
    assert prestop.drain_state(record(draining_since=requested + 0.1), requested_at=requested, now=NOW)[0] == "idle"
    assert prestop.drain_state(record(written_at=NOW - 60), requested_at=requested, now=NOW)[0] == "gone"
    assert prestop.drain_state(None, requested_at=requested, now=NOW)[0] == "gone"


def test_a_drain_request_applies_only_to_this_worker_and_only_after_it_started():
    assert drain.request_applies({"requested_at": 20.0, "pid": 7}, pid=7, started_at=10.0)
    assert drain.request_applies({"requested_at": 20.0}, pid=7, started_at=10.0)
    assert not drain.request_applies({"requested_at": 20.0, "pid": 8}, pid=7, started_at=10.0)
    assert not drain.request_applies({"requested_at": 5.0, "pid": 7}, pid=7, started_at=10.0)
    assert not drain.request_applies(None, pid=7, started_at=10.0)


def test_drain_usage_errors(capsys):
    assert prestop.main(["--deadline", "-3"]) == 2
    assert "deadline='-3' must be a positive number" in capsys.readouterr().err


def test_drain_without_a_worker_returns_at_once(tmp_path, capsys):
    assert prestop.main(["--dir", str(tmp_path)]) == 0
    assert "no worker to drain" in capsys.readouterr().out


def test_metrics_count_outcomes_and_refuse_unknown_ones():
    registry = CollectorRegistry()
    task_metrics = metrics.TaskMetrics(registry=registry)
    task_metrics.record_outcome("app.pay", "dead_lettered")
    task_metrics.record_outcome("app.pay", "dead_lettered")
    assert registry.get_sample_value("taskherd_tasks_total", {"task": "app.pay", "outcome": "dead_lettered"}) == 2
    with pytest.raises(ValueError, match="outcome='lost' for task 'app.pay' is not one of succeeded, failed"):
        task_metrics.record_outcome("app.pay", "lost")


def test_metric_names_follow_prometheus_conventions():
    registry = CollectorRegistry()
    metrics.TaskMetrics(registry=registry)
    names = {metric.name for metric in registry.collect()}
    assert names == {"taskherd_tasks", "taskherd_task_runtime_seconds", "taskherd_task_queue_wait_seconds",
                     "taskherd_tasks_in_flight", "taskherd_task_deliveries", "taskherd_pool_child_deaths",
                     "taskherd_pool_child_last_death_timestamp_seconds"}  # counters get `_total` on exposition


def test_published_at_reads_the_stamp_and_skips_missing_or_garbage():
    class Request:
        taskherd_published_at = 1700000000.5  # a number, as the PublishStamps component writes it

    assert metrics.published_at(Request()) == 1700000000.5
    assert metrics.published_at(object()) is None
    for garbage in ("yesterday", "1700000000.5", float("inf")):  # another producer's: no stamp
        Request.taskherd_published_at = garbage
        assert metrics.published_at(Request()) is None


def test_heartbeat_records_round_trip_and_corruption_is_named(tmp_path):
    from taskherd.pod import shared_files

    path = str(tmp_path / "heartbeat.json")
    shared_files.write_json_atomically(path, record(active=[task(1, 2.5)]))
    assert shared_files.read_json(path) == record(active=[task(1, 2.5)])
    (tmp_path / "heartbeat.json").write_text('{"format": 1} trailing')
    with pytest.raises(ValueError, match="heartbeat.json is not valid JSON: Extra data"):
        shared_files.read_json(path)
    (tmp_path / "heartbeat.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="holds a list, expected a JSON object"):
        shared_files.read_json(path)
    assert shared_files.read_json(str(tmp_path / "missing.json")) is None


def test_the_metrics_directory_is_per_worker_and_dead_workers_directories_go(tmp_path, monkeypatch):
    import os

    from prometheus_client import values

    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    dead = tmp_path / "worker-999999999"  # no such pid
    (dead / "sub").mkdir(parents=True)
    alive = tmp_path / "worker-1"  # pid 1 exists
    alive.mkdir()
    ours = tmp_path / "worker-4242"
    ours.mkdir()
    (ours / "counter_4242.db").write_bytes(b"stale")
    try:
        directory = metrics.prepare_multiprocess_dir(base=str(tmp_path), pid=4242)
        assert directory == str(ours) and list(ours.iterdir()) == []  # a previous run's files are wiped
        assert not dead.exists() and alive.exists()
    finally:
        # Not monkeypatch: it would restore the value prepare_multiprocess_dir exported, and the
        # workers later tests start would inherit it.
        os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)
        values.ValueClass = values.get_value_class()


def test_a_warm_shutdown_keeps_liveness_passing_and_readiness_failing():
    stopping = record(written_at=NOW - 300, stopping_since=NOW - 299, active=[task(200, 600)])
    verdict = probe.liveness(stopping, now=NOW)
    assert verdict.ok and "stopping (warm shutdown) for 299s" in verdict.reason
    assert not probe.readiness(stopping, now=NOW).ok
    # ... but a task past its hard limit still means the pool is stuck.
    assert not probe.liveness({**stopping, "active": [task(700, 600)]}, now=NOW).ok


def test_drain_gives_up_at_its_deadline_naming_the_tasks_still_running(tmp_path, capsys):
    from taskherd.pod import shared_files

    import time as clock

    # A worker that acknowledged the drain (draining_since after any request) but stays busy.
    busy = record(written_at=clock.time() + 3600, draining_since=clock.time() + 3600, active=[task(10, None)])
    shared_files.write_json_atomically(str(tmp_path / "heartbeat.json"), busy)
    started = clock.monotonic()
    assert prestop.main(["--dir", str(tmp_path), "--deadline", "0.5", "--poll", "0.05"]) == 1
    assert 0.5 <= clock.monotonic() - started < 3
    assert "deadline of 0.5s reached: 1 task(s) still running: app.slow[abc]" in capsys.readouterr().out
    request = shared_files.read_json(str(tmp_path / "drain-request.json"))
    assert request["pid"] == 42 and request["requested_at"] > 0


def test_compacting_dead_processes_keeps_every_count(tmp_path):
    import os

    from prometheus_client import multiprocess as prometheus_multiprocess
    from prometheus_client.mmap_dict import MmapedDict, mmap_key

    def write(name, pid, samples):
        values = MmapedDict(str(tmp_path / f"{name}_{pid}.db"))
        for metric, sample, labels, value in samples:
            values.write_value(mmap_key(metric, sample, list(labels), list(labels.values()), "help"), value, 0.0)
        values.close()

    def collected():
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for family in prometheus_multiprocess.MultiProcessCollector(None, path=str(tmp_path)).collect()
                for s in family.samples}

    failed = [("taskherd_tasks", "taskherd_tasks_total", {"task": "a", "outcome": "failed"}, 2.0)]
    write("counter", 999999998, failed)
    write("counter", 999999999, failed)
    write("counter", os.getpid(), failed)  # alive: kept as is
    write("histogram", 999999999, [("taskherd_task_runtime_seconds", "taskherd_task_runtime_seconds_bucket",
                                    {"task": "a", "le": "1.0"}, 3.0)])
    before = collected()
    assert metrics.compact_dead_processes(str(tmp_path)) == 3
    assert collected() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["counter_archive.db", f"counter_{os.getpid()}.db",
                                                                 "histogram_archive.db"])
    write("counter", 999999997, failed)  # a later dead child: added to the archive
    assert metrics.compact_dead_processes(str(tmp_path)) == 1
    assert collected()[("taskherd_tasks_total", (("outcome", "failed"), ("task", "a")))] == 8.0
