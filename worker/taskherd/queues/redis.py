"""Queue inspection on Redis, reading kombu's own data structures (kombu 5.6–5.7).

- A queue is a list per priority step: ``<queue>`` for priority 0 and ``<queue>\\x06\\x16<n>`` for
  the other steps (3, 6, 9 by default); producers LPUSH, consumers BRPOP, so the oldest message of
  each list is at index -1.
- A delivered, unacknowledged message is a field of the hash ``unacked`` (delivery tag →
  ``[payload, exchange, routing_key]``) and a member of the sorted set ``unacked_index`` (score =
  delivery time). Neither names the queue: it is resolved as kombu's restore does, through the
  exchange's binding table ``_kombu.binding.<exchange>``.
- Every key carries the transport's ``global_keyprefix``.
"""
from __future__ import annotations

import json
import re
import time
from collections import defaultdict
from typing import TYPE_CHECKING, Any, Iterable

import redis as redis_client

from taskherd.contract import redact
from taskherd.worker.deliveries import header_timestamp

from .stats import AGE_FROM_STAMP, BrokerRefused, BrokerUnreachable, QueueStats, QueuesUnreadable

if TYPE_CHECKING:
    from .redis_unacked import UnackedDeliveries

PUBLISHED_AT_HEADER = "taskherd_published_at"
#: kombu.transport.redis defaults (Channel.sep, PRIORITY_STEPS, unacked keys, binding prefix).
SEP = "\x06\x16"
PRIORITY_STEPS = (0, 3, 6, 9)
UNACKED_KEY = "unacked"
UNACKED_INDEX_KEY = "unacked_index"
BINDING_KEY = "_kombu.binding.%s"
#: How many messages per list we read from the oldest end looking for one without an ETA.
SCAN_LIMIT = 1000
SCAN_CHUNK = 100
#: The first read of each list's oldest end is this short: the oldest message is nearly always not
#: delayed (ETA messages wait in taskherd's delay set, not in the list), and every poll reads it.
FIRST_CHUNK = 4
#: Lua shared by the scripts below: `each_list(visit)` calls ``visit(i, key)`` for every priority
#: list of the i-th queue named in ARGV (ARGV[1] the key prefix, ARGV[2] the separator, ARGV[3] the
#: steps joined by commas, ARGV[4] the names as one string of `<bytes>:<name>`: any name, newlines
#: included), in the order `priority_list_keys` gives them. One argument instead of one key per
#: list: redis-py packs every argument in Python (~2 µs each; a queue has four lists). The keys are
#: built in the script (kombu's Redis transport is standalone Redis, where undeclared keys are
#: allowed).
_EACH_LIST = """
local function each_list(visit)
  local prefix, sep, names = ARGV[1], ARGV[2], ARGV[4]
  local steps = {}
  for step in string.gmatch(ARGV[3], '%d+') do steps[#steps + 1] = step end
  local at, i = 1, 0
  while at <= #names do
    local colon = string.find(names, ':', at, true)
    local size = tonumber(string.sub(names, at, colon - 1))
    local name = string.sub(names, colon + 1, colon + size)
    at, i = colon + size + 1, i + 1
    for _, step in ipairs(steps) do
      local key = prefix .. name
      if step ~= '0' then key = key .. sep .. step end
      visit(i, key)
    end
  end
end
"""

#: Every list of the queues read by one command, with one reply: for each list that is not empty,
#: its position in each_list's order (from 1), its length, and its oldest ARGV[5] messages (how
#: many, then each as `<bytes> <message>`), all joined by spaces (read by `_lists_from_reply`).
#: redis-py parses each element of a reply in Python (~10 µs each), and a queue has four priority
#: lists, three nearly always empty: one command and one reply element instead of two commands and
#: up to six elements per list, and nothing at all for an empty one (bench/operator_scale.py).
#: It only reads.
READ_LISTS_SCRIPT = _EACH_LIST + """
local out, position = {}, 0
each_list(function(_, key)
  position = position + 1
  local length = redis.call('LLEN', key)
  if length > 0 then
    local messages = redis.call('LRANGE', key, -tonumber(ARGV[5]), -1)
    out[#out + 1] = position
    out[#out + 1] = length
    out[#out + 1] = #messages
    for _, message in ipairs(messages) do
      out[#out + 1] = #message
      out[#out + 1] = message
    end
  end
end)
return table.concat(out, ' ')
"""

