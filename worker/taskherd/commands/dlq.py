"""``taskherd dlq list|show|redrive|delete|purge``: look into a dead-letter queue, send messages
back, or remove some (``delete``) or all (``purge``) for good.

Reads both kinds of dead letters: taskherd envelopes (header ``taskherd_envelope``) and messages
RabbitMQ dead-lettered natively (``x-death`` header: rejected, delivery limit, expired).

Redrive works as SQS redrive does: the chosen messages are published back to the queue they
came from as ordinary task messages — retry count reset, a fresh delivery budget
(``taskherd_redrives`` + 1), same task id so idempotency keys still match — and only once the
broker has confirmed that publish are they removed from the DLQ (a crash in between leaves a
copy in both, never in neither). The publish is taskherd.worker.publishing's: on RabbitMQ a
queue that does not exist (a typo in ``--to``) is refused by the broker and the dead letter
stays; on Redis the ``--global-keyprefix`` applies to the work queue as to the DLQ. A dead letter
that was never a task message (a Redis list item that was not a kombu message, see
:func:`never_a_task`) is not redriven: named, it is refused (exit 1); under ``--all`` it is skipped
and counted. ``show`` prints such a letter's bytes.

Browsing RabbitMQ takes the messages with ``basic.get`` and returns the ones not removed by
closing the channel (they are requeued); Redis is read with LRANGE and changed with LREM.
"""
from __future__ import annotations

import argparse
import base64
import dataclasses
import datetime as dt
import hashlib
import json
import sys
from typing import Any, Iterable

from taskherd import contract
from taskherd.contract import broker_kind
from taskherd.worker.amqp_properties import UNREADABLE_HEADERS
from taskherd.worker.deadletter import ENVELOPE_HEADER, FIRST_FAILURE_HEADER, REDRIVES_HEADER, Envelope, Reason
from taskherd.worker.deliveries import header_count, header_timestamp
from taskherd.worker.publishing import Unroutable, publish
from taskherd.worker.redis_items import UNREADABLE_CONTENT_TYPE, UNREADABLE_HEADER

from . import options

#: Headers RabbitMQ adds when dead-lettering; dropped on redrive (a message carrying x-death
#: back into the queue it died in can confuse cycle detection).
_DEATH_HEADERS = ("x-death", "x-first-death-exchange", "x-first-death-queue", "x-first-death-reason",
                  "x-last-death-exchange", "x-last-death-queue", "x-last-death-reason")


