"""`taskherd worker`: start a Celery worker without loading Celery's command line.

``celery -A app worker`` imports every Celery subcommand before it starts the worker: click,
click-repl and prompt_toolkit (for ``celery amqp``'s shell), ``celery multi``, ``celery events``…
Measured here (10 boots each, alternated), the worker's main process used 0.96 s of CPU from its
start to "ready" through Celery's command line and 0.82 s through this one (-15 %), CPU every new
pod of a scale-up pays while it shares its node's cores with the others. This command loads the
app (as ``celery -A`` finds it) and starts ``app.Worker`` with the same options, nothing else.

It takes the worker options a pod needs (``taskherd worker --help``). Any other option is handed to
Celery's own command line unchanged (``celery --app APP worker …``: the process is replaced), so a
pool's extra arguments keep working, at Celery's start-up cost.
"""
from __future__ import annotations

import argparse
import math
import os
import sys

from taskherd import contract

from .options import AppImportFailed, AppNotFound, Parser, load_app, report_app_import_failure

#: flag -> (dest, kind): "value" takes an argument, "flag" is a switch (celery worker's spelling)
OPTIONS = {
    ("-A", "--app"): ("app", "value"),
    ("-Q", "--queues"): ("queues", "value"),
    ("-c", "--concurrency"): ("concurrency", "value"),
    ("-P", "--pool"): ("pool", "value"),
    ("-n", "--hostname"): ("hostname", "value"),
    ("-l", "--loglevel"): ("loglevel", "value"),
    ("-O", "--optimization"): ("optimization", "value"),
    ("--prefetch-multiplier",): ("prefetch_multiplier", "value"),
    ("--soft-time-limit",): ("soft_time_limit", "value"),
    ("--time-limit",): ("time_limit", "value"),
    ("--max-tasks-per-child",): ("max_tasks_per_child", "value"),
    ("--max-memory-per-child",): ("max_memory_per_child", "value"),
    ("-E", "--task-events", "--events"): ("task_events", "flag"),
    ("--without-gossip",): ("without_gossip", "flag"),
    ("--without-mingle",): ("without_mingle", "flag"),
    ("--without-heartbeat",): ("without_heartbeat", "flag"),
}


def parser() -> argparse.ArgumentParser:
    result = Parser(
        prog="taskherd worker", description=__doc__.split("\n\n")[0],
        epilog="Other `celery worker` options are passed to Celery's own command line.")
    for flags, (dest, kind) in OPTIONS.items():
        if kind == "flag":
            result.add_argument(*flags, dest=dest, action="store_true", default=None)
        else:
            result.add_argument(*flags, dest=dest)
    return result


def _number(name: str, value: str | None, kind: type, minimum: float,
            maximum: float | None = None) -> float | int | None:
    if value is None:
        return None
    try:
        number = kind(value)
    except ValueError:
        raise ValueError(f"{name}={value!r} is not {'an integer' if kind is int else 'a number'}") from None
    if not (math.isfinite(number) and number >= minimum):  # 'nan' and 'inf' parse as floats
        raise ValueError(f"{name}={value!r} must be {'an integer' if kind is int else 'a finite number'} "
                         f">= {minimum:g}" + (f" and <= {maximum:g}" if maximum is not None else ""))
    if maximum is not None and number > maximum:
        raise ValueError(f"{name}={value!r} must be a finite number >= {minimum:g} and <= {maximum:g}")
    return number


def _queue_names(value: str | None) -> list[str] | None:
    """-Q's names; an empty one is an error, not a silent fall-back to the app's default queue."""
    if value is None:
        return None
    names = [name.strip() for name in value.split(",")]
    if not all(names):
        raise ValueError(f"--queues={value!r} has an empty queue name (valid: names separated by commas)")
    return names


