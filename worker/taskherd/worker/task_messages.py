"""What a task message must look like before it may reach the pool: one check per part, each
returning the problem in a sentence (naming the field as it is on the wire and what is valid), or
None.

Celery decodes a protocol-2 body in the main process but checks its shape only in the pool child,
where a wrong shape is a FAILURE that gets acked with no trace of the message (``kwargs`` as a
list), or runs with the wrong arguments (``args: "ab"`` becomes ``f("a", "b")``). A header it
cannot use either escapes into the event loop or, for an ETA it cannot convert, rejects the
message — which drops it on Redis. These checks run first, in the main process, so that every
such message is dead-lettered whole, with the reason.

They accept what Celery itself produces (protocol 2, and protocol 1 from old versions and other
languages' clients), and nothing that Celery would misread.
"""
from __future__ import annotations

import codecs
import math
import time
from datetime import datetime
from typing import Any, Callable, Mapping

from taskherd.contract import shown

#: content-encodings a JSON body may declare (kombu's JSON decoder reads UTF-8 whatever is declared)
JSON_ENCODINGS = ("utf-8",)

#: protocol-2 headers (protocol 1: body fields) that are strings when present
_OPTIONAL_STRINGS = ("shadow",)
#: headers that are date-times when present (ISO 8601 strings, or AMQP timestamps)
_DATE_TIMES = ("eta", "expires")
#: headers that are non-negative integers when present
_COUNTS = ("retries", "replaced_task_nesting")


def refused_content_problem(content_type: str | None, accepted: set[str]) -> str | None:
    """Why a declared content type is refused, or None. ``accepted``: MIME types (kombu's
    ``prepare_accept_content``). kombu trusts ``application/data`` and ``application/text``
    whatever ``accept_content`` says: here they are refused like any other."""
    if content_type and content_type not in accepted:
        return f"content-type {content_type!r} refused (valid: {_listed(accepted)})"
    return None


def encoding_problem(content_type: str | None, content_encoding: str | None) -> str | None:
    """Why the body cannot be read as declared, or None."""
    if not content_type:
        return "no content-type: cannot tell how to decode the body (valid: application/json)"
    if content_encoding is None or content_encoding == "utf-8":
        return None  # kombu reads an undeclared encoding as UTF-8; "utf-8" itself needs no codec lookup
    if not isinstance(content_encoding, str) or _codec_name(content_encoding) not in JSON_ENCODINGS:
        return f"content-encoding {content_encoding!r} is not supported (valid: {_listed(JSON_ENCODINGS)})"
    return None


