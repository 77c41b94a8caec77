"""Command-line options shared by the `taskherd` commands, spelled as Celery spells them.

``-A/--app``, ``-b/--broker``, ``-Q/--queues`` as in ``celery``; one spelling each for the Redis key
prefix (``--global-keyprefix``, kombu's transport option) and for dead-letter queue naming
(``--dead-letter-queues`` one per queue, else ``--dead-letter-pattern``). Defaults come from the
chart's contract (taskherd.contract), so a command run inside a worker pod needs no flag.
"""
from __future__ import annotations

import argparse
import math
from importlib import metadata

from taskherd import contract

#: The longest interval or timeout a command takes, in seconds (a week). Larger values are typos
#: (a unit slip, 1e309 = inf) and Python's sleep and wait overflow on them with a traceback.
MAX_SECONDS = 7 * 24 * 3600.0


class Parser(argparse.ArgumentParser):
    """argparse without abbreviations: an option is written whole, as Celery's command line (click)
    wants it. With them `taskherd worker --time=1800` was taken for --time-limit while the chart's
    check of extraArgs and `celery worker` both read it as another option, and an option added
    later would change what an abbreviation in a deployed command line means."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)


def version() -> str:
    try:
        return metadata.version("taskherd")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


def from_env(parser: argparse.ArgumentParser, name: str):
    """The value of contract variable ``name`` (its default when unset), for an option left out.

    Read only when the option was not given, so a bad variable never blocks a command that
    overrides it. An invalid value is a usage error naming the variable as written and its valid
    range: ignoring it would run against another broker or queue than the one the user set."""
    values, problems = contract.read((name,))
    if problems:
        parser.error(problems[0])
    value = values[name]
    return ",".join(value) if isinstance(value, tuple) else value


def _env(name: str) -> str | None:
    """For help texts and defaults that cannot fail: the variable's value, None when unset or invalid."""
    values, _ = contract.read((name,))
    value = values.get(name)
    return ",".join(value) if isinstance(value, tuple) else value


def seconds(flag: str, *, allow_zero: bool = False):
    """An argparse ``type`` for a duration: a finite number of seconds in (0 or >0)..MAX_SECONDS.

    argparse's own message names the flag ("argument --timeout: …"); ``flag`` is repeated in the
    text so that it reads on its own too."""
    low = ">= 0" if allow_zero else "> 0"

    def parse(raw: str) -> float:
        try:
            value = float(raw)
        except ValueError:
            value = math.nan
        if not (value >= 0 if allow_zero else value > 0) or not value <= MAX_SECONDS:
            raise argparse.ArgumentTypeError(f"{flag}={raw!r} is not a number of seconds {low} and <= "
                                             f"{MAX_SECONDS:.0f} (a week)")
        return value
    return parse


def whole_number(flag: str, minimum: int, maximum: int | None = None):
    """An argparse ``type`` for an integer in minimum..maximum (no maximum: minimum or more)."""
    valid = f"an integer in {minimum}..{maximum}" if maximum is not None else f"an integer >= {minimum}"

    def parse(raw: str) -> int:
        try:
            value = int(raw)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag}={raw!r} is not {valid}") from None
        if value < minimum or (maximum is not None and value > maximum):
            raise argparse.ArgumentTypeError(f"{flag}={raw!r} is not {valid}")
        return value
    return parse


def not_empty(flag: str):
    """An argparse ``type`` refusing an empty (or blank) name instead of falling back to a default."""
    def parse(raw: str) -> str:
        if not raw.strip():
            raise argparse.ArgumentTypeError(f"{flag}={raw!r} is empty (valid: a queue name)")
        return raw.strip()
    return parse


def base_url(flag: str):
    """An argparse ``type`` for an http(s) base URL (an API's root), judged as its variable is
    (contract.http_url_problem), shown without its password."""
    def parse(raw: str) -> str:
        problem = contract.http_url_problem(raw, base=True)
        if problem:
            raise argparse.ArgumentTypeError(f"{flag}={contract.redact(raw)!r}"
                                             + contract.said_with_valid(problem, contract.HTTP_BASE_URL_VALID))
        return raw
    return parse