@dataclasses.dataclass(kw_only=True)
class DeadLetter:
    """One message in a DLQ, decoded enough to list, show and redrive it."""

    ref: str  #: task id, or a digest of the message when it has none
    kind: str  #: "envelope" | "native" | "unknown"
    task: str | None
    task_id: str | None
    reason: str
    queue: str | None  #: the queue to redrive to
    dead_lettered_at: float | None
    attempts: int | None
    envelope: Envelope | None
    body: bytes
    headers: dict
    content_type: str | None
    content_encoding: str | None
    handle: Any = dataclasses.field(repr=False, default=None)  #: transport-specific, to remove it

    def summary(self) -> dict:
        """One `dlq list --json` line: what failed, with which arguments, why, how often and when."""
        envelope = self.envelope
        args, kwargs = (envelope.args, envelope.kwargs) if envelope else self._native_arguments()
        return {"ref": self.ref, "kind": self.kind, "task": self.task, "task_id": self.task_id,
                "args": args, "kwargs": kwargs, "reason": self.reason,
                "detail": envelope.detail if envelope else None, "queue": self.queue, "attempts": self.attempts,
                "first_failure_at": envelope.first_failure_at if envelope else None,
                "last_failure_at": envelope.last_failure_at if envelope else None,
                "dead_lettered_at": self.dead_lettered_at}

    def _native_arguments(self) -> tuple[Any, Any]:
        """(args, kwargs) of a protocol-2 task body dead-lettered by RabbitMQ itself, if it is one."""
        try:
            body = json.loads(self.body)
        except ValueError:
            return None, None
        if isinstance(body, list) and len(body) == 3 and isinstance(body[0], list) and isinstance(body[1], dict):
            return body[0], body[1]
        return None, None

    def full(self) -> dict:
        data = self.summary()
        if self.envelope:
            data["envelope"] = self.envelope.to_dict()
        else:
            data["headers"] = _jsonable(self.headers)
            data["content_type"] = self.content_type
            try:
                data["body"] = json.loads(self.body)
            except ValueError:
                data["body_b64"] = base64.b64encode(self.body).decode("ascii")
        return data


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def parse(body: bytes, headers: dict | None, content_type: str | None, content_encoding: str | None,
          handle: Any = None) -> DeadLetter:
    """A DLQ message (our envelope, a natively dead-lettered one, or something else) as a DeadLetter."""
    if isinstance(body, str):  # py-amqp hands text bodies over already decoded
        body = body.encode(content_encoding if content_encoding not in (None, "binary") else "utf-8")
    headers = dict(headers or {})
    common = dict(body=body, headers=headers, content_type=content_type, content_encoding=content_encoding,
                  handle=handle)
    envelope, unreadable = None, None
    if ENVELOPE_HEADER in headers:
        try:
            envelope = Envelope.from_dict(json.loads(body))
        except (ValueError, TypeError, AttributeError) as exc:  # not JSON, not an object, fields missing
            unreadable = f"unreadable-envelope: {type(exc).__name__}: {exc}"
    if envelope is not None:
        return DeadLetter(ref=envelope.task_id or _digest(body), kind="envelope", task=envelope.task,
                          task_id=envelope.task_id, reason=envelope.reason, queue=envelope.queue,
                          dead_lettered_at=envelope.dead_lettered_at, attempts=envelope.attempts,
                          envelope=envelope, **common)
    deaths = headers.get("x-death")
    deaths = deaths if isinstance(deaths, list) else []  # RabbitMQ writes a list; a producer may write anything
    task_id = headers.get("id") if isinstance(headers.get("id"), str) else None
    task = headers.get("task") if isinstance(headers.get("task"), str) else None
    if deaths:
        first = deaths[0] if isinstance(deaths[0], dict) else {}
        when = first.get("time")
        if isinstance(when, dt.datetime):
            when = when.timestamp()
        return DeadLetter(ref=task_id or _digest(body), kind="native", task=task, task_id=task_id,
                          reason=f"rabbitmq:{first.get('reason', 'unknown')}",
                          queue=headers.get("x-first-death-queue") or first.get("queue"),
                          dead_lettered_at=header_timestamp(when),
                          attempts=sum(header_count(d.get("count", 1)) or 1 for d in deaths if isinstance(d, dict)),
                          envelope=None, **common)
    return DeadLetter(ref=task_id or _digest(body), kind="unknown", task=task, task_id=task_id,
                      reason=unreadable or "unknown", queue=None, dead_lettered_at=None, attempts=None,
                      envelope=None, **common)


def _digest(body: bytes) -> str:
    return "m-" + hashlib.sha1(body).hexdigest()[:12]


def redrive_message(letter: DeadLetter) -> tuple[bytes, dict, str, str]:
    """(body, headers, content_type, content_encoding) to publish when redriving ``letter``."""
    if letter.envelope is not None and letter.envelope.raw_body_b64 is None:
        env = letter.envelope
        headers = {k: v for k, v in (env.headers or {}).items() if k != FIRST_FAILURE_HEADER}
        embed = env.embed or {}
        headers.update(retries=0, eta=None, expires=None, **{REDRIVES_HEADER: next_redrive(headers)})
        body = json.dumps([env.args or [], env.kwargs or {},
                           {"callbacks": embed.get("callbacks"), "errbacks": embed.get("errbacks"),
                            "chain": embed.get("chain"), "chord": embed.get("chord")}]).encode()
        return body, headers, "application/json", "utf-8"
    if letter.envelope is not None:  # a bad message: back exactly as it came
        env = letter.envelope
        headers = {k: v for k, v in (env.headers or {}).items() if k != "unparseable_headers"}
        return (base64.b64decode(env.raw_body_b64), headers, env.content_type or "application/data",
                env.content_encoding or "binary")
    headers = {k: v for k, v in letter.headers.items() if k not in _DEATH_HEADERS}
    if "task" in headers:
        headers[REDRIVES_HEADER] = next_redrive(headers)
    return letter.body, headers, letter.content_type or "application/data", letter.content_encoding or "binary"


