"""A background sampler: `tick()` at once, then every `interval` seconds on a daemon thread until
`stop()`. A failing tick is recorded in `errors` (with its time since `t0`) and the sampling goes
on: one bad read of the cluster or the database must not end a watch that a verdict depends on.
The demo's and the chaos suite's observers are samplers."""
from __future__ import annotations

import threading
import time

import psycopg


class Sampler:
    #: thread name, for a stack dump
    name = "sampler"

    def __init__(self, *, t0: float, interval: float = 2.0, error_chars: int = 300):
        self.t0, self.interval, self.error_chars = t0, interval, error_chars
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
        #: the sampler's own database connection, if its tick reads one; closed by stop()
        self._conn: psycopg.Connection | None = None

    def tick(self):
        raise NotImplementedError

    def start(self):
        self.tick()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        if self._conn is not None:
            self._conn.close()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.tick()
            except Exception as exc:  # noqa: BLE001 - reported with the verdict
                self.errors.append(f"{time.time() - self.t0:.0f}s: {type(exc).__name__}: {exc}"[:self.error_chars])
