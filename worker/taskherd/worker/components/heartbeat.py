"""The heartbeat: a consumer bootstep in the worker's MAIN process that writes heartbeat.json.

Why a bootstep on the event loop's timer and not a thread: the record must go stale when the main
loop is wedged (a blocking call without timeout, a deadlock, SIGSTOP). A thread would keep ticking
while the loop that consumes, acknowledges and enforces time limits is dead.

While the broker is down Celery leaves the event loop and retries the connection in the main
thread (kombu's ``retry_over_time``, which calls back about once a second). The step hooks that
callback, so the heartbeat keeps being refreshed — by the main thread — with
``broker.state = "disconnected"``: readiness fails, liveness does not (see taskherd.probe).
A connection attempt that hangs without timeout stops the callbacks and does go stale.

The record (format 1, see taskherd.pod.shared_files): ``written_at``, ``interval_seconds``,
``hostname``, ``pid``, ``started_at``, ``broker`` {state, since}, ``draining_since``, ``stopping_since``,
``active`` [{id, name, started_at, worker_pid, time_limit, soft_time_limit}], ``reserved``,
``scheduled``, ``pool_pids``.

Caveat: with ``--pool solo`` tasks run on the main loop itself, so a task longer than the
staleness threshold fails liveness. Use prefork (the default) or threads.
"""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Any

from celery import Celery, bootsteps, signals
from celery.worker import state as worker_state

from taskherd.pod import shared_files

from . import Component, installed, is_seconds, too_long
from taskherd.contract import shown

logger = logging.getLogger(__name__)

#: Default interval between heartbeats, in seconds.
DEFAULT_INTERVAL = 5.0


@dataclass(frozen=True, kw_only=True)
class Heartbeat(Component):
    """Writes heartbeat.json from the worker's event loop, for `taskherd probe` and `taskherd drain`."""

    environment = {shared_files.DIR_ENV: "directory", "TASKHERD_HEARTBEAT_INTERVAL": "interval"}

    #: directory of heartbeat.json (an emptyDir in the pod); None: $TASKHERD_HEARTBEAT_DIR or /tmp/taskherd
    directory: str | None = None
    #: seconds between writes; the liveness probe calls the worker wedged after 6 missed
    interval: float = DEFAULT_INTERVAL

    @property
    def resolved_directory(self) -> str:
        return shared_files.heartbeat_dir(self.directory)

    def problems(self) -> list[str]:
        if not (is_seconds(self.interval) and self.interval > 0):
            return [f"Heartbeat(interval={shown(self.interval)}) must be a positive number of seconds"]
        # bounded as TASKHERD_HEARTBEAT_INTERVAL is: a heartbeat every 1e300 s would keep a wedged
        # worker alive as far as the liveness probe (6 missed intervals) can tell
        return too_long("Heartbeat(interval", self.interval)

    def install(self, app: Celery, profile: Any = None) -> None:
        app.steps["consumer"].add(HeartbeatStep)


def hard_limit(request: Any, app: Celery) -> tuple[float | None, float | None]:
    """(hard, soft) time limits the pool enforces for `request`: message, else task, else app config."""
    hard, soft = request.time_limits
    task = request.task
    return (hard or getattr(task, "time_limit", None) or app.conf.task_time_limit,
            soft or getattr(task, "soft_time_limit", None) or app.conf.task_soft_time_limit)


def active_tasks(app: Celery) -> list[dict[str, Any]]:
    tasks = []
    for request in tuple(worker_state.active_requests):
        hard, soft = hard_limit(request, app)
        tasks.append({"id": request.id, "name": request.name, "started_at": request.time_start,
                      "worker_pid": request.worker_pid, "time_limit": hard, "soft_time_limit": soft})
    return tasks


def pool_pids(consumer: Any) -> list[int]:
    try:
        return list(consumer.pool.info.get("processes") or [])
    except Exception:  # noqa: BLE001 - pools without `info` (or not started yet) just report none
        return []


