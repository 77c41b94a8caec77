"""The reliability profile: one call that makes a Celery app lose no task, validated as a whole.

``configure(app, ...)`` applies the settings below, checks that they hold together, stores the
resulting :class:`Profile` on the app and then runs every module listed in ``_INSTALLERS``
(each exposes ``install(app, profile)``) to hook the runtime parts in: the base Task class that
retries and dead-letters, the consumer that dead-letters bad messages, and so on.

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
- ``broker_transport_options["visibility_timeout"]`` (Redis): derived as
  ``time_limit + backoff_cap + margin`` — a message is restored to the queue once it has been
  unacked that long, so it must outlive the longest run AND the longest retry countdown (retry
  messages wait unacked in the worker until their ETA).
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

import importlib
import os
import warnings
from dataclasses import dataclass, field
from typing import Any, Sequence
from urllib.parse import urlsplit

from .backoff import Rng
from .environment import BROKER_URL_VARIABLE, settings_from_env
from .transient import ErrorClassifier, make_classifier

#: Dotted module paths whose ``install(app, profile)`` configure() calls last, in order.
#: The lead adds the runtime modules of other areas here (idempotency, heartbeat, metrics, …).
_INSTALLERS: list[str] = [
    "taskherd.worker.task",  # base Task class: retries, dead-lettering, delivery counting
    "taskherd.worker.consumer",  # bad messages to the DLQ; DLQ declaration on RabbitMQ
    # --- other areas' installers go below this line ---
    "taskherd.worker.stamping",  # publish time on every message (queue age, queue-wait metric)
    "taskherd.worker.heartbeat",  # heartbeat file read by `taskherd probe`
    "taskherd.worker.draining",  # `taskherd drain` (preStop) support
    "taskherd.worker.metrics",  # Prometheus metrics on TASKHERD_METRICS_PORT (default 9808)
    "taskherd.worker.recovery",  # Redis: a killed worker's deliveries come back in seconds
]
#: Attribute of the Celery app listing the installers already run (configure() may run twice).
INSTALLED_ATTRIBUTE = "taskherd_installed"

JSON_CONTENT = "json"
_JSON_ALIASES = {"json", "application/json"}
REDIS_SCHEMES = {"redis", "rediss", "sentinel", "redis+socket"}
AMQP_SCHEMES = {"amqp", "amqps", "pyamqp", "librabbitmq"}
QUEUE_TYPES = ("classic", "quorum")
#: Attribute of the Celery app holding its Profile (read by get_profile()).
APP_ATTRIBUTE = "taskherd_profile"


class ProfileError(ValueError):
    """The profile's settings contradict each other. ``problems`` lists every one found."""

    def __init__(self, problems: Sequence[str]):
        self.problems = list(problems)
        super().__init__("invalid taskherd reliability profile: " + "; ".join(self.problems))


class ProfileWarning(UserWarning):
    """A legal but risky combination (documented in docs/reliability.md)."""


@dataclass(frozen=True, kw_only=True)
class Profile:
    """The validated reliability settings of one app. Other modules read these, never app.conf."""

    broker_url: str
    soft_time_limit: float
    time_limit: float
    max_tasks_per_child: int | None
    max_memory_per_child_kb: int | None
    prefetch_multiplier: int
    #: Redis only: seconds a delivered, unacked message stays invisible. None on RabbitMQ.
    visibility_timeout: float | None
    broker_heartbeat: float
    max_retries: int
    backoff_base: float
    backoff_cap: float
    backoff_rng: Rng | None = field(default=None, compare=False, repr=False)
    classifier: ErrorClassifier = field(default_factory=ErrorClassifier)
    #: the work queues declared with dead-lettering, e.g. ("orders",)
    queues: tuple[str, ...]
    #: DLQ name pattern; ``{queue}`` is replaced by the work queue's name
    dead_letter_queue: str
    #: deliveries of one (task id, retry) allowed before it is dead-lettered unrun
    max_deliveries: int
    #: Redis URL of the delivery counter; None disables counting (quorum x-delivery-limit remains)
    delivery_counter_url: str | None
    queue_type: str
    #: seconds a delivery counter key lives (long enough to outlast any redelivery loop)
    delivery_counter_ttl: float = 7 * 24 * 3600

    @property
    def broker_is_redis(self) -> bool:
        return broker_kind(self.broker_url) == "redis"

    @property
    def broker_is_amqp(self) -> bool:
        return broker_kind(self.broker_url) == "amqp"

    def dead_letter_queue_for(self, queue: str) -> str:
        return self.dead_letter_queue.format(queue=queue)


