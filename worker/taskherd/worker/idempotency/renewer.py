"""A background thread extends the lease of every claim of one store it is told about.

One per store and process, shared by the store's claims rather than one thread per claim: starting
a thread per task costs more than the task itself for short tasks (see bench/throughput.py). Not
one per process: a store whose Redis stops answering must not stall the renewals of another
store's leases (and its renewals run with a socket timeout, so the thread itself comes back and
retries). A renewal that fails is retried sooner than the next regular one. Fork-safe: a forked
child (prefork pool) starts its own thread on first use, because threads do not survive fork.
"""
from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import Callable

logger = logging.getLogger(__name__)


@dataclass
class _Lease:
    renew: Callable[[], bool]      # returns False when the key is no longer ours
    every_seconds: float
    due: float
    lost: bool = False


#: Seconds before a failed renewal is tried again (at most; never later than the next regular one).
RETRY_SECONDS = 0.5


class Renewer:
    def __init__(self, *, name: str = "taskherd-lease-renewer", clock: Callable[[], float] = time.monotonic):
        self._name = name
        self._clock = clock
        self._leases: dict[int, _Lease] = {}
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._pid: int | None = None
        self._thread: threading.Thread | None = None
        #: when the thread will next look on its own; an add() due later need not wake it (waking
        #: it on every task costs a context switch per task, see bench/throughput.py)
        self._wakes_at = float("inf")
        #: the shortest renewal period asked for: with no lease left, the thread still looks this
        #: often, so that the next short task's add() (due a period from now, later than that
        #: look) does not have to wake it either
        self._idle_seconds = float("inf")

    def add(self, renew: Callable[[], bool], every_seconds: float) -> int:
        with self._lock:
            if self._pid != os.getpid():   # first use, or we are a forked child
                self._pid, self._leases, self._wakes_at = os.getpid(), {}, float("inf")
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            lease_id = next(self._ids)
            due = self._clock() + every_seconds
            self._leases[lease_id] = _Lease(renew, every_seconds, due)
            self._idle_seconds = min(self._idle_seconds, every_seconds)
            wake = due < self._wakes_at
        if wake:
            self._wake.set()
        return lease_id

    def remove(self, lease_id: int) -> bool:
        """Stops renewing; returns True when a renewal found the key was no longer ours."""
        with self._lock:
            lease = self._leases.pop(lease_id, None)
        return bool(lease and lease.lost)

    def _run(self) -> None:
        while True:
            self._wake.clear()  # before looking, so an add() from now on wakes the wait below
            with self._lock:
                now = self._clock()
                due = [lease for lease in self._leases.values() if lease.due <= now and not lease.lost]
                for lease in due:
                    lease.due = now + lease.every_seconds
            for lease in due:
                try:
                    lease.lost = not lease.renew()
                except Exception:  # a broker blip: keep trying until the lease itself runs out
                    logger.warning("idempotency lease renewal failed; retrying", exc_info=True)
                    with self._lock:
                        lease.due = min(lease.due, self._clock() + RETRY_SECONDS)
            with self._lock:
                waiting = [lease.due for lease in self._leases.values() if not lease.lost]
                self._wakes_at = min(waiting) if waiting else self._clock() + self._idle_seconds
            # At most threading.TIMEOUT_MAX at a time (a lease may be 1e15 s): it looks again then.
            self._wake.wait(min(max(self._wakes_at - self._clock(), 0.0), threading.TIMEOUT_MAX))

