"""Fast recovery on Redis: a dead worker's unacknowledged messages return in seconds, not an hour.

On Redis, kombu emulates acknowledgements: a delivered message sits in the hash ``unacked`` until
acked, and only ``visibility_timeout`` (3600 s by default) after its delivery does some worker's
periodic sweep put it back. Nothing records WHICH worker holds it. This module adds that:

- **The pop.** kombu waits for a message with BRPOP: from the moment Redis pops it until the
  worker has written kombu's ``unacked`` entry (the next round trip), the message is only in a
  socket buffer and the worker's memory, and a worker killed then loses it for good. So a worker
  pops with ``POP_SCRIPT`` instead: one script pops the next message (kombu's list order) and
  records it as this worker's (``owner``, ``held.<worker>``, kombu's ``unacked`` entries) in the same
  step. Its reply reads like BRPOP's, so kombu and the bad-message guard handle it unchanged. A
  script cannot block: when every list is empty the worker waits with ``BLMOVE first first RIGHT
  RIGHT`` on its first list, which returns when a message arrives without moving it, and pops
  again (on a worker consuming several queues, the others' lists are looked at every
  ``SEVERAL_QUEUES_WAIT_SECONDS`` when idle). Needs Redis >= 6.2 (BLMOVE); older servers keep
  kombu's BRPOP and its window, with a warning.
- **Ownership.** ``TrackingQoS`` replaces kombu's Redis QoS in the worker process. Once the
  consumer has the message, it replaces the pop's held record with
  ``held.<worker>[tag] = {destination lists, message}``, where the message is exactly what kombu's
  own restore would push (``redelivered`` set, plus the delivery count + 1 that
  taskherd.worker.deliveries reads) and the destination lists are kombu's (binding lookup,
  priority sub-list, key prefix): one HSET, the pop having written the rest (without atomic pops,
  one MULTI/EXEC writes kombu's ``unacked``/``unacked_index`` entries, ``owner[tag] = worker`` and
  the held record). Ack, reject and kombu's own
  restores remove them again — the ack through a Lua script that only deletes kombu's entries if
  this worker still owns the delivery (a worker whose lease lapsed cannot ack away the entry of
  the worker the message went to next).
- **Lease.** Each worker process keeps ``alive.<worker>`` with a TTL of ``timeout`` (4 s),
  refreshed every ``heartbeat_interval`` (1 s) by one script that also registers it in the set
  ``workers`` and records when the lease runs out in the sorted set ``expiry`` (Redis's own clock).
- **Restorer.** Every live worker, every ``heartbeat_interval``, asks ``expiry`` for the workers
  whose lease ran out (one call, however many workers there are; every minute it looks at every
  registered worker instead) and runs ``RESTORE_SCRIPT`` for each: in one atomic script it
  re-checks the lease, RPUSHes each still-unacked message it owns to its queue list(s) (the
  consuming end, as kombu's restore does), deletes kombu's entries, and forgets the worker. Two
  restorers racing restore nothing twice: the second finds the worker already forgotten.
  ``taskherd recover`` does the same standalone.

Target: SIGKILL of a whole worker → its task runs elsewhere about ``timeout`` later (at most
``timeout`` + one restorer period: 5 s with the defaults) instead of ``visibility_timeout``, for
two script calls a second per worker (bench/pod_kill.py, bench/redelivery.py).

The lease is refreshed by a daemon thread of the worker's main process, not by the event loop:
with the solo or threads pool a long task blocks the loop, and a lease tied to it would lapse
under a live, busy worker and run its task twice. A process whose main loop is wedged therefore
keeps its lease; the heartbeat-file liveness probe restarts it, and then its lease lapses.
Like any lease, a process frozen (SIGSTOP, a network partition from Redis, starved of CPU) for
longer than ``timeout`` is treated as dead: its messages run elsewhere and, if it comes back, the
fenced ack keeps kombu's bookkeeping right, but its own run is a second one (the idempotency
guard's case). When a whole node stalls, every lease on it lapses at once: a restorer whose own
refreshes were late (:func:`stalled`) waits a full lease period before restoring anyone, so the
workers of a node that froze together do not take each other's tasks. Kombu's visibility-timeout
sweep stays in place as the fallback for anything not tracked.

A live worker can strand deliveries too: when its broker connection drops, Celery gives up every
message delivered on it (their acks are refused after a connection loss, their tasks cancelled)
and kombu pushes them back as the channel closes — which fails when Redis itself is what went
away (a restart, a failover). They would then wait in ``unacked``, owned by a lease that stays
alive, for the visibility timeout. So when that give-back fails, the worker takes a new identity
for its next deliveries and hands the old one's to its lease thread, which restores them as soon
as Redis answers again (``Lease.adopt``).
"""
from __future__ import annotations

import atexit
import json
import logging
import os
import threading
import time
import uuid
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import redis

from taskherd import compat
from taskherd.contract import broker_kind, shown

from .. import deliveries

from . import Component, is_seconds, too_long

logger = logging.getLogger(__name__)

KEY_NAMESPACE = "taskherd.recovery."
WORKERS_KEY = KEY_NAMESPACE + "workers"
#: sorted set: worker id -> when its lease runs out (Redis server time, ms): a restorer pass asks
#: only for the lapsed ones, whatever the number of workers
EXPIRY_KEY = KEY_NAMESPACE + "expiry"
OWNER_KEY = KEY_NAMESPACE + "owner"
UNACKED_KEY = "unacked"  # kombu.transport.redis.Channel defaults
UNACKED_INDEX_KEY = "unacked_index"
#: hash: delivery tag -> kombu's unacked entry that could be neither read nor restored from its
#: holder's record (kept for an operator rather than dropped, or restored again on every sweep)
UNRESTORABLE_KEY = KEY_NAMESPACE + "unrestorable"