def broker_kind(url: str | None) -> str:
    """'redis', 'amqp' or 'other' from a broker URL (its first URL when several are given)."""
    first = (url or "").split(";")[0].strip()
    scheme = urlsplit(first).scheme.lower()
    if scheme in REDIS_SCHEMES:
        return "redis"
    if scheme in AMQP_SCHEMES:
        return "amqp"
    return "other"


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


def validate(*, broker_url: str, soft_time_limit: float, time_limit: float,
             max_tasks_per_child: int | None, max_memory_per_child_kb: int | None,
             prefetch_multiplier: int, visibility_timeout: float | None, broker_heartbeat: float,
             max_retries: int, backoff_base: float, backoff_cap: float, max_deliveries: int,
             queue_type: str, dead_letter_queue: str, queues: Sequence[str],
             accept_content: Sequence[str], app_serialization: dict[str, Any]) -> tuple[list[str], list[str]]:
    """Every problem with the combination (errors, warnings); pure, so tests call it directly."""
    errors: list[str] = []
    warns: list[str] = []
    kind = broker_kind(broker_url)

    if not time_limit > 0:
        errors.append(f"time_limit={time_limit!r} must be > 0 seconds")
    if not soft_time_limit > 0:
        errors.append(f"soft_time_limit={soft_time_limit!r} must be > 0 seconds")
    elif soft_time_limit >= time_limit:
        errors.append(f"soft_time_limit={soft_time_limit!r} must be less than time_limit={time_limit!r} "
                      f"(valid: 0 < soft_time_limit < {time_limit!r}); the soft limit lets the task "
                      f"clean up before the hard limit kills its process")
    if visibility_timeout is not None and time_limit > 0 and visibility_timeout <= time_limit:
        errors.append(f"visibility_timeout={visibility_timeout!r} must be greater than time_limit={time_limit!r} "
                      f"(valid: > {time_limit!r}, derived default "
                      f"{derived_visibility_timeout(time_limit=time_limit, backoff_cap=max(backoff_cap, 0))!r}); "
                      f"otherwise Redis redelivers a task that is still running")
    elif (visibility_timeout is not None and kind == "redis" and time_limit > 0
          and visibility_timeout < time_limit + backoff_cap):
        warns.append(f"visibility_timeout={visibility_timeout!r} is less than time_limit + backoff_cap = "
                     f"{time_limit + backoff_cap!r}: a retry waiting for its countdown may be redelivered "
                     f"and run twice")
    bad_accept = _non_json(accept_content)
    if bad_accept:
        errors.append(f"accept_content={list(accept_content)!r} accepts non-JSON content {bad_accept!r} "
                      f"(valid: ['json']); pickle and friends from the broker are remote code execution")
    for setting, value in app_serialization.items():
        bad = _non_json(value)
        if bad:
            errors.append(f"{setting}={value!r} is not JSON (valid: 'json'); the profile accepts and "
                          f"produces JSON only")
    if not (isinstance(prefetch_multiplier, int) and prefetch_multiplier >= 1):
        errors.append(f"prefetch_multiplier={prefetch_multiplier!r} must be an integer >= 1 "
                      f"(0 means unlimited prefetch); valid: 1")
    elif prefetch_multiplier > 1:
        why = (f"prefetch_multiplier={prefetch_multiplier!r} with late acks: prefetched messages sit unacked "
               f"behind running tasks")
        if kind == "redis":
            errors.append(f"{why} and Redis redelivers them after visibility_timeout while still held "
                          f"(duplicates); valid: 1")
        else:
            warns.append(f"{why}, adding latency and hiding backlog from the ready count; 1 is recommended")
    for name, value in (("max_tasks_per_child", max_tasks_per_child),
                        ("max_memory_per_child_kb", max_memory_per_child_kb)):
        if value is not None and not (isinstance(value, int) and value >= 1):
            errors.append(f"{name}={value!r} must be None (no limit) or an integer >= 1")
    if not broker_heartbeat >= 0:
        errors.append(f"broker_heartbeat={broker_heartbeat!r} must be >= 0 seconds (0 disables it)")
    elif broker_heartbeat == 0 and kind == "amqp":
        warns.append("broker_heartbeat=0 on RabbitMQ: a dead connection may take minutes to notice")
    if not (isinstance(max_retries, int) and max_retries >= 0):
        errors.append(f"max_retries={max_retries!r} must be an integer >= 0")
    if not backoff_base > 0:
        errors.append(f"backoff_base={backoff_base!r} must be > 0 seconds")
    elif not backoff_cap >= backoff_base:
        errors.append(f"backoff_cap={backoff_cap!r} must be >= backoff_base={backoff_base!r}")
    if not (isinstance(max_deliveries, int) and max_deliveries >= 1):
        errors.append(f"max_deliveries={max_deliveries!r} must be an integer >= 1")
    if queue_type not in QUEUE_TYPES:
        errors.append(f"queue_type={queue_type!r} must be one of {list(QUEUE_TYPES)!r}")
    if "{queue}" not in dead_letter_queue:
        errors.append(f"dead_letter_queue={dead_letter_queue!r} must contain '{{queue}}' "
                      f"(e.g. '{{queue}}.dlq') so each work queue gets its own DLQ")
    if not queues:
        errors.append("queues=[] must name at least one work queue")
    return errors, warns


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