#: The ready count of each queue (its priority lists summed) by one command, for the operator's
#: early notice (operator/early_notice.py): the reply is the counts joined by commas. One argument
#: and one reply instead of one per queue: 2.5 ms of CPU for 1,000 queues against 0.3 ms. It only
#: reads.
READY_COUNTS_SCRIPT = _EACH_LIST + """
local out = {}
each_list(function(i, key) out[i] = (out[i] or 0) + redis.call('LLEN', key) end)
return table.concat(out, ',')
"""


def _script_arguments(queues: Iterable[str], *, prefix: str, steps: tuple[int, ...]) -> list[str]:
    """ARGV[1..4] of the scripts above (_EACH_LIST)."""
    return [prefix, SEP, ",".join(str(step) for step in steps),
            "".join(f"{len(queue.encode())}:{queue}" for queue in queues)]


def priority_list_keys(queue: str, *, steps: Iterable[int] = PRIORITY_STEPS, prefix: str = "") -> list[str]:
    """The Redis keys holding ``queue``'s ready messages, one per priority step."""
    return [prefix + (queue if step == 0 else f"{queue}{SEP}{step}") for step in steps]


def _headers(payload: dict[str, Any]) -> dict[str, Any]:
    """A list item's headers; {} when it has none, or something that is not a JSON object."""
    headers = payload.get("headers")
    return headers if isinstance(headers, dict) else {}


def is_delayed(payload: dict[str, Any]) -> bool:
    """An ETA/countdown message waits on purpose; it says nothing about backlog age."""
    return bool(_headers(payload).get("eta"))


def published_at(payload: dict[str, Any]) -> float | None:
    """A list item's publish stamp, or None when it has none or none readable. Any producer can put
    anything in the header: float() took Infinity, NaN, '1e999' and digits of other scripts ('١٢'),
    and the oldest age read NaN or -inf. Read by taskherd's one lenient reader
    (deliveries.header_timestamp, which imports no Celery): an unreadable stamp is no stamp."""
    return header_timestamp(_headers(payload).get(PUBLISHED_AT_HEADER))


def oldest_undelayed(raw_messages_oldest_first: Iterable[bytes]) -> tuple[bool, float | None]:
    """(found, publish time) of the first message without an ETA; publish time None if unstamped."""
    for raw in raw_messages_oldest_first:
        try:
            payload = json.loads(raw)
        except ValueError:
            return True, None  # not a kombu message: counted, but its age is unknown
        if not isinstance(payload, dict) or is_delayed(payload):
            continue
        return True, published_at(payload)
    return False, None


def queues_for_delivery(exchange: str, routing_key: str, bindings: Iterable[str]) -> list[str]:
    """Queues a message published to (exchange, routing_key) went to, from the binding members.

    Mirrors kombu's lookup for direct and topic exchanges: a member is
    ``routing_key SEP pattern SEP queue`` (pattern: the regex kombu derives from a topic key);
    the anonymous exchange routes to the queue named by the routing key.
    """
    if not exchange:
        return [routing_key]
    matched = []
    for member in bindings:
        parts = member.split(SEP)
        if len(parts) != 3:
            continue
        bound_key, pattern, queue = parts
        if bound_key == routing_key or (pattern and _topic_match(pattern, routing_key)):
            matched.append(queue)
    return matched


def _topic_match(pattern: str, routing_key: str) -> bool:
    try:
        return re.match(pattern, routing_key) is not None
    except re.error:
        return False


def _client(broker_url: str) -> redis_client.Redis:
    return redis_client.Redis.from_url(broker_url, socket_timeout=10, socket_connect_timeout=5)