#: Defaults (bench/pod_kill.py, docs/benchmarks.md): a killed worker's task runs again after about
#: ``timeout`` (median), at most ``timeout + heartbeat_interval``; a live worker keeps its lease
#: through ``timeout - heartbeat_interval`` seconds without a refresh (a stalled thread, a Redis
#: blip). Each refresh and each restorer pass is one script call: about two commands a second.
DEFAULT_HEARTBEAT_INTERVAL = 1.0
DEFAULT_TIMEOUT = 4.0


def alive_key(worker_id: str) -> str:
    return f"{KEY_NAMESPACE}alive.{worker_id}"


def held_key(worker_id: str) -> str:
    return f"{KEY_NAMESPACE}held.{worker_id}"


@dataclass(frozen=True, kw_only=True)
class FastRecovery(Component):
    """Redis only: a killed worker's unacknowledged messages return in seconds (module docstring).

    On other brokers it does nothing: a closed AMQP connection requeues on its own. Producers that
    install it are unaffected: its bootstep only runs inside ``celery worker``.
    """

    environment = {"TASKHERD_RECOVERY_HEARTBEAT_INTERVAL": "heartbeat_interval",
                   "TASKHERD_RECOVERY_TIMEOUT": "timeout"}

    #: seconds between lease refreshes, and between restorer passes
    heartbeat_interval: float = DEFAULT_HEARTBEAT_INTERVAL
    #: seconds without a refresh after which a worker is dead and its messages are restored
    timeout: float = DEFAULT_TIMEOUT

    def problems(self) -> list[str]:
        if not (is_seconds(self.heartbeat_interval) and self.heartbeat_interval > 0):
            return [f"FastRecovery(heartbeat_interval={shown(self.heartbeat_interval)}) must be > 0 seconds"]
        # bounded as their variables are: the lease thread waits heartbeat_interval on an Event, and
        # Event.wait(1e10) raises OverflowError there; a lease of a week recovers nothing in time
        problem = too_long("FastRecovery(heartbeat_interval", self.heartbeat_interval)
        if problem:
            return problem
        if not (is_seconds(self.timeout) and self.timeout >= 2 * self.heartbeat_interval):
            return [f"FastRecovery(timeout={shown(self.timeout)}) must be at least twice heartbeat_interval="
                    f"{self.heartbeat_interval!r} (>= {2 * self.heartbeat_interval!r} s), so that one late "
                    f"refresh does not declare a live worker dead"]
        return too_long("FastRecovery(timeout", self.timeout, minimum=f"{2 * self.heartbeat_interval!r} <=")

    @property
    def expected_recovery_seconds(self) -> float:
        """Worst case from SIGKILL to the message being back on its queue."""
        return self.timeout + self.heartbeat_interval

    def install(self, app: Any, profile: Any = None) -> None:
        visibility_timeout = getattr(profile, "visibility_timeout", None)
        if visibility_timeout and self.expected_recovery_seconds >= visibility_timeout:
            warnings.warn(f"recovery timeout={self.timeout!r} + heartbeat_interval={self.heartbeat_interval!r} "
                          f"is not below visibility_timeout={visibility_timeout!r}: kombu's sweep would redeliver "
                          f"first and fast recovery would never act", stacklevel=2)
        from celery import bootsteps

        settings = self

        class FastRecoveryStep(bootsteps.StartStopStep):
            """Started before the consumer, so the lease exists before anything is delivered."""

            label = "taskherd fast recovery"

            def start(self, worker):
                broker_url = first_broker_url(worker.app)
                if broker_kind(broker_url) != "redis":
                    return
                if broker_url.lower().startswith("sentinel"):
                    logger.warning("taskherd recovery: Redis Sentinel brokers are not supported; unacked messages "
                                   "of a killed worker wait for visibility_timeout")
                    return
                activate(broker_url=broker_url, hostname=worker.hostname, settings=settings,
                         prefix=key_prefix(worker.app))

        app.steps["worker"].add(FastRecoveryStep)


# KEYS: owner, held.<me>, unacked, unacked_index. ARGV: tag, me.
# Deletes kombu's entries unless another worker owns the delivery now (our lease lapsed, the
# message was restored and redelivered): that entry is theirs.
ACK_SCRIPT = """
local owner = redis.call('HGET', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
if owner == ARGV[2] then redis.call('HDEL', KEYS[1], ARGV[1]) end
if owner == false or owner == ARGV[2] then
  redis.call('ZREM', KEYS[4], ARGV[1])
  redis.call('HDEL', KEYS[3], ARGV[1])
  return 1
end
return 0
"""

# KEYS: held.<me>. ARGV: tag, record. The held record of a delivery POP_SCRIPT recorded, replaced
# by the one a restore must push (marked redelivered, its count + 1: TrackingQoS.append). A script
# rather than HSET so that it runs on the same connection as ACK_SCRIPT (taskherd.worker.idempotency.scripts).
HOLD_SCRIPT = """
return redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
"""