def configure(
    app: Any,
    *,
    soft_time_limit: float = 240,
    time_limit: float = 300,
    max_tasks_per_child: int | None = 1000,
    max_memory_per_child_kb: int | None = None,
    prefetch_multiplier: int = 1,
    visibility_timeout: float | None = None,
    broker_heartbeat: float = 30,
    max_retries: int = 5,
    backoff_base: float = 1.0,
    backoff_cap: float = 120.0,
    backoff_rng: Rng | None = None,
    transient_errors: Sequence[type[BaseException]] = (),
    permanent_errors: Sequence[type[BaseException]] = (),
    queues: Sequence[str] | None = None,
    dead_letter_queue: str = "{queue}.dlq",
    max_deliveries: int = 5,
    delivery_counter_url: str | None = None,
    queue_type: str = "classic",
    accept_content: Sequence[str] = ("json",),
) -> Profile:
    """Apply the reliability profile to ``app`` and return the validated :class:`Profile`.

    ``queues`` defaults to ``[app.conf.task_default_queue]``; workers must consume only queues
    listed here (they are declared with their dead-letter arguments). ``delivery_counter_url``
    defaults to the broker URL on Redis; on RabbitMQ without it, per-delivery counting is off
    (a warning says so) and only a quorum queue's ``x-delivery-limit`` bounds a poison message.
    The broker URL must be set before (``Celery(broker=...)``, ``broker_url`` or
    ``CELERY_BROKER_URL``): the Redis-only settings and checks depend on it.
    Raises :class:`ProfileError` listing every invalid setting, its value and the valid range.
    """
    conf = app.conf
    # The pod's environment (set by the chart) wins over the code's values: see environment.py.
    env_values, env_problems = settings_from_env(os.environ)
    soft_time_limit = env_values.get("soft_time_limit", soft_time_limit)
    time_limit = env_values.get("time_limit", time_limit)
    visibility_timeout = env_values.get("visibility_timeout", visibility_timeout)
    max_tasks_per_child = env_values.get("max_tasks_per_child", max_tasks_per_child)
    max_memory_per_child_kb = env_values.get("max_memory_per_child_kb", max_memory_per_child_kb)
    queues = env_values.get("queues", queues)
    if os.environ.get(BROKER_URL_VARIABLE, "").strip():
        conf.broker_url = os.environ[BROKER_URL_VARIABLE].strip()
    broker_url = conf.broker_url or ""
    queue_names = tuple(queues) if queues is not None else (conf.task_default_queue,)
    app_serialization = {name: conf.get(name) for name in
                         ("task_serializer", "result_serializer", "event_serializer",
                          "accept_content", "result_accept_content")}
    errors, warns = validate(
        broker_url=broker_url, soft_time_limit=soft_time_limit, time_limit=time_limit,
        max_tasks_per_child=max_tasks_per_child, max_memory_per_child_kb=max_memory_per_child_kb,
        prefetch_multiplier=prefetch_multiplier, visibility_timeout=visibility_timeout,
        broker_heartbeat=broker_heartbeat, max_retries=max_retries, backoff_base=backoff_base,
        backoff_cap=backoff_cap, max_deliveries=max_deliveries, queue_type=queue_type,
        dead_letter_queue=dead_letter_queue, queues=queue_names, accept_content=accept_content,
        app_serialization=app_serialization)
    errors = env_problems + errors
    if errors:
        raise ProfileError(errors)

    kind = broker_kind(broker_url)
    if kind == "redis" and visibility_timeout is None:
        visibility_timeout = derived_visibility_timeout(time_limit=time_limit, backoff_cap=backoff_cap)
    if delivery_counter_url is None and kind == "redis":
        delivery_counter_url = broker_url.split(";")[0].strip()
    if delivery_counter_url is None:
        warns.append("no delivery_counter_url (a Redis URL) on a non-Redis broker: a message that kills "
                     "its worker is bounded only by a quorum queue's x-delivery-limit")
    for message in warns:
        warnings.warn(message, ProfileWarning, stacklevel=2)

    profile = Profile(
        broker_url=broker_url, soft_time_limit=soft_time_limit, time_limit=time_limit,
        max_tasks_per_child=max_tasks_per_child, max_memory_per_child_kb=max_memory_per_child_kb,
        prefetch_multiplier=prefetch_multiplier,
        visibility_timeout=visibility_timeout if kind == "redis" else None,
        broker_heartbeat=broker_heartbeat, max_retries=max_retries, backoff_base=backoff_base,
        backoff_cap=backoff_cap, backoff_rng=backoff_rng,
        classifier=make_classifier(transient=transient_errors, permanent=permanent_errors),
        queues=queue_names, dead_letter_queue=dead_letter_queue, max_deliveries=max_deliveries,
        delivery_counter_url=delivery_counter_url, queue_type=queue_type,
    )

    transport_options = dict(conf.broker_transport_options or {})
    if profile.visibility_timeout is not None:
        transport_options["visibility_timeout"] = profile.visibility_timeout
    conf.update(
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_acks_on_failure_or_timeout=True,
        worker_prefetch_multiplier=prefetch_multiplier,
        task_soft_time_limit=soft_time_limit,
        task_time_limit=time_limit,
        worker_max_tasks_per_child=max_tasks_per_child,
        worker_max_memory_per_child=max_memory_per_child_kb,
        accept_content=[JSON_CONTENT],
        result_accept_content=[JSON_CONTENT],
        task_serializer=JSON_CONTENT,
        result_serializer=JSON_CONTENT,
        event_serializer=JSON_CONTENT,
        broker_heartbeat=broker_heartbeat,
        worker_cancel_long_running_tasks_on_connection_loss=True,
        broker_transport_options=transport_options,
        task_queues=_queue_declarations(profile, list(conf.task_queues or ())),
    )
    if conf.task_default_queue not in queue_names:
        conf.task_default_queue = queue_names[0]
    setattr(app, APP_ATTRIBUTE, profile)
    installed = getattr(app, INSTALLED_ATTRIBUTE, set())
    setattr(app, INSTALLED_ATTRIBUTE, installed)
    for module_path in _INSTALLERS:
        if module_path not in installed:  # a second configure() must not add bootsteps twice
            importlib.import_module(module_path).install(app, profile)
            installed.add(module_path)
    return profile
