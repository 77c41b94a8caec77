"""A corpus of malformed messages, each on Redis and RabbitMQ against one real worker per broker:
one bad message, then a good one. Each bad message must end in the DLQ with the reason, a detail
naming what is wrong, and its raw bytes; the worker's process and pool stay the same; the good
message runs; nothing is left on the queue or unacknowledged.

The kinds come from the issue, from what producers in other languages and old Celery versions get
wrong (protocol 1, missing or mistyped headers, other encodings, compression) and from what a
shell script LPUSHing onto a Redis list does.
"""
from __future__ import annotations

import base64
import dataclasses
import json
import pickle
import sys
import uuid
import zlib

import pytest

from e2e.lib.waiting import wait_for
from raw_messages import (DROP, RedisItem, Wire, consuming_worker, json_body, kombu_payload, settle,
                          task_headers)
from taskherd.worker.decompression import MAX_DECOMPRESSED_BYTES

UNDECODABLE, INVALID, REFUSED, UNKNOWN = "undecodable-message", "invalid-message", "content-refused", "unknown-task"
GOOD_BODY = [["corpus", "ok"], {}, {"callbacks": None, "errbacks": None, "chain": None, "chord": None}]


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    message: Wire | RedisItem
    #: (reason, a fragment of the detail) on Redis, and on RabbitMQ when it differs
    expected: tuple[str, str]
    amqp_expected: tuple[str, str] | None = None

    def outcome(self, broker: str) -> tuple[str, str]:
        return self.amqp_expected if broker == "rabbitmq" and self.amqp_expected else self.expected


def _task(body, **headers) -> Wire:
    return Wire(json_body(body) if not isinstance(body, bytes) else body, headers=task_headers(**headers))


def _nested(depth: int) -> list:
    """[[[…]]], ``depth`` lists deep (built without recursion)."""
    value: list = []
    for _ in range(depth - 1):
        value = [value]
    return value


def _zlib_bomb(size: int) -> bytes:
    """A good task body, [["aaa…"], {}, {}] of about ``size`` bytes, zlib-compressed (to ~1/1000),
    written in steps so that this process never holds it inflated."""
    packer = zlib.compressobj(9)
    chunk = b"a" * (1 << 20)
    parts = [packer.compress(b'[["')]
    parts += [packer.compress(chunk) for _ in range(size >> 20)]
    parts += [packer.compress(b'"], {}, {}]'), packer.flush()]
    return b"".join(parts)


def _item(**changes) -> RedisItem:
    """A kombu Redis payload of a good message, with top-level or ``properties.*`` keys changed
    (DROP removes one)."""
    # The routing key does not decide which list an item is pushed on: any will do.
    payload = kombu_payload(json_body(GOOD_BODY), task_headers(), queue="any-routing-key")
    for key, value in changes.items():
        target, name = (payload["properties"], key[len("properties."):]) if key.startswith("properties.") \
            else (payload, key)
        if value is DROP:
            target.pop(name, None)
        else:
            target[name] = value
    return RedisItem(json_body(payload))


# On RabbitMQ a RedisItem is the same bytes sent as a JSON body without headers.
NOT_A_TASK = (INVALID, "not a Celery task message")
NOT_DECODABLE = (UNDECODABLE, "body could not be decoded")