def broker_errors() -> tuple[type[BaseException], ...]:
    """What a broker that cannot be reached (refused, timed out, bad credentials, no such database)
    raises through redis-py, py-amqp or kombu: the commands report it in one line, without traceback."""
    import amqp.exceptions
    import kombu.exceptions
    import redis.exceptions

    return (OSError, redis.exceptions.RedisError, amqp.exceptions.ConnectionError, amqp.exceptions.AccessRefused,
            kombu.exceptions.OperationalError)


def add_broker(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-b", "--broker", default=None,
                        help="broker URL, redis://… or amqp://… (default: $TASKHERD_BROKER_URL)")


class AppNotFound(ValueError):
    """-A/--app names a module that is not there (a usage error: exit 2, one line)."""


def find_app(spec: str):
    """The Celery app ``spec`` names, found as ``celery -A`` finds it (a module, ``module:attribute``,
    from the working directory too). A module that is not there is :class:`AppNotFound`; an import
    failing inside the user's own module is raised as it is: its traceback is what they need."""
    import os
    import sys

    from celery.app.utils import find_app as celery_find_app

    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        return celery_find_app(spec)
    except ModuleNotFoundError as exc:
        if not exc.name or not spec.split(":")[0].startswith(exc.name):
            raise
        raise AppNotFound(f"--app={spec!r}: no module named {exc.name!r} (valid: a module path as for "
                          f"`celery -A`, e.g. myproject.celery or myproject.celery:app)") from None


def add_app(parser: argparse.ArgumentParser, help_: str) -> None:
    parser.add_argument("-A", "--app", help=help_)


def add_queues(parser: argparse.ArgumentParser, help_: str) -> None:
    # --queue too: the 0.1 docs wrote `taskherd dlq list --queue orders`, which argparse took as an
    # abbreviation of --queues; abbreviations are gone (Parser), that spelling stays
    parser.add_argument("-Q", "--queues", "--queue", action="append", default=[], metavar="QUEUES",
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
    from_environment = None if args.queues else from_env(parser, "TASKHERD_QUEUES")
    raw = args.queues or ([from_environment] if from_environment else [])
    names = [name.strip() for item in raw for name in item.split(",")]
    if any(not name for name in names):
        parser.error(f"-Q/--queues={','.join(raw)!r} has an empty queue name")
    return names


def dead_letter_queues(parser: argparse.ArgumentParser, args: argparse.Namespace,
                       queue_names: list[str]) -> dict[str, str]:
    """{queue: DLQ} from --dead-letter-queues / $TASKHERD_DEAD_LETTER_QUEUES or the pattern."""
    explicit_raw = args.dead_letter_queues or from_env(parser, "TASKHERD_DEAD_LETTER_QUEUES")
    explicit = [name.strip() for name in explicit_raw.split(",")] if explicit_raw else None
    try:
        return contract.dead_letter_queues(queue_names, explicit, args.dead_letter_pattern,
                                           source="--dead-letter-queues" if explicit else "--dead-letter-pattern")
    except contract.ContractError as exc:
        parser.error(str(exc))
        raise  # parser.error exits; this line is never reached


def broker(parser: argparse.ArgumentParser, args: argparse.Namespace, *, kinds: tuple[str, ...] = ("redis", "amqp"),
           required: bool = True):
    """The broker URL of -b/$TASKHERD_BROKER_URL, checked to be of one of ``kinds`` and to parse
    (a usage error naming -b/--broker otherwise); also stored back in ``args.broker``."""
    flag = "-b/--broker"
    if args.broker is None:  # not given: the variable, named as the user wrote it in errors
        args.broker, flag = from_env(parser, "TASKHERD_BROKER_URL"), "TASKHERD_BROKER_URL"
    if not args.broker:
        if not required:
            return None
        parser.error("-b/--broker is required (or set TASKHERD_BROKER_URL)")
    if contract.broker_kind(args.broker) not in kinds:
        valid = ", ".join(f"{scheme}://" for kind in kinds for scheme in
                          (contract.REDIS_SCHEMES if kind == "redis" else contract.AMQP_SCHEMES))
        parser.error(f"{flag}={args.broker.partition('://')[0]}://… is not supported here (valid: {valid})")
    problem = contract.url_problem(args.broker)
    if problem:
        parser.error(f"{flag}={contract.redact(args.broker)!r}: {problem}")
    return args.broker