# KEYS: alive.<w>, held.<w>, owner, unacked, unacked_index, workers, expiry. ARGV: w.
# Returns -1 if the worker is alive (nothing done), else the number of messages restored.
# Queue list keys come from the held records (computed by kombu's own lookup at delivery time);
# they are not in KEYS, which kombu's Redis transport (no cluster support) does not need.
RESTORE_SCRIPT = """
if redis.call('EXISTS', KEYS[1]) == 1 then return -1 end
local entries = redis.call('HGETALL', KEYS[2])
local restored = 0
for i = 1, #entries, 2 do
  local tag, record = entries[i], entries[i + 1]
  if redis.call('HGET', KEYS[3], tag) == ARGV[1] then
    redis.call('HDEL', KEYS[3], tag)
    if redis.call('HEXISTS', KEYS[4], tag) == 1 then
      local held = cjson.decode(record)
      for _, list in ipairs(held['lists']) do redis.call('RPUSH', list, held['message']) end
      redis.call('HDEL', KEYS[4], tag)
      redis.call('ZREM', KEYS[5], tag)
      restored = restored + 1
    end
  end
end
redis.call('DEL', KEYS[2])
redis.call('SREM', KEYS[6], ARGV[1])
redis.call('ZREM', KEYS[7], ARGV[1])
return restored
"""

# KEYS: owner, held.<w>, unacked, unacked_index, then the queue lists in kombu's BRPOP order.
# ARGV: w, now (seconds). Returns BRPOP's reply ({list, item}, or nil when every list is empty)
# with the delivery already recorded as w's: kombu's unacked entry and index (what kombu's append
# writes), and the held record restoring pushes back — the item as it was popped, to the list it
# came from (it never reached a task: not a redelivery). An item without a delivery tag (not a
# kombu message; an empty tag counts as none) is returned untracked: the bad-message guard
# dead-letters it at once. With ARGV[3] (any value) the reply of a recorded item carries the tag it
# was recorded under as a third element: {list, item, tag}. The worker's guard acknowledges a
# replacement under that very tag, whatever Python's own parser makes of the item (one too deeply
# nested for it, say), so that no record of the pop outlives its acknowledgement.
POP_SCRIPT = """
local function text(v) if type(v) == 'string' then return v end return '' end
for i = 5, #KEYS do
  local item = redis.call('RPOP', KEYS[i])
  if item then
    local ok, message = pcall(cjson.decode, item)
    local properties = ok and type(message) == 'table' and message['properties']
    local tag = type(properties) == 'table' and properties['delivery_tag']
    if type(tag) == 'string' and tag ~= '' then
      local info = properties['delivery_info']
      if type(info) ~= 'table' then info = {} end
      redis.call('HSET', KEYS[1], tag, ARGV[1])
      redis.call('HSET', KEYS[2], tag, cjson.encode({lists = {KEYS[i]}, message = item}))
      redis.call('HSET', KEYS[3], tag, '[' .. item .. ',' .. cjson.encode(text(info['exchange'])) .. ',' ..
                 cjson.encode(text(info['routing_key'])) .. ']')
      redis.call('ZADD', KEYS[4], ARGV[2], tag)
      if ARGV[3] then return {KEYS[i], item, tag} end
    end
    return {KEYS[i], item}
  end
end
return false
"""

# KEYS: alive.<w>, workers, expiry. ARGV: record, timeout ms, w. Returns the previous record (nil
# when the lease had lapsed). The expiry is the server's clock: no worker's clock is compared with
# another's.
REFRESH_SCRIPT = """
local now = redis.call('TIME')
local previous = redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2], 'GET')
redis.call('SADD', KEYS[2], ARGV[3])
redis.call('ZADD', KEYS[3], now[1] * 1000 + math.floor(now[2] / 1000) + tonumber(ARGV[2]), ARGV[3])
return previous
"""

# KEYS: expiry. ARGV: limit. The workers whose lease ran out (server time), at most `limit`.
LAPSED_SCRIPT = """
local now = redis.call('TIME')
return redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now[1] * 1000 + math.floor(now[2] / 1000), 'LIMIT', 0,
                  tonumber(ARGV[1]))
"""


class Keys:
    """Fully prefixed key names (kombu's ``global_keyprefix`` applies to ours too)."""

    def __init__(self, prefix: str = ""):
        self.prefix = prefix

    def __call__(self, name: str) -> str:
        return self.prefix + name

    def restore_keys(self, worker_id: str) -> list[str]:
        return [self(alive_key(worker_id)), self(held_key(worker_id)), self(OWNER_KEY),
                self(UNACKED_KEY), self(UNACKED_INDEX_KEY), self(WORKERS_KEY), self(EXPIRY_KEY)]


def restore_worker(client: redis.Redis, worker_id: str, *, prefix: str = "") -> int:
    """Restores ``worker_id``'s unacked messages if its lease is gone: count, or -1 if alive."""
    return int(client.register_script(RESTORE_SCRIPT)(keys=Keys(prefix).restore_keys(worker_id), args=[worker_id]))


def restore_dead_workers(client: redis.Redis, *, prefix: str = "", exclude: Iterable[str] = ()) -> dict[str, int]:
    """A full restorer pass: worker id → messages restored, for each registered worker found dead
    (every registered worker is looked at: `taskherd recover`, and a live worker now and then)."""
    keys = Keys(prefix)
    excluded = set(exclude)
    workers = [w.decode() if isinstance(w, bytes) else w for w in client.smembers(keys(WORKERS_KEY))]
    workers = [w for w in workers if w not in excluded]
    if not workers:
        return {}
    with client.pipeline(transaction=False) as pipe:
        for worker_id in workers:
            pipe.exists(keys(alive_key(worker_id)))
        alive = pipe.execute()
    return _restore(client, [w for w, is_alive in zip(workers, alive) if not is_alive], prefix=prefix)


