"""Redis list items that are not kombu messages: caught as they are popped, kept whole.

A Redis consumer pops an item off its list (BRPOP) and only then parses it. kombu's parse and its
delivery bookkeeping raise on anything but the JSON kombu itself writes — not JSON, no
``properties``, a body that is not valid base64, … — and at that moment the item exists only in
the worker's memory: the exception ends the consumer ("Unrecoverable error") or passes for a lost
connection (a ``KeyError``), and the item is gone. One bad producer takes every worker of the
queue down in turn.

:func:`guarded` checks each popped item for everything kombu's parse and bookkeeping need. An item
that fails is replaced by a well-formed message that carries the original bytes (base64) and the
problem (header :data:`UNREADABLE_HEADER`). kombu then records it in ``unacked`` like any delivery
— so it survives a crash of the worker — and the consumer dead-letters it as
``undecodable-message`` with the original bytes. A valid item is returned as it came, untouched.
"""
from __future__ import annotations

import base64
import json
import math
import uuid
from typing import Any, Callable, Mapping

from taskherd.contract import shown

#: Header of a replacement message: why the original item is not a kombu message.
UNREADABLE_HEADER = "taskherd_unreadable_item"
#: Content type of a replacement message: its body is the original item, byte for byte.
UNREADABLE_CONTENT_TYPE = "application/x-taskherd-unreadable-item"


def item_problem(item: bytes, *, loads: Callable[[bytes], Any], body_codecs: Mapping[str, Any],
                 recorded_tag: str | None = None) -> str | None:
    """Why kombu could not turn ``item`` into a delivery, or None.

    ``loads``: kombu's JSON decoding of an item; ``body_codecs``: kombu's body encodings by name
    (both passed in, so that the check reads an item exactly as kombu will). ``recorded_tag``: the
    delivery tag the pop recorded the item under (recovery.POP_SCRIPT reads it with Redis's JSON
    parser), which kombu's reading must find too, or the acknowledgement would clear another entry.
    """
    try:
        payload = loads(item)
    except Exception as exc:  # noqa: BLE001 - whatever kombu's parse raises, kombu would raise too
        return f"not valid kombu JSON ({type(exc).__name__}: {_short(exc)})"
    if not isinstance(payload, dict):
        return f"a JSON {_json_kind(payload)}, not a kombu message (a JSON object with 'properties')"
    properties = payload.get("properties")
    if not isinstance(properties, dict):
        return f"'properties' must be a JSON object, got {_shown(properties)}"
    tag = properties.get("delivery_tag")
    if not isinstance(tag, str) or not tag:
        return f"'properties.delivery_tag' must be a non-empty string, got {_shown(tag)}"
    if recorded_tag is not None and tag != recorded_tag:
        return (f"'properties.delivery_tag' reads {_shown(tag)} here but {_shown(recorded_tag)} where it was "
                f"popped (valid: one 'delivery_tag' that every JSON parser reads alike)")
    info = properties.get("delivery_info")
    if not isinstance(info, dict):
        return f"'properties.delivery_info' must be a JSON object, got {_shown(info)}"
    for name in ("exchange", "routing_key"):
        if not isinstance(info.get(name), str):
            return f"'properties.delivery_info.{name}' must be a string, got {_shown(info.get(name))}"
    priority = properties.get("priority")
    if isinstance(priority, float) and not math.isfinite(priority):
        return f"'properties.priority' must be a finite number, got {_shown(priority)}"
    for name in ("content-type", "content-encoding"):
        if payload.get(name) is not None and not isinstance(payload.get(name), str):
            return f"{name!r} must be a string, got {_shown(payload.get(name))}"
    if payload.get("headers") is not None and not isinstance(payload.get("headers"), dict):
        return f"'headers' must be a JSON object, got {_shown(payload.get('headers'))}"
    return _body_problem(payload.get("body"), properties.get("body_encoding"), body_codecs)


def _body_problem(body: Any, encoding: Any, body_codecs: Mapping[str, Any]) -> str | None:
    if body is not None and not isinstance(body, str):
        return f"'body' must be a string, got {_shown(body)}"
    if encoding is None or encoding == "":
        return None
    if not isinstance(encoding, str):
        return f"'properties.body_encoding' must be a string, got {_shown(encoding)}"
    if encoding.lower() == "utf-8":
        return None  # kombu leaves the body as it is
    codec = body_codecs.get(encoding)
    if codec is None:
        return f"unknown 'properties.body_encoding' {encoding!r} (valid: {', '.join(sorted(body_codecs))}, utf-8)"
    if body:
        try:
            codec.decode(body)
        except Exception as exc:  # noqa: BLE001 - kombu's decode raises the same
            return f"body is not valid {encoding} ({type(exc).__name__}: {_short(exc)})"
    return None


def replacement(item: bytes, *, queue: str, problem: str, tag: str | None = None) -> bytes:
    """A kombu message carrying ``item`` whole, to be dead-lettered from ``queue``, under delivery
    tag ``tag``: the tag taskherd's pop recorded the item under as this worker's delivery
    (recovery.POP_SCRIPT returns it), so that the replacement's acknowledgement clears that record
    rather than leave it to be restored and dead-lettered again. None: the pop recorded nothing (or
    kombu's own BRPOP/RPOP popped it): a tag of its own, which kombu records when it delivers it.
    Never read from the item here: what the pop's parser (Redis's cjson) reads in it may be
    unreadable for Python's (an item nested deeper than Python's recursion limit) or differ."""
    return json.dumps({
        "body": base64.b64encode(item).decode("ascii"),
        "content-type": UNREADABLE_CONTENT_TYPE,
        "content-encoding": "binary",
        "headers": {UNREADABLE_HEADER: problem},
        "properties": {
            "body_encoding": "base64",
            "delivery_tag": str(uuid.uuid4()) if tag is None else tag,
            "delivery_info": {"exchange": "", "routing_key": queue},
            "delivery_mode": 2,
            "priority": 0,
        },
    }).encode("utf-8")


def guarded(item: Any, queue: str, *, loads: Callable[[bytes], Any], body_codecs: Mapping[str, Any],
            recorded_tag: str | None = None) -> Any:
    """``item`` if kombu can deliver it, else its :func:`replacement` (see the module doc).
    ``recorded_tag``: the delivery tag the pop recorded it under, if it recorded it."""
    if not isinstance(item, (bytes, str)):
        return item  # nothing popped
    raw = item.encode("utf-8", "surrogateescape") if isinstance(item, str) else item
    problem = item_problem(raw, loads=loads, body_codecs=body_codecs, recorded_tag=recorded_tag)
    return item if problem is None else replacement(raw, queue=queue, problem=problem, tag=recorded_tag)


def _json_kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else type(value).__name__


def _shown(value: Any) -> str:
    return "missing/null" if value is None else shown(value, 60)


def _short(exc: BaseException, limit: int = 120) -> str:
    text = str(exc)
    return text if len(text) <= limit else f"{text[:limit]}…"