def worker_options(args: argparse.Namespace) -> dict:
    """The keyword arguments of ``app.Worker`` from the parsed options (ValueError naming a bad one)."""
    options = {
        "queues": _queue_names(args.queues),
        "concurrency": _number("--concurrency", args.concurrency, int, 1),
        "loglevel": args.loglevel or "WARNING",
        "optimization": args.optimization,
        # At least 1: Celery reads 0 as "unlimited prefetch", which configure() refuses (prefetched messages
        # sit unacked behind running tasks; Redis redelivers them): the command line must not bypass that.
        "prefetch_multiplier": _number("--prefetch-multiplier", args.prefetch_multiplier, int, 1),
        # At most the contract's week, as TASKHERD_(SOFT_)TIME_LIMIT and configure()'s keywords
        "soft_time_limit": _number("--soft-time-limit", args.soft_time_limit, float, 0, contract.MAX_SECONDS),
        "time_limit": _number("--time-limit", args.time_limit, float, 0, contract.MAX_SECONDS),
        "max_tasks_per_child": _number("--max-tasks-per-child", args.max_tasks_per_child, int, 0),
        "max_memory_per_child": _number("--max-memory-per-child", args.max_memory_per_child, int, 0),
        "task_events": args.task_events,
        "without_gossip": args.without_gossip,
        "without_mingle": args.without_mingle,
        "without_heartbeat": args.without_heartbeat,
    }
    if args.optimization not in (None, "default", "fair"):
        raise ValueError(f"--optimization={args.optimization!r} must be default or fair")
    # Celery's own tables (the worker imports both modules anyway): Celery looks a log level up deep
    # in the worker's start (a KeyError traceback) and a pool alias at the pool's start.
    from celery.concurrency import ALIASES as POOLS
    from celery.utils.log import LOG_LEVELS

    levels = sorted((name for name in LOG_LEVELS if isinstance(name, str) and name != "NOTSET"), key=LOG_LEVELS.get)
    if args.loglevel is not None and args.loglevel.upper() not in levels:
        raise ValueError(f"--loglevel={args.loglevel!r} is not a log level (valid: {', '.join(levels)}, in any case)")
    if args.pool is not None:
        options["pool_cls"] = _pool(args.pool, POOLS)
    return {key: value for key, value in options.items() if value is not None}


#: pool alias -> the library it runs on, which Celery's pool module imports only when the pool
#: starts (celery.concurrency.gevent imports gevent inside the pool): checked before that.
POOL_LIBRARIES = {"gevent": "gevent", "eventlet": "eventlet"}


def _pool(name: str, aliases: dict, *, named: str = "-P/--pool") -> type:
    """-P's pool class (``named``: how it was given, app.conf.worker_pool when not on the command
    line), imported now, with the library it runs on: an alias whose module cannot be imported
    (eventlet not installed, 'custom' without CELERY_CUSTOM_WORKER_POOL), one whose library is
    missing (gevent: its module imports it only when the pool starts) or a module:Class that is not
    there or is no pool was a traceback at the worker's start."""
    import importlib.util

    from celery.concurrency import get_implementation
    from celery.concurrency.base import BasePool

    valid = f"valid: {', '.join(alias for alias, path in aliases.items() if path)}, or module:Class of a Celery pool"
    if not isinstance(name, str) or (name not in aliases and ":" not in name):
        raise ValueError(f"{named}={name!r} is not a pool ({valid})")
    library = POOL_LIBRARIES.get(name)
    try:
        missing = library is not None and importlib.util.find_spec(library) is None
    except (ImportError, ValueError):  # a broken package of that name
        missing = True
    if missing:
        raise ValueError(f"{named}={name!r} needs the {library} library, which is not installed "
                         f"(pip install {library}; or another pool: {valid})")
    try:
        pool = get_implementation(name)
    except (ImportError, AttributeError, ValueError, TypeError) as exc:  # TypeError: 'custom' -> None
        raise ValueError(f"{named}={name!r} cannot be loaded ({type(exc).__name__}: {exc}; {valid})") from None
    if not (isinstance(pool, type) and issubclass(pool, BasePool)):
        raise ValueError(f"{named}={name!r} names a {type(pool).__name__}, not a Celery pool class ({valid})")
    return pool


def flags_given(argv: list[str]) -> dict[str, str]:
    """{dest: the flag as written} for each option of :data:`OPTIONS` in ``argv`` (the last one
    wins, as for argparse): ``--time-limit``, ``-c``. (No abbreviations: Parser refuses them.)"""
    spelled = {flag: dest for flags, (dest, _) in OPTIONS.items() for flag in flags}
    given = {}
    for arg in argv:
        if arg == "--":
            break
        flag = arg.split("=", 1)[0] if arg.startswith("--") else arg[:2] if arg.startswith("-") else None
        if flag in spelled:
            given[spelled[flag]] = flag
    return given