def restore_lapsed_workers(client: redis.Redis, *, prefix: str = "", exclude: Iterable[str] = (),
                           lapsed: Callable[..., Any] | None = None) -> dict[str, int]:
    """The restorer pass of every interval: only the workers whose lease ran out, found in the
    expiry index in one call (nothing else is read, however many workers there are)."""
    keys = Keys(prefix)
    lapsed = lapsed or client.register_script(LAPSED_SCRIPT)
    excluded = set(exclude)
    workers = [w.decode() if isinstance(w, bytes) else w for w in lapsed(keys=[keys(EXPIRY_KEY)], args=[100])]
    return _restore(client, [w for w in workers if w not in excluded], prefix=prefix)


def _restore(client: redis.Redis, workers: list[str], *, prefix: str) -> dict[str, int]:
    restored = {}
    for worker_id in workers:
        count = restore_worker(client, worker_id, prefix=prefix)
        if count >= 0:  # -1: it refreshed its lease since we looked
            restored[worker_id] = count
    return restored


def may_restore(*, now: float, redis_healthy_since: float | None, timeout: float) -> bool:
    """Whether this worker may act as a restorer now (monotonic clock).

    Only after a full lease period of talking to Redis without error: after a Redis outage every
    lease may have lapsed, and the first worker back must give the others time to renew theirs
    before it takes their leases' absence for their death. A new worker waits the same way.
    """
    return redis_healthy_since is not None and now - redis_healthy_since >= timeout


def stalled(*, previous: float | None, now: float, interval: float) -> bool:
    """Whether the lease thread's refreshes were further apart than two intervals (monotonic
    clock): a thread that was itself not scheduled must not trust the silence of the others."""
    return previous is not None and now - previous > 2 * interval


#: A restorer pass that looks at every registered worker, every this many passes (the others ask
#: the expiry index only).
FULL_PASS_EVERY = 60


class Lease(threading.Thread):
    """Keeps this worker's lease alive and restores dead workers' messages, every interval."""

    def __init__(self, *, client: redis.Redis, worker_id: str, settings: FastRecovery, prefix: str = "",
                 clock: Callable[[], float] = time.time):
        super().__init__(name="taskherd-recovery-lease", daemon=True)
        self.client = client
        self.worker_id = worker_id
        self.settings = settings
        self.keys = Keys(prefix)
        self.clock = clock
        self._stopped = threading.Event()
        self._held_once = False
        self._pid = os.getpid()  # atexit handlers are inherited by forked pool children
        self._redis_healthy_since: float | None = None
        self._refresh = client.register_script(REFRESH_SCRIPT)
        self._lapsed = client.register_script(LAPSED_SCRIPT)
        self._passes = 0
        self._lock = threading.Lock()
        #: identities this process gave up, whose deliveries are still to be restored
        self._abandoned: list[str] = []

    def adopt(self, worker_id: str) -> str:
        """Keep the lease of `worker_id` from now on and give back, on the next pass that reaches
        Redis, every delivery still held under the identity it replaces (returned): its lease is
        dropped and RESTORE_SCRIPT run for it, at once rather than after its timeout, since this
        process knows that identity will never ack."""
        with self._lock:
            old, self.worker_id = self.worker_id, worker_id
            self._abandoned.append(old)
            self._held_once = False
        return old

    def give_back_abandoned(self) -> int:
        with self._lock:
            pending = list(self._abandoned)
        total = 0
        for old in pending:
            self.client.delete(self.keys(alive_key(old)))
            count = restore_worker(self.client, old, prefix=self.keys.prefix)
            with self._lock:
                self._abandoned.remove(old)
            total += max(count, 0)
            logger.warning("taskherd recovery: gave back %d message(s) delivered to %s before its broker connection "
                           "was lost", max(count, 0), old)
        return total

    def refresh(self) -> None:
        record = json.dumps({"pid": os.getpid(), "refreshed_at": self.clock()})
        previous = self._refresh(keys=[self.keys(alive_key(self.worker_id)), self.keys(WORKERS_KEY),
                                       self.keys(EXPIRY_KEY)],
                                 args=[record, int(self.settings.timeout * 1000), self.worker_id])
        if previous is None and self._held_once:
            logger.warning("taskherd recovery: the lease of %s had lapsed (no refresh for %.0f s); other workers may "
                           "have restored its messages", self.worker_id, self.settings.timeout)
        self._held_once = True

    def restore_others(self) -> dict[str, int]:
        # Every FULL_PASS_EVERY passes, every registered worker is looked at too: one registered
        # by a version without the expiry index, or whose entry there was lost.
        self._passes += 1
        if self._passes % FULL_PASS_EVERY == 0:
            restored = restore_dead_workers(self.client, prefix=self.keys.prefix, exclude=[self.worker_id])
        else:
            restored = restore_lapsed_workers(self.client, prefix=self.keys.prefix, exclude=[self.worker_id],
                                              lapsed=self._lapsed)
        for worker_id, count in restored.items():
            logger.warning("taskherd recovery: worker %s lost its lease; restored %d unacked message(s)",
                           worker_id, count)
        return restored

    def run(self) -> None:
        refreshed_at: float | None = None
        while not self._stopped.is_set():
            started = time.monotonic()
            try:
                self.refresh()
                if stalled(previous=refreshed_at, now=time.monotonic(), interval=self.settings.heartbeat_interval):
                    # This thread was not scheduled for a while: the whole node may have been
                    # (CPU starvation, a freeze). Others' leases may have lapsed for the same reason:
                    # give them a full lease period to refresh before taking silence for death.
                    self._redis_healthy_since = None
                refreshed_at = time.monotonic()
                if self._abandoned:
                    self.give_back_abandoned()
                if self._redis_healthy_since is None:
                    self._redis_healthy_since = time.monotonic()
                # Half an interval of slack: the pass that falls on the boundary must not miss it by
                # a millisecond and wait a whole interval more.
                if may_restore(now=time.monotonic() + self.settings.heartbeat_interval / 2,
                               redis_healthy_since=self._redis_healthy_since, timeout=self.settings.timeout):
                    self.restore_others()
            except redis.RedisError as exc:
                self._redis_healthy_since = None
                logger.warning("taskherd recovery: Redis error (%s); retrying in %.1f s", exc,
                               self.settings.heartbeat_interval)
            self._stopped.wait(max(0.0, self.settings.heartbeat_interval - (time.monotonic() - started)))

    def release(self) -> None:
        """At process exit: drop the lease and give back whatever is still held, at once."""
        if os.getpid() != self._pid:
            return
        self._stopped.set()
        try:
            self.client.delete(self.keys(alive_key(self.worker_id)))
            restore_worker(self.client, self.worker_id, prefix=self.keys.prefix)
        except redis.RedisError as exc:
            logger.warning("taskherd recovery: could not release the lease of %s (%s); it expires in %.0f s",
                           self.worker_id, exc, self.settings.timeout)