def inspect_redis(broker_url: str, queues: list[str], *, global_keyprefix: str = "",
                  now: float | None = None, visibility_timeout: float = 3600.0,
                  priority_steps: Iterable[int] = PRIORITY_STEPS,
                  client: redis_client.Redis | None = None,
                  unacked: UnackedDeliveries | None = None) -> dict[str, QueueStats]:
    """One round trip in the common case (module docstring's figures, all read in one pipeline);
    more only for a list whose oldest messages are all delayed, a large unacked hash, or bindings.
    `unacked` (taskherd.queues.redis_unacked, for a caller that inspects the same broker often)
    reads the unacknowledged deliveries instead, at most once per its max_age_seconds."""
    own_client = client is None
    client = client or _client(broker_url)
    steps = tuple(priority_steps)
    where = f"Redis at {redact(broker_url)}"
    try:
        ready, oldest, unacked, errors = _read(client, queues, prefix=global_keyprefix, steps=steps, unacked=unacked)
    except (redis_client.ConnectionError, redis_client.TimeoutError) as exc:
        raise BrokerUnreachable(f"{where}: {exc}") from exc
    except redis_client.RedisError as exc:
        # any other reply error (WRONGTYPE, NOPERM of an ACL, READONLY, ...) of what is no one
        # queue's (the unacked hash, a binding set): the broker answered, for no queue
        raise BrokerRefused(redact(f"{where}: {_said(exc)}")) from exc
    finally:
        if own_client:
            client.close()
    now = time.time() if now is None else now
    result = {}
    for queue in queues:
        if queue in errors:
            continue
        delivered_at = unacked.get(queue, [])
        published = oldest[queue]
        result[queue] = QueueStats(
            queue=queue,
            ready=ready[queue],
            unacked=len(delivered_at),
            consumers=None,
            oldest_age_seconds=max(0.0, now - published) if published is not None else None,
            oldest_unacked_age_seconds=max(0.0, now - min(delivered_at)) if delivered_at else None,
            visibility_timeout_seconds=visibility_timeout,
            oldest_age_method=AGE_FROM_STAMP if published is not None else None,
            oldest_age_error_seconds=0.0 if published is not None else None,
        )
    if errors:  # the others' figures stand: one queue's figures never depend on another's
        raise QueuesUnreadable({queue: redact(why) for queue, why in errors.items()}, result, where=where)
    return result


def _said(exc: BaseException) -> str:
    """A redis-py error as the broker said it, with its class (NoPermissionError, ReadOnlyError...)."""
    return f"{type(exc).__name__}: {exc}"


def _wrong_type(client, key: str, exc: BaseException, *, wanted: str, holds: str) -> str:
    """Why ``key`` could not be read: for a key of the wrong type, its type named (one more command)."""
    if not str(exc).startswith("WRONGTYPE"):
        return f"key {key!r}: {_said(exc)}"
    try:
        kind = _text(client.type(key))
    except redis_client.RedisError:
        kind = "another type"
    return (f"key {key!r} holds a {kind}, not a {wanted}: kombu's Redis transport keeps {holds} in a {wanted} "
            f"(the broker said: {exc})")


def ready_counts(client: redis_client.Redis, queues: list[str], *, global_keyprefix: str = "",
                 priority_steps: Iterable[int] = PRIORITY_STEPS) -> dict[str, int]:
    """Each queue's ready messages (all its priority lists) in one round trip: the length part of
    `inspect_redis`, without ages or unacknowledged messages."""
    steps = tuple(priority_steps)
    try:
        try:
            reply = client.eval(READY_COUNTS_SCRIPT, 0, *_script_arguments(queues, prefix=global_keyprefix, steps=steps))
            text = reply.decode() if isinstance(reply, bytes) else reply  # decode_responses or not
            counts = [int(n) for n in text.split(",")] if text else []
        except redis_client.ResponseError:
            # Scripting refused (an ACL without @scripting, a managed Redis) or a key of the wrong
            # type: one LLEN per list, which raises the error that was not the script's.
            with client.pipeline(transaction=False) as pipe:
                for queue in queues:
                    for key in priority_list_keys(queue, steps=steps, prefix=global_keyprefix):
                        pipe.llen(key)
                lengths = pipe.execute()
            counts = [sum(lengths[i * len(steps):(i + 1) * len(steps)]) for i in range(len(queues))]
    except (redis_client.ConnectionError, redis_client.TimeoutError) as exc:
        raise BrokerUnreachable(f"Redis: {exc}") from exc
    return dict(zip(queues, counts))