CASES = [
    # -- not a kombu message at all (Redis: LPUSHed by hand) ------------------------------------
    Case("raw-text", RedisItem(b"hello from a shell script"),
         (UNDECODABLE, "not a kombu message: not valid kombu JSON"), NOT_DECODABLE),
    Case("raw-non-utf8", RedisItem(b"\xff\xfe\xfd\x00 binary garbage"),
         (UNDECODABLE, "not a kombu message: not valid kombu JSON"), NOT_DECODABLE),
    Case("raw-json-array", RedisItem(b'["core.record", ["k", "v"]]'),
         (UNDECODABLE, "not a kombu message: a JSON array, not a kombu message"), NOT_A_TASK),
    Case("raw-json-number", RedisItem(b"42"), (UNDECODABLE, "a JSON number, not a kombu message"), NOT_A_TASK),
    Case("raw-json-null", RedisItem(b"null"), (UNDECODABLE, "a JSON null, not a kombu message"), NOT_A_TASK),
    Case("kombu-type-marker-garbage", RedisItem(b'{"__type__": "datetime", "__value__": "yesterday"}'),
         (UNDECODABLE, "not valid kombu JSON (ValueError"), (UNDECODABLE, "Invalid isoformat string: 'yesterday'")),
    # -- kombu's JSON, hand-written wrong ---------------------------------------------------------
    Case("body-not-base64", _item(body="not base64!!"),
         (UNDECODABLE, "body is not valid base64 (Error: "), NOT_A_TASK),
    Case("no-properties", _item(properties=DROP),
         (UNDECODABLE, "'properties' must be a JSON object, got missing/null"), NOT_A_TASK),
    Case("no-delivery-tag", _item(**{"properties.delivery_tag": DROP}),
         (UNDECODABLE, "'properties.delivery_tag' must be a non-empty string, got missing/null"), NOT_A_TASK),
    Case("delivery-tag-number", _item(**{"properties.delivery_tag": 17}),
         (UNDECODABLE, "'properties.delivery_tag' must be a non-empty string, got 17"), NOT_A_TASK),
    Case("no-delivery-info", _item(**{"properties.delivery_info": DROP}),
         (UNDECODABLE, "'properties.delivery_info' must be a JSON object"), NOT_A_TASK),
    Case("unknown-body-encoding", _item(**{"properties.body_encoding": "rot13"}),
         (UNDECODABLE, "unknown 'properties.body_encoding' 'rot13' (valid: base64, utf-8)"), NOT_A_TASK),
    Case("body-not-a-string", _item(body={"args": ["k"], "kwargs": {}}),
         (UNDECODABLE, "'body' must be a string, got {"), NOT_A_TASK),
    Case("headers-not-an-object", _item(headers="task=core.record"),
         (UNDECODABLE, "'headers' must be a JSON object, got 'task=core.record'"), NOT_A_TASK),
    Case("priority-infinite", RedisItem(json_body(kombu_payload(json_body(GOOD_BODY), task_headers(), queue="q"))
                                        .replace(b'"priority": 0', b'"priority": 1e999')),
         (UNDECODABLE, "'properties.priority' must be a finite number, got inf"), NOT_A_TASK),
    # -- the body ---------------------------------------------------------------------------------
    Case("body-not-json", _task(b"{this is not json"), NOT_DECODABLE),
    Case("body-not-utf8", _task(b'\xff\xfe[["k"], {}, {}]'), NOT_DECODABLE),
    Case("body-empty", _task(b""), (UNDECODABLE, "empty body (valid: a JSON document)")),
    Case("body-nested-too-deep", _task(b"[" * 200_000 + b"]" * 200_000),
         (UNDECODABLE, "body could not be decoded: maximum recursion depth exceeded")),
    Case("body-huge-garbage", _task(b"x" * (4 << 20)), NOT_DECODABLE),
    Case("content-encoding-unknown", Wire(json_body(GOOD_BODY), task_headers(), content_encoding="x-snappy"),
         (UNDECODABLE, "content-encoding 'x-snappy' is not supported (valid: utf-8)")),
    Case("content-encoding-latin1", Wire(json_body(GOOD_BODY), task_headers(), content_encoding="latin-1"),
         (UNDECODABLE, "content-encoding 'latin-1' is not supported (valid: utf-8)")),
    Case("content-type-missing", Wire(json_body(GOOD_BODY), task_headers(), content_type=None),
         (UNDECODABLE, "no content-type: cannot tell how to decode the body")),
    Case("content-type-text", Wire(json_body(GOOD_BODY), task_headers(), content_type="text/plain"),
         (REFUSED, "content-type 'text/plain' refused (valid: application/json)")),
    Case("content-type-trusted-by-kombu", Wire(json_body(GOOD_BODY), task_headers(), content_type="application/data"),
         (REFUSED, "content-type 'application/data' refused (valid: application/json)")),
    Case("pickle", Wire(pickle.dumps([["k"], {}, {}]), task_headers(), content_type="application/x-python-serialize",
                        content_encoding="binary"),
         (REFUSED, "content-type 'application/x-python-serialize' refused")),
    Case("compressed-bad-data", _task(b"\xff\xfe not zlib data", compression="application/x-gzip"),
         (UNDECODABLE, "body (compression 'application/x-gzip') could not be decoded: Error -3 while decompressing")),
    Case("compression-unknown", _task(json_body(GOOD_BODY), compression="application/x-snappy"),
         (UNDECODABLE, "body (compression 'application/x-snappy') could not be decoded: ")),
    # a valid task whose body inflates past the bound: it ran, inflated whole in the main process
    # and again in the pool child; larger, it got the worker killed for memory (and the next one)
    Case("compression-bomb", _task(_zlib_bomb(MAX_DECOMPRESSED_BYTES + (1 << 20)), compression="application/x-gzip"),
         (UNDECODABLE, f"could not be decoded: the body inflates to more than {MAX_DECOMPRESSED_BYTES} bytes")),
    # -- the protocol-2 body's shape --------------------------------------------------------------
    Case("kwargs-list", _task([["k"], ["v"], {}]), (INVALID, "kwargs must be a JSON object, got ['v']")),
    Case("args-string", _task(["ab", {}, {}]), (INVALID, "args must be a JSON array, got 'ab'")),
    Case("dict-body-with-protocol-2-headers", _task({"args": ["k"], "kwargs": {}}),
         (INVALID, "body is a JSON object, but the message has protocol-2 headers")),
    Case("body-two-items", _task([["k"], {}]), (INVALID, "body must be [args, kwargs, embed], got [['k'], {}]")),
    Case("embed-not-object", _task([["k"], {}, "callbacks"]),
         (INVALID, "embed (the body's third item) must be a JSON object or null, got 'callbacks'")),
    Case("callbacks-not-signatures", _task([["k"], {}, {"callbacks": "core.record"}]),
         (INVALID, "embed 'callbacks' must be a list of signatures")),
    Case("chain-of-empty-signatures", _task([["k"], {}, {"chain": [{}]}]),
         (INVALID, "embed 'chain' must be a list of signatures (JSON objects with a 'task') or null, got [{}]")),
    Case("too-many-arguments", _task([["k", "v", "extra"], {}, None]),
         (INVALID, "arguments do not match task 'core.record': ")),
    Case("unknown-keyword-argument", _task([["k"], {"colour": "red"}, None]),
         (INVALID, "arguments do not match task 'core.record': ")),
    # -- protocol-2 headers -----------------------------------------------------------------------
    Case("no-id", _task(GOOD_BODY, id=DROP), (INVALID, "header 'id' must be a non-empty string, got None")),
    Case("id-number", _task(GOOD_BODY, id=12345), (INVALID, "header 'id' must be a non-empty string, got 12345")),
    Case("task-number", _task(GOOD_BODY, task=42), (INVALID, "header 'task' must be a non-empty string, got 42")),
    Case("shadow-list", _task(GOOD_BODY, shadow=["x"]), (INVALID, "header 'shadow' must be a string or null")),
    Case("retries-string", _task(GOOD_BODY, retries="3"),
         (INVALID, "header 'retries' must be an integer >= 0, got '3'")),
    Case("retries-negative", _task(GOOD_BODY, retries=-1),
         (INVALID, "header 'retries' must be an integer >= 0, got -1")),
    Case("eta-garbage", _task(GOOD_BODY, eta="tomorrow"),
         (INVALID, "header 'eta' must be an ISO 8601 date-time string within years 1-9999, got 'tomorrow'")),
    Case("eta-number", _task(GOOD_BODY, eta=1700000000),
         (INVALID, "header 'eta' must be an ISO 8601 date-time string, got 1700000000")),
    Case("eta-out-of-range", _task(GOOD_BODY, eta="0001-01-01T00:00:00+14:00"),
         (INVALID, "header 'eta' must be an ISO 8601 date-time string within years 1-9999")),
    Case("expires-garbage", _task(GOOD_BODY, expires="never"),
         (INVALID, "header 'expires' must be an ISO 8601 date-time string within years 1-9999, got 'never'")),
    Case("timelimit-string", _task(GOOD_BODY, timelimit="soon"),
         (INVALID, "header 'timelimit' must be [hard, soft] with each a number of seconds >= 0 or null")),
    Case("timelimit-negative", _task(GOOD_BODY, timelimit=[-1, 10]),
         (INVALID, "header 'timelimit' must be [hard, soft]")),
    Case("group-index-string", _task(GOOD_BODY, group_index="first"),
         (INVALID, "header 'group_index' must be an integer or null, got 'first'")),
    Case("stamped-headers-not-a-list", _task(GOOD_BODY, stamped_headers=5, stamps={}),
         (INVALID, "header 'stamped_headers' must be a list of strings or null, got 5")),
    Case("stamps-not-an-object", _task(GOOD_BODY, stamped_headers=["tenant"], stamps="acme"),
         (INVALID, "header 'stamps' must be a table/object or null, got 'acme'")),
    # Nested deeper than pickle goes: Celery fails to hand it to the pool child, after it took a
    # pool slot for it (the worker has one: a slot kept would stop it for good).
    Case("header-nested-too-deep-for-the-pool", _task(GOOD_BODY, **{"x-deep": _nested(900)}),
         (INVALID, "the task could not be handed to the pool: RecursionError")),
    Case("unknown-task", _task(GOOD_BODY, task="core.no_such_task"),
         (UNKNOWN, "no task named 'core.no_such_task' is registered on this worker")),
    # -- protocol 1 (Celery 3, some clients in other languages) ------------------------------------
    Case("protocol-1-args-string", Wire(json_body({"task": "core.record", "id": "p1", "args": "ab", "kwargs": {}})),
         (INVALID, "args must be a JSON array, got 'ab'")),
    Case("protocol-1-kwargs-list", Wire(json_body({"task": "core.record", "id": "p1", "args": [], "kwargs": []})),
         (INVALID, "kwargs must be a JSON object, got []")),
    Case("protocol-1-no-id", Wire(json_body({"task": "core.record", "args": ["k"], "kwargs": {}})),
         (INVALID, "field 'id' must be a non-empty string, got None")),
    Case("protocol-1-eta-garbage",
         Wire(json_body({"task": "core.record", "id": "p1", "args": ["k"], "kwargs": {}, "eta": "soon"})),
         (INVALID, "field 'eta' must be an ISO 8601 date-time string")),
    Case("protocol-1-header-overrides-a-field",
         Wire(json_body({"task": "core.record", "id": "p1", "args": ["k"], "kwargs": {}}), {"timelimit": "soon"}),
         (INVALID, "header 'timelimit' must be [hard, soft]")),
    Case("protocol-1-unknown-task", Wire(json_body({"task": "core.nope", "id": "p1", "args": [], "kwargs": {}})),
         (UNKNOWN, "no task named 'core.nope' is registered on this worker")),
    Case("json-object-without-task", Wire(json_body({"hello": "world"})), NOT_A_TASK),
]


