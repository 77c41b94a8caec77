"""The BrokerCheck component: a worker refuses to start on a broker configured to lose its work.

At worker start (a bootstep: producers never pay for it) it reads the broker's settings and
compares them, and every registered task's own time limit, with what the profile relies on:

Redis (the broker, and the delivery counter's Redis when it is another one), from ``INFO`` and
``CONFIG GET save``:

- ``maxmemory-policy`` other than ``noeviction`` — **refused**. Every other policy evicts keys
  under memory pressure, silently and during normal operation: queues, kombu's ``unacked`` hash,
  the dead-letter queues (``allkeys-*``), and, with the ``volatile-*`` policies, everything with a
  TTL — idempotency done-records (an effect runs again), leases, delivery counters.
- persistence off (``appendonly no`` and no ``save`` points) — **a warning**: a Redis restart then
  loses every queued task, unacked delivery and dead letter. It is not refused because it takes a
  restart, and some deployments choose it on purpose (a replica that is promoted instead, work
  that can be re-enqueued); the warning says what it costs.
- what cannot be read (``INFO`` or ``CONFIG`` refused by ACLs or a managed service) — a warning
  naming the setting to check by hand.

RabbitMQ: ``consumer_timeout`` closes the channel of a delivery unacknowledged longer than that
(30 min by default) and requeues it — a long task runs twice. RabbitMQ 3.10 and 3.11 do not tell
a client its value (it needs ``rabbitmqctl``, i.e. the Erlang cookie, which a worker does not
have; per-queue ``consumer-timeout`` policies arrive in 3.12), so configure() checks the time
limits against ``rabbitmq_consumer_timeout`` (what the broker is declared to use) and the worker
logs, at start, a warning naming the server version and the value it assumed.

Tasks: a task's own ``time_limit`` (``@app.task(time_limit=…)``) not below the Redis visibility
timeout, or RabbitMQ's consumer timeout, is **refused**: such a run is delivered a second time
while it still runs. (A per-call ``apply_async(time_limit=…)`` is refused at publish, by the profile.)
So is the worker's own ``--time-limit`` (it overrides the profile's), and on Redis its
``--prefetch-multiplier`` above 1 (a warning on RabbitMQ), as configure() refuses them — or the
same values set in app.conf after configure(), each named where it came from.

Settings changed after configure() that take back what it set (``app.conf.task_acks_late = False``
below the call, a task's own ``acks_late=False``, ``broker_transport_options`` replaced) are
**refused**, all in one message (taskherd.worker.profile_undone).
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Any, Mapping

from taskherd.contract import broker_kind, redact

from ..profile_undone import route_warnings, undone_problem
from . import Component
from .recovery import first_broker_url

logger = logging.getLogger(__name__)


class UnsafeBroker(Exception):
    """The broker (or a task's time limit) would lose or repeat work. ``problems`` lists each one."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        super().__init__("taskherd refuses to start: " + "; ".join(self.problems))


@dataclasses.dataclass
class Findings:
    errors: list[str] = dataclasses.field(default_factory=list)
    warnings: list[str] = dataclasses.field(default_factory=list)

    def extend(self, other: "Findings") -> None:
        self.errors += other.errors
        self.warnings += other.warnings


def redis_findings(where: str, info: Mapping[str, Any] | None, save: str | None, *,
                   unreadable: str | None = None) -> Findings:
    """What is wrong with a Redis's data-safety settings (pure: the shell reads INFO and CONFIG).

    ``info``: the merged ``INFO memory`` and ``INFO persistence`` fields (None: INFO refused);
    ``save``: ``CONFIG GET save`` (None: refused); ``unreadable``: why something could not be read.
    """
    findings = Findings()
    if info is None:
        findings.warnings.append(f"Redis {where}: could not read INFO ({unreadable}); check by hand that "
                                 f"maxmemory-policy is noeviction and persistence (appendonly) is on")
        return findings
    policy = str(info.get("maxmemory_policy", ""))
    if policy and policy != "noeviction":
        findings.errors.append(
            f"Redis {where}: maxmemory-policy={policy!r} evicts keys under memory pressure — queues, unacked "
            f"deliveries, dead letters and idempotency records among them; fix: CONFIG SET maxmemory-policy "
            f"noeviction, and 'maxmemory-policy noeviction' in redis.conf (writes then fail loudly instead)")
    if str(info.get("aof_enabled", "0")) == "1":
        return findings
    if save is None:
        findings.warnings.append(
            f"Redis {where}: appendonly is off and the snapshot schedule could not be read ({unreadable}); if "
            f"'save' is empty too, a Redis restart loses every queued task; fix: appendonly yes in redis.conf")
    elif not save.strip():
        findings.warnings.append(
            f"Redis {where}: persistence is off (appendonly no, save ''): a Redis restart loses every queued "
            f"task, unacked delivery and dead letter; fix: 'appendonly yes' (appendfsync everysec) in redis.conf")
    return findings


def rabbitmq_findings(version: str, *, consumer_timeout: float | None, time_limit: float) -> Findings:
    """The consumer_timeout caveat for this RabbitMQ (configure() already refused a time limit at
    or above the declared consumer timeout)."""
    findings = Findings()
    if consumer_timeout is None:
        return findings
    findings.warnings.append(
        f"RabbitMQ {version}: its consumer_timeout cannot be read by a client (it needs rabbitmqctl); taskherd "
        f"assumes rabbitmq_consumer_timeout={consumer_timeout:g}s, above time_limit={time_limit:g}s. If "
        f"rabbitmq.conf sets consumer_timeout lower, a task running longer is redelivered while it runs: raise "
        f"it there, or pass configure(rabbitmq_consumer_timeout=<its value in seconds>) to have this checked")
    return findings


def task_limit_findings(tasks: Mapping[str, Any], *, limit: float | None, what: str) -> Findings:
    """A problem for each task whose own hard time limit is not below ``limit`` (``what`` names it)."""
    from taskherd.worker.profile import time_limit_problem

    findings = Findings()
    if limit is not None:
        problems = (time_limit_problem(name, getattr(task, "time_limit", None), below=limit, what=what)
                    for name, task in sorted(tasks.items()))
        findings.errors += [problem for problem in problems if problem]
    return findings


def broker_url_findings(*, configured: Any, connecting: Any) -> Findings:
    """configure() read the broker URL once: the dead-letter envelopes, the delivery counter and
    every broker rule follow it. A URL set after configure() (``config_from_object`` later,
    ``app.conf.broker_url = …`` below the call) went unnoticed: the worker consumed from one broker
    and published its dead letters to another (Celery's default amqp://localhost, say)."""
    findings = Findings()
    if not connecting:
        findings.errors.append(
            "no broker URL is set (Celery would connect to its default, amqp://guest@localhost//): set it "
            "before configure(app) — Celery(broker=…), app.conf.broker_url, CELERY_BROKER_URL or TASKHERD_BROKER_URL")
    elif configured != connecting:
        findings.errors.append(
            f"configure(app) ran when the broker URL was {_shown_url(configured)}, but this worker connects to "
            f"{_shown_url(connecting)}: dead letters, delivery counts and the broker checks would follow the "
            f"first — call configure(app) after the broker URL is set (after config_from_object or "
            f"app.conf.broker_url = …)")
    return findings


def _shown_url(url: Any) -> str:
    """A broker URL (or a list of them) without its password; "none" when unset."""
    if not url:
        return "none"
    return repr(redact(";".join(url) if isinstance(url, (list, tuple)) else str(url)))


#: the worker options BrokerCheck judges -> (their flag, the app.conf setting read without it,
#: the configure() setting that set that)
WORKER_OPTIONS = {
    "time_limit": ("--time-limit", "task_time_limit", "time_limit"),
    "soft_time_limit": ("--soft-time-limit", "task_soft_time_limit", "soft_time_limit"),
    "prefetch_multiplier": ("--prefetch-multiplier", "worker_prefetch_multiplier", "prefetch_multiplier"),
}


#: Attribute of the Celery app where ``taskherd worker`` leaves the flags it parsed, as written
#: ({option: '--time-limit'}): it starts the worker without click, so :func:`given_options` has
#: no click context to ask.
COMMAND_LINE_ATTRIBUTE = "taskherd_worker_flags"


def given_options(options: Mapping[str, Any], app: Any = None) -> dict[str, str]:
    """{option: how it was given} for each of :data:`WORKER_OPTIONS` this worker got rather than
    read from app.conf: ``'--time-limit'``, or the variable that set it (``CELERY_WORKER_TIME_LIMIT``).

    ``celery worker`` fills a missing ``--prefetch-multiplier`` from app.conf before the worker sees
    it, so the worker's own arguments cannot tell: click's context can. ``taskherd worker`` has no
    click context: it leaves the flags it parsed on ``app`` (:data:`COMMAND_LINE_ATTRIBUTE`).
    ``options``: the worker's keyword arguments, for a worker started without a command line
    (``app.Worker(time_limit=…)``)."""
    import click
    from click.core import ParameterSource

    context = click.get_current_context(silent=True)
    flags = getattr(app, COMMAND_LINE_ATTRIBUTE, None) if context is None else None
    given = {}
    for option, (flag, _, _) in WORKER_OPTIONS.items():
        if isinstance(flags, Mapping) and option in flags:
            given[option] = flags[option]
        elif context is not None and option in context.params:
            source = context.get_parameter_source(option)
            if source == ParameterSource.COMMANDLINE:
                given[option] = flag
            elif source == ParameterSource.ENVIRONMENT:
                given[option] = f"{context.auto_envvar_prefix}_{option.upper()}"
        elif options.get(option) is not None:
            given[option] = f"{option}="
    return given


def _source(option: str, value: Any, *, given: Mapping[str, str] | None, profile: Any) -> str:
    """Where the worker's ``option`` came from, as the user wrote it (``given`` None: a flag)."""
    flag, setting, field = WORKER_OPTIONS[option]
    if given is None or option in given:
        how = flag if given is None else given[option]
        return f"{how}{'' if how.endswith('=') else '='}{value!r}"
    configured = getattr(profile, field)
    if value == configured:
        return f"configure()'s {field}={configured!r}"
    return f"app.conf.{setting}={value!r}, changed after configure(app), which set {configured!r}"


def unprofiled_queue_problems(consumed: list[str], profiled: tuple[str, ...] | list[str]) -> list[str]:
    """A queue the worker consumes (``-Q``) that configure(queues=…) does not list is declared without
    its dead-letter arguments, and its failed tasks were dead-lettered as if they came from the
    profile's queue (a redrive then sent them there)."""
    others = [queue for queue in consumed if queue not in profiled]
    if not others:
        return []
    return [f"the worker consumes {others} (its -Q/--queues, or app.conf.task_queues without -Q), not in "
            f"configure(queues={list(profiled)}): such a queue "
            f"has no dead-letter queue of its own, and its failed tasks would be dead-lettered as if they came "
            f"from {profiled[0]!r} (valid: every queue the workers consume listed in configure(queues=…) or "
            f"TASKHERD_QUEUES; or consume only those)"]


def _named(option: str, *, given: Mapping[str, str] | None, profile: Any, value: Any) -> str:
    """The worker option's name as the user wrote it, without its value: ``--prefetch-multiplier``,
    ``CELERY_WORKER_PREFETCH_MULTIPLIER``, ``prefetch_multiplier`` (app.Worker's keyword),
    ``app.conf.worker_prefetch_multiplier`` or configure()'s ``prefetch_multiplier``."""
    flag, setting, field = WORKER_OPTIONS[option]
    if given is None:
        return flag
    if option in given:
        return given[option].rstrip("=")
    return field if value == getattr(profile, field) else f"app.conf.{setting}"


def worker_option_findings(*, time_limit: Any, prefetch_multiplier: Any, profile: Any,
                           soft_time_limit: Any = None, given: Mapping[str, str] | None = None,
                           judge_broker: bool = True, pool_size: Any = None) -> Findings:
    """The worker's own options (``celery worker --time-limit … --prefetch-multiplier …``) or
    app.conf changed after configure() override the settings configure() checked; the same rules,
    applied to what this worker will really use, each value named where it came from.

    ``given``: :func:`given_options` (None: every value came from its flag). ``pool_size``: the
    worker's pool processes (the autoscale maximum if any), which multiply the prefetch on RabbitMQ
    (taskherd.worker.profile.prefetch_problem, configure()'s rule). ``judge_broker``:
    False when the worker's broker is not the one configure() judged (the broker URL check
    refuses that): the broker's limits are then unknown, and only the rules without them apply.

    A newcomer's ``--time-limit 600`` on Redis, with a visibility timeout of 74 s, started without a
    word: every task running longer than 74 s would have been delivered a second time while it ran."""
    findings = Findings()

    def source(option: str, value: Any) -> str:
        return _source(option, value, given=given, profile=profile)

    def from_flag(option: str) -> bool:
        return given is None or option in given

    if profile.broker_is_redis:
        limit, what = profile.visibility_timeout, "visibility_timeout"
    else:
        limit, what = profile.rabbitmq_consumer_timeout, "rabbitmq_consumer_timeout"
    if judge_broker and limit is not None \
            and not (isinstance(time_limit, (int, float)) and 0 < time_limit < limit):
        said = source("time_limit", time_limit)
        if not time_limit:
            said = ("no hard time limit (--time-limit 0)" if given is None
                    else f"no hard time limit ({said})")
        valid = (f"0 < --time-limit < {limit!r}; or leave the option out: configure() set "
                 f"time_limit={profile.time_limit!r}" if from_flag("time_limit") else
                 f"0 < task_time_limit < {limit!r}: drop the change, or pass time_limit= to configure(), "
                 f"which checks it")
        findings.errors.append(
            f"the worker runs with {said}, not below {what}={limit!r}: a task running that long is delivered "
            f"a second time while it still runs (valid: {valid})")
    elif not judge_broker and not from_flag("time_limit") and time_limit != profile.time_limit:
        said = source("time_limit", time_limit)
        findings.errors.append(
            f"the worker runs with {'no hard time limit (' + said + ')' if not time_limit else said}: a task running "
            f"longer than the broker's visibility or consumer timeout is delivered a second time while it still "
            f"runs (valid: drop the change, or pass time_limit= to configure(), which checks it against the broker)")
    if (isinstance(time_limit, (int, float)) and time_limit > 0 and isinstance(soft_time_limit, (int, float))
            and soft_time_limit > 0 and soft_time_limit >= time_limit):
        # Celery runs it anyway: the hard limit kills the task before its soft limit can ask it to stop.
        findings.errors.append(
            f"the worker runs with a soft time limit of {soft_time_limit!r} s, not below its hard time limit of "
            f"{time_limit!r} s ({source('soft_time_limit', soft_time_limit)}; {source('time_limit', time_limit)}): "
            f"the task is killed before it is asked to stop (valid: 0 < --soft-time-limit < {time_limit!r})")
    from taskherd.worker.profile import prefetch_problem

    wrong_prefetch = prefetch_problem(
        prefetch_multiplier, named=_named("prefetch_multiplier", given=given, profile=profile, value=prefetch_multiplier),
        said=source("prefetch_multiplier", prefetch_multiplier), amqp=judge_broker and profile.broker_is_amqp,
        pool_size=pool_size, pool_named="pool size (-c/--concurrency, or the --autoscale maximum)")
    if wrong_prefetch:
        findings.errors.append(f"the worker runs with {wrong_prefetch}")
    elif judge_broker and isinstance(prefetch_multiplier, int) and prefetch_multiplier > 1 \
            and (from_flag("prefetch_multiplier") or prefetch_multiplier != profile.prefetch_multiplier):
        why = (f"the worker runs with {source('prefetch_multiplier', prefetch_multiplier)}: with late acks "
               f"prefetched messages sit unacked behind running tasks")
        if profile.broker_is_redis:
            leave = ("leave the option out" if from_flag("prefetch_multiplier") else "drop the change")
            findings.errors.append(f"{why}, and Redis redelivers them after visibility_timeout while still held "
                                   f"(duplicates); valid: 1 ({leave}: configure() set 1)")
        else:
            findings.warnings.append(f"{why}, adding latency and hiding backlog from the ready count; 1 is "
                                     f"recommended")
    return findings


def _read_redis(url: str) -> tuple[dict | None, str | None, str | None]:
    import redis

    client = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)
    try:
        try:
            info = {**client.info("memory"), **client.info("persistence")}
        except redis.RedisError as exc:
            return None, None, repr(exc)
        try:
            save = client.config_get("save").get("save")
            return info, save, None
        except redis.RedisError as exc:
            return info, None, repr(exc)
    finally:
        client.close()


