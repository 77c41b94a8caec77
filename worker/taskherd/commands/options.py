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
#: The contract's: a flag and its variable take the same range.
MAX_SECONDS = float(contract.MAX_SECONDS)



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


def seconds(flag: str, *, allow_zero: bool = False, maximum: float = MAX_SECONDS):
    """An argparse ``type`` for a duration: a finite number of seconds in (0 or >0)..``maximum``
    (the bound of its variable, when it has one: contract.MAX_TIMEOUT_SECONDS, …).

    argparse's own message names the flag ("argument --timeout: …"); ``flag`` is repeated in the
    text so that it reads on its own too."""
    valid = contract.seconds_valid(int(maximum))
    if allow_zero:
        valid = valid.replace("> 0", ">= 0", 1)

    def parse(raw: str) -> float:
        try:
            value = float(raw)
        except ValueError:
            value = math.nan
        if not (value >= 0 if allow_zero else value > 0) or not value <= maximum:
            raise argparse.ArgumentTypeError(f"{flag}={raw!r} is not {valid}")
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


def listen_address(flag: str):
    """An argparse ``type`` for an address to serve on, judged as TASKHERD_METRICS_ADDR is
    (contract.listen_address), when the command line is read: not at the first bind, after a
    broker poll, with a traceback for a label too long for IDNA."""
    def parse(raw: str) -> str:
        try:
            return contract.listen_address(raw)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag}={raw!r} is not {contract.LISTEN_ADDRESS_VALID}") from None
    return parse


def broker_errors() -> tuple[type[BaseException], ...]:
    """What a broker that cannot be reached (refused, timed out, bad credentials, no such database)
    raises through redis-py, py-amqp or kombu: the commands report it in one line, without traceback."""
    import amqp.exceptions
    import kombu.exceptions
    import redis.exceptions

    return (OSError, redis.exceptions.RedisError, amqp.exceptions.ConnectionError, amqp.exceptions.AccessRefused,
            kombu.exceptions.OperationalError)


def add_broker(parser: argparse.ArgumentParser, schemes: tuple[str, ...] | None = None, note: str = "") -> None:
    """-b/--broker; its help names ``schemes``, those the command's broker() check takes (None: every
    broker URL Celery takes, Redis or RabbitMQ), and ``note`` after them (what it is not for)."""
    said = ("redis://… or amqp://…" if schemes is None
            else ", ".join(f"{scheme}://…" for scheme in schemes[:-1]) + f" or {schemes[-1]}://…"
            if len(schemes) > 1 else f"{schemes[0]}://…")
    parser.add_argument("-b", "--broker", default=None,
                        help=f"broker URL, {said}{'; ' + note if note else ''} (default: $TASKHERD_BROKER_URL)")


class AppNotFound(ValueError):
    """-A/--app names no Celery app: a spec that is no module path, a module that is not there, an
    attribute it has not, something that is not a Celery app (a usage error: exit 2, one line)."""


class AppImportFailed(Exception):
    """Importing the module of -A/--app raised: the user's own code (or what it imports) failed at
    import time. ``error`` is that exception, with its traceback: what the commands show
    (:func:`report_app_import_failure`), exit 1, as ``celery -A`` shows it."""

    def __init__(self, spec: str, error: BaseException):
        self.spec, self.error = spec, error
        super().__init__(f"-A/--app={spec!r}: importing it raised {type(error).__name__}: {error}")


_APP_VALID = "valid: a module path as for `celery -A`, e.g. myproject.celery or myproject.celery:app"


def _spec_problem(spec: str) -> str | None:
    """What makes ``spec`` no module path at all, before anything is imported (importlib's ValueError
    for ':' and the ModuleNotFoundError of ':app' or 'a:b:c' would read like the user's own errors).
    Dots are left to Celery, which reads '.mod' and 'mod.' as 'mod'."""
    module, colon, attribute = spec.partition(":")
    if not module.strip():
        return "no module before ':'" if colon else "empty"
    if ":" in attribute:
        return "more than one ':'"
    return None


def _raised_in_module_code(exc: BaseException) -> bool:
    """Whether ``exc`` was raised while a module's top-level code ran (the user's module, or one it
    imports): its traceback passes through a ``<module>`` frame. An import that fails before any
    module code runs (no such module, importlib refusing the name) has none."""
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_name == "<module>":
            return True
        tb = tb.tb_next
    return False


