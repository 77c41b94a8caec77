"""kombu's unacknowledged deliveries on one Redis broker, by queue, for a caller that inspects the
same broker many times a second (the operator): read at most once per `max_age_seconds`, and only
what changed.

`inspect_redis` on its own reads all of kombu's `unacked` hash and `unacked_index` at each call and
decodes every delivery's JSON to find its queue: with 6,000 tasks running on one broker that is
~105 ms of CPU a call, and the operator makes one call per batch of pools polled together — several
a second at 1,000 WorkerPools, over a core in all (bench/operator_scale.py). A delivery tag never
changes queue, so here each tag's queues are resolved once (an HMGET of the tags not seen before,
resolved as kombu's restore does) and remembered while the tag stays in the index; the index
itself comes back as one string from a read-only script.

The figures a call returns are at most `max_age_seconds` old: a delivery made or acknowledged
within that time may be missing or still counted. Delivery times are Redis's own, so ages stay
exact.
"""
from __future__ import annotations

import threading
import time
from typing import Callable, Iterable

import redis as redis_client

from .redis import UNACKED_INDEX_KEY, UNACKED_KEY, delivery_queues

#: kombu's delivery index as `<tag> <score> <tag> <score> …`; nil when a tag holds a space or a line
#: break (kombu's tags are UUIDs; anything else is read the slow way).
INDEX_SCRIPT = """
local index = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
for i = 1, #index, 2 do
  if string.find(index[i], '[ \\r\\n]') then return false end
end
return table.concat(index, ' ')
"""
#: tags asked for by one HMGET
HMGET_BATCH = 1000


class UnackedDeliveries:
    def __init__(self, *, max_age_seconds: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_age_seconds = max_age_seconds
        self._clock = clock
        self._lock = threading.Lock()  # inspections run in worker threads
        self._read_at: float | None = None
        #: delivery tag -> the queues it was delivered from, for the tags in the index
        self._queues_of: dict[bytes, tuple[str, ...]] = {}
        #: queue -> {delivery tag: delivery time}
        self._delivered: dict[str, dict[bytes, float]] = {}

    def by_queue(self, client: redis_client.Redis, *, prefix: str,
                 queues: Iterable[str]) -> dict[str, list[float]] | None:
        """Each of `queues` (those with any) -> the delivery times of its unacknowledged messages;
        None when the index cannot be read this way (scripts refused, a tag with a space): the
        caller reads it whole."""
        with self._lock:
            now = self._clock()
            if self._read_at is None or now - self._read_at >= self.max_age_seconds:
                if not self._refresh(client, prefix=prefix):
                    return None
                self._read_at = now
            return {queue: list(self._delivered[queue].values()) for queue in queues if queue in self._delivered}

    def _refresh(self, client: redis_client.Redis, *, prefix: str) -> bool:
        """Reads the index and applies what changed since the last read: set operations over the
        tags, then work only for the tags that came or went. A tag's delivery time is the one first
        read: kombu and taskherd's fast recovery write it once, at delivery."""
        try:
            reply = client.eval(INDEX_SCRIPT, 1, prefix + UNACKED_INDEX_KEY)
        except redis_client.ResponseError:
            return False
        if reply is None:
            return False
        data = reply.encode() if isinstance(reply, str) else reply  # a client with decode_responses
        parts = data.split(b" ") if data else []
        index = dict(zip(parts[::2], parts[1::2]))
        for tag in self._queues_of.keys() - index.keys():
            self._forget(tag)
        # new tags, and those whose hash entry was missing last time (asked again)
        new = list(index.keys() - self._queues_of.keys())
        self._resolve(client, new, prefix=prefix)
        for tag in new:
            for queue in self._queues_of.get(tag, ()):
                self._delivered.setdefault(queue, {})[tag] = float(index[tag])
        return True

    def _forget(self, tag: bytes) -> None:
        for queue in self._queues_of.pop(tag, ()):
            delivered = self._delivered.get(queue, {})
            delivered.pop(tag, None)
            if not delivered:
                self._delivered.pop(queue, None)

    def _resolve(self, client: redis_client.Redis, tags: list[bytes], *, prefix: str) -> None:
        """Remembers the queues of `tags` whose hash entry is still there (one acknowledged since
        the index was read is not); an entry that is not kombu's belongs to no queue, as
        inspect_redis leaves it out."""
        entries = []
        for start in range(0, len(tags), HMGET_BATCH):
            batch = tags[start:start + HMGET_BATCH]
            entries += [(tag, raw) for tag, raw in zip(batch, client.hmget(prefix + UNACKED_KEY, batch))
                        if raw is not None]
        resolved = dict(delivery_queues(client, entries, prefix=prefix))
        for tag, _raw in entries:
            self._queues_of[tag] = resolved.get(tag.decode(), ())