def _read(client, queues: list[str], *, prefix: str, steps: tuple[int, ...], unacked=None):
    """(ready per queue, oldest publish stamp per queue, unacked delivery times per queue, why each
    queue that could not be read could not). A reply error of one queue's list (a key of the wrong
    type, an ACL refusing it) is that queue's; of the unacked hash or index, everyone's: raised."""
    queues = list(dict.fromkeys(queues))
    keys = {queue: priority_list_keys(queue, steps=steps, prefix=prefix) for queue in queues}
    listed = [key for queue in queues for key in keys[queue]]  # the script's order (_EACH_LIST)
    unacked_read: tuple | None = None  # (index, first page, cursor) when read here
    errors: dict[str, str] = {}
    try:
        with client.pipeline(transaction=False) as pipe:
            pipe.eval(READ_LISTS_SCRIPT, 0, *_script_arguments(queues, prefix=prefix, steps=steps), FIRST_CHUNK)
            if unacked is None:
                _ask_unacked(pipe, prefix)
            reply, *asked = pipe.execute()
        if asked:
            unacked_read = (asked[0], asked[1][1], asked[1][0])
        lists = {listed[position - 1]: read for position, read in _lists_from_reply(reply)}
    except redis_client.ResponseError:
        # Scripting refused (an ACL without @scripting, a managed Redis) or a key of the wrong
        # type: the same reads one command each, which raise the error that was not the script's.
        # Each reply on its own: one queue's error is that queue's.
        with client.pipeline(transaction=False) as pipe:
            for key in listed:
                pipe.llen(key)
                pipe.lrange(key, -FIRST_CHUNK, -1)  # the oldest end (read oldest first below)
            _ask_unacked(pipe, prefix)
            *replies, index, scanned = pipe.execute(raise_on_error=False)
        for key, reply in ((prefix + UNACKED_INDEX_KEY, index), (prefix + UNACKED_KEY, scanned)):
            if isinstance(reply, Exception):
                kind = "sorted set" if key.endswith(UNACKED_INDEX_KEY) else "hash"
                raise redis_client.ResponseError(_wrong_type(client, key, reply, wanted=kind,
                                                             holds="unacknowledged deliveries")) from reply
        cursor, first_page = scanned
        unacked_read = (index, first_page, cursor)
        lists = {}
        for i, key in enumerate(listed):
            length, chunk = replies[2 * i], replies[2 * i + 1]
            failed = next((reply for reply in (length, chunk) if isinstance(reply, Exception)), None)
            if failed is not None:
                queue = next(q for q in queues if key in keys[q])
                errors.setdefault(queue, _wrong_type(client, key, failed, wanted="list", holds="a queue's messages"))
            elif length:
                lists[key] = (length, chunk)
    # `lists` holds the lists that are not empty: (length, oldest messages)
    ready, oldest = {}, {}
    for queue in queues:
        if queue in errors:
            continue
        found = [(key, lists[key]) for key in keys[queue] if key in lists]
        stamps = [stamp for key, (_, chunk) in found if (stamp := _oldest_stamp(client, key, chunk)) is not None]
        ready[queue], oldest[queue] = sum(length for _, (length, _) in found), min(stamps) if stamps else None
    by_queue = unacked.by_queue(client, prefix=prefix, queues=queues) if unacked_read is None else None
    if by_queue is None:  # read here, or the reader could not (scripts refused): read it all now
        if unacked_read is None:
            with client.pipeline(transaction=False) as pipe:
                _ask_unacked(pipe, prefix)
                index, (cursor, first_page) = pipe.execute()
            unacked_read = (index, first_page, cursor)
        by_queue = _unacked_by_queue(client, *unacked_read, prefix=prefix)
    return ready, oldest, by_queue, errors


