"""A redis-server of one test (or benchmark) alone, on a free loopback port: for what the shared
Redis of scripts/services.sh must never see (stopped and restarted, frozen, an eviction policy, a
replica). Killed by its PID, never by name."""
from __future__ import annotations

import contextlib
import subprocess
from pathlib import Path
from typing import Iterator

import redis

from e2e.lib.services import free_port
from e2e.lib.waiting import wait_for


class PrivateRedis:
    """`settings` are redis-server flags (``"--maxmemory-policy", "allkeys-lru"``); persistence is off
    unless a flag turns it on. `start()` again after `stop()` brings it back on the same port."""

    def __init__(self, directory: Path, *settings: str):
        self.port = free_port()
        self.directory = directory
        self.settings = settings
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        log_path = self.directory / f"redis-{self.port}.log"
        with open(log_path, "ab") as log:
            self.process = subprocess.Popen(
                ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.directory),
                 "--save", "", "--appendonly", "no", *self.settings],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        client = redis.Redis(port=self.port, socket_connect_timeout=1, socket_timeout=1)

        def answers() -> bool:
            if self.process.poll() is not None:
                raise AssertionError(f"redis-server {self.settings} exited: {log_path.read_text()[-2000:]}")
            try:
                return bool(client.ping())
            except redis.RedisError:
                return False

        wait_for(f"redis-server on port {self.port} answering", answers, timeout=15, interval=0.05)

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)


@contextlib.contextmanager
def private_redis(directory: Path, *settings: str) -> Iterator[tuple[str, subprocess.Popen]]:
    """A PrivateRedis for the block: yields (URL of database 0, the server process)."""
    server = PrivateRedis(directory, *settings)
    try:
        server.start()
        yield f"{server.url}/0", server.process
    finally:
        server.stop()
