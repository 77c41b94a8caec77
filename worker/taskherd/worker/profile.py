"""The reliability profile: one call that makes a Celery app lose no task, validated as a whole.

``configure(app, **settings)`` applies the :class:`Settings` below, checks that they hold together,
stores the resulting :class:`Profile` on the app and then installs its components
(taskherd.worker.components: the base Task class that retries and dead-letters, the consumer that
dead-letters bad messages, publish stamps, heartbeat, drain, metrics, Redis fast recovery).

Settings applied and why (docs/reliability.md has the long form):

- ``task_acks_late`` + ``task_reject_on_worker_lost``: a message is acknowledged only when its
  task has ended; a child killed mid-task (SIGKILL, OOM) puts it back instead of acking it.
- ``task_acks_on_failure_or_timeout=True``: a failed task is acknowledged, but only AFTER our
  Task class has published its dead-letter envelope (with confirms). Rejecting it instead would
  rely on RabbitMQ's native dead-lettering, which is at-most-once and carries no exception.
- ``worker_prefetch_multiplier=1``: a worker holds only what it runs (see the prefetch rule).
- soft/hard time limits, ``worker_max_tasks_per_child``, ``worker_max_memory_per_child``.
- JSON only: ``accept_content``, ``result_accept_content``, and the task/result/event serializers.
  Anything else accepted from the broker (pickle above all) is remote code execution.
- ``broker_heartbeat``: a dead broker connection is noticed in seconds, not minutes.
- ``worker_cancel_long_running_tasks_on_connection_loss``: when the connection drops, the
  broker redelivers unacked messages; cancelling our copies avoids running them twice at once.
- ``broker_connection_retry`` with ``broker_connection_max_retries=None``: a worker keeps
  reconnecting through a broker outage instead of exiting after 100 attempts — an outage must not
  restart every worker of the cluster (the heartbeat keeps liveness green meanwhile).
- ``broker_transport_options["visibility_timeout"]`` (Redis): derived as
  ``time_limit + backoff_cap + margin`` — a message is restored to the queue once it has been
  unacked that long, so it must outlive the longest run. (Retry countdowns and other ETA
  messages wait in the delay set, taskherd.worker.delayed, not unacked in a worker; the
  ``backoff_cap`` term keeps the margin for workers without the DelayedMessages component.)
  A task's own ``time_limit`` and a per-call ``apply_async(time_limit=…)`` must be below it too:
  the first is refused at worker start (BrokerCheck), the second at publish.
- ``broker_transport_options["socket_connect_timeout"]`` (Redis, unless set): kombu connects with
  no timeout, so a connect whose SYN goes unanswered (a broker pod restarting behind its Service)
  waits out the kernel's SYN retries, about two minutes, before the publish or the reconnect
  retries. (No read timeout: a worker's idle pub/sub connection would time out with it.)
- ``broker_transport_options["unacked_mutex_expire"]`` (Redis, unless set): 10 s instead of
  kombu's 300. Each worker sweeps the expired unacked messages back to their queue holding this
  lock; a worker killed during its sweep leaves the lock behind, and every other worker's sweep
  then waited for it to expire — a killed task's comeback after its visibility timeout was late by
  up to five minutes. A sweep takes milliseconds, and two at once restore nothing twice (each
  restore is a transaction watching the unacked hash).
- ``broker_transport_options["confirm_publish"]`` (RabbitMQ): every publish — a retry, a task a
  task sends — returns once the broker has it; without confirms a retry could be lost in a broker
  crash after the original was acknowledged.
- ``rabbitmq_consumer_timeout``: RabbitMQ closes the channel of a delivery unacknowledged longer
  than its ``consumer_timeout`` and redelivers it; the hard time limit must be below it.
- ``task_queues``: each work queue is declared with ``x-dead-letter-exchange`` (the default
  exchange) and ``x-dead-letter-routing-key`` = its DLQ, ``x-queue-type`` and, for quorum
  queues, ``x-delivery-limit`` = ``max_deliveries`` as a broker-side backstop. Redis ignores queue arguments.

Prefetch > 1 with late acks: an ERROR on Redis, a WARNING on RabbitMQ. On Redis a prefetched
message is unacked from the moment it is reserved, so it can wait behind other tasks longer than
the derived visibility timeout and be delivered a second time while still held: duplicates,
which breaks the profile's promise. On RabbitMQ nothing is redelivered while the channel lives;
prefetch only costs latency (a message waits behind a long task on a busy worker while others
idle) and makes the ready count undercount the backlog — a trade-off a user may choose.
"""
from __future__ import annotations

import dataclasses
import inspect
import math
import os
import re
import warnings
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from taskherd import compat, contract
from taskherd.contract import broker_kind

from .backoff import Rng
from .components import (MAX_SECONDS, Component, default_components, is_seconds, is_whole,
                         missing_requirements)
from .components import install as install_components
from .transient import ErrorClassifier, make_classifier

JSON_CONTENT = "json"
_JSON_ALIASES = {"json", "application/json"}
QUEUE_TYPES = ("classic", "quorum")
#: Attribute of the Celery app holding its Profile (read by get_profile()).
APP_ATTRIBUTE = "taskherd_profile"
#: kombu Redis transport options set when the app has none of its own (see the docstring)
#: kombu's Redis transport options the profile sets unless the app did (the module docstring says why)
REDIS_TRANSPORT_DEFAULTS = {"socket_connect_timeout": 5.0, "unacked_mutex_expire": 10}


class ProfileError(ValueError):
    """The profile's settings contradict each other. ``problems`` lists every one found."""

    def __init__(self, problems: Sequence[str]):
        self.problems = list(problems)
        super().__init__("invalid taskherd reliability profile: " + "; ".join(self.problems))


class ProfileWarning(UserWarning):
    """A legal but risky combination (documented in docs/reliability.md)."""


