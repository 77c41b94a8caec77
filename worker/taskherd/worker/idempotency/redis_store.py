"""Redis store: a `SET NX` state machine, in_progress (with a lease) -> done (with the result).

- The claim is one Lua script: SET NX PX lease, or else return the record and its TTL.
- While the body runs, the store's renewer thread extends the lease every third of it, only if
  the record is still this claim's (compare-and-PEXPIRE), on connections whose socket timeout is
  that third: a Redis that stops answering delays nothing but its own leases.
- On success the record becomes done, kept for `result_ttl_seconds`, only if it is still ours (or
  has expired with nobody taking it, in which case the effect still ran exactly once).
- On an exception the record is deleted (if ours) so that a retry runs the effect again.
- A crashed holder stops renewing; Redis expires its record after the lease; the next claim wins.

A duplicate that finds the key in progress raises `InProgress` (after waiting up to
`wait_seconds`, if asked to). A duplicate that finds it done gets the stored result back.

An effect that is itself a write to the store's Redis can commit WITH the done record:
`claim.in_transaction(lambda pipe: pipe.rpush("ledger", order))` queues it, and the end of the
guard runs it and the done record in one MULTI/EXEC, WATCHing the key — so the effect is applied
exactly when the key becomes done, and not at all if another holder took the key over. For such
effects the gap between "effect committed" and "done record written" does not exist. The commit
is one round trip (`_COMMIT_CHECK`), so such an effect costs the claim and one packet in all.

Redis unreachable: before the effect, `StoreUnavailable` (transient: nothing ran). After the
effect, the done mark is retried briefly and then given up with an error log rather than raised:
raising would make the task retry and, once the lease expires, repeat the effect.
"""
from __future__ import annotations

import contextlib
import dataclasses
import inspect
import logging
import os
import socket
import threading
import time
from typing import Any, Callable, Iterator

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.exceptions import WatchError

from taskherd import compat

from .. import celery_json
from .claim import Claim, InProgress, LeaseLost, StoreUnavailable, unstorable_result, validate_key, validate_seconds
from .records import Action, decide, done_record, in_progress_record, new_token
from .renewer import Renewer
from .scripts import Scripts

logger = logging.getLogger(__name__)

#: Redis failures worth retrying: the server was unreachable or slow, not the command wrong.
_UNREACHABLE = (RedisConnectionError, RedisTimeoutError)
#: Pauses between attempts to write the done mark after the effect ran.
_FINISH_RETRY_DELAYS = (0.05, 0.2, 0.5, 1.0)
#: Leases and result TTLs are sent as milliseconds (PX) in a signed 64-bit integer, which Redis
#: also adds to its clock: a longer one is refused by the command, after the effect for the TTL.
_MAX_SECONDS = 1e15

_CLAIM = """
if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return {1} end
return {0, redis.call('get', KEYS[1]), redis.call('pttl', KEYS[1])}
"""
_RENEW = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) end
return 0
"""
# 1: ours, now done (or already, when a lost reply made us run it twice). 2: our lease had expired
# but nobody took the key: done too. 0: taken over.
_COMPLETE = """
local current = redis.call('get', KEYS[1])
if current == ARGV[1] or current == ARGV[2] then redis.call('set', KEYS[1], ARGV[2], 'PX', ARGV[3]) return 1 end
if not current then redis.call('set', KEYS[1], ARGV[2], 'PX', ARGV[3]) return 2 end
return 0
"""
# The commit's check, sent in one packet between WATCH and MULTI: a key that is not this claim's
# any more is rewritten as it is (its value, then its TTL). That write changes nothing but counts
# as a modification of the watched key — also for the client that watches it — so our own EXEC
# aborts and nothing queued is applied: the one way to make a pipelined transaction depend on what
# the server finds, and it works on every Redis version (SET KEEPTTL would need 6.0).
# 1: ours, or lapsed with nobody taking it (EXEC applies). 2: done by an earlier try whose reply
# was lost. 0: taken over.
_COMMIT_CHECK = """
local current = redis.call('get', KEYS[1])
if current == ARGV[1] or not current then return 1 end
local ttl = redis.call('pttl', KEYS[1])
redis.call('set', KEYS[1], current)
if ttl > 0 then redis.call('pexpire', KEYS[1], ttl) end
if current == ARGV[2] then return 2 end
return 0
"""
_RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end
return 0
"""


