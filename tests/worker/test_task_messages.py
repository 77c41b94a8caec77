"""The checks that decide whether a message may run, without a broker: the pure checks of
taskherd.worker.task_messages and redis_items, and the consumer's verdict on real kombu Message
objects (kombu's own decoding, accept list and compression)."""
import base64
import json

import pytest
from celery import Celery
from kombu import Message

from taskherd import compat
from taskherd.worker import redis_items, task_messages
from taskherd.worker.components.bad_messages import Verdict, verdict_on

GOOD = {"id": "t-1", "task": "shop.charge"}


def _nested(depth: int) -> list:
    value: list = []
    for _ in range(depth - 1):
        value = [value]
    return value


@pytest.mark.parametrize("headers,problem", [
    ({"task": "t"}, "header 'id' must be a non-empty string, got None"),
    ({"task": "t", "id": ""}, "header 'id' must be a non-empty string, got ''"),
    ({"task": 5, "id": "x"}, "header 'task' must be a non-empty string, got 5"),
    ({**GOOD, "retries": "three"}, "header 'retries' must be an integer >= 0, got 'three'"),
    ({**GOOD, "retries": True}, "header 'retries' must be an integer >= 0, got True"),
    ({**GOOD, "retries": -2}, "header 'retries' must be an integer >= 0, got -2"),
    ({**GOOD, "shadow": 3}, "header 'shadow' must be a string or null, got 3"),
    ({**GOOD, "group_index": 1.5}, "header 'group_index' must be an integer or null, got 1.5"),
    ({**GOOD, "ignore_result": "yes"}, "header 'ignore_result' must be true, false or null, got 'yes'"),
    ({**GOOD, "eta": "next week"}, "header 'eta' must be an ISO 8601 date-time string within years 1-9999, "
                                   "got 'next week'"),
    ({**GOOD, "expires": 1700000000}, "header 'expires' must be an ISO 8601 date-time string, got 1700000000"),
    ({**GOOD, "eta": "0001-01-01T00:00:00+14:00"}, "date value out of range"),
    ({**GOOD, "timelimit": [1, 2, 3]}, "header 'timelimit' must be [hard, soft]"),
    ({**GOOD, "timelimit": [True, None]}, "header 'timelimit' must be [hard, soft]"),
    ({**GOOD, "timelimit": [float("inf"), None]}, "header 'timelimit' must be [hard, soft]"),
    ({**GOOD, "x" * 500: "x" * 500, "shadow": ["y" * 500]}, "got ['yyyy" + "y" * 79 + "…(334 more characters)…"),
    ({**GOOD, "retries": 3, "eta": "2026-01-01T00:00:00", "expires": "2026-01-02T00:00:00+02:00",
      "timelimit": [10, 20.5], "shadow": None, "group_index": 0, "ignore_result": False}, None),
    ({**GOOD, "eta": "", "expires": None, "timelimit": None}, None),  # Celery reads a falsy eta as none
    ({**GOOD, "stamped_headers": 5, "stamps": {}}, "header 'stamped_headers' must be a list of strings or null, got 5"),
    ({**GOOD, "stamped_headers": "on_signature"}, "header 'stamped_headers' must be a list of strings or null"),
    ({**GOOD, "stamped_headers": [["x"]]}, "header 'stamped_headers' must be a list of strings or null"),
    ({**GOOD, "stamped_headers": ["tenant"], "stamps": ["acme"]}, "header 'stamps' must be a table/object or null"),
    ({**GOOD, "stamped_headers": ["tenant"], "stamps": {"tenant": "acme"}}, None),
    ({**GOOD, "stamped_headers": None, "stamps": None}, None),
    # too deep for repr: the detail still says what is wrong
    ({**GOOD, "id": _nested(5000)}, "header 'id' must be a non-empty string, got <a list that cannot be shown"),
])
def test_header_problem(headers, problem):
    found = task_messages.header_problem(headers)
    assert (found is None) if problem is None else (problem in found), found


