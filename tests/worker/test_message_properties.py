"""Property: whatever a producer puts on the queue, the worker never exits and every message ends
either run once or in the DLQ — on Redis and on RabbitMQ, against one real worker per broker.

Hypothesis generates message envelopes — headers (valid, mistyped, missing, unknown), content
type and encoding, compression, bodies (protocol-2 shaped or not, any JSON, any bytes) and, on
Redis, list items that are kombu's JSON with parts changed or dropped, or not JSON at all — and
publishes each raw. Runs are counted by ``core.sink``, which takes any arguments; dead letters by
the DLQ's length. Generated ETAs lie in the past and expiries in the future, so that no message
is held back on purpose or discarded as expired (both by design, not by accident).
"""
from __future__ import annotations

import os
import string
from collections import Counter
import uuid
import zlib
from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raw_messages import RedisItem, Wire, consuming_worker, json_body, kombu_payload
from worker_support import wait_for

#: examples per broker: about 0.25 s each; raise it for a soak run
EXAMPLES_PER_BROKER = int(os.environ.get("TASKHERD_MESSAGE_EXAMPLES", "100"))

# -- values a producer might put anywhere ------------------------------------------------------
# Keys from a tiny alphabet: never the name of a header or embed field that would make a random
# value meaningful (a generated "chain" would publish more messages after the run).
_junk_keys = st.text(alphabet="xyz", min_size=1, max_size=3)
_scalars = (st.none() | st.booleans() | st.integers(-2**31, 2**31) | st.floats(allow_nan=False, allow_infinity=False)
            | st.text(max_size=12))
junk = st.recursive(_scalars, lambda children: st.lists(children, max_size=3)
                    | st.dictionaries(_junk_keys, children, max_size=3), max_leaves=6)
#: junk that can never be read as a date-time or a time limit (a random "3000" would be an ETA
#: in the future, held back on purpose; [0.001, 0.002] a real limit)
_not_a_date = junk.filter(lambda v: not isinstance(v, str)) | st.text(alphabet=string.ascii_letters, min_size=1,
                                                                       max_size=8)
_not_a_limit = _not_a_date.filter(lambda v: not isinstance(v, list)) | st.lists(
    st.integers(-10, -1) | st.text(alphabet="ab", max_size=2), min_size=1, max_size=3)

_past = st.datetimes(min_value=datetime(1971, 1, 2), max_value=datetime(2020, 1, 1)).map(
    lambda d: d.replace(tzinfo=timezone.utc).isoformat())
_future = st.integers(1, 3650).map(lambda days: (datetime.now(timezone.utc) + timedelta(days=days)).isoformat())
_ids = st.uuids().map(str)

#: a protocol-2 message for core.sink as any client may send it: every optional header valid
VALID_HEADERS = st.fixed_dictionaries(
    {"id": _ids, "task": st.just("core.sink")},
    optional={"lang": st.sampled_from(["py", "js", "go"]), "retries": st.integers(0, 5), "eta": st.none() | _past,
              "expires": st.none() | _future,
              "timelimit": st.sampled_from([None, [None, None], [30, 60], [None, 45.5]]),
              "shadow": st.none() | st.text(max_size=8), "group_index": st.none() | st.integers(0, 9),
              "ignore_result": st.booleans(), "root_id": st.none() | _ids, "parent_id": st.none() | _ids,
              "group": st.none() | _ids, "argsrepr": st.text(max_size=8), "kwargsrepr": st.text(max_size=8),
              "origin": st.text(max_size=8), "x-custom": junk},
)
VALID_BODY = st.tuples(st.lists(junk, max_size=3), st.dictionaries(st.text(min_size=1, max_size=6), junk, max_size=3),
                       st.sampled_from([None, {}, {"callbacks": None, "errbacks": None, "chain": None, "chord": None}]))
#: what a header is replaced with, by header
_WRONG = {"eta": _not_a_date, "expires": _not_a_date, "timelimit": _not_a_limit}
_HEADER_NAMES = ["id", "task", "retries", "eta", "expires", "timelimit", "shadow", "group_index", "ignore_result",
                 "root_id", "argsrepr"]
MUTATIONS = ["header-wrong", "header-wrong", "header-dropped", "no-headers", "unknown-task", "args-wrong",
             "kwargs-wrong", "embed-wrong", "body-any-json", "body-bytes", "body-protocol-1-shape", "content-type",
             "content-encoding", "compressed", "compression-false"]