@dataclass(frozen=True, kw_only=True)
class Settings:
    """What ``configure(app, **settings)`` accepts: each field once, with its unit and default."""

    #: seconds before SoftTimeLimitExceeded is raised in the task; must be < time_limit
    soft_time_limit: float = 240
    #: seconds before the pool kills the task's process (Celery task_time_limit)
    time_limit: float = 300
    #: tasks a pool process runs before it is replaced; None: no limit
    max_tasks_per_child: int | None = 1000
    #: KiB of resident memory after which a pool process is replaced (checked after a task); None: off
    max_memory_per_child_kb: int | None = None
    #: messages reserved per pool process; 1 (see the prefetch rule in the module docstring)
    prefetch_multiplier: int = 1
    #: Redis only, seconds a delivered unacked message stays invisible; None: derived (see module doc)
    visibility_timeout: float | None = None
    #: seconds between AMQP heartbeats; 0 disables them
    broker_heartbeat: float = 30
    #: retries of a transient error before it is dead-lettered
    max_retries: int = 5
    #: seconds: the backoff ceiling of the first retry (doubling each retry, full jitter)
    backoff_base: float = 1.0
    #: seconds: the longest backoff
    backoff_cap: float = 120.0
    #: source of uniform floats in [0, 1] for the jitter; None: random.random
    backoff_rng: Rng | None = field(default=None, compare=False, repr=False)
    #: exception classes retried with backoff, in addition to the defaults (taskherd.worker.transient)
    transient_errors: Sequence[type[BaseException]] = ()
    #: exception classes never retried, in addition to PermanentError; they win over transient ones
    permanent_errors: Sequence[type[BaseException]] = ()
    #: the work queues, declared with dead-lettering; None: [app.conf.task_default_queue]
    queues: Sequence[str] | None = None
    #: DLQ name pattern; ``{queue}`` is replaced by the work queue's name
    dead_letter_queue: str = contract.DEFAULT_DEAD_LETTER_PATTERN
    #: one DLQ name per queue, in the order of ``queues``; None: from ``dead_letter_queue``
    dead_letter_queues: Sequence[str] | None = None
    #: deliveries of one (task id, retry) allowed before it is dead-lettered unrun
    max_deliveries: int = 5
    #: Redis URL of a delivery counter, asked on a redelivery the message or the broker cannot
    #: count (taskherd.worker.deliveries); None: the broker itself on Redis (used only without
    #: FastRecovery), none on RabbitMQ (quorum queues count, classic queues get a copy with the count)
    delivery_counter_url: str | None = None
    #: RabbitMQ queue type of the work queues and DLQs: "classic" or "quorum"
    queue_type: str = "classic"
    #: content types accepted from the broker: JSON only (pickle is remote code execution)
    accept_content: Sequence[str] = ("json",)
    #: RabbitMQ only, seconds: the broker's consumer_timeout (rabbitmq.conf, in ms there; 30 min by
    #: default), which the hard time limit must stay below; None: disabled on the broker
    rabbitmq_consumer_timeout: float | None = 1800.0


#: configure() keywords
SETTING_NAMES = tuple(f.name for f in dataclasses.fields(Settings))

#: contract variable -> the setting it overrides (the pod's environment wins: see taskherd.contract)
ENVIRONMENT: dict[str, str] = {
    "TASKHERD_SOFT_TIME_LIMIT": "soft_time_limit",
    "TASKHERD_TIME_LIMIT": "time_limit",
    "TASKHERD_VISIBILITY_TIMEOUT": "visibility_timeout",
    "TASKHERD_MAX_TASKS_PER_CHILD": "max_tasks_per_child",
    "TASKHERD_MAX_MEMORY_PER_CHILD_KB": "max_memory_per_child_kb",
    "TASKHERD_QUEUES": "queues",
    "TASKHERD_DEAD_LETTER_QUEUES": "dead_letter_queues",
    "TASKHERD_DELIVERY_COUNTER_URL": "delivery_counter_url",
    "TASKHERD_RABBITMQ_CONSUMER_TIMEOUT": "rabbitmq_consumer_timeout",
}
BROKER_URL_VARIABLE = "TASKHERD_BROKER_URL"
BROKER_TYPE_VARIABLE = "TASKHERD_BROKER_TYPE"
#: the chart's broker.type -> broker_kind() of its URL
_BROKER_TYPE_KINDS = {"redis": "redis", "rabbitmq": "amqp"}


@dataclass(frozen=True, kw_only=True)
class Profile(Settings):
    """The validated settings of one app, resolved. Other modules read these, never app.conf."""

    broker_url: str
    queues: tuple[str, ...]
    #: work queue -> its DLQ
    dead_letters: Mapping[str, str] = field(default_factory=dict)
    classifier: ErrorClassifier = field(default_factory=ErrorClassifier)
    #: the installed components, in order
    components: tuple[Component, ...] = ()
    #: seconds a delivery counter key lives (long enough to outlast any redelivery loop)
    delivery_counter_ttl: float = 7 * 24 * 3600
    #: legal but risky choices about how a worker consumes; issued when a worker of the app starts
    worker_warnings: tuple[str, ...] = ()

    @property
    def broker_is_redis(self) -> bool:
        return broker_kind(self.broker_url) == "redis"

    @property
    def broker_is_amqp(self) -> bool:
        return broker_kind(self.broker_url) == "amqp"

    def dead_letter_queue_for(self, queue: str) -> str:
        return self.dead_letters.get(queue) or self.dead_letter_queue.format(queue=queue)

    def component(self, kind: type[Component]) -> Component | None:
        return next((c for c in self.components if isinstance(c, kind)), None)


def derived_visibility_timeout(*, time_limit: float, backoff_cap: float) -> float:
    """Redis visibility timeout covering the longest run plus the longest retry countdown.

    The margin (10 % of both, at least 60 s) absorbs the time a message waits between its
    delivery and its start, and kombu's restore sweep running late.
    """
    held = time_limit + backoff_cap
    return float(held + max(60.0, 0.1 * held))


def get_profile(app: Any) -> Profile:
    """The Profile configure() stored on ``app``; raises if configure() was not called."""
    profile = getattr(app, APP_ATTRIBUTE, None)
    if profile is None:
        raise RuntimeError(f"taskherd.worker.configure(app) was not called on {app!r}")
    return profile


def _non_json(values: Any) -> list[str]:
    if values is None:
        return []
    if isinstance(values, str):
        values = [values]
    return [v for v in values if str(v).lower() not in _JSON_ALIASES]


def _names(value: Any) -> bool:
    """A list or tuple of non-empty strings: a bare str would be split into one queue per character."""
    return isinstance(value, (list, tuple)) and all(isinstance(name, str) and name.strip() for name in value)


