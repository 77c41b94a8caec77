"""The dead-letter envelope and publishing it to ``<queue>.dlq``.

An envelope is a JSON message saying what failed, why, how often and where, with everything
needed to send the task back (``taskherd dlq redrive``). It is published through the broker:

- Redis: LPUSH onto the list named after the DLQ (kombu's default exchange routes by name).
- RabbitMQ: the default exchange, routing key = DLQ name, with publisher confirms; the DLQ is
  durable and is also the work queue's ``x-dead-letter-exchange`` target. We publish ourselves
  and only then acknowledge the original, instead of rejecting it into native dead-lettering,
  because native dead-lettering is at-most-once (RabbitMQ republishes without confirms) and
  carries no exception, traceback or attempt count. Native dead-lettering remains the backstop
  for what never reaches our code (a quorum queue's delivery limit, a reject by other code).

The publisher raises when the broker did not take the envelope; callers must then NOT ack the
original, so a failure to dead-letter never loses the message (they put it back on its queue).
"""
from __future__ import annotations

import base64
import socket
import time
import traceback as traceback_module
from dataclasses import asdict, dataclass, field
from typing import Any

#: Version of the envelope format; readers accept this and refuse newer ones loudly.
ENVELOPE_VERSION = 1
#: Header marking a message in a DLQ as one of our envelopes (natively dead-lettered ones lack it).
ENVELOPE_HEADER = "taskherd_envelope"
#: Custom task headers carried across retries and redrives.
FIRST_FAILURE_HEADER = "taskherd_first_failure_at"
REDRIVES_HEADER = "taskherd_redrives"


class Reason:
    """Why a message was dead-lettered (the envelope's ``reason``)."""

    PERMANENT_ERROR = "permanent-error"
    RETRIES_EXHAUSTED = "retries-exhausted"
    KILLED_WORKER = "killed-worker"
    SOFT_TIME_LIMIT = "soft-time-limit"
    HARD_TIME_LIMIT = "hard-time-limit"
    UNDECODABLE = "undecodable-message"
    CONTENT_REFUSED = "content-refused"
    UNKNOWN_TASK = "unknown-task"
    INVALID_MESSAGE = "invalid-message"


@dataclass(kw_only=True)
class Envelope:
    reason: str
    #: one human sentence: "raised ValueError, not retried", "killed its worker 5 times", …
    detail: str
    queue: str | None
    task: str | None = None
    task_id: str | None = None
    args: list | None = None
    kwargs: dict | None = None
    #: callbacks/errbacks/chain/chord of the original protocol-2 body, to redrive it whole
    embed: dict | None = None
    #: the original message headers (Celery's protocol-2 headers and any custom ones)
    headers: dict = field(default_factory=dict)
    exception_type: str | None = None
    exception_message: str | None = None
    traceback: str | None = None
    attempts: int = 0
    first_failure_at: float | None = None
    last_failure_at: float | None = None
    hostname: str = field(default_factory=socket.gethostname)
    dead_lettered_at: float = field(default_factory=time.time)
    exchange: str | None = None
    routing_key: str | None = None
    #: bad messages only: the undecoded body, base64, with its content type and encoding
    raw_body_b64: str | None = None
    content_type: str | None = None
    content_encoding: str | None = None
    version: int = ENVELOPE_VERSION

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Envelope":
        version = data.get("version", ENVELOPE_VERSION)
        if version > ENVELOPE_VERSION:
            raise ValueError(f"envelope version={version!r} is newer than this taskherd reads "
                             f"(valid: <= {ENVELOPE_VERSION})")
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})


def exception_fields(exc: BaseException, tb: str | None = None) -> dict[str, str]:
    cls = type(exc)
    return {
        "exception_type": f"{cls.__module__}.{cls.__qualname__}",
        "exception_message": str(exc),
        "traceback": tb if tb is not None else "".join(traceback_module.format_exception(exc)),
    }


def raw_body_fields(body: bytes | str | None, content_type: str | None, content_encoding: str | None) -> dict:
    if isinstance(body, str):
        body = body.encode("utf-8", "surrogateescape")
    return {
        "raw_body_b64": base64.b64encode(body or b"").decode("ascii"),
        "content_type": content_type,
        "content_encoding": content_encoding,
    }


#: How deep an envelope shows a message's values: a message's own headers or arguments may nest
#: deeper than Python's recursion limit lets this walk them, or JSON encode them, from inside a
#: worker's stack (two frames a level here). Far deeper than any data a task is given in practice
#: (and than what Celery itself can pickle to a pool child, ~500 levels).
MAX_SHOWN_DEPTH = 200


def json_safe(value: Any, *, _depth: int = 0) -> Any:
    """Headers and arguments made JSON-serialisable without losing what they were (below
    MAX_SHOWN_DEPTH levels of nesting; deeper, a note says so: the raw body keeps the rest)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, (dict, list, tuple, set)) and _depth >= MAX_SHOWN_DEPTH:
        return f"<{type(value).__name__} nested deeper than {MAX_SHOWN_DEPTH} levels: not shown>"
    if isinstance(value, dict):
        return {str(k): json_safe(v, _depth=_depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [json_safe(v, _depth=_depth + 1) for v in value]
    if hasattr(value, "isoformat"):
        return value.isoformat()
    try:
        return repr(value)
    except Exception:  # noqa: BLE001 - an object whose repr fails must not fail its envelope
        return f"<{type(value).__name__}: its repr failed>"


def dead_letter_queue_declaration(name: str, *, queue_type: str = "classic"):
    """The kombu Queue of a DLQ: durable, bound to the default exchange by its name."""
    from kombu import Queue

    arguments = {"x-queue-type": "quorum"} if queue_type == "quorum" else None
    return Queue(name, routing_key=name, durable=True, auto_delete=False, queue_arguments=arguments,
                 no_declare=False)


def publish_envelope(envelope: Envelope, *, broker_url: str, dead_letter_queue: str,
                     transport_options: dict | None = None, queue_type: str = "classic",
                     timeout: float = 10.0) -> None:
    """Publish ``envelope`` to ``dead_letter_queue``; returns only once the broker has it
    (taskherd.worker.publishing: confirms and mandatory routing on RabbitMQ). Raises on failure."""
    from .publishing import publish

    publish(
        json_safe(envelope.to_dict()),
        broker_url=broker_url, exchange="", routing_key=dead_letter_queue, transport_options=transport_options,
        declare=[dead_letter_queue_declaration(dead_letter_queue, queue_type=queue_type)], timeout=timeout,
        serializer="json",
        delivery_mode=2,
        # Not Celery's "id"/"task" headers: a worker consuming a DLQ by mistake must not
        # take an envelope for a task.
        headers={ENVELOPE_HEADER: ENVELOPE_VERSION, "taskherd_reason": envelope.reason,
                 "taskherd_task_id": envelope.task_id, "taskherd_task": envelope.task},
        timestamp=int(time.time()),  # AMQP timestamps are whole seconds
    )