#: An idle worker consuming several queues waits on the first one's list and looks at all of them
#: again this often (a script cannot block, BLMOVE waits on one list): the most a message on
#: another queue waits for an idle worker. One queue: kombu's own BRPOP timeout.
SEVERAL_QUEUES_WAIT_SECONDS = 0.1

#: seconds before a worker whose pop Redis refused asks again
POP_REFUSED_RETRY_SECONDS = 1.0

#: BLMOVE, which waits without taking the message, came with Redis 6.2
ATOMIC_POPS_SINCE = (6, 2)


def _pop_start(channel: Any, kombus_start: Callable[..., Any], timeout: float | None = None) -> None:
    """In place of kombu's BRPOP: POP_SCRIPT, or after an empty pop the wait for the first list."""
    tracker = _installed_tracker
    if tracker is None:
        channel._taskherd_sent = None
        return kombus_start(channel, timeout)
    lists = compat.redis_consumed_lists(channel)
    if not lists:
        return None
    if time.monotonic() < getattr(channel, "_taskherd_refused_until", 0.0):
        return None  # Redis refused the last pop: kombu asks again on a later tick
    keys = tracker.keys
    if getattr(channel, "_taskherd_sent", None) == "pop-empty":
        first = keys(lists[0])
        several = len(channel.active_queues) > 1
        wait = SEVERAL_QUEUES_WAIT_SECONDS if several else compat.redis_brpop_timeout(channel, timeout)
        channel._taskherd_sent = "wait"
        return compat.redis_send_poll(channel, "BLMOVE", first, first, "RIGHT", "RIGHT", wait)
    channel._taskherd_sent = "pop"
    return compat.redis_send_poll(
        channel, "EVAL", POP_SCRIPT, 4 + len(lists), keys(OWNER_KEY), keys(held_key(tracker.worker_id)),
        keys(UNACKED_KEY), keys(UNACKED_INDEX_KEY), *(keys(name) for name in lists), tracker.worker_id,
        repr(time.time()), "tag")


def _pop_read(channel: Any, kombus_read: Callable[..., Any], **options: Any) -> Any:
    """Reads what _pop_start sent. A pop's reply is delivered as kombu delivers BRPOP's
    (:func:`_as_brpop_reply`); a wait's reply only means "pop again"."""
    from queue import Empty

    sent = getattr(channel, "_taskherd_sent", None)
    if sent not in ("wait", "pop"):
        return kombus_read(channel, **options)
    try:
        # A pop's reply is read as the script's ("EVAL"): not through the client's BRPOP handling
        # (prefix stripping, the bad-message guard), which knows nothing of the recorded tag.
        reply = compat.redis_read_poll(channel, "BLMOVE" if sent == "wait" else "EVAL", **options)
    except channel.connection_errors:
        if sent == "pop":
            # The reply may have carried a message, now recorded as ours and read by nobody: this
            # identity's deliveries go back through the lease (kombu gives back those it knows of
            # when the channel closes; this one it never saw).
            abandon_identity()
        raise
    except redis.ResponseError as exc:
        # The pop or the wait was refused (a full noeviction Redis refuses a wait, which may grow
        # memory; scripting disabled): the message stays on its list, where it is safe, and the
        # worker asks again in a second.
        channel._taskherd_sent = "waited"
        channel._taskherd_refused_until = time.monotonic() + POP_REFUSED_RETRY_SECONDS
        logger.warning("taskherd recovery: Redis refused to pop (%s); trying again in %.0f s", exc,
                       POP_REFUSED_RETRY_SECONDS)
        raise Empty() from exc
    if sent == "wait":
        channel._taskherd_sent = "waited"
        raise Empty()
    if not reply:
        channel._taskherd_sent = "pop-empty"
        raise Empty()
    return compat.redis_deliver_popped(channel, _as_brpop_reply(channel, reply))