@pytest.mark.parametrize("body,problem", [
    ([[1], {"a": 2}, None], None),
    ([[], {}, {"callbacks": [{"task": "t"}], "errbacks": None, "chain": [], "chord": {"task": "c"}}], None),
    ({"args": [], "kwargs": {}}, "body is a JSON object, but the message has protocol-2 headers"),
    ("ab", "body must be [args, kwargs, embed], got 'ab'"),
    ([[], {}], "body must be [args, kwargs, embed], got [[], {}]"),
    (["ab", {}, None], "args must be a JSON array, got 'ab'"),
    ([[], [], None], "kwargs must be a JSON object, got []"),
    ([[], {}, []], "embed (the body's third item) must be a JSON object or null, got []"),
    ([[], {}, {"errbacks": [{"args": []}]}], "embed 'errbacks' must be a list of signatures"),
    ([[], {}, {"chord": "c"}], "embed 'chord' must be a signature"),
])
def test_body_problem(body, problem):
    found = task_messages.body_problem(body)
    assert (found is None) if problem is None else (problem in found), found


def test_the_timelimit_problem_names_celerys_wire_order_hard_then_soft():
    """Celery sends ``timelimit`` as [time_limit, soft_time_limit] (as_task_v2): the problem said
    [soft, hard], and a producer writing by it swapped its limits."""
    sent = Celery(broker="memory://").amqp.as_task_v2("i", "t", time_limit=60, soft_time_limit=30)
    assert sent.headers["timelimit"] == [60, 30]
    assert task_messages.header_problem({**GOOD, "timelimit": sent.headers["timelimit"]}) is None
    problem = task_messages.header_problem({**GOOD, "timelimit": [60, 30, 1]})
    assert "'timelimit' must be [hard, soft]" in problem and "[soft, hard]" not in problem


def test_protocol1_problem_names_fields_and_headers():
    ok = {"task": "t", "id": "i", "args": [1], "kwargs": {}}
    assert task_messages.protocol1_problem(ok, {}) is None
    assert task_messages.protocol1_problem({"task": "t", "args": []}, {}) == \
        "field 'id' must be a non-empty string, got None"
    assert task_messages.protocol1_problem({**ok, "kwargs": []}, {}) == "kwargs must be a JSON object, got []"
    assert "embed 'callbacks'" in task_messages.protocol1_problem({**ok, "callbacks": "x"}, {})
    # Celery lets headers override the body's fields
    assert task_messages.protocol1_problem(ok, {"timelimit": "soon"}).startswith("header 'timelimit' must be")


@pytest.mark.parametrize("content_type,content_encoding,refused,undecodable", [
    ("application/json", "utf-8", None, None),
    ("application/json", "UTF8", None, None),
    ("application/json", None, None, None),
    ("application/json", "gzip", None, "content-encoding 'gzip' is not supported (valid: utf-8)"),
    ("application/json", "latin-1", None, "content-encoding 'latin-1' is not supported"),
    (None, "utf-8", None, "no content-type: cannot tell how to decode the body"),
    ("application/data", "binary", "content-type 'application/data' refused (valid: application/json)", None),
    ("application/x-python-serialize", "binary", "content-type 'application/x-python-serialize' refused", None),
])
def test_content_problems(content_type, content_encoding, refused, undecodable):
    found = task_messages.refused_content_problem(content_type, {"application/json"})
    assert (found is None) if refused is None else refused in found
    if refused is None:  # the consumer checks the encoding of accepted content only
        found = task_messages.encoding_problem(content_type, content_encoding)
        assert (found is None) if undecodable is None else undecodable in found