def _redis_label(url: str) -> str:
    from kombu.utils.url import maybe_sanitize_url

    return maybe_sanitize_url(url)


def _rabbitmq_version(url: str) -> str:
    from kombu import Connection

    with Connection(url, connect_timeout=5) as connection:
        connection.ensure_connection(max_retries=1)
        properties = getattr(connection.connection, "server_properties", None) or {}
    version = properties.get("version")
    return version.decode() if isinstance(version, bytes) else str(version or "(version unknown)")


def check(app: Any, profile: Any) -> Findings:
    """Reads the broker(s) of ``app`` and judges them (the imperative shell of this module)."""
    findings = Findings()
    url = first_broker_url(app)
    kind = broker_kind(url)
    if kind == "redis" and not url.lower().startswith("sentinel"):
        urls = [url] + [u for u in [profile.delivery_counter_url] if u and u.split("?")[0] != url.split("?")[0]]
        for each in urls:
            info, save, unreadable = _read_redis(each)
            findings.extend(redis_findings(_redis_label(each), info, save, unreadable=unreadable))
        findings.extend(task_limit_findings(app.tasks, limit=profile.visibility_timeout, what="visibility_timeout"))
    elif kind == "amqp":
        try:
            version = _rabbitmq_version(url)
        except Exception as exc:  # noqa: BLE001 - the consumer will report the broker itself
            version = f"(unreachable at start: {exc!r})"
        findings.extend(rabbitmq_findings(version, consumer_timeout=profile.rabbitmq_consumer_timeout,
                                          time_limit=profile.time_limit))
        findings.extend(task_limit_findings(app.tasks, limit=profile.rabbitmq_consumer_timeout,
                                            what="rabbitmq_consumer_timeout"))
    return findings