def _as_brpop_reply(channel: Any, reply: Any) -> tuple[str, Any]:
    """POP_SCRIPT's reply ({list, item} or {list, item, recorded tag}) as kombu's client would
    have returned BRPOP's: the list key without the global_keyprefix, and the item through the
    bad-message guard when the worker has it (taskherd.worker.redis_items) — an item kombu cannot
    deliver is replaced by a message under the tag the pop recorded it under, so that its
    acknowledgement clears that record, whatever Python's parser makes of the item."""
    from kombu.utils.encoding import bytes_to_str

    list_key, item = reply[0], reply[1]
    recorded_tag = bytes_to_str(reply[2]) if len(reply) > 2 else None
    key = bytes_to_str(list_key)
    tracker = _installed_tracker
    prefix = tracker.keys.prefix if tracker is not None else ""
    if prefix and key.startswith(prefix):
        key = key[len(prefix):]
    guard = compat.redis_item_guard()  # the BadMessages component's, when installed
    if guard is not None:
        item = guard(item, key, recorded_tag=recorded_tag)
    return key, item


def pops_atomically(redis_version: str) -> bool:
    """Whether a Redis server of this version has what POP_SCRIPT's wait needs (BLMOVE)."""
    try:
        return tuple(int(part) for part in redis_version.split(".")[:2]) >= ATOMIC_POPS_SINCE
    except ValueError:
        return False


class Destinations:
    """The Redis lists kombu's own restore would push a delivered message back to (binding lookup,
    priority sub-list, key prefix), cached briefly: bindings rarely change, and the cache saves one
    SMEMBERS per delivery."""

    def __init__(self, keys: Keys):
        self.keys = keys
        self._cache: dict[tuple[str, str, int], tuple[float, list[str]]] = {}

    def of(self, channel: Any, message: Any) -> list[str]:
        delivery = message.delivery_info
        priority = channel._get_message_priority(message._raw, reverse=False)
        key = (delivery["exchange"], delivery["routing_key"], priority)
        now = time.monotonic()
        cached = self._cache.get(key)
        if cached and now - cached[0] < 30:
            return cached[1]
        lists = [self.keys(channel._q_for_pri(queue, priority))
                 for queue in channel._lookup(delivery["exchange"], delivery["routing_key"])]
        self._cache[key] = (now, lists)
        return lists


class Tracker:
    """This process's identity and key names, used by TrackingQoS."""

    def __init__(self, *, worker_id: str, prefix: str = ""):
        self.worker_id = worker_id
        self.keys = Keys(prefix)
        self.destinations = Destinations(self.keys)

    def held_record(self, channel: Any, message: Any) -> str:
        """JSON of what restoring this delivery pushes, and where (kombu's restore, precomputed):
        the message marked redelivered and carrying its delivery count + 1 (taskherd.worker.deliveries)."""
        payload = returned(_copy_of_what_returned_changes(message._raw))  # the consumer keeps reading the original
        # kombu's JSON for the message: kombu decoded it with it, so its headers may hold what only
        # it writes back (a datetime eta/expires, from the __type__ marker), which json.dumps refuses
        # — in the consumer, where that would end the worker.
        from kombu.utils.json import dumps as kombu_dumps

        return json.dumps({"lists": self.destinations.of(channel, message), "message": kombu_dumps(payload)})


def _copy_of_what_returned_changes(raw: Any) -> Any:
    """A copy of kombu's message deep enough for :func:`returned` (the payload, its properties and
    their delivery info; the headers it replaces itself): a JSON round trip of the whole message,
    body included, cost more than the rest of the delivery's bookkeeping."""
    if not isinstance(raw, dict):
        return raw
    payload = dict(raw)
    properties = payload.get("properties")
    if isinstance(properties, dict):
        payload["properties"] = properties = dict(properties)
        info = properties.get("delivery_info")
        if isinstance(info, dict):
            properties["delivery_info"] = dict(info)
    return payload


def returned(payload: Any) -> Any:
    """kombu's Redis message ``payload`` as it goes back to its queue: redelivered, with the
    delivery count of its attempt + 1 in its headers (taskherd.worker.deliveries)."""
    try:
        payload["headers"] = deliveries.returned_headers(payload["headers"])
        payload["headers"]["redelivered"] = True
        payload["properties"]["delivery_info"]["redelivered"] = True
    except (KeyError, TypeError, AttributeError):
        pass  # not a task message taskherd knows: restored as kombu would
    except Exception:  # noqa: BLE001 - this runs in the main process: a message must not end the worker
        # returned_headers reads every header leniently; should a value still defeat it, the
        # message goes back uncounted (the message checks then judge it) rather than stop consuming.
        logger.exception("taskherd: could not count a return of a message; it goes back to its queue uncounted")
    return payload