def test_signature_problem_uses_the_tasks_own_checker():
    app = Celery("signatures", set_as_current=False)

    @app.task(name="t.two")
    def two(a, b=1):
        return a, b

    @app.task(name="t.loose", typing=False)
    def loose(a):
        return a

    check = compat.argument_checker(two)
    assert task_messages.signature_problem("t.two", check, [1], {"b": 2}) is None
    assert "arguments do not match task 't.two': " in task_messages.signature_problem("t.two", check, [1, 2, 3], {})
    assert "unexpected keyword argument 'c'" in task_messages.signature_problem("t.two", check, [1], {"c": 3})
    assert compat.argument_checker(loose) is None, "typing=False opts out, as for apply_async"


# -- Redis items ---------------------------------------------------------------------------------
def _item(**changes) -> bytes:
    payload = {"body": base64.b64encode(b'[[], {}, null]').decode(), "content-type": "application/json",
               "content-encoding": "utf-8", "headers": {"task": "t", "id": "i"},
               "properties": {"body_encoding": "base64", "delivery_tag": "tag-1",
                              "delivery_info": {"exchange": "", "routing_key": "q"}, "priority": 0}}
    for key, value in changes.items():
        target = payload["properties"] if key in payload["properties"] or key.startswith("p_") else payload
        target[key.removeprefix("p_")] = value
    return json.dumps(payload).encode()


def _item_problem(item: bytes):
    return redis_items.item_problem(item, loads=compat.redis_item_loads, body_codecs=compat.redis_body_codecs())


@pytest.mark.parametrize("item,problem", [
    (_item(), None),
    (_item(p_body_encoding=None, body='[[], {}, null]'), None),
    (_item(p_body_encoding="UTF-8", body='[[], {}, null]'), None),
    (b"hello", "not valid kombu JSON (JSONDecodeError: "),
    (b"\xff\xfe", "not valid kombu JSON"),
    (b'{"__type__": "datetime", "__value__": "no"}', "not valid kombu JSON (ValueError: "),
    (b"[1]", "a JSON array, not a kombu message"),
    (b'"text"', "a JSON string, not a kombu message"),
    (b"true", "a JSON boolean, not a kombu message"),
    (_item(properties=[]), "'properties' must be a JSON object, got []"),
    (_item(delivery_tag=""), "'properties.delivery_tag' must be a non-empty string, got ''"),
    (_item(delivery_tag={"__type__": "datetime", "__value__": "2026-01-01T00:00:00"}),
     "'properties.delivery_tag' must be a non-empty string, got datetime.datetime("),
    (_item(delivery_info={"exchange": ""}),
     "'properties.delivery_info.routing_key' must be a string, got missing/null"),
    (_item(priority=float("inf")), "'properties.priority' must be a finite number, got inf"),
    (_item(**{"content-type": 5}), "'content-type' must be a string, got 5"),
    (_item(headers=["task"]), "'headers' must be a JSON object, got ['task']"),
    (_item(body=5), "'body' must be a string, got 5"),
    (_item(body_encoding=7), "'properties.body_encoding' must be a string, got 7"),
    (_item(body_encoding="rot13"), "unknown 'properties.body_encoding' 'rot13' (valid: base64, utf-8)"),
    (_item(body="abcde"), "body is not valid base64 (Error: "),
])
def test_redis_item_problem(item, problem):
    found = _item_problem(item)
    assert (found is None) if problem is None else (problem in found), found


def test_an_unreadable_item_is_replaced_by_a_message_that_carries_it_whole():
    guard = dict(loads=compat.redis_item_loads, body_codecs=compat.redis_body_codecs())
    good = _item()
    assert redis_items.guarded(good, "orders", **guard) is good, "a valid item passes untouched"
    assert redis_items.guarded(None, "orders", **guard) is None, "nothing popped"

    replacement = redis_items.guarded(b"\xffnot json", "orders", **guard)
    assert _item_problem(replacement) is None, "the replacement is a message kombu can deliver"
    payload = json.loads(replacement)
    assert base64.b64decode(payload["body"]) == b"\xffnot json"
    assert payload["headers"][redis_items.UNREADABLE_HEADER].startswith("not valid kombu JSON")
    assert payload["properties"]["delivery_info"] == {"exchange": "", "routing_key": "orders"}
    assert payload["properties"]["delivery_tag"] != json.loads(redis_items.guarded(b"x", "orders", **guard))[
        "properties"]["delivery_tag"], "each replacement gets its own delivery tag"


