"""Helpers for the effects tests: separate processes delivering the same idempotency key, and a
database with the outbox table."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from apps.effects_schema import create_tables
from e2e.lib.waiting import wait_for
from support.worker_process import TESTS_DIR, python_env
from taskherd.worker import outbox


class Deliverers:
    """Starts `apps.effects_duplicates` processes, releases them together, collects what they saw."""

    def __init__(self, sync_dir: Path):
        self.sync_dir = sync_dir
        self.processes: dict[str, subprocess.Popen] = {}

    def start(self, store: str, url: str, key: str, name: str, **options: float) -> subprocess.Popen:
        cmd = [sys.executable, "-m", "apps.effects_duplicates", store, url, key, name, str(self.sync_dir)]
        for option, value in options.items():
            cmd += [f"--{option}", str(value)]
        process = subprocess.Popen(cmd, env=python_env(), cwd=TESTS_DIR, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, start_new_session=True)
        self.processes[name] = process
        return process

    def wait_ready(self, names, timeout: float = 60) -> None:
        def not_ready() -> list[str]:
            waiting = [name for name in names if not (self.sync_dir / f"ready-{name}").exists()]
            for name in waiting:
                if self.processes[name].poll() is not None:
                    raise AssertionError(f"deliverer {name} exited early: {self.processes[name].stderr.read()}")
            return waiting

        wait_for("every deliverer ready (those not yet)", not_ready, timeout=timeout, interval=0.02, equals=[])

    def go(self) -> None:
        (self.sync_dir / "go").touch()

    def outcome(self, name: str, timeout: float = 60) -> dict:
        process = self.processes[name]
        out, err = process.communicate(timeout=timeout)
        assert process.returncode == 0, f"deliverer {name} failed ({process.returncode}): {err}"
        return json.loads(out.strip().splitlines()[-1])

    def kill_all(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.kill()
                process.wait()
            for pipe in (process.stdout, process.stderr):
                pipe.close()


@pytest.fixture
def deliverers(tmp_path):
    sync_dir = tmp_path / "sync"
    sync_dir.mkdir()
    group = Deliverers(sync_dir)
    yield group
    group.kill_all()


@pytest.fixture
def ledger_dsn(pg_dsn) -> str:
    """A fresh database with the idempotency key table and a `ledger` of effects (no unique key)."""
    from apps.effects_schema import create_tables

    create_tables(pg_dsn)
    return pg_dsn


@pytest.fixture
def outbox_dsn(pg_dsn) -> str:
    """The test database with the effects tables and the outbox table."""
    create_tables(pg_dsn)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        outbox.create_table(conn)
    return pg_dsn