def never_a_task(letter: DeadLetter) -> str | None:
    """Why ``letter`` was never a task message and cannot be redriven into one, or None.

    Redriving sends a bad message back as it came (:func:`redrive_message`); for these there is
    nothing a worker could run, and it dead-lettered the copy again under a new ref
    (``content-refused``), the original reason lost:

    - a Redis list item that was not a kombu message (``undecodable-message``, the worker's detail
      ``not a kombu message: …``): the envelope keeps the item's bytes, with no headers and no
      content type (taskherd.worker.redis_items);
    - a bad message with no headers and no content type: nothing in it names a task;
    - a RabbitMQ message whose headers could not be read: they were not kept, so no task name or id;
    - an item of a Redis DLQ list that is not a kombu message itself (listed ``undecodable: …``).
    """
    envelope = letter.envelope
    if envelope is not None and envelope.raw_body_b64 is not None:
        headers = envelope.headers if isinstance(envelope.headers, dict) else {}
        not_kombu = envelope.reason == Reason.UNDECODABLE and str(envelope.detail).startswith("not a kombu message")
        if not_kombu or envelope.content_type == UNREADABLE_CONTENT_TYPE or UNREADABLE_HEADER in headers:
            return "it was a Redis list item that is not a kombu message, not a task"
        if not headers and envelope.content_type is None:
            return "it has no headers and no content type: nothing in it is a task to send back"
        if UNREADABLE_HEADERS in headers:
            return "its AMQP headers could not be read and were not kept: no task can be rebuilt from it"
    if letter.kind == "unknown" and letter.reason.startswith("undecodable:"):
        return "it is an item of the DLQ's Redis list that is not a kombu message, not a task"
    return None


def next_redrive(headers: dict) -> int:
    """The redrive number of the next redrive: one more than the letter's. A ``taskherd_redrives``
    that is no count (any producer can set it) reads as 0, as the worker reads it
    (taskherd.worker.deliveries.attempt): the redrive is number 1, a fresh delivery budget."""
    return (header_count(headers.get(REDRIVES_HEADER)) or 0) + 1


class RedisDeadLetters:
    """A DLQ that is a Redis list (kombu's Redis transport: LPUSH by producers, newest first)."""

    def __init__(self, *, broker_url: str, dlq: str, keyprefix: str = ""):
        import redis

        self.broker_url, self.dlq = broker_url, dlq
        self.key = keyprefix + dlq
        self.client = redis.Redis.from_url(broker_url)

    def letters(self, limit: int | None = None) -> list[DeadLetter]:
        raws = self.client.lrange(self.key, 0, -1)[::-1]  # oldest first
        letters = []
        for raw in raws[:limit] if limit else raws:
            try:
                payload = json.loads(raw)
                props = payload.get("properties") or {}
                body = payload.get("body") or ""
                body = base64.b64decode(body) if props.get("body_encoding") == "base64" else body.encode()
                headers = payload.get("headers")
            except (ValueError, TypeError, AttributeError) as exc:
                # Not a kombu message (a raw LPUSH, a bad base64 body): listed as it is, so that one
                # bad item does not hide the others or stop a purge; its ref is the item's digest.
                letters.append(DeadLetter(ref=_digest(raw), kind="unknown", task=None, task_id=None,
                                          reason=f"undecodable: {type(exc).__name__}: {exc}", queue=None,
                                          dead_lettered_at=None, attempts=None, envelope=None, body=raw,
                                          headers={}, content_type=None, content_encoding=None, handle=raw))
                continue
            letters.append(parse(body, headers, payload.get("content-type"),
                                 payload.get("content-encoding"), handle=raw))
        return letters

    def remove(self, letter: DeadLetter) -> None:
        self.client.lrem(self.key, 1, letter.handle)

    def purge(self) -> int:
        count = self.client.llen(self.key)
        self.client.delete(self.key)
        return count

    def close(self) -> None:
        self.client.close()


