"""A faster decoder of AMQP message properties, giving exactly what py-amqp's own gives.

py-amqp decodes each delivered message's content header (content type, delivery mode, the
application headers table...) in pure Python, through a generic format interpreter: for Celery's
twenty task headers that is ~195k instructions a message, a sixth of what vanilla Celery's worker
spends on a whole no-op task (docs/benchmarks.md, "Celery's own hot paths"). This decoder reads
the same bytes with the common value types inline (strings, void, booleans, integers, arrays and
nested tables) and hands every other type to py-amqp's own item reader, so those (decimals,
timestamps, floats...) are py-amqp's by construction. The AmqpHeaders component installs it
(taskherd.compat.use_amqp_properties_decoder) in the worker's main process, the one that reads
deliveries.

Same result or same error: any exception on the fast path (a malformed or truncated frame) decodes
the frame again with py-amqp's own function, which then raises its own error — or, were this
decoder ever wrong to fail, returns the right answer. tests/worker/test_amqp_properties.py compares
the two on Celery's headers, on generated tables and on random bytes.
"""
from __future__ import annotations

from struct import Struct
from typing import Any, Callable

_u16 = Struct(">H").unpack_from
_u32 = Struct(">I").unpack_from
_i32 = Struct(">i").unpack_from
_i64 = Struct(">q").unpack_from
_u64 = Struct(">Q").unpack_from

# The value types read inline, as py-amqp 5's _read_item reads them: 'S' a long string, 'V' void,
# 't' a bool, 'I' a signed 32-bit int, 'L' and 'l' signed 64-bit, 'A' an array, 'F' a table.
_S, _V, _t, _I, _L, _l, _A, _F = b"SVtILlAF"

#: The only application header of a delivery whose headers could not be read (nested deeper than
#: Python reads): why. The consumer dead-letters such a message (components/bad_messages.py).
UNREADABLE_HEADERS = "taskherd_unreadable_headers"

#: Properties that are a short string, by flag bit, in the order of AMQP's basic class.
_SHORT_STRINGS_BEFORE_HEADERS = ((0x8000, "content_type"), (0x4000, "content_encoding"))
_SHORT_STRINGS_AFTER_PRIORITY = ((0x0400, "correlation_id"), (0x0200, "reply_to"), (0x0100, "expiration"),
                                 (0x0080, "message_id"))
_SHORT_STRINGS_AFTER_TIMESTAMP = ((0x0020, "type"), (0x0010, "user_id"), (0x0008, "app_id"),
                                  (0x0004, "cluster_id"))


def decoder(slow_properties: Callable[[Any, int], tuple[dict, int]],
            slow_item: Callable[[Any, int], tuple[Any, int]]) -> Callable[[Any, int], tuple[dict, int]]:
    """A drop-in for py-amqp's ``decode_properties_basic``, given it and py-amqp's ``_read_item``
    (the reader of the value types this one does not read itself)."""

    def text(raw: bytes) -> str | bytes:
        # py-amqp: utf-8 with surrogatepass, the bytes themselves when that fails
        try:
            return raw.decode("utf-8", "surrogatepass")
        except UnicodeDecodeError:
            return raw

    def item(buf: bytes, offset: int) -> tuple[Any, int]:
        kind = buf[offset]
        offset += 1
        if kind == _S:
            end = offset + 4 + _u32(buf, offset)[0]
            return text(buf[offset + 4:end]), end
        if kind == _V:
            return None, offset
        if kind == _t:
            return bool(buf[offset]), offset + 1
        if kind == _I:
            return _i32(buf, offset)[0], offset + 4
        if kind == _L or kind == _l:
            return _i64(buf, offset)[0], offset + 8
        if kind == _F:
            return table(buf, offset)
        if kind == _A:
            end = offset + 4 + _u32(buf, offset)[0]
            offset += 4
            values = []
            while offset < end:
                value, offset = item(buf, offset)
                values.append(value)
            return values, offset
        return slow_item(buf, offset - 1)

    def table(buf: bytes, offset: int) -> tuple[dict, int]:
        # Keys, strings and voids (most of Celery's headers) inline: a call per entry costs more
        # than reading it.
        end = offset + 4 + _u32(buf, offset)[0]
        offset += 4
        values = {}
        while offset < end:
            key_end = offset + 1 + buf[offset]
            try:
                key = buf[offset + 1:key_end].decode("utf-8", "surrogatepass")
            except UnicodeDecodeError:
                key = buf[offset + 1:key_end]
            kind = buf[key_end]
            if kind == _S:
                offset = key_end + 5 + _u32(buf, key_end + 1)[0]
                try:
                    values[key] = buf[key_end + 5:offset].decode("utf-8", "surrogatepass")
                except UnicodeDecodeError:
                    values[key] = buf[key_end + 5:offset]
            elif kind == _V:
                values[key] = None
                offset = key_end + 1
            else:
                values[key], offset = item(buf, key_end)
        return values, offset

    def short_strings(buf: bytes, offset: int, flags: int, names, properties: dict) -> int:
        for flag, name in names:
            if flags & flag:
                end = offset + 1 + buf[offset]
                properties[name] = buf[offset + 1:end].decode("utf-8", "surrogatepass")
                offset = end
        return offset

    def fast(buf: bytes, offset: int) -> tuple[dict, int]:
        properties: dict = {}
        flags = _u16(buf, offset)[0]
        offset = short_strings(buf, offset + 2, flags, _SHORT_STRINGS_BEFORE_HEADERS, properties)
        if flags & 0x2000:
            properties["application_headers"], offset = table(buf, offset)
        if flags & 0x1000:
            properties["delivery_mode"] = buf[offset]
            offset += 1
        if flags & 0x0800:
            properties["priority"] = buf[offset]
            offset += 1
        offset = short_strings(buf, offset, flags, _SHORT_STRINGS_AFTER_PRIORITY, properties)
        if flags & 0x0040:
            properties["timestamp"] = _u64(buf, offset)[0]
            offset += 8
        return properties, short_strings(buf, offset, flags, _SHORT_STRINGS_AFTER_TIMESTAMP, properties)

    def without_headers(buf: bytes, offset: int, problem: str) -> tuple[dict, int]:
        """The properties, the application headers table skipped and replaced by
        {UNREADABLE_HEADERS: problem}."""
        flags = _u16(buf, offset)[0]
        start = offset + 2
        for flag, _ in _SHORT_STRINGS_BEFORE_HEADERS:
            if flags & flag:
                start += 1 + buf[start]
        length = _u32(buf, start)[0]
        # The same frame with an empty table in its place, read as usual; its end moved back.
        properties, end = fast(buf[:start] + b"\0\0\0\0" + buf[start + 4 + length:], offset)
        properties["application_headers"] = {UNREADABLE_HEADERS: problem}
        return properties, end + length

    def decode_properties_basic(buf: Any, offset: int) -> tuple[dict, int]:
        if type(buf) is bytes:  # what py-amqp's transports read frames into; anything else: its own
            try:
                return fast(buf, offset)
            except Exception:  # a malformed frame: py-amqp's decoder raises its own error for it
                pass
        try:
            return slow_properties(buf, offset)
        except RecursionError as exc:
            # Headers nested deeper than Python's recursion limit lets anyone read them: raised
            # here, the error ends the worker (Celery: "Unrecoverable error") and the broker hands
            # the message to the next worker, which ends the same way. Delivered with the table
            # replaced, the consumer dead-letters it with its body.
            return without_headers(bytes(buf), offset, f"the headers table is nested too deep to read ({exc})")

    decode_properties_basic.slow = slow_properties  # type: ignore[attr-defined]
    return decode_properties_basic
