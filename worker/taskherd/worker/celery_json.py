"""JSON as Celery's own serializer writes and reads it (``kombu.utils.json``).

The idempotency stores keep a task's result and the outbox keeps a task's arguments. Both hand
them back later in Celery's place — a duplicate returns the stored result, the relay publishes the
stored arguments — so both encode them as Celery would: a datetime, date, time, Decimal, UUID or
bytes that ``.delay()`` and a result backend carry comes back as the same type, and a value Celery
can carry is never refused by a store.
"""
from __future__ import annotations

import re
from typing import Any

from kombu.utils import json as kombu_json

#: kombu_json.dumps(value) builds an encoder per call; this one writes the same text (same defaults).
_encode = kombu_json.JSONEncoder().encode
#: jsonb keeps the parsed value, not the text: characters as themselves (see _SURROGATE)
_encode_for_jsonb = kombu_json.JSONEncoder(allow_nan=False, ensure_ascii=False).encode
#: "\u0000" written by the encoder (an odd number of backslashes before it), which jsonb refuses
_ESCAPED_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")
#: a surrogate code point (U+D800..U+DFFF): no Unicode text holds one (a str gets them from bytes
#: decoded with errors='surrogateescape', or from a UTF-16 pair split in two). The jsonb encoder
#: writes non-ASCII characters as themselves, so that one here is such a code point in a str (a
#: value or a key), never an escape of a real character outside the BMP (which jsonb would read
#: back as one character, and a lone one refuse).
_SURROGATE = re.compile("[\ud800-\udfff]")

#: what the error messages offer as valid
VALID = ("a value Celery's JSON serializer encodes: JSON types (str keys), datetime, date, time, "
         "Decimal, UUID, bytes, or an object with __json__()")


def dumps(value: Any, *, for_jsonb: bool = False) -> str:
    """`value` as kombu's JSON text; TypeError or ValueError (saying why) if it cannot be one.

    `for_jsonb`: also refuse what PostgreSQL's jsonb cannot hold (NaN, infinities, NUL, and the
    surrogate code points U+D800..U+DFFF, in a value or a key), with a ValueError, before the
    statement that would fail on it and abort the caller's transaction.
    """
    try:
        text = (_encode_for_jsonb if for_jsonb else _encode)(value)
    except ValueError as exc:
        if for_jsonb and "Out of range float" in str(exc):
            raise ValueError("NaN and infinite floats cannot be stored in PostgreSQL jsonb") from exc
        raise
    if for_jsonb and _ESCAPED_NUL.search(text):
        raise ValueError("the character NUL (\\x00) cannot be stored in PostgreSQL jsonb")
    if for_jsonb:
        surrogate = _SURROGATE.search(text)
        if surrogate is not None:
            raise ValueError(f"a str holds the surrogate code point \\u{ord(surrogate.group()):04x} (not "
                             "Unicode text: e.g. bytes decoded with errors='surrogateescape'), which PostgreSQL "
                             "jsonb cannot store; valid: str of Unicode characters (encodable as UTF-8)")
    if '"__type__"' in text:
        # A dict of exactly {"__type__", "__value__"} is read back as one of kombu's typed values:
        # one that kombu does not know would fail every later read, so it fails here instead.
        try:
            kombu_json.loads(text)
        except ValueError as exc:
            raise ValueError("a dict with exactly the keys '__type__' and '__value__' is read back by Celery's "
                             f"JSON serializer as a typed value, and it knows no such type ({exc.args[-1]!r})") from exc
    return text


def loads(text: str | bytes) -> Any:
    """What Celery's JSON serializer reads from `text` (typed values decoded)."""
    return kombu_json.loads(text)