@dataclasses.dataclass(frozen=True, kw_only=True)
class BrokerCheck(Component):
    """At worker start: refuse a broker configured to lose work; warn where it cannot be checked."""

    #: True: a finding that loses work stops the worker (exit code 1); False: it is only logged
    refuse: bool = True

    def install(self, app: Any, profile: Any = None) -> None:
        from celery import bootsteps

        settings = self

        class BrokerCheckStep(bootsteps.StartStopStep):
            """Before the consumer starts: nothing is taken from a broker that would lose it."""

            label = "taskherd broker check"

            def __init__(self, worker, **options):
                super().__init__(worker, **options)
                self.given = given_options(options, worker.app)  # while the command line's context is current

            def start(self, worker):
                from taskherd.worker.profile import get_profile

                app = worker.app
                profile = get_profile(app)
                findings = broker_url_findings(configured=profile.broker_url, connecting=app.conf.broker_url)
                same_broker = not findings.errors  # else its broker is not the one configure() judged
                if same_broker:
                    findings.extend(check(app, profile))
                findings.errors += unprofiled_queue_problems(list(app.amqp.queues.consume_from), profile.queues)
                undone = undone_problem(app.conf, app.tasks, confirm_publish=same_broker and profile.broker_is_amqp,
                                        visibility_timeout=profile.visibility_timeout if same_broker else None,
                                        queues=profile.queues)
                findings.errors += [undone] if undone else []
                findings.warnings += route_warnings(app.conf, profile.queues)
                findings.extend(worker_option_findings(time_limit=worker.time_limit,
                                                       soft_time_limit=worker.soft_time_limit,
                                                       prefetch_multiplier=worker.prefetch_multiplier,
                                                       profile=profile, given=self.given, judge_broker=same_broker,
                                                       pool_size=worker.max_concurrency or worker.concurrency))
                for warning in findings.warnings:
                    logger.warning("taskherd broker check: %s", warning)
                for error in findings.errors:
                    logger.critical("taskherd broker check: %s", error)
                if findings.errors and settings.refuse:
                    raise UnsafeBroker(findings.errors)

        app.steps["worker"].add(BrokerCheckStep)
