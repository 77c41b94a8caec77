"""A real `celery worker` process for tests: started, signalled, killed, its log read.

The app module is imported by the worker subprocess, so it must be importable from tests/ (put
test apps in tests/apps/) and take its configuration from environment variables passed in `env`.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

TESTS_DIR = Path(__file__).resolve().parent.parent


class WorkerProcess:
    def __init__(
        self,
        app_module: str,
        *,
        log_dir: Path,
        queues: list[str] | None = None,
        concurrency: int = 2,
        pool: str = "prefork",
        env: dict[str, str] | None = None,
        hostname: str | None = None,
        extra_args: list[str] | None = None,
        ready_timeout: float = 60,
    ):
        self.app_module = app_module
        self.queues = queues or []
        self.concurrency = concurrency
        self.pool = pool
        self.hostname = hostname or f"w-{uuid.uuid4().hex[:6]}@%h"
        self.extra_args = extra_args or []
        self.ready_timeout = ready_timeout
        self.name = uuid.uuid4().hex[:6]
        # configure() installs the heartbeat and the metrics server: give each worker its own
        # heartbeat directory and no metrics port unless the test asks for them, so that workers
        # running side by side never share a file or fight over the metrics port.
        defaults = {"TASKHERD_HEARTBEAT_DIR": str(Path(log_dir) / f"heartbeat-{self.name}"),
                    "TASKHERD_METRICS_PORT": "0"}
        self.env = {**os.environ, **defaults, **(env or {})}
        # The worker imports test apps from tests/ (support and apps packages).
        self.env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS_DIR), self.env.get("PYTHONPATH")]))
        self.log_path = Path(log_dir) / f"worker-{self.name}.log"
        self.process: subprocess.Popen | None = None

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "celery", "-A", self.app_module, "worker",
               "--loglevel", "INFO", "--pool", self.pool, "--concurrency", str(self.concurrency),
               "--hostname", self.hostname, "--without-mingle", "--without-gossip"]
        if self.queues:
            cmd += ["--queues", ",".join(self.queues)]
        return cmd + self.extra_args

    def start(self) -> "WorkerProcess":
        log = open(self.log_path, "ab")
        # Its own session, so signals we send reach only this worker and its pool children.
        self.process = subprocess.Popen(self.command(), env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, start_new_session=True, cwd=TESTS_DIR)
        log.close()
        self.wait_for_log("ready.", timeout=self.ready_timeout)
        return self

    @property
    def pid(self) -> int:
        assert self.process is not None, "worker not started"
        return self.process.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def wait_for_log(self, needle: str, timeout: float = 30, count: int = 1) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.log().count(needle) >= count:
                return
            if self.process is not None and self.process.poll() is not None:
                raise AssertionError(f"worker exited ({self.process.returncode}) before logging {needle!r}:\n{self.tail()}")
            time.sleep(0.1)
        raise AssertionError(f"worker did not log {needle!r} within {timeout}s:\n{self.tail()}")

    def tail(self, lines: int = 60) -> str:
        return "\n".join(self.log().splitlines()[-lines:])

    def child_pids(self) -> list[int]:
        """PIDs of the pool's child processes (prefork)."""
        children: list[int] = []
        task_dir = Path(f"/proc/{self.pid}/task")
        for task in task_dir.iterdir() if task_dir.exists() else []:
            children_file = task / "children"
            if children_file.exists():
                children += [int(p) for p in children_file.read_text().split()]
        return children

    def signal(self, signum: int) -> None:
        os.kill(self.pid, signum)

    def is_running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def wait(self, timeout: float) -> int:
        assert self.process is not None
        return self.process.wait(timeout=timeout)

    def stop(self, timeout: float = 30) -> int:
        """Warm shutdown (SIGTERM), then SIGKILL of the whole session if it does not end in time."""
        if not self.is_running():
            return self.process.returncode if self.process else 0
        self.signal(signal.SIGTERM)
        try:
            return self.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return self.process.returncode

    def kill(self) -> None:
        """SIGKILL to the worker and every process of its session (pool children included)."""
        if self.process is None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
