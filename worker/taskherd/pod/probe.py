"""`taskherd probe liveness|readiness|startup`: Kubernetes exec probes that only read the heartbeat.

No Celery import, no broker round trip: the probe reads one small JSON file written by the worker's
main loop (see taskherd.worker.components.heartbeat) and decides. Exit 0 = pass, 1 = fail, 2 = usage error;
one line on stdout says why (the kubelet puts it in the pod's events).

- liveness fails when the heartbeat is stale (the main loop is wedged) or when a running task has
  outlived its hard time limit plus a margin (the pool failed to kill it: the pool is stuck).
  A broker outage alone does NOT fail liveness: the worker reconnects by itself and restarting
  every worker in the cluster during a broker blip helps nobody; readiness reports the outage.
  During a warm shutdown (SIGTERM) the main loop stops on purpose while the pool finishes: the
  record says ``stopping_since`` and liveness passes (the grace period bounds the shutdown).
- readiness passes when the heartbeat is fresh, the broker is connected and the worker is neither
  draining nor stopping.
- startup passes once the worker has written its first heartbeat.

The decisions are pure functions of the record and `now`, tested without a worker.
"""
import sys
import time

from taskherd.pod import flags, shared_files

# No dataclasses or typing imports: they would triple the probe's import time (python -X importtime).

#: A heartbeat older than this many intervals is stale (30 s at the default 5 s interval).
DEFAULT_STALE_INTERVALS = 6
#: Seconds a task may run past its hard limit before the pool counts as stuck. Celery's own
#: hard-limit kill needs a moment, and the heartbeat is up to one interval old.
DEFAULT_TASK_MARGIN = 30.0

KINDS = ("liveness", "readiness", "startup")
USAGE = (
    "usage: taskherd probe liveness|readiness|startup [--dir DIR] [--max-age SECONDS] "
    "[--task-margin SECONDS]\n"
    f"  --dir          heartbeat directory (default ${shared_files.DIR_ENV} or {shared_files.DEFAULT_DIR})\n"
    f"  --max-age      a heartbeat older than this is stale (default {DEFAULT_STALE_INTERVALS} x the worker's interval)\n"
    f"  --task-margin  liveness: seconds past a task's hard limit before failing (default {DEFAULT_TASK_MARGIN:g})"
)


class Verdict:
    """A probe's outcome: pass or fail, and the one-line reason."""

    __slots__ = ("ok", "reason")

    def __init__(self, ok: bool, reason: str):
        self.ok, self.reason = ok, reason

    def __repr__(self) -> str:
        return f"Verdict(ok={self.ok!r}, reason={self.reason!r})"


def max_age_for(record: dict[str, object], max_age: float | None) -> float:
    """The staleness threshold: the one given, else DEFAULT_STALE_INTERVALS x the record's interval."""
    if max_age is not None:
        return max_age
    return DEFAULT_STALE_INTERVALS * float(record.get("interval_seconds") or 5.0)


def _freshness(record: dict[str, object] | None, now: float, max_age: float | None) -> Verdict:
    if record is None:
        return Verdict(False, "no heartbeat file: the worker has not started (or its heartbeat is not installed)")
    if record.get("format") != shared_files.FORMAT:
        return Verdict(False, f"heartbeat format {record.get('format')!r} unknown (expected {shared_files.FORMAT})")
    age = now - float(record["written_at"])
    limit = max_age_for(record, max_age)
    if age > limit:
        return Verdict(False, f"heartbeat is {age:.1f}s old (limit {limit:g}s): the worker's main loop is not running")
    return Verdict(True, f"heartbeat {age:.1f}s old")


def stuck_tasks(record: dict[str, object], now: float, task_margin: float) -> list[str]:
    """Descriptions of running tasks past their hard time limit plus `task_margin`."""
    stuck = []
    for task in record.get("active") or []:
        limit, started = task.get("time_limit"), task.get("started_at")
        if limit and started and now - started > limit + task_margin:
            stuck.append(f"{task.get('name')}[{task.get('id')}] has run {now - started:.0f}s "
                         f"(hard limit {limit:g}s + margin {task_margin:g}s)")
    return stuck