class AmqpDeadLetters:
    """A RabbitMQ DLQ, browsed with basic.get; unremoved messages are requeued on close."""

    def __init__(self, *, broker_url: str, dlq: str):
        from kombu import Connection

        self.broker_url, self.dlq = broker_url, dlq
        self.connection = Connection(broker_url)
        self.channel = self.connection.channel()

    def letters(self, limit: int | None = None) -> list[DeadLetter]:
        letters = []
        while limit is None or len(letters) < limit:
            raw = self.channel.basic_get(self.dlq, no_ack=False)
            if raw is None:
                break
            message = self.channel.message_to_python(raw)
            letters.append(parse(message.body, message.headers, message.content_type,
                                 message.content_encoding, handle=message.delivery_tag))
        return letters

    def remove(self, letter: DeadLetter) -> None:
        self.channel.basic_ack(letter.handle)

    def purge(self) -> int:
        return self.channel.queue_purge(self.dlq) or 0

    def close(self) -> None:
        # Closing the channel requeues every message we took and did not ack.
        try:
            self.channel.close()
        finally:
            self.connection.release()


def open_dead_letters(broker_url: str, dlq: str, *, keyprefix: str = ""):
    kind = broker_kind(broker_url)
    if kind == "redis":
        return RedisDeadLetters(broker_url=broker_url, dlq=dlq, keyprefix=keyprefix)
    if kind == "amqp":
        return AmqpDeadLetters(broker_url=broker_url, dlq=dlq)
    raise SystemExit(f"taskherd dlq: broker URL scheme of {broker_url!r} is not supported "
                     f"(valid: redis://, rediss://, amqp://, amqps://)")


def publish_back(broker_url: str, letter: DeadLetter, queue: str, *, keyprefix: str = "") -> None:
    """Publish ``letter`` to ``queue`` (default exchange, by name); returns once the broker has it in
    that queue, raises :class:`Unroutable` when RabbitMQ has no such queue."""
    body, headers, content_type, content_encoding = redrive_message(letter)
    properties = {"correlation_id": letter.task_id} if letter.task_id else {}
    publish(body, broker_url=broker_url, exchange="", routing_key=queue,
            transport_options={"global_keyprefix": keyprefix} if keyprefix else None,
            headers=headers, content_type=content_type, content_encoding=content_encoding, delivery_mode=2,
            **properties)


def _select(letters: list[DeadLetter], refs: Iterable[str], select_all: bool) -> list[DeadLetter]:
    if select_all:
        return letters
    wanted = set(refs)
    return [letter for letter in letters if letter.ref in wanted or letter.task_id in wanted]


def _format_time(epoch: float | None) -> str:
    if epoch is None:
        return "-"
    return dt.datetime.fromtimestamp(epoch, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _print_table(letters: list[DeadLetter], out) -> None:
    rows = [("REF", "TASK", "REASON", "QUEUE", "ATTEMPTS", "DEAD-LETTERED")]
    rows += [(l.ref, l.task or "-", l.reason, l.queue or "-", "-" if l.attempts is None else str(l.attempts),
              _format_time(l.dead_lettered_at)) for l in letters]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip(), file=out)


#: the labels of `dlq show`, the longest (exception_message:) with a space after it: at 18 it was
#: printed glued to its value ("exception_message:order 42 …")
_LABEL_WIDTH = len("exception_message:") + 1


def _print_letter(letter: DeadLetter, out) -> None:
    """`dlq show` for a person: the fields of `list`, then the exception and traceback."""
    full = letter.full()
    envelope = full.pop("envelope", None) or {}
    for key, value in full.items():
        if value is not None and key not in ("body", "body_b64", "headers"):
            shown = _format_time(value) if key.endswith("_at") else json.dumps(value, default=str)
            print(f"{key + ':':<{_LABEL_WIDTH}}{shown}", file=out)
    for key in ("exception_type", "exception_message", "hostname"):
        if envelope.get(key):
            print(f"{key + ':':<{_LABEL_WIDTH}}{envelope[key]}", file=out)
    if envelope.get("traceback"):
        print("traceback:", file=out)
        print("  " + envelope["traceback"].rstrip().replace("\n", "\n  "), file=out)
    if envelope.get("raw_body_b64") is not None:  # a bad message: the bytes as they came
        _print_raw("raw_body", envelope["raw_body_b64"], out)
    if "body" in full:
        print(f"{'body:':<{_LABEL_WIDTH}}{json.dumps(full['body'], default=str)}", file=out)
    elif "body_b64" in full:
        _print_raw("body", full["body_b64"], out)
    print("", file=out)