def _exception_classes(value: Any) -> bool:
    return isinstance(value, (list, tuple, set, frozenset)) and all(
        isinstance(cls, type) and issubclass(cls, BaseException) for cls in value)


def _rng(value: Any) -> bool:
    """None, or what backoff_delay calls with no argument for a float in [0, 1] (random.random, a
    seeded ``random.Random(7).random``). Only its signature is checked: calling it here would spend a
    draw of a seeded sequence. A wrong one was accepted and made the first retry of a transient
    error raise TypeError inside the task's retry path instead."""
    if value is None:
        return True
    if not callable(value):
        return False
    try:
        inspect.signature(value).bind()
    except TypeError:  # needs arguments: random.uniform, random.randint
        return False
    except ValueError:  # a builtin without a signature: it may be fine
        pass
    return True


#: The broker-side timeouts that must outlast a run and its retry countdown (time_limit +
#: backoff_cap, each up to a week, plus the margin): 30 days, as their variables and the chart's
#: visibilityTimeoutSeconds.
MAX_BROKER_TIMEOUT = contract.MAX_TIMEOUT_SECONDS
#: broker_heartbeat: AMQP negotiates it in a 16-bit field (Connection.Tune-Ok); py-amqp sends a
#: larger one as is when the server disables heartbeats, and fails to pack it (struct.error).
MAX_HEARTBEAT = 65535
#: max_deliveries: the quorum queues' x-delivery-limit argument, which py-amqp cannot encode past
#: a signed 64-bit int (struct.error at declare); a signed 32-bit bound is already far beyond use.
MAX_DELIVERIES = 2**31 - 1
#: schemes redis.Redis.from_url accepts (its parse_url raises ValueError for any other, e.g. kombu's
#: sentinel:// and redis+socket://, on every count: deliveries would silently go uncounted); not a
#: broker URL, so a Unix socket's unix:// too
COUNTER_SCHEMES = contract.REDIS_PY_SCHEMES + ("unix",)


#: basic.qos's prefetch_count is a 16-bit field (AMQP 0-9-1): py-amqp fails to pack a larger count
#: (struct.error "'H' format requires 0 <= number <= 65535", the worker's "Unrecoverable error").
MAX_PREFETCH_COUNT = 65535
PREFETCH_VALID = "an integer >= 1 (0 means unlimited prefetch)"


def prefetch_fits(value: Any) -> bool:
    """A prefetch multiplier a worker can run with, whatever its broker: an integer >= 1."""
    return is_whole(value) and value >= 1


def prefetch_problem(value: Any, *, named: str, amqp: bool, pool_size: Any = None, said: str | None = None,
                     pool_named: str = "the pool size") -> str | None:
    """Why a worker must not run with prefetch multiplier ``value`` (None when it may): the one rule of
    configure()'s ``prefetch_multiplier``, ``taskherd worker --prefetch-multiplier`` and what the worker
    really uses at start (BrokerCheck: ``celery worker --prefetch-multiplier``, app.conf changed later).

    An integer >= 1: Celery reads 0 as unlimited prefetch (every ready message held unacknowledged
    by one worker) and a negative count as none at all on Redis (the worker is ready and consumes
    nothing) or as a basic.qos it cannot send on RabbitMQ. On RabbitMQ (``amqp``) the count sent is
    the multiplier x the pool size (``pool_size``: the autoscale maximum if any; None or unknown: 1),
    at most :data:`MAX_PREFETCH_COUNT`. ``named``: the setting as the user wrote it
    (``--prefetch-multiplier``, ``app.conf.worker_prefetch_multiplier``, ``prefetch_multiplier``);
    ``said``: where the value came from (``configure()'s prefetch_multiplier=4``), named first."""
    size = pool_size if is_whole(pool_size) and pool_size >= 1 else 1
    largest = MAX_PREFETCH_COUNT // size
    said = f"{said}: {named}" if said else f"{named}={contract.shown(value)}"
    valid = f"valid: an integer from 1 to {largest}, 1 recommended" if amqp else "valid: 1"
    if not prefetch_fits(value):
        got = f"; got a {type(value).__name__}" if not isinstance(value, int) or isinstance(value, bool) else ""
        with_pool = f" with {pool_named} {size}" if amqp and size > 1 else ""
        return f"{said} must be {PREFETCH_VALID}{got} ({valid}{with_pool})"
    if amqp and value * size > MAX_PREFETCH_COUNT:
        return (f"{said} x {pool_named} {size} = {value * size} prefetched messages, more than RabbitMQ's basic.qos "
                f"takes ({MAX_PREFETCH_COUNT}: a 16-bit field); the worker would fail at its first connection "
                f"({valid} with {pool_named} {size})")
    return None


def _counter_url(value: Any) -> bool:
    return isinstance(value, str) and value.partition("://")[0].lower() in COUNTER_SCHEMES and "://" in value \
        and not contract.url_problem(value)


