"""The Redis store's Lua scripts, run over one connection per thread, in RESP we write and read.

Why not `client.register_script`: every redis-py command goes through a connection-pool checkout
(with a readability poll), retry wrappers, event dispatch and observability hooks, then packs its
arguments and parses the reply in Python layers built for every command and protocol — measured
here at about 100 µs of CPU per command against 68 µs for the same round trip on a bare socket,
most of which is the two system calls. The guard makes two commands per task and fast recovery
one, so that machinery was the larger part of their cost (bench/throughput.py). These scripts run
on a connection this thread owns: redis-py still connects it (TLS, unix sockets, AUTH, SELECT,
HELLO), then EVALSHA goes out as one prepacked buffer and its reply — an integer, a bulk string,
a null or an array of those — is read straight from the socket (:class:`_Reply`). Clients
without a connection pool (cluster clients and the like) take redis-py's ordinary path.

``socket_timeout`` overrides the client's own (often none) on these connections: the lease
renewals use it, so that one Redis that stops answering cannot hang the renewing thread.

:meth:`Scripts.pipeline` sends several commands in one packet on the same connection and returns
every reply: the store's commit (WATCH, a check, MULTI, the effects, the done record, EXEC) is one
round trip.
"""
from __future__ import annotations

import hashlib
import os
import socket
import threading
from typing import Any, Callable, Sequence

from redis.exceptions import ConnectionError, DataError, NoScriptError, ResponseError, TimeoutError

from taskherd import compat


class Scripts:
    def __init__(self, client, *, socket_timeout: float | None = None):
        self._client = client
        self._pool = getattr(client, "connection_pool", None)
        #: whether this client's connections can be opened here for a wire of our own
        self._wired = self._pool is not None and hasattr(self._pool, "make_connection")
        self._socket_timeout = socket_timeout
        self._local = threading.local()

    def register(self, source: str) -> Callable[..., Any]:
        """A callable `script(keys=[...], args=[...])` returning the script's reply."""
        if not self._wired:
            return self._client.register_script(source)
        sha = hashlib.sha1(source.encode()).hexdigest().encode()
        # The command and the script, packed once: only the keys and arguments change per call.
        by_sha, by_source = _bulk(b"EVALSHA") + _bulk(sha), _bulk(b"EVAL") + _bulk(source.encode())

        def call(keys: Sequence = (), args: Sequence = ()) -> Any:
            for attempt in (1, 2):
                wire = self._wire()
                try:
                    arguments = wire.arguments(keys, args)
                    try:
                        return wire.round_trip(by_sha, arguments)
                    except NoScriptError:  # the server's script cache is empty (restart, SCRIPT FLUSH)
                        return wire.round_trip(by_source, arguments)
                except (ConnectionError, TimeoutError) as exc:
                    wire.disconnect()
                    # Once more on a fresh connection, as redis-py's default retry would: a
                    # connection idle since the last task may have been closed by the server.
                    # Every script of the store is safe to run twice (see redis_store.py).
                    if attempt == 2:
                        raise exc
                except (ResponseError, DataError):
                    raise  # the reply was read whole (or nothing was sent): the connection is fine
                except BaseException:
                    # The reply may still be in flight: never reuse a connection in an unknown state.
                    wire.disconnect()
                    raise

        return call

    def pipeline(self, commands: Sequence[Sequence[Any]]) -> list[Any]:
        """Sends `commands` (each a tuple of arguments, packed by redis-py's rules) in one packet on
        this thread's connection and returns their replies in order, errors as ResponseError objects
        rather than raised: each belongs to its own command. Not retried here: only the caller knows
        whether its commands may run twice."""
        self.require_pipeline()
        wire = self._wire()
        try:
            return wire.exchange(commands)
        except BaseException:
            # A reply may still be in flight, or a WATCH left set: never reuse the connection.
            wire.disconnect()
            raise

    def require_pipeline(self) -> None:
        """Raises TypeError unless :meth:`pipeline` can run on this client: callers check before
        anything depends on it (the store, when an effect is queued for the commit)."""
        if not self._wired:
            raise TypeError(f"{type(self._client).__name__} has no connection pool: the idempotency store's "
                            "commit (claim.in_transaction) needs a redis.Redis client (standalone or Sentinel)")

    def _wire(self) -> "_Wire":
        local = self._local
        if getattr(local, "pid", None) != os.getpid():  # new thread, or a forked child
            local.pid, local.wire = os.getpid(), _Wire(self._new_connection())
        return local.wire

    def _new_connection(self):
        if self._socket_timeout is None:
            return self._pool.make_connection()
        options = {**self._pool.connection_kwargs, "socket_timeout": self._socket_timeout,
                   "socket_connect_timeout": self._socket_timeout}
        return self._pool.connection_class(**options)


