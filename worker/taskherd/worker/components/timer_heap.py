"""Keeps the worker's event loop from holding every finished task's soft-time-limit timer.

With a time limit, Celery's prefork pool starts a timer for each task's soft limit on the main
process's event loop and cancels it when the task ends (celery/concurrency/asynpool.py). kombu
only marks a cancelled timer; it stays in the loop's heap until it would have fired. With the
profile's 240 s soft limit a worker holds every task of the last four minutes there: ~440 bytes
each (the entry, its arguments, the heap slot), 20 MB at 200 tasks/s, 100 MB at 1,000, and each
new timer is pushed onto that heap. Every ``interval`` seconds this drops the cancelled ones, so
the heap holds about ``interval`` seconds of tasks (docs/benchmarks.md, "The event loop's timers").
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Any

from celery import bootsteps

from taskherd import compat

from . import Component, installed, is_seconds, too_long
from taskherd.contract import shown

logger = logging.getLogger(__name__)

#: Default seconds between two sweeps of the heap.
DEFAULT_INTERVAL = 10.0


@dataclasses.dataclass(frozen=True, kw_only=True)
class TimerHeap(Component):
    """Drops the event loop's cancelled timers every ``interval`` seconds (prefork pool)."""

    #: seconds between sweeps: the heap keeps about this long of finished tasks' timers; a sweep
    #: costs ~0.1 µs per timer it looks at
    interval: float = DEFAULT_INTERVAL

    def problems(self) -> list[str]:
        if not (is_seconds(self.interval) and self.interval > 0):
            return [f"TimerHeap(interval={shown(self.interval)}) must be a positive number of seconds"]
        return too_long("TimerHeap(interval", self.interval)  # bounded as every duration keyword is

    def install(self, app: Any, profile: Any = None) -> None:
        app.steps["consumer"].add(TimerHeapStep)


class TimerHeapStep(bootsteps.StartStopStep):
    """Consumer bootstep: sweeps the consumer's timer, the event loop's (the pool's time limits)."""

    name = "taskherd.worker.components.timer_heap.TimerHeapStep"

    def __init__(self, c: Any, **kwargs: Any):
        super().__init__(c, **kwargs)
        self.interval = float((installed(c.app, TimerHeap) or TimerHeap()).interval)
        self.timer_entry = None

    def start(self, c: Any) -> None:
        self.stop(c)
        if compat.drop_cancelled_timers(c.timer) is not None:  # an event-loop timer: sweep it
            self.timer_entry = c.timer.call_repeatedly(self.interval, self.sweep, (c.timer,), priority=20)

    def stop(self, c: Any) -> None:
        if self.timer_entry is not None:
            self.timer_entry.cancel()
            self.timer_entry = None

    shutdown = stop

    @staticmethod
    def sweep(timer: Any) -> None:
        dropped = compat.drop_cancelled_timers(timer)
        if dropped:
            logger.debug("taskherd: dropped %d cancelled timers from the event loop", dropped)