@dataclasses.dataclass
class RedisClaim(Claim):
    """A Redis store's claim: also takes effects that commit with the done record."""

    _transactional: list[Callable[[Any], Any]] = dataclasses.field(default_factory=list, repr=False)
    #: raises TypeError when the store's client cannot send the commit (Scripts.require_pipeline)
    _require_commit: Callable[[], None] = dataclasses.field(default=lambda: None, repr=False)

    def in_transaction(self, queue_effects: Callable[[Any], Any]) -> None:
        """``queue_effects(pipeline)`` queues commands on the store's own Redis; they run at the end
        of the guard in the same MULTI/EXEC as the done record (module docstring)."""
        self._check_open("in_transaction")
        if not callable(queue_effects):
            raise TypeError(f"claim.in_transaction(queue_effects): a function given the pipeline, e.g. "
                            f"lambda pipe: pipe.rpush('ledger', order); got a {type(queue_effects).__name__}")
        # Here, not at the commit: raised in the body, it releases the key at once (the commit
        # runs after the body, when a failure could only leave the key to its lease).
        self._require_commit()
        self._transactional.append(queue_effects)


_holder_of_pid: tuple[int, str] = (0, "")


def _holder() -> str:
    """"host:pid" of this process, as records name their holder (looked up once per process)."""
    global _holder_of_pid
    pid = os.getpid()
    if _holder_of_pid[0] != pid:
        _holder_of_pid = (pid, f"{socket.gethostname()}:{pid}")
    return _holder_of_pid[1]


def _seconds(name: str, value: object, minimum: float) -> float:
    return validate_seconds("RedisStore", name, value, minimum, _MAX_SECONDS)


_VALID_CLIENT = ("valid: a synchronous redis-py client: redis.Redis (e.g. redis.Redis.from_url(url)), "
                 "a Sentinel master, or redis.RedisCluster")


def _client(client: object) -> object:
    # The scripts need register_script (clients without a connection pool, such as RedisCluster,
    # run them through it); an asyncio client would hand back coroutines that nothing awaits.
    # The type only, in both errors: a URL passed by mistake would show its password.
    if inspect.iscoroutinefunction(getattr(client, "execute_command", None)):
        # Its class is called Redis too: say which one it is, or "got a Redis" reads as a contradiction.
        kind = type(client)
        raise TypeError(f"RedisStore client= got an asyncio client ({kind.__module__}.{kind.__qualname__}); "
                        f"the store runs in the task's thread and needs a synchronous one; {_VALID_CLIENT}")
    if not callable(getattr(client, "register_script", None)):
        raise TypeError(f"RedisStore client= got a {type(client).__name__}; {_VALID_CLIENT}")
    return client


