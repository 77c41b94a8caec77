"""Helpers for the runtime tests: the real `taskherd` CLI, a private Redis server, free ports."""
from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import redis

from support.waiting import wait_until

TASKHERD = [sys.executable, "-m", "taskherd.cli"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def probe(kind: str, directory: Path, *options: str) -> tuple[int, str]:
    """Runs `taskherd probe <kind>` as Kubernetes would: a fresh process reading the heartbeat."""
    done = subprocess.run([*TASKHERD, "probe", kind, "--dir", str(directory), *options],
                          capture_output=True, text=True, timeout=30)
    return done.returncode, (done.stdout + done.stderr).strip()


class PrivateRedis:
    """A redis-server of this test alone, so that it can be stopped (never the shared one)."""

    def __init__(self, directory: Path):
        self.port = free_port()
        self.directory = directory
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def start(self) -> None:
        log = open(self.directory / f"redis-{self.port}.log", "ab")
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(self.directory)], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        client = redis.Redis(port=self.port, socket_connect_timeout=1)
        wait_until(lambda: _pings(client), timeout=15, what=f"redis-server on port {self.port} answering")

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.kill()  # by PID: it is ours
            self.process.wait(timeout=10)


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False