@st.composite
def wire_messages(draw) -> Wire:
    """A valid message with 0-3 things made wrong (none: it must run)."""
    headers = draw(VALID_HEADERS)
    args, kwargs, embed = draw(VALID_BODY)
    body: bytes | None = None
    content_type, content_encoding = "application/json", "utf-8"
    compression = None
    for mutation in draw(st.lists(st.sampled_from(MUTATIONS), max_size=3)):
        if mutation == "header-wrong" and headers is not None:
            name = draw(st.sampled_from(_HEADER_NAMES))
            headers[name] = draw(_WRONG.get(name, junk))
        elif mutation == "header-dropped" and headers is not None:
            headers.pop(draw(st.sampled_from(_HEADER_NAMES)), None)
        elif mutation == "no-headers":
            headers = None
        elif mutation == "unknown-task" and headers is not None:
            headers["task"] = draw(st.sampled_from(["no.such.task", "core.sink ", "CORE.SINK"]))
        elif mutation == "args-wrong":
            args = draw(junk)
        elif mutation == "kwargs-wrong":
            kwargs = draw(junk)
        elif mutation == "embed-wrong":
            embed = draw(junk | st.fixed_dictionaries({}, optional={n: junk for n in ("callbacks", "chain", "chord")}))
        elif mutation == "body-any-json":
            body = json_body(draw(junk))
        elif mutation == "body-bytes":
            body = draw(st.binary(max_size=48))
        elif mutation == "body-protocol-1-shape":
            body = json_body({"args": args, "kwargs": kwargs})
        elif mutation == "content-type":
            content_type = draw(st.sampled_from([None, "text/plain", "application/data",
                                                 "application/x-python-serialize", "application/json; charset=utf-8"]))
        elif mutation == "content-encoding":
            content_encoding = draw(st.sampled_from([None, "UTF8", "latin-1", "binary", "x-bogus"]))
        elif mutation in ("compressed", "compression-false"):
            compression = mutation
    body = json_body([args, kwargs, embed]) if body is None else body
    if compression and headers is not None:
        # compressed as kombu compresses, or claiming a compression the body does not have
        headers["compression"] = "application/x-gzip"
        body = zlib.compress(body) if compression == "compressed" else body
    return Wire(body, headers=headers, content_type=content_type, content_encoding=content_encoding)


@st.composite
def redis_items(draw) -> RedisItem:
    """kombu's JSON for a good core.sink message with 0-3 parts replaced or dropped, or not JSON at all."""
    kind = draw(st.sampled_from(["payload", "payload", "payload", "payload", "json", "bytes"]))
    if kind == "bytes":
        return RedisItem(draw(st.binary(max_size=64)))
    if kind == "json":
        return RedisItem(json_body(draw(junk)))
    # The routing key does not decide which list an item is pushed on: any will do.
    payload = kombu_payload(json_body([["x"], {}, None]), {"task": "core.sink", "id": str(uuid.uuid4())},
                            queue="any-routing-key")
    for _ in range(draw(st.integers(0, 3))):
        part = draw(st.sampled_from(["body", "headers", "content-type", "content-encoding", "properties",
                                     "properties.body_encoding", "properties.delivery_tag",
                                     "properties.delivery_info", "properties.priority"]))
        target, name = (payload.get("properties"), part.split(".", 1)[1]) if "." in part else (payload, part)
        if not isinstance(target, dict):
            continue
        if draw(st.booleans()):
            target.pop(name, None)
        else:
            target[name] = draw(junk)
    return RedisItem(json_body(payload))


@pytest.fixture(scope="module", params=["redis", "rabbitmq"])
def consuming(request, tmp_path_factory):
    with consuming_worker(request.param, tmp_path_factory.mktemp(f"property-{request.param}")) as worker:
        yield worker


def test_the_worker_never_exits_and_every_message_runs_or_is_dead_lettered(consuming):
    published = []

    @settings(max_examples=EXAMPLES_PER_BROKER, deadline=None, derandomize=False,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(message=st.one_of(wire_messages(), wire_messages(), wire_messages(), redis_items()))
    def one_message(message):
        outcomes_before = consuming.dead_letter_count() + len(consuming.recorded("sink"))
        consuming.publish(message)
        published.append(message)
        wait_for(lambda: consuming.dead_letter_count() + len(consuming.recorded("sink")) > outcomes_before,
                 timeout=20, what=f"{message!r} to run or be dead-lettered", explain=consuming.worker.tail)
        assert consuming.worker.is_running() and consuming.worker.pid == consuming.pid, consuming.worker.tail()

    one_message()
    # No message ran twice, or ran and was dead-lettered too; none is left behind.
    wait_for(lambda: consuming.unacked() == 0, timeout=20, what="nothing left on the queue or unacked")
    reasons = Counter(letter.envelope.reason if letter.envelope else letter.kind for letter in consuming.letters())
    print(f"\n{consuming.broker}: {len(published)} messages, {len(consuming.recorded('sink'))} ran, "
          f"dead-lettered: {dict(reasons)}")
    assert sum(reasons.values()) + len(consuming.recorded("sink")) == len(published)
    assert consuming.worker.is_running() and consuming.worker.pid == consuming.pid
    assert "Unrecoverable error" not in consuming.worker.log()