class RedisStore:
    def __init__(
        self,
        *,
        client,
        prefix: str = "taskherd:idempotency:",
        lease_seconds: float = 30.0,
        result_ttl_seconds: float = 7 * 24 * 3600,
        poll_interval_seconds: float = 0.1,
    ):
        #: a redis.Redis client (thread-safe; the renewer thread shares it)
        self.client = _client(client)
        if not isinstance(prefix, str):
            raise TypeError(f"RedisStore prefix={prefix!r} ({type(prefix).__name__}); valid: a str "
                            "(every key is stored as prefix + key)")
        #: every key is stored as prefix + key
        self.prefix = prefix
        #: how long a dead holder blocks its key; renewed every third of it while the holder lives
        self.lease_seconds = _seconds("lease_seconds", lease_seconds, 0.1)
        #: how long a done key answers duplicates: must outlive every way a duplicate can arrive
        #: (Redis visibility timeout, retries with their backoff, an outbox relay restarted late)
        self.result_ttl_seconds = _seconds("result_ttl_seconds", result_ttl_seconds, self.lease_seconds)
        #: how often `wait_seconds` polls a busy key
        self.poll_interval_seconds = _seconds("poll_interval_seconds", poll_interval_seconds, 0.001)
        self._scripts = scripts = Scripts(client)
        self._claim = scripts.register(_CLAIM)
        # A third of the lease, within what a socket timeout can be (a lease may be 1e15 s).
        self._renew = Scripts(client, socket_timeout=min(self.lease_seconds / 3, threading.TIMEOUT_MAX)
                              ).register(_RENEW)
        self._renewer = Renewer(name=f"taskherd-lease-renewer-{prefix}")
        self._complete = scripts.register(_COMPLETE)
        self._release = scripts.register(_RELEASE)

    def state(self, key: str) -> dict | None:
        """The stored record for `key` (for inspection and tests), or None."""
        raw = self.client.get(self.prefix + validate_key(key))
        return celery_json.loads(raw) if raw is not None else None

    @contextlib.contextmanager
    def guard(self, key: str, *, wait_seconds: float = 0.0) -> Iterator[Claim]:
        key = validate_key(key)
        if wait_seconds != 0.0:  # the default costs one comparison (the guard's CPU is measured)
            wait_seconds = validate_seconds("RedisStore.guard", "wait_seconds", wait_seconds, 0)
        redis_key = self.prefix + key
        lease_ms = int(self.lease_seconds * 1000)
        holder = _holder()
        token = new_token()
        record = in_progress_record(holder, token)
        deadline = time.monotonic() + wait_seconds
        while True:
            try:
                claimed, *rest = self._claim(keys=[redis_key], args=[record, lease_ms])
            except _UNREACHABLE as exc:
                raise StoreUnavailable(key, cause=exc) from exc
            decision = decide(bool(claimed), *(rest or [None, 0]), own_record=record)
            if decision.action is not Action.BUSY:
                break
            if time.monotonic() >= deadline:
                raise InProgress(key, retry_after=decision.retry_after, holder=decision.holder)
            time.sleep(self.poll_interval_seconds)

        if decision.action is Action.RETURN:
            done_claim = RedisClaim(key, done=True, result=decision.result)
            try:
                yield done_claim
            finally:
                done_claim._finished = True
            return

        lease_id = self._renewer.add(lambda: bool(self._renew(keys=[redis_key], args=[record, lease_ms])),
                                     self.lease_seconds / 3)
        claim = RedisClaim(key, done=False, _require_commit=self._scripts.require_pipeline)
        try:
            yield claim
        except BaseException:
            claim._finished = True
            self._renewer.remove(lease_id)
            self._release_after_failure(key, redis_key, record)
            raise
        claim._finished = True
        self._renewer.remove(lease_id)
        self._finish(key, redis_key, record, holder, token, claim)

    def _release_after_failure(self, key: str, redis_key: str, record: str) -> None:
        try:
            self._release(keys=[redis_key], args=[record])
        except _UNREACHABLE:
            # The key stays in progress until its lease expires; retries wait until then.
            logger.warning("idempotency key %r: could not release it after a failure; it frees itself "
                           "after the %ss lease", key, self.lease_seconds, exc_info=True)

    def _finish(self, key: str, redis_key: str, record: str, holder: str, token: str, claim: RedisClaim) -> None:
        ttl_ms = int(self.result_ttl_seconds * 1000)
        try:
            done = done_record(holder, claim.result, token)
        except (TypeError, ValueError) as exc:
            self._finish_unstorable(key, redis_key, record, holder, token, claim, ttl_ms, exc)
        if claim._transactional:
            self._commit(key, redis_key, record, done, ttl_ms, claim._transactional)
        else:
            self._complete_after_effect(key, redis_key, record, done, ttl_ms)

    def _finish_unstorable(self, key: str, redis_key: str, record: str, holder: str, token: str,
                           claim: RedisClaim, ttl_ms: int, error: Exception) -> None:
        """A result Celery's JSON cannot encode: say so, and make sure no effect runs twice for it."""
        if claim._transactional:
            # Nothing is applied yet: drop the queued effects and free the key, as for a failed body.
            self._release_after_failure(key, redis_key, record)
            raise unstorable_result(key, "RedisStore", claim.result, error,
                                    "nothing was applied: the effects queued with claim.in_transaction were "
                                    "dropped and the key released") from error
        # The effect has happened: record it as done anyway, so that it never runs again.
        self._complete_after_effect(key, redis_key, record, done_record(holder, None, token), ttl_ms)
        raise unstorable_result(key, "RedisStore", claim.result, error,
                                "the effect ran once and the key is recorded as done with result None, "
                                "which duplicates return") from error

    def _commit(self, key: str, redis_key: str, record: str, done: str, ttl_ms: int,
                effects: list[Callable[[Any], Any]]) -> None:
        """The effects and the done record in one MULTI/EXEC, if the key is still ours (or lapsed
        with nobody taking it), in one packet: WATCH, `_COMMIT_CHECK`, MULTI, the effects, the done
        record, EXEC. Nothing has happened yet, so a Redis failure is raised (the task retries; its
        retry finds the key done if this EXEC was applied and only its reply lost)."""
        queued = self.client.pipeline(transaction=True)  # only records what the effects queue
        try:
            for queue_effects in effects:
                queue_effects(queued)
            effect_commands = compat.redis_queued_commands(queued)
        except BaseException:
            # Nothing was sent: the effects are dropped and the key freed at once, as for a body
            # that fails (left to its lease, every retry would get InProgress until it lapsed).
            self._release_after_failure(key, redis_key, record)
            raise
        commands = [("WATCH", redis_key), ("EVAL", _COMMIT_CHECK, 1, redis_key, record, done), ("MULTI",),
                    *effect_commands, ("SET", redis_key, done, "PX", ttl_ms), ("EXEC",)]
        for delay in (*_FINISH_RETRY_DELAYS, None):
            try:
                replies = self._scripts.pipeline(commands)
            except _UNREACHABLE as exc:
                if delay is None:
                    raise StoreUnavailable(key, cause=exc) from exc
            else:
                check, executed = replies[1], replies[-1]
                if isinstance(check, ResponseError):
                    raise check
                if check == 2:
                    return  # an earlier try was applied; its reply was lost
                if check == 0:
                    raise LeaseLost(key, lease_seconds=self.lease_seconds)
                if isinstance(executed, ResponseError):
                    # EXECABORT: Redis refused a queued command (its own error says which), so
                    # nothing was applied and the key is still ours until its lease lapses.
                    queued_replies = replies[3:-1]
                    raise next((r for r in queued_replies if isinstance(r, ResponseError)), executed)
                if executed is not None:
                    # Applied. A command that failed as it ran (WRONGTYPE…) raises, as redis-py's
                    # pipeline does; the others and the done record were applied with it.
                    failed = next((r for r in executed if isinstance(r, ResponseError)), None)
                    if failed is not None:
                        raise failed
                    return
                # None: the key changed between WATCH and EXEC (a renewal in flight): look again
            if delay is not None:
                time.sleep(delay)
        raise StoreUnavailable(key, cause=WatchError(f"{redis_key} kept changing under the commit"))

    def _complete_after_effect(self, key: str, redis_key: str, record: str, done: str, ttl_ms: int) -> None:
        for delay in (*_FINISH_RETRY_DELAYS, None):
            try:
                completed = self._complete(keys=[redis_key], args=[record, done, ttl_ms])
                break
            except _UNREACHABLE:
                if delay is None:
                    logger.error("idempotency key %r: the effect ran but Redis could not record it as done; "
                                 "a duplicate arriving after the %ss lease would run it again", key,
                                 self.lease_seconds, exc_info=True)
                    return
                time.sleep(delay)
        if not completed:
            raise LeaseLost(key, lease_seconds=self.lease_seconds)
