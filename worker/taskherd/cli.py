"""The `taskherd` command: one entry point, each subcommand owned by the module that implements it.

Subcommand modules are imported lazily so that `taskherd probe` (run by Kubernetes every few
seconds) never pays for importing Celery.
"""
from __future__ import annotations

import importlib
import sys

#: subcommand -> (module, help). Each module exposes ``main(argv: list[str]) -> int``.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "dlq": ("taskherd.worker.dlq_cli", "inspect, redrive and purge dead-letter queues"),
    "outbox": ("taskherd.worker.outbox_cli", "run the transactional outbox relay"),
    "probe": ("taskherd.probe", "liveness/readiness/startup probe reading the heartbeat"),
    "drain": ("taskherd.drain", "preStop: stop consuming and wait for in-flight tasks"),
    "exporter": ("taskherd.exporter", "export queue depth, age and DLQ size as Prometheus metrics"),
}


def usage() -> str:
    lines = ["usage: taskherd <command> [options]", "", "commands:"]
    lines += [f"  {name:<10} {help_}" for name, (_, help_) in SUBCOMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in SUBCOMMANDS:
        print(f"taskherd: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(SUBCOMMANDS[name][0])
    return module.main(rest)


if __name__ == "__main__":
    sys.exit(main())
