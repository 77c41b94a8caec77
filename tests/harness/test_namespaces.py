"""Which test namespaces a new session removes (e2e/lib/pytest_plugin.py): those of runs that are gone."""
import os
import subprocess
import sys
from datetime import datetime, timedelta, timezone

from e2e.lib.pytest_plugin import STALE_AFTER, _dns_label, _still_running, is_leftover, process_identity

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)


def namespace(owner: str | None, age: timedelta, deleting: bool = False) -> dict:
    meta = {"name": "ns", "creationTimestamp": (NOW - age).strftime("%Y-%m-%dT%H:%M:%SZ"), "annotations": {}}
    if owner:
        meta["annotations"]["taskherd.io/test-owner"] = owner
    if deleting:
        meta["deletionTimestamp"] = NOW.isoformat()
    return {"metadata": meta}


def leftover(ns: dict, alive: set[str] = frozenset()) -> bool:
    return is_leftover(ns, host="here", alive=lambda process: process in alive, now=NOW)


def test_a_namespace_of_this_machine_goes_exactly_when_its_owner_process_is_gone():
    assert leftover(namespace("here/41.900", timedelta(minutes=1)))
    assert not leftover(namespace("here/41.900", timedelta(days=3)), alive={"41.900"})


def test_a_namespace_whose_owner_cannot_be_asked_goes_only_once_stale():
    for owner in ("elsewhere/41.900", None):
        assert not leftover(namespace(owner, STALE_AFTER - timedelta(minutes=1)))
        assert leftover(namespace(owner, STALE_AFTER + timedelta(minutes=1)))


def test_a_namespace_already_being_deleted_is_left_alone():
    assert not leftover(namespace("here/41.900", timedelta(days=1), deleting=True))


def test_a_process_is_known_by_its_pid_and_start_time():
    assert _still_running(process_identity(os.getpid()))
    pid, start = process_identity(os.getpid()).split(".")
    assert not _still_running(f"{pid}.{int(start) + 1}")  # the PID reused by a later process
    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    assert not _still_running(f"{finished.stdout.strip()}.0")
    assert not _still_running("garbage")


def test_a_test_path_becomes_a_valid_piece_of_a_namespace_name():
    assert _dns_label("test_restart[Redis-Ünïcode]", 30) == "test-restart-redis--n-code"
    assert _dns_label("__x__", 30) == "x"
    assert len(_dns_label("a" * 80, 30)) == 30