@pytest.fixture(scope="module", params=["redis", "rabbitmq"])
def consuming(request, tmp_path_factory):
    with consuming_worker(request.param, tmp_path_factory.mktemp(f"corpus-{request.param}")) as worker:
        yield worker


def test_the_corpus_has_at_least_twenty_kinds():
    assert len({case.name for case in CASES}) == len(CASES) >= 20


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_a_bad_message_is_dead_lettered_whole_and_the_next_one_runs(consuming, case):
    consuming.purge_dead_letters()
    log_before = len(consuming.worker.log())
    key = f"after-{case.name}-{uuid.uuid4().hex[:6]}"

    consuming.publish(case.message)
    consuming.publish_good(key)

    wait_for(f"the good message after {case.name}", lambda: consuming.recorded(key), timeout=30,
             explain=consuming.worker.tail)
    letters = wait_for(f"the envelope of {case.name}", consuming.letters, timeout=10, explain=consuming.worker.tail)
    assert len(letters) == 1, [letter.envelope for letter in letters]
    envelope = letters[0].envelope
    reason, detail = case.outcome(consuming.broker)
    assert (envelope.reason, detail in envelope.detail) == (reason, True), envelope.detail
    assert base64.b64decode(envelope.raw_body_b64) == case.message.raw, "the raw bytes are kept"
    assert envelope.queue == consuming.queue
    assert consuming.recorded(key) == ["ok"]
    consuming.assert_alive_and_unchanged()
    log = consuming.worker.log()[log_before:]
    for symptom in ("Unrecoverable error", "Connection to broker lost", "Internal error"):
        assert symptom not in log, log[-3000:]
    settle(consuming)