def _lists_from_reply(reply: bytes | str) -> list[tuple[int, tuple[int, list[bytes]]]]:
    """READ_LISTS_SCRIPT's reply: (position, (length, oldest messages)) of each list not empty."""
    data = reply.encode() if isinstance(reply, str) else reply  # a client with decode_responses
    lists, at = [], 0

    def number() -> int:
        nonlocal at
        space = data.find(b" ", at)
        end = space if space >= 0 else len(data)
        value, at = int(data[at:end]), end + 1
        return value

    while at < len(data):
        position, length, count = number(), number(), number()
        messages = []
        for _ in range(count):
            size = number()
            messages.append(data[at:at + size])
            at += size + 1  # the message, then the space after it
        lists.append((position, (length, messages)))
    return lists


def _ask_unacked(pipe, prefix: str) -> None:
    pipe.zrange(prefix + UNACKED_INDEX_KEY, 0, -1, withscores=True)
    pipe.hscan(prefix + UNACKED_KEY, 0, count=500)


def _oldest_stamp(client, key: str, first_chunk: list) -> float | None:
    """The publish stamp of the oldest non-ETA message of one list, from its first chunk (already
    read) and, when every message there is delayed, the next chunks."""
    chunk, read, size = first_chunk, 0, FIRST_CHUNK
    while True:
        found, stamp = oldest_undelayed(reversed(chunk))
        if found:
            return stamp
        read += size
        if len(chunk) < size or read >= SCAN_LIMIT:
            return None
        size = SCAN_CHUNK
        # LRANGE with negative indices reads from the oldest end; reverse to go oldest first.
        chunk = client.lrange(key, -(read + size), -(read + 1))


def _unacked_by_queue(client, index: list, first_page: dict, cursor: int, *, prefix: str) -> dict[str, list[float]]:
    """Queue name → delivery times of its unacknowledged messages (all of kombu's unacked hash):
    the first HSCAN page is given, the rest is read while the cursor says there is more."""
    delivered_at = {_text(tag): score for tag, score in index}
    entries = list(first_page.items())
    while cursor:
        cursor, page = client.hscan(prefix + UNACKED_KEY, cursor, count=500)
        entries += page.items()
    by_queue: dict[str, list[float]] = defaultdict(list)
    for tag, queues in delivery_queues(client, entries, prefix=prefix):
        for queue in queues:
            # A tag in the hash but not (yet) in the index: kombu writes both in one MULTI, so this
            # is only a read between two commands of ours; count it as delivered now.
            by_queue[queue].append(delivered_at.get(tag, time.time()))
    return by_queue


def delivery_queues(client, entries: Iterable[tuple[Any, Any]], *, prefix: str) -> list[tuple[str, tuple[str, ...]]]:
    """(delivery tag, the queues it was delivered from) of kombu `unacked` hash entries (tag, raw
    ``[payload, exchange, routing_key]``), resolved as kombu's restore does; entries that are not
    kombu's are left out."""
    deliveries = []
    for tag, raw in entries:
        try:
            _payload, exchange, routing_key = json.loads(raw)
        except (ValueError, TypeError):
            continue
        deliveries.append((_text(tag), exchange or "", routing_key or ""))
    exchanges = sorted({exchange for _, exchange, _ in deliveries if exchange})
    bindings_of: dict[str, list[str]] = {}
    if exchanges:
        with client.pipeline(transaction=False) as pipe:
            for exchange in exchanges:
                pipe.smembers(prefix + BINDING_KEY % exchange)
            replies = pipe.execute(raise_on_error=False)
        for exchange, members in zip(exchanges, replies):
            if isinstance(members, Exception):
                raise redis_client.ResponseError(_wrong_type(
                    client, prefix + BINDING_KEY % exchange, members, wanted="set",
                    holds="an exchange's bindings")) from members
            bindings_of[exchange] = [_text(m) for m in members]
    return [(tag, tuple(queues_for_delivery(exchange, routing_key, bindings_of.get(exchange, [])) or [routing_key]))
            for tag, exchange, routing_key in deliveries]


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)

