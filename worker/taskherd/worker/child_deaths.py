"""Pool processes that died under a task: by which signal or exit code, and whether the OOM killer did it.

With prefork, the kernel's OOM killer picks the pool child that grew (the largest process), not the
container's main process: the container lives on, so Kubernetes records no OOMKilled and no restart
— on cgroup v1, and on v2 unless ``memory.oom.group`` is set. Celery's main process does see it: the
task's request fails with ``WorkerLostError("Worker exited prematurely: signal 9 (SIGKILL) Job: 3.")``
and, with ``task_reject_on_worker_lost``, its message goes back to the queue.

:func:`record` (called by taskherd's Request in the main process) names the cause — ``OOMKilled``
when the container's memory cgroup counted an OOM kill not yet attributed to a death, otherwise the
signal (``SIGKILL``, ``SIGSEGV``, …) or ``ExitCode<n>`` — logs it, and counts it in
``taskherd_pool_child_deaths_total{task,cause}`` with its time in
``taskherd_pool_child_last_death_timestamp_seconds{task,cause}``. The operator reads both from every
worker pod into the WorkerPool's ``status.recentTerminations`` and a Warning Event.
"""
from __future__ import annotations

import logging
import re
import signal
import time
from pathlib import Path
from typing import Callable

logger = logging.getLogger(__name__)

OOM_KILLED = "OOMKilled"
#: The causes :func:`cause_of` names that are known before any death: the worker creates their
#: series at 0 for every task at start (taskherd.worker.components.metrics.create_known_series), so
#: that the first death of each shows in Prometheus's ``increase()``. ``ExitCode<n>`` and other
#: signals appear at their first death.
KNOWN_CAUSES = (OOM_KILLED, signal.SIGKILL.name, signal.SIGSEGV.name)
CGROUP_ROOT = Path("/sys/fs/cgroup")
_STATUS = re.compile(r"(?:signal (?P<signal>\d+)|exitcode (?P<exitcode>-?\d+))")


def parse_status(message: str) -> tuple[int | None, int | None]:
    """(signal number, exit code) from billiard's WorkerLostError text; (None, None) if neither."""
    match = _STATUS.search(message or "")
    if match is None:
        return None, None
    if match.group("signal"):
        return int(match.group("signal")), None
    return None, int(match.group("exitcode"))


def cause_of(signum: int | None, exitcode: int | None, *, oom_killed: bool) -> str:
    """``OOMKilled``, a signal name (``SIGKILL``), ``ExitCode<n>``, or ``Unknown``."""
    if signum == signal.SIGKILL and oom_killed:
        return OOM_KILLED
    if signum is not None:
        try:
            return signal.Signals(signum).name
        except ValueError:
            return f"Signal{signum}"
    return f"ExitCode{exitcode}" if exitcode is not None else "Unknown"


def _counter(text: str, name: str = "oom_kill") -> int | None:
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == name and value.strip().isdigit():
            return int(value)
    return None


def read_oom_kills(root: Path = CGROUP_ROOT, proc_cgroup: Path = Path("/proc/self/cgroup")) -> int | None:
    """OOM kills the kernel counted in this process's memory cgroup; None where it cannot be read.

    cgroup v2: ``memory.events``; v1: ``memory.oom_control`` under the memory controller. Inside a
    container the controller's mount is the container's own cgroup (the path /proc/self/cgroup
    names does not exist under it); on a host it is the whole tree, hence the path first."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        lines = []
    candidates = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            candidates.append(root / path.lstrip("/") / "memory.events")
        elif "memory" in controllers.split(","):
            candidates.append(root / "memory" / path.lstrip("/") / "memory.oom_control")
    candidates += [root / "memory.events", root / "memory" / "memory.oom_control"]
    for candidate in candidates:
        try:
            count = _counter(candidate.read_text())
        except OSError:
            continue
        if count is not None:
            return count
    return None


class OomKills:
    """Attributes the memory cgroup's OOM kills to deaths, one each: two children killed together
    are both OOMKilled, and a later plain SIGKILL is not."""

    def __init__(self, read: Callable[[], int | None] = read_oom_kills) -> None:
        self._read = read
        #: kills counted before this worker started belong to nobody here
        self._attributed = read() or 0

    def claim(self) -> bool:
        """True when an OOM kill is counted that no earlier death took."""
        count = self._read()
        if count is None or count <= self._attributed:
            return False
        self._attributed += 1
        return True


#: created when the worker imports the app, before its pool starts
_oom_kills = OomKills()


def record(task_name: str, message: str, *, task_id: str = "", now: Callable[[], float] = time.time) -> str:
    """Names, logs and counts one pool child's death under ``task_name``; returns its cause."""
    from .components.metrics import default_metrics

    signum, exitcode = parse_status(message)
    cause = cause_of(signum, exitcode, oom_killed=signum == signal.SIGKILL and _oom_kills.claim())
    metrics = default_metrics()
    metrics.child_deaths.labels(task_name, cause).inc()
    metrics.last_child_death.labels(task_name, cause).set(now())
    logger.error("taskherd: the pool process running %s[%s] died: %s (%s); its message goes back to the "
                 "queue, and the operator lists it in the WorkerPool's status.recentTerminations",
                 task_name, task_id, cause, message)
    return cause
