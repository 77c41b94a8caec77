"""Pure parts of dead-lettering: envelope round trip, DLQ message parsing, redrive messages."""
import base64
import datetime as dt
import json

import pytest

from taskherd.worker.deadletter import ENVELOPE_HEADER, MAX_SHOWN_DEPTH, Envelope, Reason, json_safe
from taskherd.worker.deliveries import delivery_key, exceeds
from taskherd.commands.dlq import parse, redrive_message


def _envelope(**overrides) -> Envelope:
    fields = dict(reason=Reason.PERMANENT_ERROR, detail="ValueError is permanent: not retried", queue="orders",
                  task="shop.charge", task_id="t-1", args=[1], kwargs={"a": 2},
                  embed={"callbacks": None, "errbacks": None, "chain": None, "chord": None},
                  headers={"id": "t-1", "task": "shop.charge", "retries": 3, "eta": "2026-01-01T00:00:00",
                           "expires": "2026-01-02T00:00:00", "taskherd_first_failure_at": 1.0, "x-tenant": "acme"},
                  attempts=4)
    fields.update(overrides)
    return Envelope(**fields)


def test_envelope_round_trips_through_json():
    envelope = _envelope()
    assert Envelope.from_dict(json.loads(json.dumps(envelope.to_dict()))) == envelope
    with pytest.raises(ValueError, match="envelope version=99 is newer"):
        Envelope.from_dict({**envelope.to_dict(), "version": 99})


def test_redrive_of_an_envelope_is_a_fresh_task_message_with_the_same_id():
    letter = parse(json.dumps(_envelope().to_dict()).encode(), {ENVELOPE_HEADER: 1}, "application/json", "utf-8")
    assert letter.kind == "envelope" and letter.ref == "t-1" and letter.queue == "orders"
    body, headers, content_type, _ = redrive_message(letter)
    assert json.loads(body) == [[1], {"a": 2}, {"callbacks": None, "errbacks": None, "chain": None, "chord": None}]
    assert headers["id"] == "t-1" and headers["task"] == "shop.charge" and headers["x-tenant"] == "acme"
    assert headers["retries"] == 0 and headers["eta"] is None and headers["expires"] is None
    assert headers["taskherd_redrives"] == 1 and "taskherd_first_failure_at" not in headers
    assert content_type == "application/json"
    again = parse(json.dumps(_envelope(headers=headers).to_dict()).encode(), {ENVELOPE_HEADER: 1}, None, None)
    assert redrive_message(again)[1]["taskherd_redrives"] == 2


def test_redrive_of_a_bad_message_sends_its_raw_bytes_back():
    raw = b"\x80\x04garbage"
    envelope = _envelope(reason=Reason.CONTENT_REFUSED, raw_body_b64=base64.b64encode(raw).decode(),
                         content_type="application/x-python-serialize", content_encoding="binary",
                         headers={"id": "p", "task": "x"})
    body, headers, content_type, encoding = redrive_message(
        parse(json.dumps(envelope.to_dict()), {ENVELOPE_HEADER: 1}, "application/json", "utf-8"))
    assert (body, headers, content_type, encoding) == (raw, {"id": "p", "task": "x"},
                                                       "application/x-python-serialize", "binary")


def test_native_x_death_message_is_read_and_redriven_without_death_headers():
    when = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    headers = {"id": "n-1", "task": "shop.charge", "x-first-death-queue": "orders", "x-first-death-reason": "rejected",
               "x-death": [{"queue": "orders", "reason": "delivery_limit", "count": 2, "time": when}]}
    letter = parse(b'[[], {}, {}]', headers, "application/json", "utf-8")
    assert (letter.kind, letter.reason, letter.queue, letter.attempts) == ("native", "rabbitmq:delivery_limit", "orders", 2)
    assert letter.dead_lettered_at == when.timestamp()
    body, out_headers, _, _ = redrive_message(letter)
    assert body == b'[[], {}, {}]' and not any(k.startswith("x-") for k in out_headers)
    assert out_headers["taskherd_redrives"] == 1


def test_unknown_dlq_message_has_a_stable_ref_and_no_queue():
    letter = parse(b"hello", {}, "text/plain", "utf-8")
    assert letter.kind == "unknown" and letter.queue is None and letter.ref == parse(b"hello", {}, None, None).ref


def test_delivery_budget():
    assert delivery_key("abc", 2, 1) == "taskherd:deliveries:abc:2:1"
    # the counter holds redeliveries: delivery number = count + 1
    assert not exceeds(None, 5) and not exceeds(4, 5) and exceeds(5, 5)


def test_json_safe_shows_values_nested_deeper_than_it_can_walk_as_a_note():
    deep: list = []
    for _ in range(5000):  # deeper than the recursion limit: walking it would raise RecursionError
        deep = [deep]
    shown = json_safe({"x-deep": deep})
    for _ in range(MAX_SHOWN_DEPTH - 1):
        shown = shown["x-deep"] if isinstance(shown, dict) else shown[0]
    assert shown == [f"<list nested deeper than {MAX_SHOWN_DEPTH} levels: not shown>"]
    assert json.loads(json.dumps(json_safe({"x-deep": deep})))  # and the envelope encodes


def test_json_safe_keeps_what_it_can():
    when = dt.datetime(2026, 1, 1)
    assert json_safe({"a": (1, b"x", when, {1: object})}) == {"a": [1, "x", when.isoformat(), {"1": repr(object)}]}
