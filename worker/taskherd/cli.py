"""The `taskherd` command: every subcommand registered here, each implemented in its own module.

Subcommand modules are imported only when run, so that `taskherd probe` (run by the kubelet every
few seconds) never pays for importing Celery, argparse or the other commands.
"""
import sys

#: subcommand -> (module with ``main(argv) -> int``, one line of help). Pod-side commands first.
COMMANDS = {
    "probe": ("taskherd.pod.probe", "liveness/readiness/startup probe reading the worker's heartbeat"),
    "drain": ("taskherd.pod.prestop", "preStop hook: stop consuming and wait for in-flight tasks"),
    "dlq": ("taskherd.commands.dlq", "list, show, redrive and purge dead-letter queues"),
    "outbox": ("taskherd.commands.outbox", "run the transactional outbox relay (relay, migrate, status)"),
    "exporter": ("taskherd.commands.exporter", "export queue depth, age and DLQ size as Prometheus metrics"),
    "recover": ("taskherd.commands.recover", "Redis: give back the unacked messages of dead workers"),
    "ping": ("taskherd.commands.ping", "send a ping task through the broker and wait for a worker to run it"),
}


def usage() -> str:
    lines = ["usage: taskherd [--version] [--help] <command> [options]", "", "commands:"]
    lines += [f"  {name:<10} {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["", "`taskherd <command> --help` describes each command's options."]
    return "\n".join(lines)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        print(usage(), file=sys.stderr)
        return 2
    if argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    if argv[0] in ("-V", "--version"):
        from taskherd.commands.options import version

        print(f"taskherd {version()}")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"taskherd: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    import importlib

    return importlib.import_module(COMMANDS[name][0]).main(rest)


if __name__ == "__main__":
    sys.exit(main())
