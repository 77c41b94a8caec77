"""`taskherd drain`: the preStop command. Asks the worker to drain and waits until it is idle.

It writes ``drain-request.json`` in the heartbeat directory (the worker's Drain component notices it
within ~0.25 s, stops consuming, returns unstarted messages to the queue and lets running tasks
finish — see taskherd.worker.components.drain), then follows heartbeat.json until no task is running.
No Celery import, no broker round trip, no signal: it works from an exec preStop hook and needs
nothing but the shared emptyDir.

Exit 0 when the worker is idle (SIGTERM then ends it at once); 1 at the deadline with tasks still
running, when the worker does not acknowledge the request, or when its heartbeat goes stale.
Kubernetes sends SIGTERM after preStop returns either way.
"""
from __future__ import annotations

import sys
import time

from taskherd import contract
from taskherd.pod import flags, probe, shared_files

DEADLINE_ENV = "TASKHERD_DRAIN_DEADLINE"
#: Seconds to wait for the worker to acknowledge the request before giving up.
ACKNOWLEDGE_TIMEOUT = 10.0
USAGE = (
    "usage: taskherd drain [--dir DIR] [--deadline SECONDS] [--poll SECONDS]\n"
    f"  --dir       heartbeat directory (default ${shared_files.DIR_ENV} or {shared_files.DEFAULT_DIR})\n"
    f"  --deadline  return after this many seconds even if tasks still run (default ${DEADLINE_ENV}, else none:\n"
    "              Kubernetes' terminationGracePeriodSeconds bounds the wait)\n"
    "  --poll      seconds between heartbeat reads (default 0.2)"
)


def drain_state(record: dict | None, *, requested_at: float, now: float, max_age: float | None = None) -> tuple[str, str]:
    """Where a drain stands: ("idle"|"draining"|"waiting"|"gone", reason). Pure: tested directly."""
    if record is None:
        return "gone", "the heartbeat file disappeared"
    fresh = probe.startup(record, now=now, max_age=max_age)
    if not fresh.ok:
        return "gone", fresh.reason
    draining_since = record.get("draining_since")
    if not draining_since or draining_since < requested_at:
        return "waiting", "the worker has not acknowledged the drain request yet"
    active = record.get("active") or []
    if active:
        names = ", ".join(f"{task.get('name')}[{task.get('id')}]" for task in active[:5])
        return "draining", f"{len(active)} task(s) still running: {names}"
    return "idle", "no task running"


def _parse(argv: list[str]) -> dict:
    options: dict = {"dir": None, "deadline": None, "poll": 0.2}
    flags.parse_flags(argv, {"--dir": "dir", "--deadline": "deadline", "--poll": "poll"}, options)
    # each bounded as its variable is (--deadline: TASKHERD_DRAIN_DEADLINE), refused here, before
    # drain-request.json is written: a wait that cannot be slept would leave the drain half-done
    for key, maximum in (("deadline", contract.MAX_DRAIN_SECONDS), ("poll", contract.MAX_SECONDS)):
        if options[key] is not None:
            options[key] = flags.seconds(f"option --{key}", options[key], maximum=maximum)
    if options["deadline"] is None:
        options["deadline"] = contract.read_one(DEADLINE_ENV)  # ContractError is a ValueError
    return options


def main(argv: list[str] | None = None) -> int:
    options, status = flags.command_line("drain", USAGE, _parse, sys.argv[1:] if argv is None else argv)
    if status is not None:
        return status
    started = time.time()
    path = shared_files.heartbeat_path(options["dir"])
    try:
        record = shared_files.read_json(path)
    except (OSError, ValueError) as exc:
        print(f"drain: cannot read heartbeat: {exc}")
        return 1
    if record is None:
        print(f"drain: no heartbeat at {path}: no worker to drain")
        return 0
    shared_files.write_json_atomically(shared_files.drain_request_path(options["dir"]),
                                         {"requested_at": started, "pid": record.get("pid")})
    deadline = started + options["deadline"] if options["deadline"] else None
    while True:
        now = time.time()
        try:
            record = shared_files.read_json(path)
        except (OSError, ValueError):
            record = {}  # mid-replace on an exotic filesystem: read again next poll
        if record != {}:
            state, reason = drain_state(record, requested_at=started, now=now)
            if state == "idle":
                print(f"drain: worker idle after {now - started:.1f}s")
                return 0
            if state == "gone":
                print(f"drain: stopped waiting after {now - started:.1f}s: {reason}")
                return 1
            if state == "waiting" and now - started > ACKNOWLEDGE_TIMEOUT:
                print(f"drain: the worker did not acknowledge the request within {ACKNOWLEDGE_TIMEOUT:g}s "
                      "(is the Drain component of taskherd.worker.configure installed?)")
                return 1
            if deadline is not None and now >= deadline:
                print(f"drain: deadline of {options['deadline']:g}s reached: {reason}")
                return 1
        time.sleep(options["poll"])


if __name__ == "__main__":
    sys.exit(main())
