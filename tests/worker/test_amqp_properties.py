"""taskherd's decoder of AMQP message properties gives exactly what py-amqp's gives: the same values
of the same types, or the same error — on Celery's own task headers, on every property and value
type py-amqp writes, on tables of every type letter RabbitMQ and other clients send, and on
truncated or corrupted frames. The AmqpHeaders component installs it when the worker starts.

A real worker on RabbitMQ runs a task whose headers hold every type; the worker suites that
publish raw messages to one (test_message_corpus.py, test_message_properties.py) read every header
through the decoder too.
"""
from __future__ import annotations

import datetime
import struct
from decimal import Decimal

from amqp import serialization
from amqp.basic_message import Message
from amqp.spec import Basic
from celery import Celery
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from e2e.lib.waiting import wait_for
from raw_messages import Wire, consuming_worker, json_body, task_headers
from worker_support import before_and_after_worker_start
from taskherd import compat
from taskherd.worker.amqp_properties import decoder
from taskherd.worker.components.amqp_headers import AmqpHeaders

PY_AMQP = serialization.decode_properties_basic
FAST = decoder(PY_AMQP, serialization._read_item)


def outcome(decode, buf, offset=0):
    """What a decoder makes of ``buf``: its result with every type visible (repr tells True from 1,
    'a' from b'a', and keeps the order), or its error."""
    try:
        return "decoded", repr(decode(buf, offset))
    except Exception as exc:  # noqa: BLE001 - the error itself is what is compared
        return "error", type(exc), str(exc)


def assert_same(buf, offset=0):
    expected = outcome(PY_AMQP, buf, offset)
    assert outcome(FAST, buf, offset) == expected
    return expected


def encoded(properties: dict) -> bytes:
    """The content header's property flags and list, as py-amqp writes them for a published message."""
    return Message(b"", **properties)._serialize_properties()


def test_celerys_task_headers_decode_as_py_amqp_decodes_them():
    app = Celery("amqp-properties", broker="amqp://localhost//", set_as_current=False)
    message = app.amqp.as_task_v2("0f3b9c1e-1111-2222-3333-444455556666", "shop.charge", args=(1, "ü"),
                                  kwargs={"x": None}, countdown=30, expires=60, time_limit=10, soft_time_limit=5)
    properties = {key: value for key, value in message.properties.items() if key in dict(Message.PROPERTIES)}
    buf = encoded({**properties, "application_headers": message.headers, "content_type": "application/json",
                   "content_encoding": "utf-8", "delivery_mode": 2, "priority": 0})

    kind, decoded = assert_same(buf)

    assert kind == "decoded" and "'task': 'shop.charge'" in decoded and "'timelimit': [10, 5]" in decoded


# -- what py-amqp writes ----------------------------------------------------------------------------
_scalars = (st.none() | st.booleans() | st.integers(-2**63, 2**63 - 1) | st.floats() | st.text(max_size=20)
            | st.binary(max_size=20)  # not UTF-8 at times: py-amqp hands those back as bytes
            | st.decimals(allow_nan=False, allow_infinity=False, places=3, min_value=-10**5, max_value=10**5)
            | st.datetimes(min_value=datetime.datetime(1970, 1, 2), max_value=datetime.datetime(2200, 1, 1)))
_keys = st.text(max_size=12) | st.binary(max_size=12)
_values = st.recursive(_scalars, lambda children: st.lists(children, max_size=4)
                       | st.dictionaries(_keys, children, max_size=4), max_leaves=12)
_short = st.text(max_size=40)
_properties = st.fixed_dictionaries({}, optional={
    "content_type": _short, "content_encoding": _short, "application_headers": st.dictionaries(_keys, _values),
    "delivery_mode": st.integers(0, 255), "priority": st.integers(0, 255), "correlation_id": _short,
    "reply_to": _short, "expiration": _short, "message_id": _short, "timestamp": st.integers(0, 2**64 - 1),
    "type": _short, "user_id": _short, "app_id": _short, "cluster_id": _short})


def _encodable(properties: dict) -> bytes:
    try:
        return encoded(properties)
    except (struct.error, ValueError, OverflowError):  # a value py-amqp cannot write (too long, too precise)
        assume(False)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_properties)
def test_every_property_and_value_py_amqp_writes_decodes_the_same(properties):
    assert_same(_encodable(properties))


# -- what other clients write: every type letter, any bytes in it -----------------------------------
#: type letter -> bytes of its value (a length-prefixed type gets its prefix below)
_FIXED = {b"t": 1, b"b": 1, b"B": 1, b"s": 2, b"U": 2, b"u": 2, b"I": 4, b"i": 4, b"f": 4, b"L": 8, b"l": 8,
          b"d": 8, b"T": 8, b"D": 5, b"V": 0}