def test_an_envelope_names_the_message_it_came_from(consuming):
    """task and id come from the headers (protocol 2) or the body (protocol 1)."""
    consuming.purge_dead_letters()
    headers = task_headers(retries="x")
    consuming.publish(Wire(json_body(GOOD_BODY), headers=headers))
    consuming.publish(Wire(json_body({"task": "core.record", "id": "p1-id", "args": "ab", "kwargs": {}})))
    letters = wait_for("two envelopes", consuming.letters, until=lambda found: len(found) == 2, timeout=20,
                       explain=consuming.worker.tail)
    by_id = {letter.envelope.task_id: letter.envelope for letter in letters}
    assert by_id[headers["id"]].task == "core.record" and by_id[headers["id"]].headers["retries"] == "x"
    assert by_id["p1-id"].task == "core.record"
    assert json.loads(base64.b64decode(by_id["p1-id"].raw_body_b64))["args"] == "ab"


def test_headers_nested_deeper_than_python_reads_are_dead_lettered_and_the_worker_stays(consuming):
    """A producer in another language can nest headers deeper than Python's recursion limit: the
    AMQP header table, or the Redis item's JSON, cannot be read. Raised where it is read, the
    error ended the worker (RabbitMQ: "Unrecoverable error") and the message went to the next."""
    consuming.purge_dead_letters()
    log_before = len(consuming.worker.log())
    message = _task(GOOD_BODY, **{"x-deep": _nested(5000)})
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(20_000)  # to write it here (json, py-amqp): the worker runs with the default
    try:
        if consuming.broker == "redis":  # the item, as written once (its delivery tag is random)
            message = RedisItem(consuming._redis_item(message))
        consuming.publish(message)
    finally:
        sys.setrecursionlimit(limit)
    key = f"after-deep-headers-{uuid.uuid4().hex[:6]}"
    consuming.publish_good(key)

    wait_for("the good message after it", lambda: consuming.recorded(key), timeout=30, explain=consuming.worker.tail)
    [letter] = wait_for("its envelope", consuming.letters, timeout=10, explain=consuming.worker.tail)
    detail = ("AMQP headers could not be decoded: the headers table is nested too deep to read"
              if consuming.broker == "rabbitmq" else "not a kombu message: not valid kombu JSON")
    assert (letter.envelope.reason, detail in letter.envelope.detail) == (UNDECODABLE, True), letter.envelope.detail
    assert base64.b64decode(letter.envelope.raw_body_b64) == message.raw, "the raw bytes are kept"
    consuming.assert_alive_and_unchanged()
    assert "Unrecoverable error" not in consuming.worker.log()[log_before:]
    settle(consuming)