#: setting -> (does its value alone fit, the valid range in words). Checked before the rules that
#: combine settings, which then only see values of the right type (no TypeError from '300' > 0).
#: Every field of Settings has one (a test checks): a setting without a rule is accepted whatever
#: its value, and fails later, inside a worker.
_FIELD_RULES: dict[str, tuple[Any, str]] = {
    "soft_time_limit": (lambda v: is_seconds(v) and v > 0, "> 0 seconds (valid: a finite int or float)"),
    "time_limit": (lambda v: is_seconds(v) and v > 0, "> 0 seconds (valid: a finite int or float)"),
    "visibility_timeout": (lambda v: v is None or (is_seconds(v) and v > 0),
                           "> 0 seconds (valid: a finite int or float, or None to derive it)"),
    "broker_heartbeat": (lambda v: is_seconds(v) and v >= 0,
                         ">= 0 seconds (0 disables it; valid: a finite int or float)"),
    "backoff_base": (lambda v: is_seconds(v) and v > 0, "> 0 seconds (valid: a finite int or float)"),
    "backoff_cap": (lambda v: is_seconds(v) and v > 0, "> 0 seconds (valid: a finite int or float)"),
    "backoff_rng": (_rng, "None (random.random) or a function called with no argument that returns a float in "
                          "[0, 1], e.g. random.Random(7).random"),
    "rabbitmq_consumer_timeout": (lambda v: v is None or (is_seconds(v) and v > 0),
                                  "a number of seconds > 0, or None when consumer_timeout is disabled on the "
                                  "broker (valid: a finite int or float, or None)"),
    "prefetch_multiplier": (prefetch_fits, f"{PREFETCH_VALID}; valid: 1"),
    "max_retries": (lambda v: is_whole(v) and v >= 0, "an integer >= 0 (not a bool)"),
    "max_deliveries": (lambda v: is_whole(v) and v >= 1, "an integer >= 1 (not a bool)"),
    "max_tasks_per_child": (lambda v: v is None or (is_whole(v) and v >= 1),
                            "None (no limit) or an integer >= 1 (not a bool)"),
    "max_memory_per_child_kb": (lambda v: v is None or (is_whole(v) and v >= 1),
                                "None (no limit) or an integer >= 1 (not a bool)"),
    "queue_type": (lambda v: isinstance(v, str) and v in QUEUE_TYPES, f"one of {list(QUEUE_TYPES)!r}"),
    "queues": (lambda v: v is None or _names(v), "a list of queue names, e.g. ['orders'], or None"),
    "dead_letter_queue": (lambda v: isinstance(v, str), "a str containing '{queue}', e.g. '{queue}.dlq'"),
    "dead_letter_queues": (lambda v: v is None or _names(v),
                           "a list of queue names, one per queue, e.g. ['orders.failed'], or None"),
    "delivery_counter_url": (lambda v: v is None or _counter_url(v),
                             "a redis:// URL with a port in 1..65535 (or rediss://, or unix:// for a socket: what "
                             "redis-py's Redis.from_url takes; not sentinel:// nor redis+socket://), or None"),
    "accept_content": (lambda v: isinstance(v, (list, tuple)) and all(isinstance(c, str) for c in v),
                       "a list of content types (valid: ['json'])"),
    "transient_errors": (_exception_classes, "a list of exception classes, e.g. [ConnectionError]"),
    "permanent_errors": (_exception_classes, "a list of exception classes, e.g. [ValueError]"),
}

#: setting -> (its largest value, in words, the valid range), checked once its rule above passed: an
#: unbounded duration breaks where it is used (a retry countdown past timedelta's range, threading's
#: waits overflowing), and a week is what the same settings' TASKHERD_* variables take
#: (taskherd.contract.MAX_SECONDS); the others say why theirs differs.
_MAXIMA: dict[str, tuple[int, str, str]] = {
    "soft_time_limit": (MAX_SECONDS, "a week", "0 < soft_time_limit <= {max}"),
    "time_limit": (MAX_SECONDS, "a week", "0 < time_limit <= {max}"),
    "backoff_base": (MAX_SECONDS, "a week", "0 < backoff_base <= {max}"),
    "backoff_cap": (MAX_SECONDS, "a week", "0 < backoff_cap <= {max}"),
    "visibility_timeout": (MAX_BROKER_TIMEOUT, "30 days", "0 < visibility_timeout <= {max}, or None to derive it"),
    "rabbitmq_consumer_timeout": (MAX_BROKER_TIMEOUT, "30 days", "0 < rabbitmq_consumer_timeout <= {max}, or None"),
    "broker_heartbeat": (MAX_HEARTBEAT, "AMQP's 16-bit field", "0 <= broker_heartbeat <= {max}, 0 disables it"),
    "max_deliveries": (MAX_DELIVERIES, "what x-delivery-limit takes", "an integer from 1 to {max}"),
}


def field_problems(settings: Settings) -> dict[str, str]:
    """{setting: problem} for each setting whose value is wrong on its own (type, range, nan, inf)."""
    problems = {}
    for name, (fits, valid) in _FIELD_RULES.items():
        value = getattr(settings, name)
        if not fits(value):
            expects_text = name in ("queue_type", "dead_letter_queue", "delivery_counter_url")
            wrong_type = isinstance(value, bool) or (isinstance(value, str) and not expects_text)
            got = f"; got a {type(value).__name__}" if wrong_type else ""
            said = contract.shown(value, redacted=True)  # a delivery_counter_url's password stays out of the logs
            problems[name] = f"{name}={said} must be {valid}{got}"
        elif name in _MAXIMA and value is not None and value > _MAXIMA[name][0]:
            largest, why, valid_range = _MAXIMA[name]
            problems[name] = (f"{name}={contract.shown(value)} is more than {largest} ({why}) "
                              f"(valid: {valid_range.format(max=largest)})")
    return problems


def _name_the_variables(errors: Sequence[str], variable_of: Mapping[str, str], environ: Mapping[str, str]) -> list[str]:
    """``errors`` where each setting the pod's environment set (``variable_of``: setting -> the
    variable that set it) is also named as the user wrote it (``soft_time_limit=300.0 must be less
    than time_limit=300 …`` says nothing to whoever set TASKHERD_SOFT_TIME_LIMIT=300 in the chart)."""
    named = []
    for error in errors:
        mentioned = [f"{variable}={environ[variable].strip()!r}" for setting, variable in variable_of.items()
                     if re.search(rf"(?<![\w.]){setting}[=:]", error)]
        named.append(f"{error} [from the environment: {', '.join(mentioned)}]" if mentioned else error)
    return named


