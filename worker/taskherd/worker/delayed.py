"""Delayed (ETA/countdown) messages on Redis wait in a sorted set, not unacknowledged in a worker.

Celery takes an ETA message at once, whatever the prefetch limit, and holds it unacknowledged
until its time. On Redis an unacknowledged message is redelivered once it is older than the
visibility timeout, whether its worker is alive or not: a long countdown — or many short ones
piled up behind each other in one worker — runs twice. So the worker does not hold them:

1. **Park.** When a taskherd task's message arrives with an ETA in the future, the worker's
   strategy (:func:`strategy`, the Task class's ``Strategy``) ZADDs it to the sorted set
   ``taskherd.delayed`` (score = its ETA, epoch seconds) and then acknowledges it. The stored
   message is kombu's own, with its ETA moved from the ``eta`` header to ``taskherd_eta`` (so that
   when it comes back it is an ordinary message, held by no one until a worker is free for it)
   and a new delivery tag, with the Redis lists kombu would deliver it to.
2. **Move.** A thread of every worker's main process runs :data:`MOVE_DUE_SCRIPT` every
   ``interval`` seconds (sooner when a message it parked falls due first): in one atomic script,
   each message whose score has passed is RPUSHed to its lists (the consuming end, as kombu's
   restore does: it is due, so it goes first) and removed from the set. Workers racing move
   nothing twice.

**Purge.** Purging a queue (``celery worker --purge``, ``celery purge``, ``app.control.purge()``:
kombu's ``queue_purge``) erases its parked messages too, counted in the purge's total
(:func:`erase_parked_on_purge`): in plain Celery a countdown task not yet run was a message in the
queue, or held by a worker, and a purge erased it — parked here, it would have survived the purge
and run afterwards. (A message parked for several queues loses only the purged ones.)

A crash between the ZADD and the acknowledgement leaves the message both parked and unacked: it
runs twice (once when restored, once when due), with the same task id — never zero times. A
delivery that cannot be parked (Redis error) is held by Celery as before. Messages wait in the
set while no worker runs, as they would in a queue. RabbitMQ needs none of this (an unacked
message stays with its live consumer; ``consumer_timeout`` is checked at start instead).
"""
from __future__ import annotations

import datetime as dt
import json
import logging
import threading
import time
import uuid
from typing import Any, Callable

from kombu.utils import json as kombu_json

from taskherd import compat

from .task_messages import date_time_timestamp

logger = logging.getLogger(__name__)

DELAYED_KEY = "taskherd.delayed"
#: Header keeping a parked message's original ETA (the ``eta`` header itself is removed).
ORIGINAL_ETA_HEADER = "taskherd_eta"
#: Messages moved per script call (a backlog falling due at once is moved in several calls).
MOVE_BATCH = 100

# KEYS: the delayed set. ARGV: now, batch. Returns {moved, next score or nil}.
# The destination lists come from the records (computed by kombu's own lookup when the message
# was parked); they are not in KEYS, which kombu's Redis transport (no cluster support) does not need.
MOVE_DUE_SCRIPT = """
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
for _, entry in ipairs(due) do
  local record = cjson.decode(entry)
  for _, list in ipairs(record['lists']) do redis.call('RPUSH', list, record['message']) end
  redis.call('ZREM', KEYS[1], entry)
end
local head = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
return {#due, head[2]}
"""


# KEYS: the delayed set. ARGV: the Redis lists of the queue being purged (its priority sub-lists,
# key prefix included). Erases each parked message bound for one of them (a message bound for
# other queues too keeps those); returns how many were erased. A record that is not JSON is left.
ERASE_SCRIPT = """
local purged = {}
for _, list in ipairs(ARGV) do purged[list] = true end
local erased = 0
local entries = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
for i = 1, #entries, 2 do
  local entry, score = entries[i], entries[i + 1]
  local ok, record = pcall(cjson.decode, entry)
  if ok and type(record) == 'table' and type(record['lists']) == 'table' then
    local kept, hit = {}, false
    for _, list in ipairs(record['lists']) do
      if purged[list] then hit = true else table.insert(kept, list) end
    end
    if hit then
      erased = erased + 1
      redis.call('ZREM', KEYS[1], entry)
      if #kept > 0 then
        redis.call('ZADD', KEYS[1], score, cjson.encode({lists = kept, message = record['message']}))
      end
    end
  end
end
return erased
"""


def due_time(headers: Any, *, default_timezone: dt.tzinfo | None = None) -> float | None:
    """Epoch seconds of a protocol-2 message's ETA, or None (no ETA, or one Celery cannot read
    either: Celery then refuses the message itself, and the bad-message check before it).

    Read by the one reading of the message check and of Celery's worker
    (:func:`taskherd.worker.task_messages.date_time_timestamp`): an ETA accepted there is parked
    here — never held unacknowledged past the visibility timeout because this reading differs
    (``…z`` lowercase, ``T24:00:00``, a datetime, a naive value read in another time zone)."""
    if not isinstance(headers, dict) or "task" not in headers:
        return None
    eta = headers.get("eta")
    if not eta:
        return None
    try:
        return date_time_timestamp(eta, timezone=default_timezone)
    except (ValueError, TypeError, AttributeError, OverflowError, OSError):
        return None


def parked_message(raw: dict[str, Any]) -> dict[str, Any]:
    """What is stored for a delivery: kombu's message with its ETA moved aside and a new tag."""
    # A copy (the consumer keeps reading the original), through kombu's JSON: kombu decoded the
    # item with it, so the headers may hold what only it writes back (a datetime ``eta``/``expires``).
    payload = kombu_json.loads(kombu_json.dumps(raw))
    headers = payload.setdefault("headers", {})
    headers[ORIGINAL_ETA_HEADER] = headers.pop("eta", None)
    properties = payload.setdefault("properties", {})
    # A new delivery tag: if this worker dies before acknowledging the original, the original is
    # restored under its own tag and must not share kombu's unacked entry with this copy.
    properties["delivery_tag"] = str(uuid.uuid4())
    return payload