@st.composite
def _raw_item(draw, depth=0):
    kinds = [*_FIXED, b"S", b"x"] + ([b"F", b"A"] if depth < 2 else [])
    kind = draw(st.sampled_from(kinds))
    if kind in _FIXED:
        payload = draw(st.binary(min_size=_FIXED[kind], max_size=_FIXED[kind]))
        if kind == b"T":  # a timestamp datetime can hold (py-amqp fails on others either way)
            payload = struct.pack(">Q", draw(st.integers(0, 2**35)))
        return kind + payload
    if kind in (b"S", b"x"):
        data = draw(st.binary(max_size=12))
        return kind + struct.pack(">I", len(data)) + data
    if kind == b"F":
        return kind + _with_length(draw(st.lists(_raw_entry(depth + 1), max_size=3)))
    return kind + _with_length(draw(st.lists(_raw_item(depth + 1), max_size=3)))


@st.composite
def _raw_entry(draw, depth=0):
    key = draw(st.binary(max_size=8))  # not UTF-8 at times: py-amqp keeps such a key as bytes
    return bytes([len(key)]) + key + draw(_raw_item(depth))


def _with_length(parts):
    data = b"".join(parts)
    return struct.pack(">I", len(data)) + data


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_raw_entry(), max_size=6))
def test_tables_of_every_type_letter_decode_the_same(entries):
    kind, _ = assert_same(struct.pack(">H", 0x2000) + _with_length(entries))
    assert kind == "decoded" or any(entry for entry in entries)


def test_a_letter_no_client_defines_is_py_amqps_error():
    kind, error_type, _ = assert_same(struct.pack(">H", 0x2000) + _with_length([b"\x01k" + b"Z"]))
    assert (kind, error_type) == ("error", serialization.FrameSyntaxError)


# -- frames cut short or corrupted ------------------------------------------------------------------
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_properties, st.data())
def test_truncated_or_corrupted_frames_decode_or_fail_the_same(properties, data):
    buf = bytearray(_encodable(properties))
    for _ in range(data.draw(st.integers(0, 3))):
        if buf:
            buf[data.draw(st.integers(0, len(buf) - 1))] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(buf)))
    assert_same(bytes(buf[:cut]))


@given(st.binary(max_size=64))
def test_any_bytes_decode_or_fail_the_same(buf):
    assert_same(buf)


def test_buffers_of_other_types_go_to_py_amqp_whole():
    read_by_py_amqp = []

    def py_amqp(buf, offset):
        read_by_py_amqp.append(type(buf))
        return PY_AMQP(buf, offset)

    fast = decoder(py_amqp, serialization._read_item)
    buf = encoded({"content_type": "application/json", "application_headers": {"a": "b", "n": 1}})
    fast(buf, 0)
    assert read_by_py_amqp == [], "bytes (what py-amqp's transports read) are taskherd's to decode"
    for other in (bytearray(buf), memoryview(buf)):
        outcome(fast, other)  # py-amqp fails on a bytearray's table keys (unhashable): its error
    assert read_by_py_amqp == [bytearray, memoryview]
    assert_same(b"\x00" * 3 + buf, offset=3)


# -- installed by the component --------------------------------------------------------------------
def test_the_worker_reads_properties_with_taskherds_decoder_once_it_starts(monkeypatch):
    monkeypatch.setitem(serialization.PROPERTY_CLASSES, Basic.CLASS_ID, PY_AMQP)  # put back after
    before, installed = before_and_after_worker_start(AmqpHeaders(),
                                                      lambda: serialization.PROPERTY_CLASSES[Basic.CLASS_ID])
    assert before is PY_AMQP and installed is not PY_AMQP and installed.slow is PY_AMQP
    assert compat.use_amqp_properties_decoder() is False, "a second install must not wrap the first"
    assert serialization.PROPERTY_CLASSES[Basic.CLASS_ID] is installed
    headers = {"lang": "py", "task": "t", "retries": 3, "timelimit": [None, Decimal("1.5")]}
    msg = Message(b"")
    msg.inbound_header(struct.pack(">HxxQ", Basic.CLASS_ID, 0) + encoded({"application_headers": headers}))
    assert msg.properties == {"application_headers": headers}


def test_a_real_worker_runs_a_task_whose_headers_hold_every_type(tmp_path):
    typed = {"x-decimal": Decimal("1.50"), "x-when": datetime.datetime(2026, 12, 4, 3, 0), "x-raw": b"\xff\xfe",
             "x-big": -2**40, "x-float": 0.25, "x-flag": True, "x-nested": {"a": [1, None, "ü", {"b": b"ok"}]}}
    with consuming_worker("rabbitmq", tmp_path) as consuming:
        consuming.publish(Wire(json_body([["typed", "ok"], {}, {"callbacks": None, "errbacks": None, "chain": None,
                                                                "chord": None}]),
                               headers=task_headers(argsrepr="('typed', 'ok')", **typed)))

        wait_for("the task with typed headers to run", lambda: consuming.recorded("typed"), timeout=20,
                 explain=consuming.worker.tail)
        assert consuming.recorded("typed") == ["ok"]
        assert consuming.dead_letter_count() == 0
        consuming.assert_alive_and_unchanged()