def find_app(spec: str):
    """The Celery app ``spec`` names, found as ``celery -A`` finds it (a module, ``module:attribute``,
    from the working directory too). A spec that is no module path, a module that is not there, an
    attribute it has not, or what is not a Celery app is :class:`AppNotFound`; an import failing
    inside the user's own module is raised as it is (not kombu's ``ValueError("Couldn't import …")``
    wrapping of it): its traceback is what they need."""
    import os
    import sys

    from celery import Celery
    from celery.app.utils import find_app as celery_find_app

    problem = _spec_problem(spec)
    if problem:
        raise AppNotFound(f"-A/--app={spec!r}: {problem} ({_APP_VALID})")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    module, _, attribute = spec.partition(":")
    users_error = None
    try:
        app = celery_find_app(spec)
    except ModuleNotFoundError as exc:
        if _raised_in_module_code(exc):  # the user's module imports something that is not there
            raise
        if exc.name and (exc.name == module or module.startswith(exc.name + ".")):
            raise AppNotFound(f"-A/--app={spec!r}: no module named {exc.name!r} ({_APP_VALID})") from None
        # Celery imports 'module:attribute' as a module when the attribute is missing; the module
        # itself was imported (else its own error is the user's to see)
        if exc.name and exc.name.startswith(module + ":") and module in sys.modules:
            raise AppNotFound(f"-A/--app={spec!r}: module {module!r} has no attribute {attribute!r} "
                              f"({_APP_VALID})") from None
        raise
    except AttributeError as exc:  # a module without app, celery or any Celery instance in it
        if module not in sys.modules or _raised_in_module_code(exc):
            raise
        raise AppNotFound(f"-A/--app={spec!r}: module {module!r} has no Celery app (no attribute app or "
                          f"celery, no Celery instance; {_APP_VALID})") from None
    except ValueError as exc:
        if not _raised_in_module_code(exc):  # importlib refusing the name itself
            raise AppNotFound(f"-A/--app={spec!r}: {exc} ({_APP_VALID})") from None
        # kombu's symbol_by_name turns any ValueError raised while importing (int('x'), a ProfileError
        # of configure(), a bad TASKHERD_* variable) into ValueError("Couldn't import 'spec': …"),
        # raised while handling it: the user's own exception is its context
        wrapped = exc.__context__
        users_error = wrapped if isinstance(wrapped, ValueError) and str(exc).startswith("Couldn't import") else exc
    if users_error is not None:
        raise users_error  # outside the except clause: its own traceback and context, not kombu's wrapper
    if not isinstance(app, Celery):  # 'module:function': the worker would fail on it later, deeper
        raise AppNotFound(f"-A/--app={spec!r} names a {type(app).__name__}, not a Celery app ({_APP_VALID})")
    return app


def load_app(spec: str):
    """:func:`find_app` for the commands: :class:`AppNotFound` as it is (a usage error), and whatever
    the user's module raised while it was imported as :class:`AppImportFailed` holding it."""
    try:
        return find_app(spec)
    except AppNotFound:
        raise
    except Exception as exc:  # noqa: BLE001 - anything the user's module raises at import
        raise AppImportFailed(spec, exc) from exc


def report_app_import_failure(prog: str, failure: AppImportFailed, file=None) -> None:
    """The user's error first and whole (a ProfileError names every problem), then where the import
    raised it, then its traceback as Python (and ``celery -A``) prints it; no usage hint: the spec is
    right, the module is wrong."""
    import sys
    import traceback

    file = file if file is not None else sys.stderr
    error = failure.error
    print(f"{prog}: {str(error) or type(error).__name__}", file=file)
    print(f"({type(error).__name__} raised while importing -A/--app={failure.spec!r}; its traceback follows)",
          file=file)
    traceback.print_exception(error, file=file)
    file.flush()


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


def _names(parser: argparse.ArgumentParser, source: str, raw: str) -> list[str]:
    """The comma-separated names of ``raw``; a usage error naming ``source`` for an empty one or one
    named twice (configure() refuses both, in the same words: a queue watched twice was counted twice)."""
    names = [name.strip() for name in raw.split(",")]
    if any(not name for name in names):
        parser.error(f"{source}={raw!r} has an empty queue name (valid: names separated by commas)")
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        parser.error(f"{source}={raw!r} names {', '.join(map(repr, duplicates))} more than once "
                     f"(valid: each queue once)")
    return names