def header_problem(headers: Mapping[str, Any], *, noun: str = "header") -> str | None:
    """Why protocol-2 headers are unusable, or None. A protocol-1 body carries the same fields
    (``noun="field"``).

    Every message passes here in the worker's main process, so the common case (each optional
    header absent or null) costs a lookup and a test per header, and no function of ours."""
    get = headers.get
    for name in ("id", "task"):
        value = get(name)
        if not isinstance(value, str) or not value:
            return f"{noun} {name!r} must be a non-empty string, got {shown(value)}"
    for name in _OPTIONAL_STRINGS:
        value = get(name)
        if value is not None and not isinstance(value, str):
            return f"{noun} {name!r} must be a string or null, got {shown(value)}"
    for name in _COUNTS:
        value = get(name)
        if value is not None and not (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
            return f"{noun} {name!r} must be an integer >= 0, got {shown(value)}"
    group_index = get("group_index")
    if group_index is not None and not _is_int(group_index):
        return f"{noun} 'group_index' must be an integer or null, got {shown(group_index)}"
    ignore_result = get("ignore_result")
    if ignore_result is not None and not isinstance(ignore_result, bool):
        return f"{noun} 'ignore_result' must be true, false or null, got {shown(ignore_result)}"
    for name in _DATE_TIMES:
        value = get(name)
        problem = date_time_problem(value, field=name) if value else None  # falsy: none (as Celery reads it)
        if problem:
            return f"{noun} {name!r} {problem}"
    # Celery's revocation check iterates these in the main process, after the request has taken a
    # pool slot: a producer that sends anything else would have wedged the worker (see compat.guard_pool_submission).
    stamped_headers = get("stamped_headers")
    if stamped_headers is not None and not (isinstance(stamped_headers, list)
                                            and all(isinstance(name, str) for name in stamped_headers)):
        return f"{noun} 'stamped_headers' must be a list of strings or null, got {shown(stamped_headers)}"
    stamps = get("stamps")
    if stamps is not None and not isinstance(stamps, dict):
        return f"{noun} 'stamps' must be a table/object or null, got {shown(stamps)}"
    timelimit = get("timelimit")
    if not time_limit_ok(timelimit):
        return (f"{noun} 'timelimit' must be [hard, soft] with each a number of seconds >= 0 or null, "
                f"got {shown(timelimit)}")
    return None


#: How far ahead an ``eta`` may be when the worker receives it (days). Further is refused as
#: ``invalid-message``: such an ETA is a mistake (year 9999, a mistyped year, seconds sent as
#: milliseconds), and it would wait unseen — on Redis in the delay set, counted in no queue's depth;
#: on RabbitMQ held unacked by a worker. A task meant for next year belongs in a scheduler (celery beat).
MAX_ETA_AHEAD_DAYS = 365


def date_time_of(value: Any, *, timezone: Any = None) -> datetime | None:
    """The aware date-time a Celery worker reads from a message's ``eta`` or ``expires`` (None for
    a falsy one): Celery's own reading (its Request: ``maybe_iso8601``, then ``maybe_make_aware``,
    a naive value being UTC), so that what the check accepts is what the worker schedules — and
    what the delay set parks (taskherd.worker.delayed). Raises (ValueError, TypeError,
    AttributeError, OverflowError) for a value Celery cannot read; ``timezone``: the app's."""
    if not value:
        return None
    # Imported here, past the common case: an import statement costs ~1 µs even when the module is loaded.
    from celery.utils.time import maybe_iso8601, maybe_make_aware

    if not isinstance(value, (str, datetime)):
        raise TypeError(f"not a date-time string: {shown(value)}")
    return maybe_make_aware(maybe_iso8601(value), timezone)


def date_time_timestamp(value: Any, *, timezone: Any = None) -> float | None:
    """Epoch seconds of :func:`date_time_of` (None for a falsy value), converted as Celery's
    strategy converts an ETA (to the system time zone, then a timestamp): raises where it raises."""
    when = date_time_of(value, timezone=timezone)
    return None if when is None else when.astimezone(None).timestamp()


def date_time_problem(value: Any, *, field: str | None = None, now: float | None = None) -> str | None:
    """Why ``value`` is not a date-time Celery can schedule on, or None (also for no value).

    Read by :func:`date_time_timestamp`, as the worker reads it: one Celery cannot convert is
    rejected there without requeue, which drops it on Redis. An ``eta`` (``field="eta"``) more than
    :data:`MAX_ETA_AHEAD_DAYS` ahead of ``now`` (default: the clock) is refused too.
    """
    if not value:
        return None  # Celery reads a falsy eta/expires as none: nearly every message, checked first
    if not isinstance(value, (str, datetime)):
        return f"must be an ISO 8601 date-time string, got {shown(value)}"
    try:
        when = date_time_timestamp(value)
    except (ValueError, TypeError, AttributeError, OverflowError, OSError) as exc:
        return f"must be an ISO 8601 date-time string within years 1-9999, got {shown(value)} ({exc})"
    if field == "eta":
        ahead = when - (time.time() if now is None else now)
        if ahead > MAX_ETA_AHEAD_DAYS * 86400:
            return (f"is {ahead / 86400:.0f} days ahead, got {shown(value)} (valid: at most {MAX_ETA_AHEAD_DAYS} "
                    f"days ahead; schedule later tasks with celery beat)")
    return None


def time_limit_ok(value: Any) -> bool:
    if value is None:
        return True
    return isinstance(value, (list, tuple)) and len(value) == 2 and _is_limit(value[0]) and _is_limit(value[1])


def body_problem(body: Any) -> str | None:
    """Why a decoded protocol-2 body is not ``[args, kwargs, embed]``, or None."""
    if isinstance(body, dict):
        return ("body is a JSON object, but the message has protocol-2 headers: the body must be "
                "[args, kwargs, embed] (a protocol-1 message carries no 'task' header)")
    if not isinstance(body, (list, tuple)) or len(body) != 3:
        return f"body must be [args, kwargs, embed], got {shown(body)}"
    args, kwargs, embed = body
    return arguments_problem(args, kwargs) or embed_problem(embed)


def protocol1_problem(body: Mapping[str, Any], headers: Mapping[str, Any]) -> str | None:
    """Why a decoded protocol-1 body (a JSON object with a ``task`` field) is unusable, or None.
    Celery lets the message's headers override the body's fields: both are checked."""
    problem = header_problem(body, noun="field") or header_problem({**body, **headers})
    if problem:
        return problem
    problem = arguments_problem(body.get("args", ()), body.get("kwargs", {}))
    if problem:
        return problem
    return embed_problem({name: body.get(name) for name in ("callbacks", "errbacks", "chord")})


def arguments_problem(args: Any, kwargs: Any) -> str | None:
    if not isinstance(args, (list, tuple)):
        return f"args must be a JSON array, got {shown(args)}"
    if not isinstance(kwargs, dict):
        return f"kwargs must be a JSON object, got {shown(kwargs)}"
    return None


def embed_problem(embed: Any) -> str | None:
    """Why the callbacks/errbacks/chain/chord part of a body is unusable, or None."""
    if embed is None:
        return None
    if not isinstance(embed, dict):
        return f"embed (the body's third item) must be a JSON object or null, got {shown(embed)}"
    for name in ("callbacks", "errbacks", "chain"):
        value = embed.get(name)
        if value is not None and not (isinstance(value, list) and all(_is_signature(v) for v in value)):
            return (f"embed {name!r} must be a list of signatures (JSON objects with a 'task') or null, "
                    f"got {shown(value)}")
    chord = embed.get("chord")
    if chord is not None and not _is_signature(chord):
        return f"embed 'chord' must be a signature (a JSON object with a 'task') or null, got {shown(chord)}"
    return None


def _is_signature(value: Any) -> bool:
    return isinstance(value, dict) and isinstance(value.get("task"), str) and bool(value["task"])


def signature_problem(task_name: str, check: Callable[..., Any] | None, args: Any, kwargs: Any) -> str | None:
    """Why ``args``/``kwargs`` cannot be passed to the task, checked as ``apply_async`` checks
    them (``check``: the task's argument checker, None when it has none or opted out)."""
    if check is None:
        return None
    try:
        check(*args, **kwargs)
    except TypeError as exc:
        return f"arguments do not match task {task_name!r}: {exc}"
    return None


def _codec_name(encoding: str) -> str | None:
    try:
        return codecs.lookup(encoding).name
    except LookupError:
        return None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_limit(value: Any) -> bool:
    if value is None:
        return True
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


def _listed(values) -> str:
    return ", ".join(sorted(values))
