"""Command-line options shared by the `taskherd` commands, spelled as Celery spells them.

``-A/--app``, ``-b/--broker``, ``-Q/--queues`` as in ``celery``; one spelling each for the Redis key
prefix (``--global-keyprefix``, kombu's transport option) and for dead-letter queue naming
(``--dead-letter-queues`` one per queue, else ``--dead-letter-pattern``). Defaults come from the
chart's contract (taskherd.contract), so a command run inside a worker pod needs no flag.
"""
from __future__ import annotations

import argparse
from importlib import metadata

from taskherd import contract


def version() -> str:
    try:
        return metadata.version("taskherd")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


def _env(name: str) -> str | None:
    values, _ = contract.read((name,))
    value = values.get(name)
    return ",".join(value) if isinstance(value, tuple) else value


def add_broker(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-b", "--broker", default=_env("TASKHERD_BROKER_URL"),
                        help="broker URL, redis://… or amqp://… (default: $TASKHERD_BROKER_URL)")


def add_app(parser: argparse.ArgumentParser, help_: str) -> None:
    parser.add_argument("-A", "--app", help=help_)


def add_queues(parser: argparse.ArgumentParser, help_: str) -> None:
    parser.add_argument("-Q", "--queues", action="append", default=[], metavar="QUEUES",
                        help=f"{help_}; comma-separated or repeated (default: $TASKHERD_QUEUES)")


def add_dead_letter_naming(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dead-letter-queues", metavar="DLQS",
                        help="one dead-letter queue per queue of -Q, comma-separated, same order "
                             "(default: $TASKHERD_DEAD_LETTER_QUEUES, else the pattern)")
    parser.add_argument("--dead-letter-pattern", default=contract.DEFAULT_DEAD_LETTER_PATTERN, metavar="PATTERN",
                        help="DLQ name of each queue; {queue} is replaced (default: %(default)s)")


def add_keyprefix(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--global-keyprefix", default=_env("TASKHERD_GLOBAL_KEYPREFIX") or "",
                        help="Redis: kombu's global_keyprefix transport option, if the app sets one "
                             "(default: $TASKHERD_GLOBAL_KEYPREFIX)")


def queues(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[str]:
    """The queues of -Q, else $TASKHERD_QUEUES; an error naming the flag when a name is empty."""
    from_env = _env("TASKHERD_QUEUES")
    raw = args.queues or ([from_env] if from_env else [])
    names = [name.strip() for item in raw for name in item.split(",")]
    if any(not name for name in names):
        parser.error(f"-Q/--queues={','.join(raw)!r} has an empty queue name")
    return names


def dead_letter_queues(parser: argparse.ArgumentParser, args: argparse.Namespace,
                       queue_names: list[str]) -> dict[str, str]:
    """{queue: DLQ} from --dead-letter-queues / $TASKHERD_DEAD_LETTER_QUEUES or the pattern."""
    explicit_raw = args.dead_letter_queues or _env("TASKHERD_DEAD_LETTER_QUEUES")
    explicit = [name.strip() for name in explicit_raw.split(",")] if explicit_raw else None
    try:
        return contract.dead_letter_queues(queue_names, explicit, args.dead_letter_pattern,
                                           source="--dead-letter-queues" if explicit else "--dead-letter-pattern")
    except contract.ContractError as exc:
        parser.error(str(exc))
        raise  # parser.error exits; this line is never reached


def broker(parser: argparse.ArgumentParser, args: argparse.Namespace, *, kinds: tuple[str, ...] = ("redis", "amqp")):
    """The broker URL of -b/$TASKHERD_BROKER_URL, checked to be of one of ``kinds``."""
    if not args.broker:
        parser.error("-b/--broker is required (or set TASKHERD_BROKER_URL)")
    if contract.broker_kind(args.broker) not in kinds:
        valid = ", ".join(f"{scheme}://" for kind in kinds for scheme in
                          (contract.REDIS_SCHEMES if kind == "redis" else contract.AMQP_SCHEMES))
        parser.error(f"-b/--broker={args.broker.partition('://')[0]}://… is not supported here (valid: {valid})")
    return args.broker
