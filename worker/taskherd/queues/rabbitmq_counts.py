"""Ready messages of many RabbitMQ queues, counted now, over one AMQP connection.

The management API's figures are the broker's statistics, emitted every 5 s
(``collect_statistics_interval``): a burst shows there up to 5 s late, which is the whole of a
default poll interval (the operator's early notice, taskherd.operator.early_notice). A passive
``queue.declare`` answers from the queue itself: ``message_count`` is its ready messages at that
moment (KEDA's RabbitMQ scaler reads the same over AMQP).

One declare per queue, but pipelined: every request is written at once and the replies read in
order, one round trip for all the queues. The frames are written and read here, by hand, on the
socket of a py-amqp connection that kombu opened (URL, TLS, authentication and the handshake are
theirs): py-amqp's own channel calls cost ~30 µs of CPU per queue (dumping the arguments, a
receive per frame, its dispatch), ~30 ms a second for 1,000 pools; this ~5 ms.

The counts are remembered (`recent`): the poll a count brought forward runs within a second and
reads the management API, whose figures may not show the burst yet; it takes the counted ready
messages instead (`with_counted_ready`).

A queue that does not exist (or may not be read) closes the channel: the queues after it are
asked again on a reopened channel, and that one counts as None.
"""
from __future__ import annotations

import socket
import struct
import threading
import time
from dataclasses import replace
from typing import Callable, Iterable, Mapping

from .stats import QueueStats

#: AMQP 0-9-1 frame types, and the (class, method) ids used here
METHOD_FRAME, FRAME_END = 1, 0xCE
QUEUE_DECLARE, QUEUE_DECLARE_OK = (50, 10), (50, 11)
CHANNEL_OPEN, CHANNEL_OPEN_OK = (20, 10), (20, 11)
CHANNEL_CLOSE, CHANNEL_CLOSE_OK = (20, 40), (20, 41)
CONNECTION_CLOSE = (10, 50)
#: a queue name is a short string on the wire: at most 255 bytes
MAX_QUEUE_NAME_BYTES = 255
#: declare frames and counts kept (queue names counted); past it they are made again
MAX_FRAMES_KEPT = 100_000
#: the connection is the counter's alone and idle between counts: no heartbeats to answer
HEARTBEAT = 0

_HEADER = struct.Struct(">BHI")
_METHOD = struct.Struct(">HH")


class CountFailed(Exception):
    """The broker closed the connection or answered what a count does not expect."""


def _method_frame(channel: int, method: tuple[int, int], arguments: bytes = b"") -> bytes:
    payload = _METHOD.pack(*method) + arguments
    return _HEADER.pack(METHOD_FRAME, channel, len(payload)) + payload + bytes((FRAME_END,))


def declare_passive_frame(channel: int, name: bytes) -> bytes:
    """queue.declare(queue=name, passive) as one frame: reserved short, the name, the flags octet
    (passive only), an empty argument table."""
    return _method_frame(channel, QUEUE_DECLARE, b"\0\0" + bytes((len(name),)) + name + b"\x01" + b"\0\0\0\0")


class FrameReader:
    """Method frames from a socket, many per receive: when the buffer runs out, the reader waits
    `gather_seconds` before receiving, so that a receive takes what the broker wrote meanwhile
    (it answers 1,000 declares in ~20 ms, in ~300 segments; a receive each cost more CPU than
    the parsing)."""

    def __init__(self, sock: socket.socket, *, gather_seconds: float = 0.001) -> None:
        self.sock = sock
        self.gather_seconds = gather_seconds
        self.buffer = b""
        self.at = 0  # where the next frame starts: frames are not sliced off one by one

    def next(self) -> tuple[int, tuple[int, int], bytes]:
        """(channel, (class, method), arguments) of the next method frame; other frames (a
        heartbeat, content) are skipped."""
        while True:
            while (len(self.buffer) - self.at < _HEADER.size
                   or len(self.buffer) - self.at < _HEADER.size + _HEADER.unpack_from(self.buffer, self.at)[2] + 1):
                time.sleep(self.gather_seconds)
                chunk = self.sock.recv(262144)
                if not chunk:
                    raise CountFailed("the broker closed the connection")
                self.buffer, self.at = self.buffer[self.at:] + chunk, 0
            kind, channel, size = _HEADER.unpack_from(self.buffer, self.at)
            start = self.at + _HEADER.size
            end = start + size
            if self.buffer[end] != FRAME_END:
                raise CountFailed("a frame without its end octet")
            self.at = end + 1
            if kind == METHOD_FRAME and size >= _METHOD.size:
                return channel, _METHOD.unpack_from(self.buffer, start), self.buffer[start + _METHOD.size:end]


