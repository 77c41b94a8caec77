"""A heartbeat for Celery beat, written by its schedule loop, so a liveness probe can tell a beat
that is alive from one whose loop is stuck.

Beat runs one loop: ``tick()`` sends the due tasks and returns how long to sleep (at most
``max_interval``), then beat sleeps. The component wraps the tick of the scheduler beat starts
with (on ``beat_init``, whatever the scheduler class) and writes heartbeat.json after each tick,
in the worker's format (taskherd.pod.shared_files), so ``taskherd probe liveness --max-age N``
reads it unchanged. A tick that never returns (a publish blocked without timeout, a scheduler
database that hangs) stops the writes and the probe fails; a broker outage makes ticks fail fast
and log, which keeps the heartbeat fresh, as for workers.

Only a standalone beat (``celery beat``) writes it. In a producer ``beat_init`` never fires; in a
worker started with ``-B`` it does, in the embedded beat (a child process of the worker, or a thread
of it), and the component then writes nothing: the worker's own heartbeat (its main loop, its broker
state, its tasks, its pid for ``taskherd drain``) stays the only record in heartbeat.json. A beat
record there made liveness pass while the worker's main loop was stopped (the beat child kept
writing), and readiness and drain read beat's pid and state as the worker's.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import socket
import time
from typing import Any, Callable

from celery import Celery, signals

from taskherd.pod import shared_files

from . import Component

logger = logging.getLogger(__name__)


def beat_record(*, now: float, started_at: float, interval_seconds: float, pid: int, hostname: str) -> dict[str, Any]:
    """heartbeat.json for beat: a fresh `written_at`, no tasks of its own, never draining."""
    return {
        "format": shared_files.FORMAT,
        "role": "beat",
        "written_at": now,
        "interval_seconds": interval_seconds,
        "hostname": hostname,
        "pid": pid,
        "started_at": started_at,
        "broker": {"state": "connected", "since": started_at},
        "draining_since": None,
        "stopping_since": None,
        "active": [],
        "reserved": 0,
        "scheduled": 0,
        "pool_pids": [],
    }


def embedded_in_a_worker() -> bool:
    """True when the beat calling ``beat_init`` runs inside a worker (``celery worker -B``): Celery's
    embedded beat is a ``celery.beat._Process`` child (the current process) or a ``_Threaded`` thread."""
    import threading

    from celery import beat as celery_beat

    if isinstance(threading.current_thread(), celery_beat._Threaded):
        return True
    process_class = getattr(celery_beat, "_Process", None)
    if process_class is None:
        return False
    from billiard.process import current_process

    return isinstance(current_process(), process_class)


def beating(tick: Callable[[], Any], write: Callable[[], None]) -> Callable[..., Any]:
    """``tick`` followed by a heartbeat write (a failed write is logged, never raised into beat)."""

    def tick_and_beat(*args: Any, **kwargs: Any) -> Any:
        result = tick(*args, **kwargs)
        try:
            write()
        except OSError:
            logger.exception("taskherd: could not write beat's heartbeat")
        return result

    return tick_and_beat


@dataclasses.dataclass(frozen=True, kw_only=True)
class BeatHeartbeat(Component):
    """Writes heartbeat.json from a standalone beat's schedule loop (the chart's beat liveness probe
    reads it); a beat embedded in a worker (``-B``) leaves the file to the worker."""

    environment = {shared_files.DIR_ENV: "directory"}

    #: directory of heartbeat.json; None: $TASKHERD_HEARTBEAT_DIR or /tmp/taskherd
    directory: str | None = None

    def install(self, app: Celery, profile: Any = None) -> None:
        directory = self.directory

        def on_beat_init(sender: Any = None, **_: Any) -> None:
            if getattr(sender, "app", None) is not app:
                return
            if embedded_in_a_worker():
                logger.info("taskherd: beat runs inside a worker (-B): the worker's heartbeat is the only one "
                            "written; beat's loop is not watched by the liveness probe")
                return
            scheduler = sender.scheduler
            path = shared_files.heartbeat_path(shared_files.heartbeat_dir(directory))
            os.makedirs(os.path.dirname(path), exist_ok=True)
            started_at, hostname = time.time(), socket.gethostname()

            def write() -> None:
                shared_files.write_json_atomically(path, beat_record(
                    now=time.time(), started_at=started_at, interval_seconds=float(scheduler.max_interval),
                    pid=os.getpid(), hostname=hostname))

            write()
            scheduler.tick = beating(scheduler.tick, write)
            logger.info("taskherd: beat heartbeat in %s (loop at most every %ss)", path, scheduler.max_interval)

        signals.beat_init.connect(on_beat_init, weak=False, dispatch_uid=f"taskherd.beat_heartbeat.{id(app)}")