class DelaySet:
    """The sorted set of parked messages in one Redis database (module docstring)."""

    def __init__(self, client, *, prefix: str = "", clock: Callable[[], float] = time.time):
        from .components.recovery import Destinations, Keys

        self.client = client
        self.keys = Keys(prefix)
        self.key = self.keys(DELAYED_KEY)
        self.destinations = Destinations(self.keys)
        self.clock = clock
        self._move = client.register_script(MOVE_DUE_SCRIPT)
        #: set when a message parked here may fall due before the mover would next look
        self.parked = threading.Event()

    def park(self, message: Any, eta: float) -> None:
        """Stores ``message`` to be delivered again at ``eta``; returns once Redis has it."""
        record = {"lists": self.destinations.of(message.channel, message),
                  "message": kombu_json.dumps(parked_message(message._raw))}
        self.client.zadd(self.key, {json.dumps(record): eta})
        self.parked.set()

    def move_due(self) -> tuple[int, float | None]:
        """Moves every due message to its queue: (how many, score of the next one or None)."""
        moved, following = 0, None
        while True:
            reply = self._move(keys=[self.key], args=[self.clock(), MOVE_BATCH])
            count = int(reply[0])
            moved += count
            following = float(reply[1]) if len(reply) > 1 else None  # Lua drops a trailing nil
            if count < MOVE_BATCH:
                return moved, following


class Mover(threading.Thread):
    """Moves due messages back to their queues, every ``interval`` seconds or when one falls due."""

    def __init__(self, delays: DelaySet, *, interval: float):
        super().__init__(name="taskherd-delayed-mover", daemon=True)
        self.delays, self.interval = delays, interval
        self._stopped = threading.Event()

    def run(self) -> None:
        while not self._stopped.is_set():
            self.delays.parked.clear()  # before looking: a park from now on cuts the wait short
            wait = self.interval
            try:
                moved, following = self.delays.move_due()
                if moved:
                    logger.info("taskherd: %d delayed message(s) fell due and went back to their queues", moved)
                if following is not None:
                    wait = min(wait, max(0.0, following - self.delays.clock()))
            except Exception as exc:  # noqa: BLE001 - Redis blip: the set keeps them, try again
                logger.warning("taskherd: could not move due delayed messages (%s); retrying in %.1f s",
                               exc, self.interval)
            self.delays.parked.wait(wait)

    def stop(self) -> None:
        self._stopped.set()
        self.delays.parked.set()


def erase_parked(channel: Any, queue: str) -> int:
    """Erases the messages parked for ``queue`` from the delay set of ``channel``'s Redis (kombu's
    Redis channel: its database, its ``global_keyprefix``); returns how many."""
    from .components.recovery import Keys

    keys = Keys(getattr(channel, "global_keyprefix", "") or "")
    lists = [keys(name) for name in compat.redis_queue_lists(channel, queue)]
    client = compat.redis_channel_client(channel)  # unprefixed: the names above carry the prefix
    return int(client.eval(ERASE_SCRIPT, 1, keys(DELAYED_KEY), *lists))


def erase_parked_on_purge() -> None:
    """Makes every kombu Redis channel of this process erase a queue's parked messages when it
    purges the queue, counting them in what ``queue_purge`` returns (the "Erased N messages" of
    ``celery worker --purge``, the "Purged N messages" of ``celery purge``). They are erased first:
    one that falls due meanwhile is moved to the queue, and the queue's purge erases it there."""
    def erasing_parked(original: Callable[..., int]) -> Callable[..., int]:
        def queue_purge(self: Any, queue: str, **kwargs: Any) -> int:
            erased = erase_parked(self, queue)
            return (original(self, queue, **kwargs) or 0) + erased
        return queue_purge

    compat.wrap_redis_queue_purge(erasing_parked)


#: The delay set this worker process parks into (set by the DelayedMessages component's bootstep).
_active: DelaySet | None = None


def activate(delays: DelaySet, *, interval: float) -> Mover:
    """In a worker's main process: park ETA messages into ``delays`` and move the due ones."""
    global _active
    mover = Mover(delays, interval=interval)
    mover.start()
    _active = delays
    return mover


def strategy(task: Any, app: Any, consumer: Any, **kwargs: Any) -> Callable:
    """Celery's default strategy, except that on Redis an ETA message is parked (module docstring).

    Only when this worker runs a mover: a message parked where nothing moves it would never run.
    """
    handle = compat.default_strategy()(task, app, consumer, **kwargs)
    delays = _active
    if delays is None:
        return handle
    connection_errors = consumer.connection_errors
    timezone = app.timezone

    def task_message_handler(message, body, ack, reject, callbacks, **options):
        eta = due_time(message.headers, default_timezone=timezone)
        if eta is None or eta <= delays.clock():
            return handle(message, body, ack, reject, callbacks, **options)
        try:
            delays.park(message, eta)
        except Exception as exc:  # noqa: BLE001 - hold it as Celery would rather than lose it
            logger.warning("taskherd: could not park delayed %s[%s] (%s); the worker holds it until %s",
                           task.name, message.headers.get("id"), exc, message.headers.get("eta"))
            return handle(message, body, ack, reject, callbacks, **options)
        ack(logger, connection_errors)
        return None

    return task_message_handler