WELL_FORMED = [
    ("celery-5", Wire(json_body([["wf", "celery-5"], {}, None]), task_headers())),
    ("minimal-headers", Wire(json_body([["wf", "minimal"], {}, None]),
                             {"task": "core.record", "id": str(uuid.uuid4())})),
    ("kwargs-and-extra-headers", Wire(json_body([["wf"], {"value": "extra"}, {}]),
                                      task_headers(**{"x-tenant": "acme", "taskherd_custom": [1, 2]}))),
    ("encoding-spelled-differently", Wire(json_body([["wf", "utf8"], {}, None]), task_headers(),
                                          content_encoding="UTF8")),
    ("no-content-encoding", Wire(json_body([["wf", "no-encoding"], {}, None]), task_headers(), content_encoding=None)),
    ("eta-in-the-past", Wire(json_body([["wf", "eta"], {}, None]), task_headers(eta="2020-01-01T00:00:00+00:00"))),
    ("expires-in-the-future", Wire(json_body([["wf", "expires"], {}, None]),
                                   task_headers(expires="2999-01-01T00:00:00"))),
    ("timelimit-set", Wire(json_body([["wf", "timelimit"], {}, None]), task_headers(timelimit=[20, 25.5]))),
    ("protocol-1", Wire(json_body({"task": "core.record", "id": str(uuid.uuid4()), "args": ["wf", "protocol-1"],
                                   "kwargs": {}, "retries": 0, "eta": None}))),
]


@pytest.mark.parametrize("name,message", WELL_FORMED, ids=[name for name, _ in WELL_FORMED])
def test_well_formed_messages_from_other_producers_still_run(consuming, name, message):
    """The checks refuse what Celery would misread, not what it reads right."""
    consuming.purge_dead_letters()
    before = len(consuming.recorded("wf"))
    consuming.publish(message)
    wait_for(f"{name} to run (runs recorded)", lambda: len(consuming.recorded("wf")), until=lambda runs: runs > before,
             timeout=20, explain=consuming.worker.tail)
    assert consuming.letters() == []
    consuming.assert_alive_and_unchanged()
