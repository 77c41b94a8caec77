"""JSON bodies decoded with one kept JSONDecoder give exactly what kombu's decoder gives — the same
values and types (kombu's and Celery's registered types included) or the same error — and the
JsonBodies component puts it in kombu's registry when the worker starts, unless the app registered
a JSON decoder of its own."""
from __future__ import annotations

import datetime
import uuid
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kombu.serialization import registry
from kombu.utils import json as kombu_json

from worker_support import before_and_after_worker_start
from taskherd.worker.components.json_bodies import JsonBodies, loads


def outcome(decode, data):
    try:
        return "decoded", repr(decode(data))
    except Exception as exc:  # noqa: BLE001 - the error itself is what is compared
        return "error", type(exc), str(exc)


_leaves = (st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()
           | st.datetimes() | st.uuids() | st.decimals(allow_nan=False, allow_infinity=False) | st.binary(max_size=8))
_values = st.recursive(_leaves, lambda children: st.lists(children, max_size=4)
                       | st.dictionaries(st.text(max_size=8), children, max_size=4), max_leaves=12)


@given(_values, st.sampled_from(["bytes", "str", "bytearray", "memoryview"]))
def test_what_kombu_writes_decodes_the_same(value, kind):
    text = kombu_json.dumps(value)
    data = {"bytes": text.encode(), "str": text, "bytearray": bytearray(text.encode()),
            "memoryview": memoryview(text.encode())}[kind]
    assert outcome(loads, data) == outcome(kombu_json.loads, data)


@given(st.binary(max_size=40) | st.text(max_size=40))
def test_any_bytes_or_text_decode_or_fail_the_same(data):
    assert outcome(loads, data) == outcome(kombu_json.loads, data)


@pytest.mark.parametrize("data", ["\ufeff[]", b"\xef\xbb\xbf[]", b"[1, 2", "", b"\xff", 12, None,
                                  '{"__type__": "nope", "__value__": 1}'])
def test_odd_bodies_get_kombus_own_error(data):
    expected = outcome(kombu_json.loads, data)
    assert outcome(loads, data) == expected


def test_celerys_task_body_and_registered_types():
    body = kombu_json.dumps([[1, "a"], {"at": datetime.datetime(2026, 12, 4, 3, 0), "id": uuid.uuid4(),
                                        "amount": Decimal("1.50")},
                             {"callbacks": None, "errbacks": None, "chain": None, "chord": None}])
    assert loads(body.encode()) == kombu_json.loads(body.encode())
    assert isinstance(loads(body)[1]["at"], datetime.datetime)


def test_the_worker_decodes_bodies_with_it_once_it_starts(monkeypatch):
    monkeypatch.setitem(registry._decoders, "application/json", kombu_json.loads)  # put back after
    assert before_and_after_worker_start(JsonBodies(), lambda: registry._decoders["application/json"]) == (
        kombu_json.loads, loads)
    assert registry._encoders["json"].encoder is kombu_json.dumps, "the encoder stays kombu's"


def test_an_apps_own_json_decoder_is_left_in_place(monkeypatch):
    monkeypatch.setitem(registry._decoders, "application/json", kombu_json.loads)  # put back after
    def own(data):
        return "own"

    registry.register("json", None, own, content_type="application/json")
    assert before_and_after_worker_start(JsonBodies(), lambda: registry._decoders["application/json"]) == (own, own)