# -- the consumer's verdict on kombu Message objects -------------------------------------------
def _message(body: bytes, headers: dict | None = None, content_type="application/json", content_encoding="utf-8"):
    return Message(body=body, headers=headers, content_type=content_type, content_encoding=content_encoding,
                   accept={"application/json"})


@pytest.fixture(scope="module")
def tasks():
    app = Celery("verdicts", set_as_current=False)

    @app.task(name="shop.charge")
    def charge(order, amount=0):
        return order, amount

    return app.tasks


@pytest.mark.parametrize("message,verdict", [
    (_message(b'[["o1"], {"amount": 3}, null]', {"id": "i", "task": "shop.charge"}), None),
    (_message(b'{"task": "shop.charge", "id": "i", "args": ["o1"], "kwargs": {}}'), None),
    (_message(b'[[], {}, null]', {"id": "i", "task": "shop.unknown"}), None),  # Celery's unknown-task path
    (_message(b'[["o1"], {}, null]', {"id": "i", "task": "shop.charge", "compression": "application/x-gzip"}),
     None),  # kombu decompresses before this; a message built here is not compressed
    (_message(b'[["o1", 1, 2], {}, null]', {"id": "i", "task": "shop.charge"}),
     ("invalid-message", "arguments do not match task 'shop.charge': ")),
    (_message(b'[[], {}, null]', {"id": "i", "task": "shop.charge"}),
     ("invalid-message", "arguments do not match task 'shop.charge': ")),
    (_message(b'{"task": "shop.charge", "id": "i", "args": "ab"}'), ("invalid-message", "args must be a JSON array")),
    (_message(b'{"hello": 1}'), ("invalid-message", "not a Celery task message")),
    (_message(b"", {"id": "i", "task": "shop.charge"}), ("undecodable-message", "empty body")),
    (_message(b"{nope", {"id": "i", "task": "shop.charge"}), ("undecodable-message", "body could not be decoded")),
    (_message(b"[[], {}, null]", {"id": "i", "task": "shop.charge"}, content_encoding="gzip"),
     ("undecodable-message", "content-encoding 'gzip'")),
    (_message(b"\x80\x04.", {"id": "i", "task": "shop.charge"}, content_type="application/x-python-serialize"),
     ("content-refused", "content-type 'application/x-python-serialize' refused")),
])
def test_verdict_on(tasks, message, verdict):
    found = verdict_on(message, accepted={"application/json"}, tasks=tasks)
    if verdict is None:
        assert found is None
    else:
        assert isinstance(found, Verdict) and found.reason == verdict[0] and verdict[1] in found.detail, found


def test_verdict_on_a_replaced_redis_item_keeps_the_problem(tasks):
    replacement = json.loads(redis_items.replacement(b"raw", queue="q", problem="a JSON array, not a kombu message"))
    message = _message(b"raw", replacement["headers"], content_type=replacement["content-type"],
                       content_encoding="binary")
    assert verdict_on(message, accepted={"application/json"}, tasks=tasks) == Verdict(
        "undecodable-message", "not a kombu message: a JSON array, not a kombu message")


def test_a_decoded_body_is_decoded_once(tasks):
    """Celery's request reads the body the check decoded (kombu caches it on the message)."""
    message = _message(b'[["o1"], {}, null]', {"id": "i", "task": "shop.charge"})
    assert verdict_on(message, accepted={"application/json"}, tasks=tasks) is None
    message.body = b"changed after the check"
    assert message.payload == [["o1"], {}, None]