def _tracking_qos_class():
    from kombu.transport import virtual
    from kombu.utils.json import dumps, loads
    from kombu.utils.encoding import bytes_to_str

    class TrackingQoS(compat.redis_qos_base()):
        """kombu's Redis QoS, also recording which worker holds each delivery (see module doc)."""

        tracker: Tracker | None = None

        def _scripts(self) -> tuple[Callable[..., Any], Callable[..., Any]]:
            """(ack, hold): ACK_SCRIPT and HOLD_SCRIPT, sent on a connection of this thread's own
            from the channel's pool (taskherd.worker.idempotency.scripts: redis-py's per-command
            machinery cost more CPU than the command itself). Not kombu's prefixed client: it
            prefixes only the first key of EVALSHA, and ours are prefixed already."""
            scripts = getattr(self, "_taskherd_scripts", None)
            if scripts is None:
                from ..idempotency.scripts import Scripts

                registry = Scripts(redis.Redis(connection_pool=self.channel.pool))
                scripts = self._taskherd_scripts = (registry.register(ACK_SCRIPT), registry.register(HOLD_SCRIPT))
            return scripts

        def append(self, message, delivery_tag):
            tracker = self.tracker
            if tracker is None:
                return super().append(message, delivery_tag)
            record = tracker.held_record(self.channel, message)
            if getattr(self.channel, "_taskherd_sent", None) == "pop":
                # POP_SCRIPT already wrote kombu's unacked entry and index and the owner, exactly
                # as below: only the held record changes (what a restore pushes back, now with the
                # delivery count + 1). One command instead of a five-command MULTI/EXEC.
                try:
                    self._scripts()[1](keys=[tracker.keys(held_key(tracker.worker_id))], args=[delivery_tag, record])
                except redis.ResponseError as exc:
                    # A full noeviction Redis refusing this update must not strand the delivery:
                    # its pop recorded it (only the record a restore pushes back stays the message
                    # as popped, its delivery count not yet raised).
                    logger.warning("taskherd recovery: Redis refused to update the record of delivery %s (%s); "
                                   "its pop recorded it", delivery_tag, exc)
                virtual.QoS.append(self, message, delivery_tag)
                return
            delivery = message.delivery_info
            # kombu's BRPOP (Redis < 6.2) recorded nothing: one MULTI/EXEC writes kombu's entries
            # and ours (an error raises: kombu's own bookkeeping would have failed too)
            with self.pipe_or_acquire() as pipe:
                pipe.zadd(self.unacked_index_key, {delivery_tag: time.time()}) \
                    .hset(self.unacked_key, delivery_tag,
                          dumps([message._raw, delivery["exchange"], delivery["routing_key"]])) \
                    .hset(OWNER_KEY, delivery_tag, tracker.worker_id) \
                    .hset(held_key(tracker.worker_id), delivery_tag, record) \
                    .execute()
                virtual.QoS.append(self, message, delivery_tag)

        def _fenced_remove(self, delivery_tag) -> None:
            tracker = self.tracker
            keys = tracker.keys
            self._scripts()[0](keys=[keys(OWNER_KEY), keys(held_key(tracker.worker_id)),
                                     keys(self.unacked_key), keys(self.unacked_index_key)],
                               args=[delivery_tag, tracker.worker_id])

        def ack(self, delivery_tag):
            if self.tracker is None:
                return super().ack(delivery_tag)
            self._fenced_remove(delivery_tag)
            virtual.QoS.ack(self, delivery_tag)

        def reject(self, delivery_tag, requeue=False):
            if self.tracker is None:
                return super().reject(delivery_tag, requeue=requeue)
            if requeue:
                self.restore_by_tag(delivery_tag, leftmost=True)
            else:
                self._fenced_remove(delivery_tag)
            virtual.QoS.ack(self, delivery_tag)

        def restore_unacked(self, client=None):
            """The channel closes (the connection was lost, or the worker stops): kombu pushes back
            what it delivered. When Redis cannot take them (it is what went away), this worker's
            identity is abandoned instead: the lease thread restores them once Redis answers."""
            if self.tracker is None:
                return super().restore_unacked(client)
            try:
                return super().restore_unacked(client)
            except (redis.RedisError, OSError):
                abandon_identity()
                raise

        def restore_by_tag(self, tag, client=None, leftmost=False):
            if self.tracker is None:
                return super().restore_by_tag(tag, client=client, leftmost=leftmost)

            unreadable: list[Any] = []  # (why, where it went): logged once, after the transaction

            def restore_transaction(pipe):
                unreadable.clear()  # the function runs again when a watched key changed
                payload = pipe.hget(self.unacked_key, tag)
                owner = pipe.hget(OWNER_KEY, tag)
                entry = held = None
                if payload:
                    try:
                        message, exchange, routing_key = loads(bytes_to_str(payload))
                        entry = message, exchange, routing_key
                    except Exception as exc:  # noqa: BLE001 - one entry must not stop kombu's sweep of the others
                        # kombu's unacked entry of a pop is the item as Redis's parser read it,
                        # which Python's may not (nested too deep, say): the holder's record
                        # (JSON that any parser reads) says what to push back, and where.
                        held = pipe.hget(held_key(bytes_to_str(owner)), tag) if owner else None
                        unreadable.append(f"{type(exc).__name__}: {str(exc)[:120]}")
                pipe.multi()
                self._remove_from_indices(tag, pipe)
                if owner:  # whoever held it, it is back on the queue now
                    pipe.hdel(OWNER_KEY, tag)
                    pipe.hdel(held_key(bytes_to_str(owner)), tag)
                if entry is not None:
                    message, exchange, routing_key = entry
                    self.channel._do_restore_message(returned(message), exchange, routing_key, pipe, leftmost)
                elif payload:
                    lists = _push_held_record(pipe, held, prefix=self.tracker.keys.prefix, leftmost=leftmost)
                    if lists is None:  # nothing says where it goes: kept aside, never dropped
                        pipe.hset(UNRESTORABLE_KEY, tag, payload)
                    unreadable.append(lists)

            with self.channel.conn_or_acquire(client) as client:
                client.transaction(restore_transaction, self.unacked_key, OWNER_KEY)
            if unreadable:
                why, lists = unreadable
                logger.warning("taskherd recovery: the unacked entry of delivery %r cannot be read (%s); %s",
                               bytes_to_str(tag), why,
                               f"restored from its holder's record to {', '.join(lists)}" if lists else
                               f"kept in the hash {self.tracker.keys(UNRESTORABLE_KEY)}")

    return TrackingQoS