def _reply(reader: FrameReader) -> tuple[int, tuple[int, int], bytes]:
    """The next method frame that answers the count: the broker's connection.blocked and
    unblocked (channel 0, about publishing, which a count does not do) are passed over."""
    while True:
        channel, method, arguments = reader.next()
        if channel != 0 or method == CONNECTION_CLOSE:
            return channel, method, arguments


def _declare_ok_count(arguments: bytes) -> int:
    """message_count of queue.declare-ok (queue short string, message count, consumer count)."""
    return struct.unpack_from(">I", arguments, 1 + arguments[0])[0]


def _close_reason(arguments: bytes) -> tuple[int, str]:
    code = struct.unpack_from(">H", arguments)[0]
    return code, arguments[3:3 + arguments[2]].decode("utf-8", "replace")


class ReadyCounter:
    """The ready messages of queues on one broker (an AMQP URL), counted on a connection kept
    between counts and opened again after a failure. Thread-safe: one count at a time."""

    def __init__(self, url: str, *, timeout: float = 3.0, retry_after_seconds: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.url = url
        #: a count answers within milliseconds; one that waits longer is of no use a second later
        self.timeout = timeout
        #: after a failed count, counts fail at once for this long: a broker that does not answer
        #: (a firewall dropping the packets) would otherwise hold every count for `timeout`
        self.retry_after_seconds = retry_after_seconds
        self._clock = clock
        self._failed_at: float | None = None
        #: queue -> (when, ready) of its last count: what `recent` answers
        self._counted: dict[str, tuple[float, int | None]] = {}
        self._lock = threading.Lock()
        self._connection = None  # kombu.Connection
        self._channel = 0
        #: each queue's declare frame, built once: a pool's queues are counted every second
        self._frames: dict[str, bytes] = {}

    def counts(self, queues: Iterable[str]) -> dict[str, int | None]:
        """queue -> ready messages now; None for a queue that does not exist, may not be read, or
        whose name AMQP cannot carry. A kept connection found dropped is opened again once, at
        once; otherwise raises what the connection raises (OSError, kombu/py-amqp errors,
        CountFailed), with the connection closed, and CountFailed at once for the next
        retry_after_seconds: the count after them connects again."""
        names = list(dict.fromkeys(queues))
        with self._lock:
            if self._failed_at is not None and self._clock() - self._failed_at < self.retry_after_seconds:
                raise CountFailed(f"the last count failed {self._clock() - self._failed_at:.0f} s ago; "
                                  f"the next try {self.retry_after_seconds:g} s after it")
            # a kept connection the broker (or a proxy's idle timeout) dropped since the last
            # count is opened again once; a new one that fails, or any other failure, is final
            retry = self._connection is not None
            while True:
                try:
                    return self._remember(self._count(names))
                except BaseException as exc:
                    self.close(polite=False)
                    # not a timeout: that one would only wait again
                    if retry and isinstance(exc, (ConnectionError, CountFailed)):
                        retry = False
                        continue
                    self._failed_at = self._clock()
                    raise

    def recent(self, queues: Iterable[str], max_age_seconds: float) -> dict[str, int | None]:
        """The queues among `queues` counted within `max_age_seconds`, with what they counted."""
        oldest = self._clock() - max_age_seconds
        return {queue: found[1] for queue in queues
                if (found := self._counted.get(queue)) is not None and found[0] >= oldest}

    def _remember(self, counts: dict[str, int | None]) -> dict[str, int | None]:
        now = self._clock()
        self._failed_at = None
        if len(self._counted) > MAX_FRAMES_KEPT:
            self._counted.clear()
        self._counted.update((queue, (now, n)) for queue, n in counts.items())
        return counts

    def close(self, *, polite: bool = True) -> None:
        """Closes the connection: with the AMQP close handshake, or (after a failed count, whose
        unread replies the handshake would wade through) by dropping the socket."""
        connection, self._connection = self._connection, None
        if connection is not None:
            try:
                connection.release() if polite else connection.collect()
            except Exception:  # noqa: BLE001 - a connection already gone
                pass

    def _socket(self) -> socket.socket:
        if self._connection is None:
            from kombu import Connection
            connection = Connection(self.url, heartbeat=HEARTBEAT, connect_timeout=self.timeout)
            connection.connect()
            self._channel = connection.connection.channel().channel_id  # opened by py-amqp
            self._frames.clear()  # they carry the channel's number
            self._connection = connection
        sock = self._connection.connection.transport.sock
        sock.settimeout(self.timeout)
        return sock

    def _count(self, names: list[str]) -> dict[str, int | None]:
        result: dict[str, int | None] = {}
        sock = self._socket()
        if len(self._frames) > MAX_FRAMES_KEPT:
            self._frames.clear()
        asked = []
        for name in names:
            frame = self._frames.get(name)
            if frame is None:
                raw = name.encode("utf-8")
                if len(raw) > MAX_QUEUE_NAME_BYTES:
                    result[name] = None
                    continue
                frame = self._frames[name] = declare_passive_frame(self._channel, raw)
            asked.append((name, frame))
        reader = FrameReader(sock)
        while asked:
            sock.sendall(b"".join(frame for _, frame in asked))
            answered = 0
            for name, _ in asked:
                channel, method, arguments = _reply(reader)
                if method == QUEUE_DECLARE_OK and channel == self._channel:
                    result[name] = _declare_ok_count(arguments)
                    answered += 1
                    continue
                if method == CHANNEL_CLOSE and channel == self._channel:
                    # 404 NOT_FOUND, 403 ACCESS_REFUSED, 405 RESOURCE_LOCKED (another
                    # connection's exclusive queue): this queue is not counted; the broker
                    # dropped the declares after it
                    result[name] = None
                    answered += 1
                    self._reopen(sock, reader)
                    break
                if method == CONNECTION_CLOSE:
                    code, text = _close_reason(arguments)
                    raise CountFailed(f"the broker closed the connection: {code} {text}")
                raise CountFailed(f"unexpected method {method} on channel {channel}")
            asked = asked[answered:]
        return {name: result[name] for name in names}

    def _reopen(self, sock: socket.socket, reader: FrameReader) -> None:
        """close-ok for the closed channel, then open it again (the same number may be reused
        once the close is acknowledged)."""
        sock.sendall(_method_frame(self._channel, CHANNEL_CLOSE_OK)
                     + _method_frame(self._channel, CHANNEL_OPEN, b"\0"))
        channel, method, arguments = _reply(reader)
        if (channel, method) != (self._channel, CHANNEL_OPEN_OK):
            raise CountFailed(f"the channel did not open again: {method} on channel {channel}")


def with_counted_ready(stats: Mapping[str, QueueStats], counted: Mapping[str, int | None]) -> dict[str, QueueStats]:
    """`stats` (from the management API, whose figures are up to 5 s old) with each queue's ready
    messages as counted since (pure). A count of 0 drops the head's age, which was a message
    since delivered; a queue the API has not reported yet (pending) keeps its figures, whose
    unacknowledged messages are unknown too."""
    fresher = dict(stats)
    for queue, ready in counted.items():
        listed = fresher.get(queue)
        if listed is None or ready is None or listed.pending or ready == listed.ready:
            continue
        gone = {} if ready else {"oldest_age_seconds": None, "oldest_age_method": None, "oldest_age_error_seconds": None}
        fresher[queue] = replace(listed, ready=ready, **gone)
    return fresher