def validate(settings: Settings, *, broker_url: str, queues: Sequence[str],
             app_serialization: Mapping[str, Any], parks_delayed_messages: bool = False) -> tuple[list[str], list[str]]:
    """Every problem with the combination (errors, warnings); pure, so tests call it directly.

    Each setting is checked on its own first (:func:`field_problems`); a rule combining settings is
    checked only when all of them passed, so one wrong value is reported once, by its own name.

    ``parks_delayed_messages``: the DelayedMessages component is installed, so on Redis a retry's
    countdown is spent in the delay set rather than unacknowledged in a worker."""
    s = settings
    bad = field_problems(s)
    errors: list[str] = list(bad.values())
    warns: list[str] = []
    kind = broker_kind(broker_url)

    def ok(*names: str) -> bool:
        return not any(name in bad for name in names)

    if ok("soft_time_limit", "time_limit") and s.soft_time_limit >= s.time_limit:
        errors.append(f"soft_time_limit={s.soft_time_limit!r} must be less than time_limit={s.time_limit!r} "
                      f"(valid: 0 < soft_time_limit < {s.time_limit!r}); the soft limit lets the task "
                      f"clean up before the hard limit kills its process")
    visibility = s.visibility_timeout if kind == "redis" else None
    if visibility is not None and ok("visibility_timeout", "time_limit", "backoff_cap"):
        if visibility <= s.time_limit:
            errors.append(f"visibility_timeout={visibility!r} must be greater than time_limit={s.time_limit!r} "
                          f"(valid: > {s.time_limit!r}, derived default "
                          f"{derived_visibility_timeout(time_limit=s.time_limit, backoff_cap=s.backoff_cap)!r}); "
                          f"otherwise Redis redelivers a task that is still running")
        elif visibility < s.time_limit + s.backoff_cap and not parks_delayed_messages:
            warns.append(f"visibility_timeout={visibility!r} is less than time_limit + backoff_cap = "
                         f"{s.time_limit + s.backoff_cap!r}: a retry waiting for its countdown may be redelivered "
                         f"and run twice")
    consumer_timeout = s.rabbitmq_consumer_timeout if kind == "amqp" else None
    if consumer_timeout is not None and ok("rabbitmq_consumer_timeout", "time_limit", "backoff_cap"):
        if s.time_limit >= consumer_timeout:
            errors.append(f"time_limit={s.time_limit!r} is not below rabbitmq_consumer_timeout={consumer_timeout!r}: "
                          f"RabbitMQ closes the channel of a task that runs that long and redelivers it while it "
                          f"runs (valid: time_limit < {consumer_timeout!r}); or raise consumer_timeout in "
                          f"rabbitmq.conf (milliseconds there) and pass its value here, in seconds")
        elif s.time_limit + s.backoff_cap >= consumer_timeout:
            warns.append(f"time_limit + backoff_cap = {s.time_limit + s.backoff_cap!r} is not below "
                         f"rabbitmq_consumer_timeout={consumer_timeout!r}: a retry waiting for its countdown, held "
                         f"unacknowledged by a busy worker, may be redelivered by RabbitMQ and run twice")
    bad_accept = _non_json(s.accept_content) if ok("accept_content") else []
    if bad_accept:
        errors.append(f"accept_content={list(s.accept_content)!r} accepts non-JSON content {bad_accept!r} "
                      f"(valid: ['json']); pickle and friends from the broker are remote code execution")
    for setting, value in app_serialization.items():
        bad_serialization = _non_json(value)
        if bad_serialization:
            errors.append(f"{setting}={value!r} is not JSON (valid: 'json'); the profile accepts and "
                          f"produces JSON only")
    too_many = prefetch_problem(s.prefetch_multiplier, named="prefetch_multiplier", amqp=kind == "amqp",
                                pool_size=1, pool_named="at least one pool process") if ok("prefetch_multiplier") else None
    if too_many:  # on RabbitMQ above 65535 even for one pool process; BrokerCheck judges the real pool size
        errors.append(too_many)
    elif ok("prefetch_multiplier") and s.prefetch_multiplier > 1:
        why = (f"prefetch_multiplier={s.prefetch_multiplier!r} with late acks: prefetched messages sit unacked "
               f"behind running tasks")
        if kind == "redis":
            errors.append(f"{why} and Redis redelivers them after visibility_timeout while still held "
                          f"(duplicates); valid: 1")
        else:
            warns.append(f"{why}, adding latency and hiding backlog from the ready count; 1 is recommended")
    if ok("broker_heartbeat") and s.broker_heartbeat == 0 and kind == "amqp":
        warns.append("broker_heartbeat=0 on RabbitMQ: a dead connection may take minutes to notice")
    if ok("backoff_base", "backoff_cap") and not s.backoff_cap >= s.backoff_base:
        errors.append(f"backoff_cap={s.backoff_cap!r} must be >= backoff_base={s.backoff_base!r}")
    duplicates = sorted({name for name in queues if list(queues).count(name) > 1}) if ok("queues") else []
    if not queues:
        errors.append("queues=[] must name at least one work queue")
    elif duplicates:
        errors.append(f"queues={list(queues)!r} names {', '.join(map(repr, duplicates))} more than once "
                      f"(valid: each queue once)")
    elif ok("queues", "dead_letter_queue", "dead_letter_queues"):
        try:
            dead_letters = contract.dead_letter_queues(
                queues, s.dead_letter_queues, s.dead_letter_queue,
                source="dead_letter_queues" if s.dead_letter_queues else "dead_letter_queue")
        except contract.ContractError as exc:
            errors.extend(exc.problems)
        else:
            errors.extend(_queue_name_problems(dead_letters, s, amqp=kind == "amqp"))
    return errors, warns


#: AMQP 0-9-1 sends a queue name (and the exchange and routing key, which the profile names after
#: the queue) as a short string: at most 255 bytes of UTF-8.
AMQP_MAX_NAME_BYTES = 255


