"""The store's scripts speak RESP on their own connection: what they read back must be exactly
what redis-py would have returned, on both protocols, whole or in pieces."""
from __future__ import annotations

import pytest
import redis

from taskherd.worker.idempotency.scripts import _INCOMPLETE, _SMALL_REPLIES, Scripts, _Reply

# --- pure parsing ------------------------------------------------------------------------------

REPLIES = [
    (b":1\r\n", 1),
    (b"$5\r\nhello\r\n", b"hello"),
    (b"$-1\r\n", None),
    (b"_\r\n", None),                                   # RESP3 null (a Lua false, a missing key)
    (b"*3\r\n:0\r\n$2\r\n{}\r\n:-2\r\n", [0, b"{}", -2]),
    (b"*2\r\n_\r\n*1\r\n:7\r\n", [None, [7]]),
    (b"*-1\r\n", None),
    (b"+OK\r\n", b"OK"),
    (b"#t\r\n", True),
    (b",1.5\r\n", 1.5),
    (b"%1\r\n+a\r\n:1\r\n", {b"a": 1}),
    (b"=8\r\ntxt:abcd\r\n", b"abcd"),
    (b"$4\r\na\r\nb\r\n", b"a\r\nb"),                    # CRLF inside a bulk string is data
]


@pytest.mark.parametrize("wire,value", REPLIES)
def test_every_reply_parses_whole_and_only_once_complete(wire, value):
    for cut in range(len(wire)):  # every partial read waits for more, consuming nothing
        partial = bytearray(wire[:cut])
        assert _Reply(partial, decode=False).parse() is _INCOMPLETE
        assert partial == wire[:cut]
    buffer = bytearray(wire + b":9\r\n")  # a following reply stays in the buffer
    assert _Reply(buffer, decode=False).parse() == value
    assert buffer == b":9\r\n"


@pytest.mark.parametrize("wire", sorted(_SMALL_REPLIES))
def test_the_usual_replies_recognised_whole_are_what_the_parser_reads(wire):
    known = _SMALL_REPLIES[wire]
    assert (list(known) if isinstance(known, tuple) else known) == _Reply(bytearray(wire), decode=True).parse()


def test_errors_are_returned_as_redis_py_would_raise_them():
    error = _Reply(bytearray(b"-NOSCRIPT No matching script.\r\n"), decode=False).parse()
    assert isinstance(error, redis.exceptions.NoScriptError)
    error = _Reply(bytearray(b"-WRONGTYPE Operation against a key\r\n"), decode=False).parse()
    assert type(error) is redis.exceptions.ResponseError and "WRONGTYPE" in str(error)


def test_decode_responses_decodes_strings_only():
    assert _Reply(bytearray(b"*2\r\n$3\r\nh\xc3\xa9\r\n:3\r\n"), decode=True).parse() == ["hé", 3]


# --- against Redis -----------------------------------------------------------------------------

@pytest.mark.parametrize("protocol", [2, 3])
@pytest.mark.parametrize("decode", [False, True])
def test_scripts_return_what_redis_py_returns(redis_url, protocol, decode):
    client = redis.Redis.from_url(redis_url, protocol=protocol, decode_responses=decode)
    source = "return {KEYS[1], ARGV[1], tonumber(ARGV[2]), redis.call('get', 'missing'), {ARGV[3]}}"
    scripts = Scripts(client)
    ours = scripts.register(source)
    theirs = client.register_script(source)
    arguments = dict(keys=["k:é"], args=["v\r\nw", 7, 2.5])
    assert ours(**arguments) == theirs(**arguments)
    client.set("k:str", "x")
    incr = scripts.register("return redis.call('incr', KEYS[1])")  # same connection as `ours`
    with pytest.raises(redis.exceptions.ResponseError, match="not an integer"):
        incr(keys=["k:str"], args=[])
    assert ours(**arguments) == theirs(**arguments)   # the connection survived the error reply
    with pytest.raises(redis.exceptions.DataError, match="bool"):
        ours(keys=["k"], args=[True])
    for usual in ("return 1", "return {1}", "return 0", "return 2", "return {1, 2}", "return 12"):
        mine, redis_pys = scripts.register(usual)(), client.register_script(usual)()
        assert (mine, type(mine)) == (redis_pys, type(redis_pys)), usual
    client.close()