class _Wire:
    """One redis-py connection, used only for its socket once connected (see the module doc)."""

    def __init__(self, connection):
        self.connection = connection
        encoder = connection.encoder
        self._encoding, self._errors = encoder.encoding, encoder.encoding_errors
        self._decode = bool(encoder.decode_responses)
        self._buffer = bytearray()

    def arguments(self, keys: Sequence, args: Sequence) -> tuple[int, bytes]:
        """(how many, `numkeys key… arg…` packed as RESP bulk strings), by redis-py's Encoder rules."""
        packed = [_bulk(b"%d" % len(keys))]
        for value in (*keys, *args):
            # str, the usual case, encoded here: a call per value costs more than the encoding
            packed.append(_bulk(value.encode(self._encoding, self._errors) if type(value) is str
                                else self._encode(value)))
        return len(packed), b"".join(packed)

    def _encode(self, value: Any) -> bytes:
        if isinstance(value, str):
            return value.encode(self._encoding, self._errors)
        if isinstance(value, bytes):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return repr(value).encode()
        raise DataError(f"Invalid input of type: {type(value).__name__!r}. "
                        "Convert to a bytes, string, int or float first.")

    def round_trip(self, command_and_script: bytes, arguments: tuple[int, bytes]) -> Any:
        """Sends the command (EVALSHA or EVAL and its script, packed by _bulk) with ``arguments``
        and reads its reply."""
        count, packed = arguments
        self._send(b"*%d\r\n%s%s" % (count + 2, command_and_script, packed))
        reply = self._read()
        if isinstance(reply, ResponseError):
            raise reply
        return reply

    def exchange(self, commands: Sequence[Sequence[Any]]) -> list[Any]:
        """Sends the commands in one packet; their replies in order (errors returned, not raised)."""
        self._send(b"".join(self.connection.pack_commands(commands)))
        return [self._read() for _ in commands]

    def _send(self, packet: bytes) -> None:
        sock = compat.redis_socket(self.connection)
        if sock is None:
            self.connection.connect()  # handshake (AUTH, SELECT, HELLO) through redis-py
            self._buffer.clear()
            sock = compat.redis_socket(self.connection)
        try:
            sock.sendall(packet)
        except socket.timeout as exc:
            raise TimeoutError("Timeout writing to socket") from exc
        except OSError as exc:
            raise ConnectionError(f"Error while talking to Redis: {exc}") from exc

    def _read(self) -> Any:
        """The next reply, read from the buffer or the socket."""
        buffer = self._buffer
        try:
            while True:
                if buffer:  # empty: nothing to parse until a recv fills it
                    # The scripts' usual replies (an integer; the claim's [1]) recognised whole
                    if len(buffer) <= _SMALL_REPLY_BYTES:
                        reply = _SMALL_REPLIES.get(bytes(buffer), _INCOMPLETE)
                        if reply is not _INCOMPLETE:
                            buffer.clear()
                            return list(reply) if type(reply) is tuple else reply
                    reply = _Reply(buffer, self._decode).parse()
                    if reply is not _INCOMPLETE:
                        return reply
                chunk = compat.redis_socket(self.connection).recv(65536)
                if not chunk:
                    raise ConnectionError("Connection closed by server.")
                buffer += chunk
        except socket.timeout as exc:
            raise TimeoutError("Timeout reading from socket") from exc
        except OSError as exc:
            raise ConnectionError(f"Error while talking to Redis: {exc}") from exc

    def disconnect(self) -> None:
        self._buffer.clear()
        self.connection.disconnect()


def _bulk(data: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(data), data)


_INCOMPLETE = object()
#: whole replies -> what _Reply parses them to (a tuple stands for a new list)
_SMALL_REPLIES = {b":0\r\n": 0, b":1\r\n": 1, b":2\r\n": 2, b"*1\r\n:1\r\n": (1,)}
_SMALL_REPLY_BYTES = max(map(len, _SMALL_REPLIES))


class _Reply:
    """One RESP2/RESP3 reply parsed from the front of `buffer` (consumed only once whole), as
    redis-py returns it: bulk strings as bytes (str with decode_responses), nulls as None, errors
    as ResponseError (NoScriptError for NOSCRIPT), returned rather than raised."""

    def __init__(self, buffer: bytearray, decode: bool):
        self.buffer, self.decode, self.position = buffer, decode, 0

    def parse(self) -> Any:
        value = self._value()
        if value is not _INCOMPLETE:
            del self.buffer[:self.position]
        return value

    def _line(self) -> bytes | None:
        end = self.buffer.find(b"\r\n", self.position)
        if end < 0:
            return None
        line = bytes(self.buffer[self.position:end])
        self.position = end + 2
        return line

    def _value(self) -> Any:
        line = self._line()
        if line is None:
            return _INCOMPLETE
        kind, rest = line[:1], line[1:]
        if kind == b":" or kind == b"(":
            return int(rest)
        if kind == b"$" or kind == b"=" or kind == b"!":
            size = int(rest)
            if size < 0:
                return None
            if len(self.buffer) < self.position + size + 2:
                return _INCOMPLETE
            data = bytes(self.buffer[self.position:self.position + size])
            self.position += size + 2
            if kind == b"!":
                return _error(data.decode(errors="replace"))
            if kind == b"=":
                data = data[4:]  # "txt:" / "mkd:"
            return data.decode() if self.decode else data
        if kind == b"*" or kind == b"~" or kind == b">" or kind == b"%":
            size = int(rest)
            if size < 0:
                return None
            items = []
            for _ in range(size * 2 if kind == b"%" else size):
                item = self._value()
                if item is _INCOMPLETE:
                    return _INCOMPLETE
                items.append(item)
            return dict(zip(items[::2], items[1::2])) if kind == b"%" else items
        if kind == b"+":
            return rest.decode() if self.decode else rest
        if kind == b"-":
            return _error(rest.decode(errors="replace"))
        if kind == b"_":
            return None
        if kind == b"#":
            return rest == b"t"
        if kind == b",":
            return float(rest)
        raise ConnectionError(f"unexpected RESP reply type {kind!r} from Redis: {line[:80]!r}")


def _error(message: str) -> ResponseError:
    return NoScriptError(message) if message.startswith("NOSCRIPT") else ResponseError(message)