def _queue_name_problems(dead_letters: Mapping[str, str], s: Settings, *, amqp: bool) -> list[str]:
    """A problem for each work queue or DLQ name the broker cannot take, found here rather than at
    the first declare, inside a worker: on RabbitMQ a name over 255 bytes of UTF-8 (py-amqp fails to
    pack it, struct.error), including a DLQ derived from a work queue short enough itself (the
    chart and the operator cap a work queue at 251 bytes for '{queue}.dlq'); on both brokers a name
    that cannot be encoded in UTF-8 at all (a lone surrogate: py-amqp and redis-py raise
    UnicodeEncodeError), or one holding an invisible format character (U+200B…). On Redis a name is
    part of a key, which may be far longer: no length to refuse."""
    problems = []
    explicit = bool(s.dead_letter_queues)
    for queue, dlq in dead_letters.items():
        named = []
        for what, name in (("work queue", queue), ("dead-letter queue", dlq)):
            setting = "dead_letter_queues" if what != "work queue" and explicit else "queues"  # as written
            try:
                size = len(name.encode("utf-8"))
            except UnicodeEncodeError as exc:
                problems.append(f"{setting}: the {what} {name!r} cannot be encoded in UTF-8 ({exc.reason} at "
                                f"{exc.start}); valid: a name of Unicode characters, no lone surrogates")
                continue
            invisible = contract.format_character(name)
            if invisible is not None:  # as the chart and the WorkerPool CRD refuse it
                problems.append(f"{setting}: the {what} {name!r} holds {invisible}, an invisible format character: "
                                f"it looks like another queue's name, and its workers would wait on a queue nobody "
                                f"sends to (valid: a name without Unicode format characters, category Cf)")
            if amqp and size > AMQP_MAX_NAME_BYTES:
                named.append((what, name, size))
        if named and named[0][0] == "work queue" and not explicit:
            named = named[:1]  # a derived DLQ is longer still: one problem, the work queue's, says it
        for what, name, size in named:
            if what == "work queue":
                problems.append(f"queues: the work queue {name!r} is {size} bytes in UTF-8; RabbitMQ takes queue "
                                f"names of at most {AMQP_MAX_NAME_BYTES} bytes (valid: a name of at most "
                                f"{AMQP_MAX_NAME_BYTES} bytes)")
            elif explicit:
                problems.append(f"dead_letter_queues: the dead-letter queue {name!r} of {queue!r} is {size} bytes in "
                                f"UTF-8; RabbitMQ takes queue names of at most {AMQP_MAX_NAME_BYTES} bytes (valid: "
                                f"a name of at most {AMQP_MAX_NAME_BYTES} bytes)")
            else:
                room = max(0, AMQP_MAX_NAME_BYTES - (size - len(queue.encode("utf-8"))))
                problems.append(f"queues: the dead-letter queue {name!r} of the work queue {queue!r} "
                                f"(dead_letter_queue={s.dead_letter_queue!r}) is {size} bytes in UTF-8; RabbitMQ "
                                f"takes queue names of at most {AMQP_MAX_NAME_BYTES} bytes (valid: a work queue "
                                f"of at most {room} bytes with this pattern)")
    return problems


def _queue_declarations(profile: Profile, existing: Sequence[Any] = ()) -> list:
    """kombu Queues for the profiled queues; a queue the app already declares keeps its exchange
    and routing key and gains the dead-letter arguments."""
    from kombu import Exchange, Queue

    by_name = {getattr(q, "name", None): q for q in existing or ()}
    declared = []
    for name in profile.queues:
        arguments: dict[str, Any] = {
            # The default exchange routes by queue name: no extra exchange to declare or bind.
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": profile.dead_letter_queue_for(name),
        }
        if profile.queue_type == "quorum":
            arguments["x-queue-type"] = "quorum"
            # Backstop: RabbitMQ dead-letters natively once a message was returned more than
            # this many times (3.x: runs = limit + 1). Our counter acts first — it dead-letters,
            # with an envelope, delivery max_deliveries + 1 before running it, so that delivery
            # is never returned — and this bounds the loop when the counter is unavailable.
            arguments["x-delivery-limit"] = profile.max_deliveries
        if name in by_name:
            queue = by_name[name]
            declared.append(Queue(name, queue.exchange, routing_key=queue.routing_key, durable=True,
                                  queue_arguments={**(queue.queue_arguments or {}), **arguments}))
        else:
            declared.append(Queue(name, Exchange(name, type="direct", durable=True), routing_key=name,
                                  durable=True, queue_arguments=arguments))
    # Queues the app declares that are not profiled stay as they were (without dead-lettering).
    declared += [q for q in existing or () if getattr(q, "name", None) not in profile.queues]
    return declared


def _from_environment(explicit: Mapping[str, Any], environ: Mapping[str, str]) -> tuple[dict[str, Any], list[str]]:
    """(settings the pod's environment overrides, problems); warns where it overrides the code."""
    values, problems = contract.read(ENVIRONMENT, environ)
    overrides = {}
    for name, setting in ENVIRONMENT.items():
        if not contract.is_set(name, environ) or name not in values:
            continue
        given = explicit.get(setting)
        if setting in explicit and (tuple(given) if isinstance(given, list) else given) != values[name]:
            warnings.warn(f"{name}={environ[name].strip()!r} overrides {setting}={explicit[setting]!r} given to "
                          f"configure(): the pod's environment wins (the chart derived the pod from it)",
                          ProfileWarning, stacklevel=3)
        overrides[setting] = values[name]
    return overrides, problems


def _broker_url(app: Any, environ: Mapping[str, str]) -> tuple[str, list[str]]:
    values, problems = contract.read((BROKER_URL_VARIABLE, BROKER_TYPE_VARIABLE), environ)
    if problems:  # an invalid variable has no value: report it rather than check the app's URL against it
        return app.conf.broker_url or "", problems
    if values[BROKER_URL_VARIABLE]:
        app.conf.broker_url = values[BROKER_URL_VARIABLE]
    broker_url = app.conf.broker_url or ""
    problem = contract.url_problem(broker_url)
    if problem:  # the app's own broker_url (the variable's was checked by contract.read)
        problems.append(f"broker_url={broker_url.partition('://')[0]}://…: {problem}")
    wanted = values[BROKER_TYPE_VARIABLE]
    if wanted and broker_kind(broker_url) != _BROKER_TYPE_KINDS[wanted]:
        problems.append(f"{BROKER_TYPE_VARIABLE}={wanted!r} but the broker URL is "
                        f"{broker_kind(broker_url)!r} ({broker_url.partition('://')[0]}://…): the chart's "
                        f"broker.type must match the URL in the broker Secret")
    return broker_url, problems


def time_limit_problem(task: str, time_limit: Any, *, below: float, what: str = "visibility_timeout") -> str | None:
    """Why ``task`` must not run with hard limit ``time_limit``, if it must not: the broker (Redis's
    ``visibility_timeout``, RabbitMQ's consumer timeout) would deliver it again while it runs."""
    if isinstance(time_limit, (int, float)) and not isinstance(time_limit, bool) and time_limit >= below:
        return (f"task {task!r}: time_limit={time_limit!r} is not below {what}={below!r}: a run that long is "
                f"delivered a second time while it still runs (valid: time_limit < {below!r}; shorten the limit, "
                f"or raise {what} in configure())")
    return None