#: how much of a raw body `dlq show` prints (`show --json` has it all, base64)
RAW_SHOWN = 2048


def _print_raw(label: str, encoded: Any, out) -> None:
    """A message's bytes for a person: as text (a JSON string, escapes and all, on one line) when
    they are UTF-8, else base64; the first RAW_SHOWN characters or bytes, and the total size."""
    try:
        raw = base64.b64decode(encoded, validate=True)
    except (ValueError, TypeError):  # binascii.Error is a ValueError
        print(f"{label + ':':<{_LABEL_WIDTH}}(not valid base64) {json.dumps(str(encoded)[:RAW_SHOWN])}", file=out)
        return
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        cut = len(raw) > RAW_SHOWN
        shown = base64.b64encode(raw[:RAW_SHOWN]).decode("ascii")
        more = f" …(first {RAW_SHOWN} bytes shown; all of them: dlq show --json)" if cut else ""
        print(f"{label + ':':<{_LABEL_WIDTH}}{len(raw)} bytes, base64: {shown}{more}", file=out)
        return
    cut = len(text) > RAW_SHOWN
    more = f" …(first {RAW_SHOWN} of {len(text)} characters shown; all of them: dlq show --json)" if cut else ""
    print(f"{label + ':':<{_LABEL_WIDTH}}{len(raw)} bytes, UTF-8: {json.dumps(text[:RAW_SHOWN])}{more}", file=out)


