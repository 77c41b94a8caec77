"""Settings changed after ``configure(app)`` that take the reliability profile back.

configure() writes its settings into ``app.conf`` once. Whatever writes them again below the call —
``app.conf.task_acks_late = False``, ``app.conf.broker_transport_options = {...}`` (a new dict,
without the options configure() added), ``app.config_from_object(cfg)`` (it replaces the whole
configuration) — or a task of its own (``@app.task(acks_late=False)``, a base class saying so, a
task created before configure(), which took the app's settings of then) undid it without a word: a
newcomer's task whose pool child was SIGKILLed was acknowledged and never ran again, while the
worker's log said its message went back to the queue.

:func:`undone` compares what configure() set with what the app and each of its tasks have now
(pure: BrokerCheck calls it at worker start and refuses to start on any) — ``task_default_queue``
among them: set below the call to a queue configure(queues=…) does not list, tasks sent without a
queue went where no worker of the profile consumed them. (``task_routes`` naming such a queue is
only warned about, :func:`route_warnings`: another app's workers may consume it.) The time limits and the
prefetch are not here: BrokerCheck applies configure()'s rules to the values the worker really
uses, naming where each came from.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

#: app.conf setting -> (the value configure() sets, what is lost when it is not)
ACK_SETTINGS: dict[str, tuple[Any, str]] = {
    "task_acks_late": (True, "a task is acknowledged when it starts, so one whose worker process dies "
                             "(SIGKILL, OOM) is lost"),
    "task_reject_on_worker_lost": (True, "a task whose worker process dies (SIGKILL, OOM) is acknowledged "
                                         "instead of going back to the queue: lost"),
    "task_acks_on_failure_or_timeout": (True, "a task killed at its hard time limit goes back to the queue and "
                                              "runs again, and a failed one is rejected after its dead letter "
                                              "was sent (RabbitMQ dead-letters it again, without the envelope)"),
}
#: Celery 5.7 splits the last one in two; configure() leaves them unset (None: they follow it)
SPLIT_ACK_SETTINGS = ("task_acks_on_failure", "task_acks_on_timeout")
#: task attribute -> the app.conf setting Celery resolves it from when the task is created
TASK_ATTRIBUTES = {
    "acks_late": "task_acks_late",
    "reject_on_worker_lost": "task_reject_on_worker_lost",
    "acks_on_failure_or_timeout": "task_acks_on_failure_or_timeout",
    "acks_on_failure": "task_acks_on_failure",
    "acks_on_timeout": "task_acks_on_timeout",
}
JSON_SETTINGS = ("accept_content", "result_accept_content", "task_serializer", "result_serializer",
                 "event_serializer")
_JSON = {"json", "application/json"}
#: task attributes Celery reads as False when None (the others are derived when the task is bound)
_FALSY_WHEN_UNSET = ("acks_late", "reject_on_worker_lost")
_CANCEL = "worker_cancel_long_running_tasks_on_connection_loss"


#: why a split setting matters (Celery 5.7's task_acks_on_failure / task_acks_on_timeout)
_SPLIT_WHY = {
    "task_acks_on_failure": "a failed task is rejected after its dead letter was sent (RabbitMQ dead-letters it "
                            "again, without the envelope)",
    "task_acks_on_timeout": "a task killed at its hard time limit goes back to the queue and runs again",
}


def _why(setting: str) -> str:
    return ACK_SETTINGS[setting][1] if setting in ACK_SETTINGS else _SPLIT_WHY[setting]


def _not_json(value: Any) -> bool:
    values = [value] if isinstance(value, str) else list(value or [])
    return any(str(v).lower() not in _JSON for v in values)


def _taken_back(tasks: Mapping[str, Any], attribute: str) -> list[tuple[str, Any]]:
    """(name, value) of each of the app's tasks (not Celery's built-ins) whose ``attribute``, as
    Celery resolved it, takes the profile back."""
    found = []
    for name, task in sorted(tasks.items()):
        value = getattr(task, attribute, None)
        if name.startswith("celery.") or value == True:  # noqa: E712 - 1 is as good
            continue
        if value is None and (attribute not in _FALSY_WHEN_UNSET or not getattr(type(task), "__bound__", True)):
            continue  # derived when the task is bound; an unbound one takes app.conf's when first used
        if attribute in ("acks_on_failure", "acks_on_timeout") \
                and getattr(task, "acks_on_failure_or_timeout", None) is False:
            continue  # Celery derived it from acks_on_failure_or_timeout=False, named already
        found.append((name, value))
    return found


def _tasks_with(setting: str, value: Any, tasks: Mapping[str, Any], *, shown: int = 10) -> str:
    """``; tasks with acks_late=False: 'a', 'b'``: the tasks with the value ``setting`` has now
    (they took it from there when they were created, or were given it)."""
    attribute = next(a for a, s in TASK_ATTRIBUTES.items() if s == setting)
    names = [name for name, theirs in _taken_back(tasks, attribute) if theirs == value]
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return f"; tasks with {attribute}={value!r}: {', '.join(map(repr, names[:shown]))}{more}" if names else ""


def default_queue_undone(conf: Mapping[str, Any], queues: Sequence[str] | None) -> list[str]:
    """configure() makes ``task_default_queue`` one of the profile's ``queues``: set to another queue
    below the call, every task sent without a queue went to one no worker of the profile consumes
    (declared without its dead-letter arguments), while the workers were ready and idle."""
    if not queues:
        return []
    value = conf.get("task_default_queue")
    if value in queues:
        return []
    return [f"app.conf.task_default_queue={value!r} (configure() set it to one of its queues, {list(queues)!r}: a "
            f"task sent without a queue goes to {value!r}, which no worker of the profile consumes, declared "
            f"without a dead-letter queue; valid: one of {list(queues)!r}, or add {value!r} to configure(queues=…))"]


def _static_routes(routes: Any) -> list[tuple[str, Any]]:
    """(pattern, queue) of each ``task_routes`` entry that names a queue and can be read without
    running anything: a dict (or a list of dicts / (pattern, route) pairs) whose route is a queue
    name or a dict with a 'queue' (a str or a kombu Queue). Router functions and 'module.router'
    strings decide at publish: not read."""
    found: list[tuple[str, Any]] = []
    for table in routes if isinstance(routes, (list, tuple)) else [routes]:
        if isinstance(table, Mapping):
            entries = list(table.items())
        elif isinstance(table, (list, tuple)) and all(isinstance(e, (list, tuple)) and len(e) == 2 for e in table):
            entries = [tuple(e) for e in table]
        else:
            continue
        for pattern, route in entries:
            queue = route.get("queue") if isinstance(route, Mapping) else route if isinstance(route, str) else None
            queue = getattr(queue, "name", queue)
            if isinstance(queue, str) and queue:
                found.append((getattr(pattern, "pattern", pattern), queue))
    return found


def route_warnings(conf: Mapping[str, Any], queues: Sequence[str] | None) -> list[str]:
    """A warning for each ``task_routes`` entry (read statically, :func:`_static_routes`) that sends
    tasks to a queue the profile does not list: no worker of the profile consumes it, and it has no
    dead-letter queue. A warning, not a refusal: another worker pool (another app) may consume it."""
    if not queues:
        return []
    return [f"app.conf.task_routes[{pattern!r}] sends tasks to the queue {queue!r}, not in configure(queues="
            f"{list(queues)!r}): no worker of this profile consumes it and it is declared without a dead-letter "
            f"queue (valid: one of {list(queues)!r}; or add {queue!r} to configure(queues=…) and run workers on it)"
            for pattern, queue in _static_routes(conf.get("task_routes")) if queue not in queues]


def app_undone(conf: Mapping[str, Any], tasks: Mapping[str, Any] | None = None, *,
               queues: Sequence[str] | None = None) -> list[str]:
    """``app.conf.<setting>=<value> (configure() set …: why)`` for each setting taken back, with
    the names of the app's ``tasks`` that have that value too; ``queues``: the profile's, which
    ``task_default_queue`` must be one of."""
    tasks = tasks or {}
    found = default_queue_undone(conf, queues)
    for setting, (wanted, why) in ACK_SETTINGS.items():
        value = conf.get(setting)
        if value != wanted:
            found.append(f"app.conf.{setting}={value!r} (configure() set {wanted!r}: {why}"
                         f"{_tasks_with(setting, value, tasks)})")
    for setting in SPLIT_ACK_SETTINGS:
        if conf.get(setting) is False:
            found.append(f"app.conf.{setting}=False (configure() leaves it unset, to follow "
                         f"task_acks_on_failure_or_timeout=True: {_why(setting)}{_tasks_with(setting, False, tasks)})")
    for setting in JSON_SETTINGS:
        if _not_json(conf.get(setting)):
            found.append(f"app.conf.{setting}={conf.get(setting)!r} (configure() set JSON only: anything else "
                         f"accepted from the broker, pickle above all, is remote code execution)")
    if conf.get(_CANCEL) is not True:
        found.append(f"app.conf.{_CANCEL}={conf.get(_CANCEL)!r} (configure() set True: when the connection "
                     f"drops, the broker redelivers the tasks this worker still runs, and they run twice)")
    return found


def transport_undone(options: Mapping[str, Any] | None, *, visibility_timeout: float | None,
                     confirm_publish: bool) -> list[str]:
    """The broker transport options configure() set (``visibility_timeout`` on Redis,
    ``confirm_publish`` on RabbitMQ; None/False: not this broker's) that are missing or changed."""
    options = options or {}
    found = []
    if visibility_timeout is not None and options.get("visibility_timeout") != visibility_timeout:
        now = (" missing, so kombu's 3600 s applies" if "visibility_timeout" not in options
               else f"={options['visibility_timeout']!r}")
        found.append(f"broker_transport_options['visibility_timeout']{now} (configure() set {visibility_timeout!r}: "
                     f"a message unacknowledged that long is delivered again, so the time limits were checked "
                     f"against it; pass visibility_timeout= to configure() to choose another)")
    if confirm_publish and options.get("confirm_publish") is not True:
        now = " missing" if "confirm_publish" not in options else f"={options['confirm_publish']!r}"
        found.append(f"broker_transport_options['confirm_publish']{now} (configure() set True: a retry, or a task "
                     f"a task sends, is not confirmed by RabbitMQ and is lost if the broker crashes after the "
                     f"original was acknowledged)")
    return found


def tasks_undone(tasks: Mapping[str, Any], conf: Mapping[str, Any]) -> list[str]:
    """``task '<name>' <attribute>=<value> (why)`` for each of the app's tasks whose own
    acknowledgement setting, as Celery resolved it, takes the profile back — one with the value
    app.conf has now is named with that setting instead (:func:`app_undone`)."""
    found = []
    for attribute, setting in TASK_ATTRIBUTES.items():
        found += [f"task {name!r} {attribute}={value!r} ({_why(setting)})"
                  for name, value in _taken_back(tasks, attribute) if conf.get(setting) != value]
    return found


def undone_problem(conf: Mapping[str, Any], tasks: Mapping[str, Any], *, visibility_timeout: float | None,
                   confirm_publish: bool, queues: Sequence[str] | None = None) -> str | None:
    """One message naming every setting taken back after configure(), and how to fix each kind;
    None when there is none. ``queues``: the profile's (the default queue must be one of them)."""
    from_app = app_undone(conf, tasks, queues=queues)
    from_transport = transport_undone(conf.get("broker_transport_options"), visibility_timeout=visibility_timeout,
                                      confirm_publish=confirm_publish)
    from_tasks = tasks_undone(tasks, conf)
    if not (from_app or from_transport or from_tasks):
        return None
    fixes = []
    if from_app:
        fixes.append("set app.conf settings before configure(app) (it sets what the profile needs and checks "
                     "the rest) or drop them; app.config_from_object() replaces the whole configuration, so "
                     "call it before configure(app)")
    if from_transport:
        fixes.append("set broker_transport_options before configure(app), which adds its options to yours")
    if from_tasks or any("; tasks with " in line for line in from_app):
        fixes.append("drop the option from @app.task(...) or from the task's base class; a task created before "
                     "configure(app) took the app's settings of then: create it after")
    taken_back = "; ".join(from_app + from_transport + from_tasks)
    return f"settings changed after configure(app) take back what it set: {taken_back} — fix: {'; '.join(fixes)}"