def queues(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[str]:
    """The queues of -Q, else $TASKHERD_QUEUES; an error naming the one written when a name is empty
    or repeated."""
    if args.queues:
        return _names(parser, "-Q/--queues", ",".join(args.queues))
    from_environment = from_env(parser, "TASKHERD_QUEUES")
    return _names(parser, "TASKHERD_QUEUES", from_environment) if from_environment else []


def dead_letter_queues(parser: argparse.ArgumentParser, args: argparse.Namespace,
                       queue_names: list[str]) -> dict[str, str]:
    """{queue: DLQ} from --dead-letter-queues / $TASKHERD_DEAD_LETTER_QUEUES or the pattern."""
    source = "--dead-letter-queues"  # given, even empty: a blank flag is no silent fall-back to the pattern
    explicit_raw = args.dead_letter_queues
    if explicit_raw is None:
        source, explicit_raw = "TASKHERD_DEAD_LETTER_QUEUES", from_env(parser, "TASKHERD_DEAD_LETTER_QUEUES")
    explicit = _names(parser, source, explicit_raw) if explicit_raw is not None else None
    try:
        return contract.dead_letter_queues(queue_names, explicit, args.dead_letter_pattern,
                                           source=source if explicit else "--dead-letter-pattern")
    except contract.ContractError as exc:
        parser.error(str(exc))
        raise  # parser.error exits; this line is never reached


def queue_name_problem(name: str, broker_url: str) -> str | None:
    """Why the broker of ``broker_url`` cannot take ``name`` as a queue name, with the valid range,
    or None: the rule the reliability profile applies to the worker's queues (a name that cannot be
    encoded in UTF-8; on RabbitMQ one over AMQP's 255 bytes, which py-amqp fails to pack with a
    struct.error). On Redis a name is part of a key, which may be far longer."""
    from taskherd.worker.profile import AMQP_MAX_NAME_BYTES

    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError as exc:
        return (f"cannot be encoded in UTF-8 ({exc.reason} at {exc.start}) (valid: a name of Unicode characters, "
                f"no lone surrogates)")
    if contract.broker_kind(broker_url) == "amqp" and size > AMQP_MAX_NAME_BYTES:
        return (f"is {size} bytes in UTF-8; RabbitMQ takes queue names of at most {AMQP_MAX_NAME_BYTES} bytes "
                f"(valid: a name of at most {AMQP_MAX_NAME_BYTES} bytes)")
    return None


def shown_name(name: str, limit: int = 60) -> str:
    """``name`` as an error shows it: repr'd, cut after ``limit`` characters."""
    return repr(name) if len(name) <= limit else repr(name[:limit]) + f"…({len(name)} characters)"


def check_queue_name(parser: argparse.ArgumentParser, source: str, name: str, broker_url: str) -> None:
    """A usage error naming ``source`` (the flag or variable as written) when the broker cannot take
    queue name ``name`` (:func:`queue_name_problem`), before anything is read or changed."""
    problem = queue_name_problem(name, broker_url)
    if problem:
        parser.error(f"{source}={shown_name(name)} {problem}")


#: what a broker kind is called when a command says it connects to it
_KIND_NAMES = {"redis": "Redis", "amqp": "RabbitMQ"}


def _refused_scheme(prog: str, scheme: str, url: str, schemes: tuple[str, ...], not_for: dict[str, str]) -> str:
    """Why ``prog`` refuses ``scheme``, said from what it connects to (its ``schemes``): a scheme of a
    broker it reads but through a client that cannot open that URL, or a broker it is not for at all
    (then ``not_for``'s reason for that kind, when given)."""
    kind = contract.broker_kind(url)
    taken = [k for k in _KIND_NAMES if any(contract.broker_kind(f"{s}://") == k for s in schemes)]
    if kind in taken:
        client = "redis-py" if kind == "redis" else "py-amqp"
        return f": {prog} talks to {_KIND_NAMES[kind]} with {client}, which takes no {scheme}:// URL"
    reason = f": {prog} is for {' and '.join(_KIND_NAMES[k] for k in taken)} brokers only"
    return reason + (f" ({not_for[kind]})" if kind in not_for else "")


def broker(parser: argparse.ArgumentParser, args: argparse.Namespace, *,
           schemes: tuple[str, ...] = contract.REDIS_SCHEMES + contract.AMQP_SCHEMES,
           failover: tuple[str, ...] | None = None, required: bool = True, not_for: dict[str, str] | None = None):
    """The broker URL of -b/$TASKHERD_BROKER_URL, checked to parse and to be one the command can use:
    each URL of one of ``schemes`` (what it connects with takes: through Celery, every broker
    scheme of the contract; contract.REDIS_PY_SCHEMES, PY_AMQP_SCHEMES for a command's own clients:
    sentinel:// and redis+socket:// were a ValueError traceback, librabbitmq:// an ImportError), and one URL
    unless its scheme is in ``failover`` (None: all of ``schemes``), as redis-py reads
    'redis://a/1;redis://b/1' as host a, database 0. A usage error naming -b/--broker or the
    variable as written otherwise, saying what the command connects to (``not_for``: broker kind ->
    why the command is not for it); also stored back in ``args.broker``."""
    flag = "-b/--broker"
    if args.broker is None:  # not given: the variable, named as the user wrote it in errors
        args.broker, flag = from_env(parser, "TASKHERD_BROKER_URL"), "TASKHERD_BROKER_URL"
    if not args.broker:
        if not required:
            return None
        parser.error("-b/--broker is required (or set TASKHERD_BROKER_URL)")
    problem = contract.url_problem(args.broker)  # first: an empty item between ';' has no scheme to judge
    if problem:
        parser.error(f"{flag}={contract.redact(args.broker)!r}: {problem}")
    valid = ", ".join(f"{scheme}://" for scheme in schemes)
    used = []
    for one in args.broker.split(";"):
        scheme, separator, _ = one.partition("://")
        if not separator:
            parser.error(f"{flag}={contract.redact(args.broker)!r} is not a URL (valid: {valid})")
        used.append(scheme.lower())
        if scheme.lower() not in schemes:
            why = _refused_scheme(parser.prog, scheme, one, schemes, not_for or {})
            parser.error(f"{flag}={scheme}://… is not supported here{why} (valid: {valid})")
    if len(used) > 1 and used[0] not in (schemes if failover is None else failover):
        parser.error(f"{flag}={contract.redact(args.broker)!r}: a ';'-joined failover list of {used[0]}:// "
                     f"is not supported here: {parser.prog} connects to one URL itself (valid: one URL)")
    return args.broker
