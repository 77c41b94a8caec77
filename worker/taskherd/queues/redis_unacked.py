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
from collections import defaultdict
from typing import Callable

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
        #: delivery tag -> the queues it was delivered from, for the tags in the index
        self._queues_of: dict[bytes, tuple[str, ...]] = {}
        self._read_at: float | None = None
        self._by_queue: dict[str, list[float]] = {}

    def by_queue(self, client: redis_client.Redis, *, prefix: str) -> dict[str, list[float]] | None:
        """Queue name -> delivery times of its unacknowledged messages (not to be modified); None
        when the index cannot be read this way (scripts refused, a tag with a space): the caller
        reads it whole."""
        with self._lock:
            now = self._clock()
            if self._read_at is not None and now - self._read_at < self.max_age_seconds:
                return self._by_queue
            try:
                reply = client.eval(INDEX_SCRIPT, 1, prefix + UNACKED_INDEX_KEY)
            except redis_client.ResponseError:
                return None
            if reply is None:
                return None
            data = reply.encode() if isinstance(reply, str) else reply  # a client with decode_responses
            parts = data.split(b" ") if data else []
            scores = dict(zip(parts[::2], parts[1::2]))
            self._queues_of = {tag: queues for tag, queues in self._queues_of.items() if tag in scores}
            self._resolve(client, [tag for tag in scores if tag not in self._queues_of], prefix=prefix)
            by_queue: dict[str, list[float]] = defaultdict(list)
            for tag, score in scores.items():
                for queue in self._queues_of.get(tag, ()):
                    by_queue[queue].append(float(score))
            self._read_at, self._by_queue = now, dict(by_queue)
            return self._by_queue

    def _resolve(self, client: redis_client.Redis, tags: list[bytes], *, prefix: str) -> None:
        """Remembers the queues of `tags`. A tag whose hash entry is gone (acknowledged since the
        index was read) is left out and asked again next time if still indexed; an entry that is
        not kombu's is remembered as belonging to no queue, as inspect_redis leaves it out."""
        entries = []
        for start in range(0, len(tags), HMGET_BATCH):
            batch = tags[start:start + HMGET_BATCH]
            entries += [(tag, raw) for tag, raw in zip(batch, client.hmget(prefix + UNACKED_KEY, batch))
                        if raw is not None]
        resolved = dict(delivery_queues(client, entries, prefix=prefix))
        for tag, _raw in entries:
            self._queues_of[tag] = resolved.get(tag.decode(), ())
