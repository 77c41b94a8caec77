"""A redis-server of the test's own, on a free loopback port: for settings the shared Redis must
never be given (an eviction policy, a replica, a frozen server). Killed when the block ends."""
from __future__ import annotations

import contextlib
import socket
import subprocess
import time
from pathlib import Path
from typing import Iterator

import redis


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def private_redis(workdir: Path, *settings: str) -> Iterator[tuple[str, subprocess.Popen]]:
    """Yields (URL of db 0, the server process); ``settings`` are redis-server flags
    (``"--maxmemory-policy", "allkeys-lru"``). Persistence is off unless a flag turns it on."""
    port = free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    log = open(workdir / f"redis-{port}.log", "ab")
    process = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(workdir),
                                "--save", "", "--appendonly", "no", *settings],
                               stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    log.close()
    url = f"redis://127.0.0.1:{port}/0"
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                redis.Redis.from_url(url, socket_timeout=1).ping()
                break
            except redis.ConnectionError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"redis-server {settings} did not start: "
                                         f"{(workdir / f'redis-{port}.log').read_text()[-2000:]}")
                time.sleep(0.05)
        yield url, process
    finally:
        process.kill()
        process.wait(timeout=10)
