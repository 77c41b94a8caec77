"""Strings PostgreSQL's jsonb cannot hold: surrogate code points (U+D800..U+DFFF) in a value or a key.

A str gets them from bytes decoded with errors='surrogateescape' or from a UTF-16 pair split in
two. The jsonb encoder refuses them with the ValueError it raises for NUL, before any statement
(a refused statement would abort the caller's whole transaction), and keeps real characters
outside the BMP (an emoji) as they are.
"""
from __future__ import annotations

import psycopg
import pytest

from taskherd.worker import celery_json, outbox
from taskherd.worker.idempotency import PostgresStore

from .test_worker_sigkill import rows

SURROGATE_VALUES = [
    pytest.param("\ud800", "\\\\ud800", id="lone-high"),
    pytest.param("tail\udfff", "\\\\udfff", id="lone-low"),
    pytest.param(["ok", {"deep": b"x\xff".decode(errors="surrogateescape")}], "\\\\udcff", id="nested-surrogateescape"),
    pytest.param({"k\ud800": 1}, "\\\\ud800", id="in-a-key"),
    # a pair of code points, not the character: jsonb would read the two escapes back as one emoji
    pytest.param("\ud83d\ude00", "\\\\ud83d", id="split-pair"),
]


@pytest.mark.parametrize(("value", "code"), SURROGATE_VALUES)
def test_the_jsonb_encoder_refuses_surrogates_with_the_error_it_raises_for_nul(value, code):
    with pytest.raises(ValueError, match=f"surrogate code point {code}.*PostgreSQL jsonb cannot store"):
        celery_json.dumps(value, for_jsonb=True)
    with pytest.raises(ValueError, match="NUL"):
        celery_json.dumps("a\x00", for_jsonb=True)


def test_the_jsonb_encoder_keeps_characters_outside_the_bmp_and_escaped_text():
    for value in ["😀", {"😀": "é"}, "a\\udfff", "a\\u0000", "\x01\n"]:
        assert celery_json.loads(celery_json.dumps(value, for_jsonb=True)) == value
    # Celery's own (Redis, messages) still writes what kombu writes
    assert celery_json.dumps("\ud800") == '"\\ud800"'


@pytest.mark.parametrize("arguments", [{"args": ["\ud800"]}, {"kwargs": {"a": "\udfff"}},
                                       {"kwargs": {"k\udc80": 1}}])
def test_outbox_enqueue_refuses_a_surrogate_naming_the_argument_and_keeps_the_transaction(outbox_dsn, arguments):
    argument = next(iter(arguments))
    with psycopg.connect(outbox_dsn) as conn:
        with conn.transaction():
            conn.execute("INSERT INTO ledger (key, who) VALUES ('outbox-caller', 'caller')")
            with pytest.raises(TypeError, match=f"outbox {argument}= cannot be stored \\(a str holds the "
                                                "surrogate code point"):
                outbox.enqueue(conn, "effects.record", **arguments)
            assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
            conn.execute("INSERT INTO ledger (key, who) VALUES ('outbox-caller', 'after')")
    assert rows(outbox_dsn, "SELECT count(*) FROM taskherd_outbox") == [(0,)]
    assert rows(outbox_dsn, "SELECT who FROM ledger WHERE key = 'outbox-caller' ORDER BY at") == [("caller",),
                                                                                                 ("after",)]


def test_an_emoji_result_and_argument_round_trip_through_postgresql(outbox_dsn):
    store = PostgresStore()
    with psycopg.connect(outbox_dsn, autocommit=True) as conn:
        with store.guard("emoji", conn=conn) as claim:
            claim.set_result({"😀": "\U0001f600 é"})
        with store.guard("emoji", conn=conn) as again:
            assert (again.done, again.result) == (True, {"😀": "😀 é"})
        with conn.transaction():
            outbox.enqueue(conn, "effects.record", args=["😀"])
    assert rows(outbox_dsn, "SELECT args FROM taskherd_outbox") == [(["😀"],)]