def _prefetch_problem(app, options: dict, written: str | None) -> str | None:
    """configure()'s prefetch rule (taskherd.worker.profile.prefetch_problem) for
    --prefetch-multiplier on the app's broker and pool size: on RabbitMQ the count sent to
    basic.qos is the multiplier x the pool size, at most 65535."""
    if "prefetch_multiplier" not in options:
        return None
    from taskherd.contract import broker_kind
    from taskherd.worker.components.recovery import first_broker_url
    from taskherd.worker.profile import prefetch_problem

    url = first_broker_url(app)
    size = options.get("concurrency") or app.conf.worker_concurrency or os.cpu_count() or 1
    return prefetch_problem(options["prefetch_multiplier"], named=written or "--prefetch-multiplier",
                            amqp=broker_kind(url) == "amqp", pool_size=size,
                            pool_named="the pool size (-c/--concurrency)")


def without_app(argv: list[str]) -> list[str]:
    """``argv`` minus its ``-A APP`` / ``--app APP`` / ``--app=APP`` (Celery wants it before ``worker``)."""
    rest, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in ("-A", "--app"):
            skip = True
        elif not arg.startswith("--app="):
            rest.append(arg)
    return rest


def _celery_cli(app: str | None, argv: list[str]) -> None:
    """Replace this process with Celery's own command line, same options (and interpreter flags)."""
    flags = [f"-X{key}" if value is True else f"-X{key}={value}" for key, value in sys._xoptions.items()]
    flags += [f"-W{option}" for option in sys.warnoptions]
    command = [sys.executable, *flags, "-m", "celery", *(["--app", app] if app else []), "worker",
               *without_app(argv)]
    os.execv(sys.executable, command)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args, unknown = parser().parse_known_args(argv)
    if unknown:
        print(f"taskherd worker: {unknown[0]!r} is not one of its options: running Celery's command line",
              file=sys.stderr, flush=True)
        _celery_cli(args.app, argv)
    if not args.app:
        print("taskherd worker: --app is required (the Celery app, as for `celery -A`)", file=sys.stderr)
        return 2
    try:
        options = worker_options(args)
    except ValueError as exc:
        print(f"taskherd worker: {exc}", file=sys.stderr)
        return 2
    from celery import concurrency
    from celery.utils.nodenames import default_nodename, host_format

    try:
        app = load_app(args.app)
    except AppNotFound as exc:
        print(f"taskherd worker: {exc}", file=sys.stderr)
        return 2
    except AppImportFailed as failure:  # the user's module raised: its error and traceback, as celery -A
        report_app_import_failure("taskherd worker", failure)
        return 1
    # As `celery worker -P`: the app's worker_pool unless a pool is named on the command line.
    if "pool_cls" not in options:
        try:
            options["pool_cls"] = _pool(app.conf.worker_pool, concurrency.ALIASES, named="app.conf.worker_pool")
        except ValueError as exc:
            print(f"taskherd worker: {exc}", file=sys.stderr)
            return 1
    written = flags_given(argv)
    problem = _prefetch_problem(app, options, written.get("prefetch_multiplier"))
    if problem:
        print(f"taskherd worker: {problem}", file=sys.stderr)
        return 2
    # The flags as written, for the broker check's messages (it has no click context to ask).
    from taskherd.worker.components.broker_check import COMMAND_LINE_ATTRIBUTE

    setattr(app, COMMAND_LINE_ATTRIBUTE, written)
    options["hostname"] = host_format(default_nodename(args.hostname))  # %h, %n, %d as `celery -n` expands
    from celery.exceptions import SecurityError

    try:
        worker = app.Worker(**options)
    except SecurityError as exc:  # pickle accepted while running as root (Celery's check_privileges)
        print(f"taskherd worker: app.conf.accept_content={list(app.conf.accept_content or ())!r} accepts pickle "
              f"and the worker runs as root, which Celery refuses: {' '.join(str(exc).split())} (valid: "
              f"accept_content=['json'], which configure(app) sets: set accept_content before it, or not at all; "
              f"or run as another user)", file=sys.stderr)
        return 1
    except ImportError as exc:  # a module the worker loads at its build (a pool's, an extension's)
        print(f"taskherd worker: the worker cannot be built: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    worker.start()
    return worker.exitcode or 0