def _push_held_record(pipe: Any, held: Any, *, prefix: str, leftmost: bool) -> list[str] | None:
    """Queues on ``pipe`` (kombu's, which adds the key prefix) the pushes a held record describes
    (``{"lists": [...], "message": "..."}``, full key names); the lists, or None when ``held`` is
    missing or not such a record."""
    try:
        record = json.loads(held)
        lists, message = record["lists"], record["message"]
        if not (isinstance(lists, list) and lists and all(isinstance(name, str) for name in lists)
                and isinstance(message, str)):
            return None
    except Exception:  # noqa: BLE001 - no record, or not one of ours
        return None
    for name in lists:
        (pipe.lpush if leftmost else pipe.rpush)(name[len(prefix):] if prefix and name.startswith(prefix) else name,
                                                 message)
    return lists


_installed_lease: Lease | None = None
_installed_tracker: Tracker | None = None


def new_worker_id(hostname: str) -> str:
    return f"{hostname}.{os.getpid()}.{uuid.uuid4().hex[:8]}"


def abandon_identity() -> None:
    """Track the next deliveries under a new identity; the lease thread gives back the old one's."""
    lease, tracker = _installed_lease, _installed_tracker
    if lease is None or tracker is None:
        return
    hostname = tracker.worker_id.rsplit(".", 2)[0]
    tracker.worker_id = new_worker_id(hostname)
    old = lease.adopt(tracker.worker_id)
    logger.warning("taskherd recovery: the broker connection was lost and Redis could not take back the messages "
                   "delivered on it; they go back as soon as it answers (identity %s -> %s)", old, tracker.worker_id)


def activate(*, broker_url: str, hostname: str, settings: FastRecovery, prefix: str = "") -> Lease:
    """In a worker process: start tracking deliveries and keeping the lease (once per process)."""
    global _installed_lease, _installed_tracker
    if _installed_lease is not None:
        return _installed_lease
    worker_id = new_worker_id(hostname)
    client = redis.Redis.from_url(broker_url, socket_timeout=max(1.0, settings.heartbeat_interval),
                                  socket_connect_timeout=max(1.0, settings.heartbeat_interval))
    lease = Lease(client=client, worker_id=worker_id, settings=settings, prefix=prefix)
    lease.refresh()  # the lease exists before the first delivery is tracked
    qos_class = _tracking_qos_class()
    qos_class.tracker = _installed_tracker = Tracker(worker_id=worker_id, prefix=prefix)
    compat.set_redis_qos_class(qos_class)
    redis_version = str(client.info("server").get("redis_version", "0"))
    if pops_atomically(redis_version):
        compat.wrap_redis_brpop(_pop_start, _pop_read)
    else:
        logger.warning("taskherd recovery: Redis %s has no BLMOVE (6.2+): messages are popped with kombu's "
                       "BRPOP, and a worker killed between a pop and its bookkeeping loses that message",
                       redis_version)
    lease.start()
    atexit.register(lease.release)
    _installed_lease = lease
    logger.info("taskherd recovery: worker %s holds a %.0f s lease refreshed every %.0f s", worker_id,
                settings.timeout, settings.heartbeat_interval)
    return lease


def held_as(delivery_tag: str | None) -> tuple[str, str] | None:
    """In the main process: (tag, this worker's identity) for a delivery it just took, which the
    task's request carries to the pool child (taskherd.worker.task.HELD_AS): the children are
    forked before fast recovery starts, and this identity changes after a lost connection, so a
    child cannot know it. None when fast recovery is not active."""
    tracker = _installed_tracker
    if tracker is None or not delivery_tag:
        return None
    return delivery_tag, tracker.worker_id


def holds(delivery_tag: str | None) -> bool | None:
    """In the main process: whether this worker still owns a delivery it took: False once the
    delivery went back to its queue — this worker's lease lapsed (a partition, a stall) or its
    identity was given up after a lost connection — and another worker may be running it now and
    will have the last word on it (ack, dead-letter). None when fast recovery is not active in
    this process or Redis does not answer: the caller goes on as if it held it."""
    lease, tracker = _installed_lease, _installed_tracker
    if lease is None or tracker is None or not delivery_tag:
        return None
    return _owned_by(lease.client, tracker.keys(OWNER_KEY), delivery_tag, tracker.worker_id)


def child_holds(app: Any, held: Any) -> bool | None:
    """In a pool child: :func:`holds` for the delivery its request carries (:func:`held_as`).
    Answers for the identity the delivery was taken under: one given up after a lost connection
    still counts as holding it until the lease gives its deliveries back."""
    try:
        delivery_tag, holder = held
    except (TypeError, ValueError):
        return None
    client = deliveries.process_client(first_broker_url(app))
    return _owned_by(client, Keys(key_prefix(app))(OWNER_KEY), delivery_tag, holder)


def _owned_by(client: redis.Redis, owner_key: str, delivery_tag: str, holder: str) -> bool | None:
    try:
        owner = client.hget(owner_key, delivery_tag)
    except (redis.RedisError, OSError):
        return None
    return owner is not None and owner.decode() == holder


def key_prefix(app: Any) -> str:
    """kombu's ``global_keyprefix`` of the app's Redis transport, which our keys carry too."""
    return (app.conf.broker_transport_options or {}).get("global_keyprefix", "") or ""


def first_broker_url(app: Any) -> str:
    """The app's broker URL (the first, when several are given for failover)."""
    url = app.conf.broker_url or app.conf.broker_write_url or ""
    return url[0] if isinstance(url, (list, tuple)) else url.split(";")[0]