def call_time_limit_problem(app: Any, task: str, time_limit: Any, soft_time_limit: Any, *,
                            below: float | None, what: str = "visibility_timeout") -> str | None:
    """Why a message of ``task`` must not be published with these per-call limits
    (``apply_async(time_limit=…, soft_time_limit=…)``), or None: not numbers (the worker would
    dead-letter it), a soft limit not below the hard one (the task is killed before it is asked to
    stop), or a hard limit not below ``below`` (Redis's visibility timeout, RabbitMQ's consumer
    timeout: ``what``)."""
    for option, value in (("time_limit", time_limit), ("soft_time_limit", soft_time_limit)):
        if value is not None and not (isinstance(value, (int, float)) and not isinstance(value, bool)
                                      and math.isfinite(value) and value > 0):
            return f"task {task!r}: {option}={value!r} is not a number of seconds (valid: a number > 0, or leave it out)"
    if time_limit is not None and below is not None:
        problem = time_limit_problem(task, time_limit, below=below, what=what)
        if problem:
            return problem
    if soft_time_limit is not None:
        hard = time_limit if time_limit is not None else (getattr(app.tasks.get(task), "time_limit", None)
                                                          or app.conf.task_time_limit)
        if hard and soft_time_limit >= hard:
            return (f"task {task!r}: soft_time_limit={soft_time_limit!r} is not below its hard time limit {hard!r} "
                    f"(valid: 0 < soft_time_limit < {hard!r}): the task would be killed before it is asked to stop")
    return None


def wait_problem(task: str, countdown: Any, eta: Any, *, consumer_timeout: float, time_limit: float) -> str | None:
    """Why a message of ``task`` must not wait that long on RabbitMQ (None when it may): a worker takes
    an ETA message at once and holds it unacknowledged until it has run, and RabbitMQ closes the
    channel of a delivery held longer than its consumer_timeout, redelivering every delivery of that
    channel, running tasks included (they run twice)."""
    import datetime as dt

    if isinstance(eta, dt.datetime):
        wait, said = eta.timestamp() - dt.datetime.now(dt.timezone.utc).timestamp(), f"eta={eta.isoformat()}"
    elif isinstance(countdown, (int, float)) and not isinstance(countdown, bool):
        wait, said = float(countdown), f"countdown={countdown!r}"
    else:
        return None
    room = consumer_timeout - time_limit
    if wait < room:
        return None
    return (f"task {task!r}: {said} waits {wait:.0f} s, not below rabbitmq_consumer_timeout - time_limit = "
            f"{consumer_timeout:g} - {time_limit:g} = {room:g} s: a worker holds the message unacknowledged until "
            f"the task has run, and RabbitMQ closes the channel of a delivery held longer than consumer_timeout, "
            f"delivering again every task of that channel, running ones included (valid: a wait under {room:g} s; "
            f"for longer ones raise consumer_timeout in rabbitmq.conf and rabbitmq_consumer_timeout in configure(), "
            f"or send the task later, e.g. from celery beat)")


def refuse_time_limits_at_publish(app: Any, profile: Profile) -> None:
    """Every task message ``app`` builds with per-call time limits it must not run with
    (:func:`call_time_limit_problem`, against Redis's visibility timeout or RabbitMQ's consumer
    timeout: a longer run is delivered again while it runs), or on RabbitMQ
    a first attempt waiting longer than the broker lets a worker hold it (:func:`wait_problem`),
    raises :class:`ProfileError` instead of being published. (A retry's own countdown is bounded by
    backoff_cap, checked in configure().)"""
    create = compat.task_message_creator(app)
    if getattr(create, "taskherd_checked", False):  # configure() ran before: replace the check
        create = create.__wrapped__
    parameters = list(inspect.signature(create).parameters)
    name_at, limit_at, soft_at, countdown_at, eta_at, retries_at = (
        parameters.index(name) for name in ("name", "time_limit", "soft_time_limit", "countdown", "eta", "retries"))
    consumer_timeout = profile.rabbitmq_consumer_timeout if profile.broker_is_amqp else None
    below, what = ((consumer_timeout, "rabbitmq_consumer_timeout") if profile.broker_is_amqp
                   else (profile.visibility_timeout, "visibility_timeout"))

    def given(at: int, name: str, args: tuple, kwargs: dict) -> Any:
        return args[at] if len(args) > at else kwargs.get(name)

    def checked(*args: Any, **kwargs: Any) -> Any:
        time_limit = given(limit_at, "time_limit", args, kwargs)
        soft_time_limit = given(soft_at, "soft_time_limit", args, kwargs)
        if time_limit is not None or soft_time_limit is not None:
            problem = call_time_limit_problem(app, given(name_at, "name", args, kwargs), time_limit,
                                              soft_time_limit, below=below, what=what)
            if problem:
                raise ProfileError([problem])
        if consumer_timeout is not None and not given(retries_at, "retries", args, kwargs):
            countdown, eta = given(countdown_at, "countdown", args, kwargs), given(eta_at, "eta", args, kwargs)
            if countdown is not None or eta is not None:
                run_limit = time_limit if isinstance(time_limit, (int, float)) else profile.time_limit
                problem = wait_problem(given(name_at, "name", args, kwargs), countdown, eta,
                                       consumer_timeout=consumer_timeout, time_limit=run_limit)
                if problem:
                    raise ProfileError([problem])
        return create(*args, **kwargs)

    checked.__wrapped__ = create
    checked.taskherd_checked = True
    compat.set_task_message_creator(app, checked)


def _components(components: Any) -> tuple[list[Component], list[str]]:
    """(the components to install, problems): None means :func:`default_components`; anything else
    must be a list of Component instances. Checked here, so that components=5 or ['Heartbeat'] is a
    ProfileError naming the argument, not a TypeError or AttributeError from inside configure()."""
    if components is None:
        return default_components(), []
    valid = ("valid: a list of component instances, e.g. [*default_components(), Heartbeat(interval=2.0)], "
             "or None for default_components()")
    if isinstance(components, (str, bytes, Mapping)) or not hasattr(components, "__iter__"):
        return [], [f"components={contract.shown(components)} is not a list of components ({valid}); "
                    f"got a {type(components).__name__}"]
    chosen, problems = [], []
    for index, component in enumerate(components):
        if isinstance(component, Component):
            chosen.append(component)
        elif isinstance(component, type) and issubclass(component, Component):
            problems.append(f"components[{index}]={component.__name__} is a class, not a component "
                            f"(valid: an instance, {component.__name__}())")
        else:
            problems.append(f"components[{index}]={contract.shown(component)} is not a component ({valid}); "
                            f"got a {type(component).__name__}")
    return chosen, problems