def liveness(record: dict[str, object] | None, *, now: float, max_age: float | None = None,
             task_margin: float = DEFAULT_TASK_MARGIN) -> Verdict:
    fresh = _freshness(record, now, max_age)
    stopping_since = record.get("stopping_since") if record else None
    if stopping_since and record.get("format") == shared_files.FORMAT:
        # Warm shutdown: the main loop has stopped on purpose while the pool finishes its tasks;
        # the grace period bounds it. Restarting now would kill those tasks.
        fresh = Verdict(True, f"stopping (warm shutdown) for {now - stopping_since:.0f}s")
    if not fresh.ok:
        return fresh
    stuck = stuck_tasks(record, now, task_margin)
    if stuck:
        return Verdict(False, f"pool stuck: {stuck[0]}" + (f" and {len(stuck) - 1} more" if len(stuck) > 1 else ""))
    broker = (record.get("broker") or {}).get("state", "unknown")
    return Verdict(True, f"alive: {fresh.reason}, broker {broker}, {len(record.get('active') or [])} active")


def readiness(record: dict[str, object] | None, *, now: float, max_age: float | None = None) -> Verdict:
    fresh = _freshness(record, now, max_age)
    if not fresh.ok:
        return fresh
    broker = record.get("broker") or {}
    if broker.get("state") != "connected":
        since = broker.get("since")
        for_how_long = f" for {now - since:.0f}s" if since else ""
        return Verdict(False, f"broker {broker.get('state', 'unknown')}{for_how_long}")
    if record.get("draining_since"):
        return Verdict(False, f"draining for {now - record['draining_since']:.0f}s")
    if record.get("stopping_since"):
        return Verdict(False, f"stopping (warm shutdown) for {now - record['stopping_since']:.0f}s")
    return Verdict(True, f"ready: {fresh.reason}, broker connected")


def startup(record: dict[str, object] | None, *, now: float, max_age: float | None = None) -> Verdict:
    fresh = _freshness(record, now, max_age)
    return Verdict(True, f"started: {fresh.reason}") if fresh.ok else fresh


def judge(kind: str, record: dict[str, object] | None, *, now: float, max_age: float | None = None,
          task_margin: float = DEFAULT_TASK_MARGIN, source: str = "heartbeat") -> Verdict:
    """The verdict of probe `kind` (one of KINDS) on `record`; a malformed record fails it.
    Shared by the exec probe and the worker's HTTP probe endpoints."""
    try:
        if kind == "liveness":
            return liveness(record, now=now, max_age=max_age, task_margin=task_margin)
        if kind == "readiness":
            return readiness(record, now=now, max_age=max_age)
        if kind == "startup":
            return startup(record, now=now, max_age=max_age)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        return Verdict(False, f"malformed heartbeat {source}: {exc!r}")
    raise ValueError(f"probe kind must be one of {', '.join(KINDS)}, got {kind!r}")


def _parse(argv: list[str]) -> tuple[str, dict[str, object]]:
    if not argv or argv[0] not in KINDS:
        raise ValueError(f"probe kind must be one of {', '.join(KINDS)}, got {argv[0] if argv else 'nothing'!r}")
    options: dict[str, object] = {"dir": None, "max_age": None, "task_margin": DEFAULT_TASK_MARGIN}
    flags.parse_flags(argv[1:], {"--dir": "dir", "--max-age": "max_age", "--task-margin": "task_margin"}, options)
    if options["max_age"] is not None:
        options["max_age"] = flags.seconds("option --max-age", options["max_age"])
    options["task_margin"] = flags.seconds("option --task-margin", options["task_margin"], zero_allowed=True)
    return argv[0], options


def main(argv: list[str] | None = None) -> int:
    parsed, status = flags.command_line("probe", USAGE, _parse, sys.argv[1:] if argv is None else argv)
    if status is not None:
        return status
    kind, options = parsed
    path = shared_files.heartbeat_path(options["dir"])
    try:
        record = shared_files.read_json(path)
    except (OSError, ValueError) as exc:
        print(f"{kind} failed: cannot read heartbeat: {exc}")
        return 1
    verdict = judge(kind, record, now=time.time(), max_age=options["max_age"], task_margin=options["task_margin"],
                    source=path)
    print(f"{kind} {'ok' if verdict.ok else 'failed'}: {verdict.reason}")
    return 0 if verdict.ok else 1


if __name__ == "__main__":
    sys.exit(main())
