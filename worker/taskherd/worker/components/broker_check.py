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
``--prefetch-multiplier`` above 1 (a warning on RabbitMQ), as configure() refuses them.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Any, Mapping

from taskherd.contract import broker_kind, redact

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


def worker_option_findings(*, time_limit: Any, prefetch_multiplier: Any, profile: Any,
                           soft_time_limit: Any = None) -> Findings:
    """The worker's own options (``celery worker --time-limit … --prefetch-multiplier …``) override
    the settings configure() checked; the same rules, applied to what this worker will really use.

    A newcomer's ``--time-limit 600`` on Redis, with a visibility timeout of 74 s, started without a
    word: every task running longer than 74 s would have been delivered a second time while it ran."""
    findings = Findings()
    if profile.broker_is_redis:
        limit, what = profile.visibility_timeout, "visibility_timeout"
    else:
        limit, what = profile.rabbitmq_consumer_timeout, "rabbitmq_consumer_timeout"
    if limit is not None and not (isinstance(time_limit, (int, float)) and 0 < time_limit < limit):
        given = "no hard time limit (--time-limit 0)" if not time_limit else f"--time-limit={time_limit!r}"
        findings.errors.append(
            f"the worker runs with {given}, not below {what}={limit!r}: a task running that long is delivered "
            f"a second time while it still runs (valid: 0 < --time-limit < {limit!r}; or leave the option out: "
            f"configure() set time_limit={profile.time_limit!r})")
    if (isinstance(time_limit, (int, float)) and time_limit > 0 and isinstance(soft_time_limit, (int, float))
            and soft_time_limit > 0 and soft_time_limit >= time_limit):
        # Celery runs it anyway: the hard limit kills the task before its soft limit can ask it to stop.
        findings.errors.append(
            f"the worker runs with a soft time limit of {soft_time_limit!r} s, not below its hard time limit of "
            f"{time_limit!r} s (--soft-time-limit / --time-limit, or configure()'s soft_time_limit={profile.soft_time_limit!r} "
            f"and time_limit={profile.time_limit!r}): the task is killed before it is asked to stop (valid: "
            f"0 < --soft-time-limit < {time_limit!r})")
    if isinstance(prefetch_multiplier, int) and prefetch_multiplier > 1:
        why = (f"the worker runs with --prefetch-multiplier={prefetch_multiplier}: with late acks prefetched "
               f"messages sit unacked behind running tasks")
        if profile.broker_is_redis:
            findings.errors.append(f"{why}, and Redis redelivers them after visibility_timeout while still held "
                                   f"(duplicates); valid: 1 (leave the option out: configure() set 1)")
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

            def start(self, worker):
                from taskherd.worker.profile import get_profile

                profile = get_profile(worker.app)
                findings = broker_url_findings(configured=profile.broker_url, connecting=worker.app.conf.broker_url)
                if not findings.errors:  # else the broker it would read is not the one configure() judged
                    findings.extend(check(worker.app, profile))
                findings.extend(worker_option_findings(time_limit=worker.time_limit,
                                                       soft_time_limit=worker.soft_time_limit,
                                                       prefetch_multiplier=worker.prefetch_multiplier,
                                                       profile=profile))
                for warning in findings.warnings:
                    logger.warning("taskherd broker check: %s", warning)
                for error in findings.errors:
                    logger.critical("taskherd broker check: %s", error)
                if findings.errors and settings.refuse:
                    raise UnsafeBroker(findings.errors)

        app.steps["worker"].add(BrokerCheckStep)