class HeartbeatStep(bootsteps.StartStopStep):
    """Consumer bootstep: refreshes heartbeat.json from the event loop's timer."""

    name = "taskherd.worker.components.heartbeat.HeartbeatStep"
    requires = ("celery.worker.consumer.tasks:Tasks",)

    def __init__(self, c: Any, **kwargs: Any):
        super().__init__(c, **kwargs)
        self.settings: Heartbeat = installed(c.app, Heartbeat) or Heartbeat.from_env()
        self.directory = self.settings.resolved_directory
        self.path = shared_files.heartbeat_path(self.directory)
        self.started_at = time.time()
        self.broker_state, self.broker_since = "connecting", self.started_at
        self.last_written = 0.0
        self.timer_entry = None
        #: Set by the drain step (taskherd.worker.draining) when draining begins.
        self.draining_since: float | None = None
        #: Set when a warm shutdown stops the consumer.
        self.stopping_since: float | None = None
        os.makedirs(self.directory, exist_ok=True)
        self._warn_if_shared()
        # The emptyDir outlives a container restart: a previous incarnation's record must not
        # satisfy the startup probe of this one.
        shared_files.remove(self.path)
        c.taskherd_heartbeat = self
        self._hook_reconnect_loop(c)
        signals.worker_shutting_down.connect(lambda **_: self.on_shutting_down(c), weak=False,
                                             dispatch_uid=f"taskherd.heartbeat.{id(self)}")

    # -- bootstep protocol -------------------------------------------------------------------
    def start(self, c: Any) -> None:
        self._set_broker_state("connected")
        self.write(c)
        self._cancel_timer(c)
        self.timer_entry = c.timer.call_repeatedly(self.settings.interval, self._write_quietly, (c,), priority=10)

    def stop(self, c: Any) -> None:
        # Called when the connection is lost, before Celery reconnects.
        self._cancel_timer(c)
        if self.stopping_since is None:
            self._set_broker_state("disconnected")
        self._write_quietly(c)

    def on_shutting_down(self, c: Any) -> None:
        """SIGTERM/SIGINT/SIGQUIT (Celery's worker_shutting_down, in the main thread).

        The main loop is about to stop for good while the pool finishes its tasks: say so, rather
        than go stale and have the kubelet restart a worker that is finishing its work.
        """
        self.stopping_since = self.stopping_since or time.time()
        self._write_quietly(c)

    def shutdown(self, c: Any) -> None:
        self._cancel_timer(c)

    # -- the record --------------------------------------------------------------------------
    def record(self, c: Any, now: float) -> dict[str, Any]:
        active = active_tasks(c.app)
        return {
            "format": shared_files.FORMAT,
            "written_at": now,
            "interval_seconds": self.settings.interval,
            "hostname": c.hostname,
            "pid": os.getpid(),
            "started_at": self.started_at,
            "broker": {"state": self._observed_broker_state(c), "since": self.broker_since},
            "draining_since": self.draining_since,
            "stopping_since": self.stopping_since,
            "active": active,
            "reserved": max(0, len(worker_state.reserved_requests) - len(active)),
            "scheduled": len(worker_state.scheduled_requests),
            "pool_pids": pool_pids(c),
        }

    def write(self, c: Any) -> None:
        now = time.time()
        record = self.record(c, now)
        shared_files.write_json_atomically(self.path, record)
        self.last_written = now
        if self.stopping_since and not record["stopping_since"]:
            # The shutdown signal handler ran in the middle of this write and wrote its own record,
            # which this older one just replaced: write the current state again.
            shared_files.write_json_atomically(self.path, self.record(c, time.time()))

    # -- internals ---------------------------------------------------------------------------
    def _warn_if_shared(self) -> None:
        try:
            previous = shared_files.read_json(self.path) or {}
        except (OSError, ValueError):
            return
        pid = previous.get("pid")
        if isinstance(pid, int) and pid != os.getpid():
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            except PermissionError:
                pass
            logger.warning("taskherd: worker pid %d also writes its heartbeat in %s: give each worker its own "
                           "%s, or their probes and drains will mix them up", pid, self.directory,
                           shared_files.DIR_ENV)
    def _write_quietly(self, c: Any) -> None:
        try:
            self.write(c)
        except Exception:  # noqa: BLE001 - a full disk must not stop Celery's own recovery
            logger.exception("taskherd: could not write heartbeat %s", self.path)

    def _set_broker_state(self, state: str) -> None:
        if state != self.broker_state:
            self.broker_state, self.broker_since = state, time.time()

    def _observed_broker_state(self, c: Any) -> str:
        if self.broker_state == "connected":
            connection = getattr(c, "connection", None)
            try:
                if connection is None or not connection.connected:
                    return "disconnected"
            except Exception:  # noqa: BLE001 - a transport that cannot tell is taken at its word
                pass
        return self.broker_state

    def _cancel_timer(self, c: Any) -> None:
        if self.timer_entry is not None:
            c.timer.cancel(self.timer_entry)
            self.timer_entry = None

    def _on_reconnect_tick(self, c: Any) -> None:
        """Runs in the main thread on each (re)connection retry, about once a second."""
        if self.broker_state == "connected":
            self._set_broker_state("disconnected")
        changed = self.last_written < self.broker_since
        if changed or time.time() - self.last_written >= self.settings.interval:
            self._write_quietly(c)

    def _hook_reconnect_loop(self, c: Any) -> None:
        """Wraps this consumer's ensure_connected so that its retry callback also beats.

        Celery passes ``callback=maybe_shutdown`` to ``Connection.ensure_connection``; kombu calls
        it after every failed attempt and every second while sleeping between attempts.
        Only this consumer instance and the connections it opens are touched.
        """
        original = c.ensure_connected

        def ensure_connected(conn: Any) -> Any:
            ensure_connection = conn.ensure_connection

            def ensure_connection_with_heartbeat(*args: Any, **kwargs: Any) -> Any:
                callback = kwargs.get("callback")

                def tick() -> None:
                    self._on_reconnect_tick(c)
                    if callback is not None:
                        callback()

                kwargs["callback"] = tick
                return ensure_connection(*args, **kwargs)

            conn.ensure_connection = ensure_connection_with_heartbeat
            return original(conn)

        c.ensure_connected = ensure_connected