def build_parser() -> argparse.ArgumentParser:
    common = options.Parser(add_help=False)
    options.add_broker(common)
    options.add_queues(common, "the work queue whose DLQ to use (one)")
    common.add_argument("--dlq", type=options.not_empty("--dlq"), help="the DLQ's name itself, instead of -Q")
    options.add_dead_letter_naming(common)
    options.add_keyprefix(common)

    parser = options.Parser(prog="taskherd dlq", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p_list = sub.add_parser("list", parents=[common], help="one line per dead letter, oldest first")
    # At least 1: a slice [:0] or [:-1] would list everything, or all but the newest, without a word.
    p_list.add_argument("--limit", type=options.whole_number("--limit", 1), default=None,
                        help="list at most this many, oldest first")
    p_list.add_argument("--json", action="store_true",
                        help="JSON Lines (one object per dead letter: ref, task, task_id, args, kwargs, reason, "
                             "detail, queue, attempts, first_failure_at, last_failure_at, dead_lettered_at)")
    for name, help_ in (("show", "print whole dead letters: arguments, exception, traceback, headers"),
                        ("redrive", "send dead letters back to their queue and remove them")):
        p = sub.add_parser(name, parents=[common], help=help_)
        p.add_argument("refs", nargs="*", metavar="ID", help="task id or REF from `list`")
        p.add_argument("--all", action="store_true", help="every message in the DLQ")
        if name == "show":
            p.add_argument("--json", action="store_true",
                           help="JSON Lines: one whole dead letter per line (the list fields plus the envelope)")
        if name == "redrive":
            p.add_argument("--to", type=options.not_empty("--to"),
                           help="queue to send to (default: the queue each message came from)")
    p_delete = sub.add_parser("delete", parents=[common], help="remove the named dead letters for good")
    p_delete.add_argument("refs", nargs="+", metavar="ID", help="task id or REF from `list` (every one: purge)")
    p_delete.add_argument("--force", action="store_true", help="do not ask for confirmation")
    p_purge = sub.add_parser("purge", parents=[common], help="delete every message in the DLQ")
    p_purge.add_argument("--force", action="store_true", help="do not ask for confirmation")
    return parser


def _dead_letter_queue(parser: argparse.ArgumentParser, args: argparse.Namespace, broker_url: str) -> str:
    """The DLQ to use, from --dlq or the one work queue of -Q; a usage error naming the flag (or
    variable) as written when the broker cannot take a name (options.check_queue_name), before
    anything on the broker is read or changed."""
    queue_names = options.queues(parser, args)
    if args.dlq and queue_names:
        parser.error("give either -Q/--queues (a work queue) or --dlq (its DLQ), not both")
    if args.dlq:
        options.check_queue_name(parser, "--dlq", args.dlq, broker_url)
        return args.dlq
    if len(queue_names) != 1:
        parser.error(f"-Q/--queues must name exactly one work queue (got {len(queue_names)}: "
                     f"{','.join(queue_names)!r}), or give --dlq")
    queue = queue_names[0]
    queue_source = "-Q/--queues" if args.queues else "TASKHERD_QUEUES"
    options.check_queue_name(parser, queue_source, queue, broker_url)
    dlq = options.dead_letter_queues(parser, args, queue_names)[queue]
    if args.dead_letter_queues is not None:
        options.check_queue_name(parser, "--dead-letter-queues", dlq, broker_url)
    elif options.from_env(parser, "TASKHERD_DEAD_LETTER_QUEUES") is not None:
        options.check_queue_name(parser, "TASKHERD_DEAD_LETTER_QUEUES", dlq, broker_url)
    else:  # derived: the work queue fits, its DLQ ('{queue}.dlq') may not
        problem = options.queue_name_problem(dlq, broker_url)
        if problem:
            from taskherd.worker.profile import AMQP_MAX_NAME_BYTES

            room = AMQP_MAX_NAME_BYTES - (len(dlq.encode("utf-8", "replace")) - len(queue.encode("utf-8", "replace")))
            parser.error(f"--dead-letter-pattern={args.dead_letter_pattern!r}: the DLQ of {queue_source}="
                         f"{options.shown_name(queue)} would be {options.shown_name(dlq)}, which {problem}; "
                         f"with this pattern a work queue of at most {max(room, 0)} bytes")
    return dlq


def main(argv: list[str] | None = None, *, stdin=None, stdout=None, stderr=None) -> int:
    stdin, stdout, stderr = stdin or sys.stdin, stdout or sys.stdout, stderr or sys.stderr
    parser = build_parser()
    args = parser.parse_args(argv)
    # Redis through redis-py (one URL), RabbitMQ through kombu's py-amqp (its failover lists too)
    broker_url = options.broker(parser, args, schemes=contract.REDIS_PY_SCHEMES + contract.PY_AMQP_SCHEMES,
                                failover=contract.PY_AMQP_SCHEMES)
    dlq = _dead_letter_queue(parser, args, broker_url)
    if getattr(args, "to", None):
        options.check_queue_name(parser, "--to", args.to, broker_url)
    if args.command in ("show", "redrive") and not (args.refs or args.all):
        parser.error(f"{args.command}: name at least one ID, or pass --all")

    from amqp.exceptions import NotFound

    store = None
    try:
        store = open_dead_letters(broker_url, dlq, keyprefix=args.global_keyprefix)
        if isinstance(store, RedisDeadLetters) and not store.client.exists(store.key):
            # RabbitMQ says NotFound below; an empty Redis list could be a queue never declared
            unknown = redis_queue_unknown(broker_url, [*options.queues(parser, args)[:1], dlq],
                                          keyprefix=args.global_keyprefix)
            if unknown:
                print(f"taskherd dlq: {unknown}", file=stderr)
                return 1
        return _run(args, store, dlq, stdin=stdin, stdout=stdout, stderr=stderr)
    except NotFound:
        print(f"taskherd dlq: there is no queue {dlq!r} on the broker (nothing was ever dead-lettered "
              f"there, or -Q/--dlq is wrong)", file=stderr)
        return 1
    except options.broker_errors() as exc:  # refused, timed out, bad credentials: one line, nothing changed
        print(f"taskherd dlq: cannot use the broker at {contract.redact(broker_url)}: {type(exc).__name__}: {exc}",
              file=stderr)
        return 1
    finally:
        try:
            if store is not None:
                store.close()
        except Exception:  # noqa: BLE001 - the channel a NotFound closed
            pass


def _run(args, store, dlq: str, *, stdin, stdout, stderr) -> int:
    if args.command == "purge":
        return _purge(store, dlq, force=args.force, stdin=stdin, stdout=stdout)
    letters = store.letters(limit=getattr(args, "limit", None))
    if args.command == "list":
        if args.json:
            for letter in letters:
                print(json.dumps(letter.summary()), file=stdout)
        else:
            _print_table(letters, stdout)
        return 0
    chosen = _select(letters, args.refs, getattr(args, "all", False))  # delete names each letter
    missing = set(args.refs) - {l.ref for l in chosen} - {l.task_id for l in chosen}
    for ref in sorted(missing):
        print(f"taskherd dlq: {ref} is not in {dlq}", file=stderr)
    if args.command == "delete":
        return _delete(store, chosen, dlq, force=args.force, stdin=stdin, stdout=stdout) or (1 if missing else 0)
    if args.command == "show":
        for letter in chosen:
            if args.json:
                print(json.dumps(letter.full(), default=str), file=stdout)
            else:
                _print_letter(letter, stdout)
        return 1 if missing else 0
    return (_redrive(store, chosen, args.broker, to=args.to, keyprefix=args.global_keyprefix, stdout=stdout,
                     stderr=stderr, select_all=args.all) or (1 if missing else 0))


#: kombu's Redis transport: the separator of a binding's fields (routing key, pattern, queue)
_REDIS_BINDING_SEPARATOR = "\x06\x16"


def redis_queue_declared(broker_url: str, queue: str, *, keyprefix: str = "") -> bool:
    """Whether a worker or producer has declared ``queue`` on this Redis (with ``keyprefix``)."""
    return keyprefix in redis_queue_prefixes(broker_url, [queue])


def redis_queue_prefixes(broker_url: str, queues: list[str]) -> set[str]:
    """The global key prefixes under which a worker or producer declared one of ``queues`` on this
    Redis ("" for none), in one scan of the keys. Redis has no mandatory publish, and a list exists
    only while it holds messages: what says a queue is read is kombu's binding set
    ``<prefix>_kombu.binding.<exchange>``, whose members end with the queue's name."""
    import redis

    client = redis.Redis.from_url(broker_url)
    prefixes = set()
    try:
        for key in client.scan_iter(match="*_kombu.binding.*"):
            prefix = key.decode("utf-8", "replace").rpartition("_kombu.binding.")[0]
            if prefix in prefixes:
                continue
            for member in client.smembers(key):
                if member.decode("utf-8", "replace").rpartition(_REDIS_BINDING_SEPARATOR)[2] in queues:
                    prefixes.add(prefix)
                    break
        return prefixes
    finally:
        client.close()


def redis_queue_unknown(broker_url: str, queues: list[str], *, keyprefix: str) -> str | None:
    """Why none of ``queues`` (the work queue and its DLQ) can be the one meant, on a Redis whose
    DLQ list is empty, or None: neither was declared with this prefix (a typo in -Q/--dlq, or a
    forgotten --global-keyprefix). An empty table would say "no dead letters" where the dead
    letters are under another name."""
    found = redis_queue_prefixes(broker_url, queues)
    if keyprefix in found:
        return None
    where = f"there is no queue {queues[0]!r} on this Redis"
    where += f" with --global-keyprefix={keyprefix!r}" if keyprefix else ""
    if found:
        elsewhere = ", ".join(f"--global-keyprefix={prefix!r}" if prefix else "no --global-keyprefix"
                              for prefix in sorted(found))
        return f"{where}: it is declared with {elsewhere}"
    nor_dlq = f" (nor its DLQ {queues[1]!r})" if len(queues) > 1 else ""
    return f"{where}{nor_dlq}: no worker or producer declared it, and its DLQ holds nothing (-Q/--dlq wrong?)"


def _redrive(store, letters: list[DeadLetter], broker_url: str, *, to: str | None, keyprefix: str, stdout,
             stderr, select_all: bool = False) -> int:
    failed = 0
    declared: dict[str, bool] = {}
    skipped: list[DeadLetter] = []
    for letter in letters:
        why = never_a_task(letter)
        if why is not None:
            if select_all:  # counted below, one line for all of them
                skipped.append(letter)
                continue
            detail = letter.envelope.detail if letter.envelope is not None else None
            print(f"taskherd dlq: {letter.ref}: not redriven ({_one_line(letter.reason, detail)}): {why}; it stays "
                  f"in the DLQ — see its bytes with `taskherd dlq show {letter.ref}`, remove it with "
                  f"`taskherd dlq delete {letter.ref}`", file=stderr)
            failed += 1
            continue
        queue = to or letter.queue
        if not queue:
            print(f"taskherd dlq: {letter.ref}: original queue unknown; pass --to QUEUE", file=stderr)
            failed += 1
            continue
        problem = options.queue_name_problem(queue, broker_url)  # --to was checked: the letter's own queue
        if problem:
            print(f"taskherd dlq: {letter.ref}: its queue {options.shown_name(queue)} {problem}; not redriven, it "
                  f"stays in the DLQ — pass --to QUEUE", file=stderr)
            failed += 1
            continue
        if broker_kind(broker_url) == "redis":
            if queue not in declared:
                declared[queue] = redis_queue_declared(broker_url, queue, keyprefix=keyprefix)
            if not declared[queue]:
                # Published anyway, it would wait in a list no worker reads, gone from the DLQ.
                print(f"taskherd dlq: {letter.ref}: there is no queue {queue!r} on the broker (no worker or "
                      f"producer declared it on this Redis{' with prefix ' + repr(keyprefix) if keyprefix else ''}); "
                      f"not redriven, it stays in the DLQ — check --to and --global-keyprefix", file=stderr)
                failed += 1
                continue
        try:
            publish_back(broker_url, letter, queue, keyprefix=keyprefix)  # confirmed before the DLQ copy goes
        except Unroutable:
            print(f"taskherd dlq: {letter.ref}: there is no queue {queue!r} on the broker (it returned the message "
                  f"unroutable); not redriven, it stays in the DLQ — check --to", file=stderr)
            failed += 1
            continue
        store.remove(letter)
        print(f"redriven {letter.ref} ({letter.task or 'message'}) -> {queue}", file=stdout)
    if skipped:
        # Not a failure of --all ("every dead letter that can be redriven"): no redrive will ever
        # take them, and a status of 1 for ever after would hide the failures that matter.
        print(f"taskherd dlq: skipped {len(skipped)} dead letter(s) that were never task messages (not kombu "
              f"messages, or headers that could not be read): {_refs(skipped)}; they stay in the DLQ — see "
              f"their bytes with `taskherd dlq show REF`, remove them with `taskherd dlq delete REF…`", file=stderr)
    return 1 if failed else 0


#: how many refs a line naming letters shows (redrive --all's skipped ones, delete's question)
_REFS_SHOWN = 10


def _refs(letters: list[DeadLetter]) -> str:
    refs = ", ".join(letter.ref for letter in letters[:_REFS_SHOWN])
    return refs + (f", … ({len(letters) - _REFS_SHOWN} more)" if len(letters) > _REFS_SHOWN else "")


def _one_line(reason: str, detail: str | None, limit: int = 160) -> str:
    """``reason: detail`` on one line, the detail cut at ``limit`` characters."""
    if not detail:
        return reason
    detail = " ".join(str(detail).split())
    return f"{reason}: {detail if len(detail) <= limit else detail[:limit] + '…'}"


def _delete(store, letters: list[DeadLetter], dlq: str, *, force: bool, stdin, stdout) -> int:
    if not letters:
        return 1  # each ID not found was named on stderr
    if not force:
        print(f"Delete {len(letters)} dead letter(s) from {dlq} ({_refs(letters)})? This cannot be undone. "
              f"[y/N] ", end="", file=stdout, flush=True)
        if stdin.readline().strip().lower() not in ("y", "yes"):
            print("aborted: nothing deleted", file=stdout)
            return 1
    for letter in letters:
        store.remove(letter)
        print(f"deleted {letter.ref} ({letter.task or 'message'}) from {dlq}", file=stdout)
    return 0


def _purge(store, dlq: str, *, force: bool, stdin, stdout) -> int:
    if not force:
        print(f"Purge every message in {dlq}? This cannot be undone. [y/N] ", end="", file=stdout, flush=True)
        answer = stdin.readline().strip().lower()
        if answer not in ("y", "yes"):
            print("aborted: nothing purged", file=stdout)
            return 1
    count = store.purge()
    print(f"purged {count} message(s) from {dlq}", file=stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