def configure(app: Any, *, components: Sequence[Component] | None = None, **settings: Any) -> Profile:
    """Apply the reliability profile to ``app`` and return the validated :class:`Profile`.

    ``settings`` are the fields of :class:`Settings` (each documented there). The pod's environment
    (``TASKHERD_*``, see taskherd.contract) overrides them. ``components`` defaults to
    :func:`taskherd.worker.components.default_components`; give a list to leave one out, replace or
    configure one. Workers must consume only the profiled ``queues`` (they are declared with their
    dead-letter arguments). The broker URL must be set before (``Celery(broker=...)``,
    ``broker_url``, ``CELERY_BROKER_URL`` or ``TASKHERD_BROKER_URL``): the Redis-only settings and
    checks depend on it. Raises :class:`ProfileError` listing every invalid setting, its value and
    the valid range. Legal but risky choices (``Profile.worker_warnings``) become a
    :class:`ProfileWarning` in the log of each worker of the app when it starts, not here: producers
    call configure() too.
    """
    unknown = sorted(set(settings) - set(SETTING_NAMES))
    if unknown:
        raise ProfileError([f"configure() has no setting {name!r} (valid: {', '.join(SETTING_NAMES)})"
                            for name in unknown])
    environ = os.environ
    conf = app.conf
    overrides, errors = _from_environment(settings, environ)
    broker_url, broker_problems = _broker_url(app, environ)
    errors += broker_problems
    chosen, component_problems = _components(components)
    errors += component_problems
    resolved: list[Component] = []
    for component in chosen:
        try:
            component = component.with_environment(environ)
        except contract.ContractError as exc:
            errors += exc.problems
        set_here = {field: name for name, field in component.environment.items() if contract.is_set(name, environ)}
        errors += _name_the_variables(component.problems(), set_here, environ)
        resolved.append(component)
    errors += missing_requirements(resolved)

    wanted = Settings(**{**settings, **overrides})
    # Only a valid list is taken apart here: queues=5 would raise TypeError before validate() could
    # name it (its field rule reports it; the default queue stands in meanwhile).
    queue_names = (tuple(wanted.queues) if wanted.queues is not None and _names(wanted.queues)
                   else (conf.task_default_queue,))
    app_serialization = {name: conf.get(name) for name in
                         ("task_serializer", "result_serializer", "event_serializer",
                          "accept_content", "result_accept_content")}
    from .components.delayed import DelayedMessages

    more_errors, warns = validate(wanted, broker_url=broker_url, queues=queue_names,
                                  app_serialization=app_serialization,
                                  parks_delayed_messages=any(isinstance(c, DelayedMessages) for c in resolved))
    errors += _name_the_variables(more_errors, {setting: name for name, setting in ENVIRONMENT.items()
                                                if setting in overrides}, environ)
    if errors:
        raise ProfileError(errors)

    kind = broker_kind(broker_url)
    visibility_timeout = wanted.visibility_timeout
    if kind == "redis" and visibility_timeout is None:
        visibility_timeout = derived_visibility_timeout(time_limit=wanted.time_limit, backoff_cap=wanted.backoff_cap)
    delivery_counter_url = wanted.delivery_counter_url
    if delivery_counter_url is None and kind == "redis":
        delivery_counter_url = broker_url.split(";")[0].strip()

    profile = Profile(
        **{name: getattr(wanted, name) for name in SETTING_NAMES if name not in ("queues",)},
        broker_url=broker_url, queues=queue_names,
        dead_letters=contract.dead_letter_queues(queue_names, wanted.dead_letter_queues, wanted.dead_letter_queue),
        classifier=make_classifier(transient=wanted.transient_errors, permanent=wanted.permanent_errors),
        components=tuple(resolved),
    )
    profile = dataclasses.replace(profile, visibility_timeout=visibility_timeout if kind == "redis" else None,
                                  delivery_counter_url=delivery_counter_url,
                                  worker_warnings=tuple(warns) + tuple(contract.misspelled(environ)))

    transport_options = dict(conf.broker_transport_options or {})
    if profile.visibility_timeout is not None:
        transport_options["visibility_timeout"] = profile.visibility_timeout
    if kind == "redis":
        for option, value in REDIS_TRANSPORT_DEFAULTS.items():
            transport_options.setdefault(option, value)
    if kind == "amqp":
        transport_options["confirm_publish"] = True
    conf.update(
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_acks_on_failure_or_timeout=True,
        worker_prefetch_multiplier=profile.prefetch_multiplier,
        task_soft_time_limit=profile.soft_time_limit,
        task_time_limit=profile.time_limit,
        worker_max_tasks_per_child=profile.max_tasks_per_child,
        worker_max_memory_per_child=profile.max_memory_per_child_kb,
        accept_content=[JSON_CONTENT],
        result_accept_content=[JSON_CONTENT],
        task_serializer=JSON_CONTENT,
        result_serializer=JSON_CONTENT,
        event_serializer=JSON_CONTENT,
        broker_heartbeat=profile.broker_heartbeat,
        worker_cancel_long_running_tasks_on_connection_loss=True,
        broker_connection_retry=True,
        broker_connection_max_retries=None,
        broker_transport_options=transport_options,
        task_queues=_queue_declarations(profile, list(conf.task_queues or ())),
    )
    if conf.task_default_queue not in queue_names:
        conf.task_default_queue = queue_names[0]
    setattr(app, APP_ATTRIBUTE, profile)
    refuse_time_limits_at_publish(app, profile)
    install_components(app, profile.components, profile)  # each class once: configure() may run twice
    _warn_when_a_worker_starts(app)
    return profile


def _warn_when_a_worker_starts(app: Any) -> None:
    """The profile's warnings, as ProfileWarning, once a worker of ``app`` has set up its logging
    (Celery routes warnings to the worker's log). They are about consuming: a producer importing
    the same app module calls configure() too and must not hear them."""
    from celery import signals

    def after_setup(sender: Any = None, instance: Any = None, **_: Any) -> None:
        if getattr(instance, "app", None) is not app:
            return
        for message in get_profile(app).worker_warnings:  # the last configure() call's
            warnings.warn(message, ProfileWarning, stacklevel=1)

    signals.celeryd_after_setup.connect(after_setup, weak=False, dispatch_uid=f"taskherd.profile.warnings.{id(app)}")
