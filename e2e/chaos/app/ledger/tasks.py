"""`ledger.apply`: work for a while, then apply the entry's effect once, under an idempotency guard.

Arguments (keywords): `key` (the entry), `store` ("postgres" or "redis": which guard), `seconds`
(work before the effect), `kind`:

- "normal": the effect must happen exactly once, whatever the faults;
- "permanent": invalid input, a `PermanentError`: dead-lettered after one attempt, never applied;
- "oom": builds `megabytes` of memory in a pod whose limit is lower: the kernel kills it on every
  delivery, and taskherd dead-letters it (`killed-worker`) unrun after `MAX_DELIVERIES`;
- "socket-wedge": blocks reading a socket that never answers, with no timeout, and keeps
  blocking through the soft limit (as C code that retries on EINTR does): only the hard time
  limit ends it (dead-lettered `hard-time-limit`).

A small share of normal attempts fails with a transient error first (`LEDGER_TRANSIENT_RATE`),
so every scenario also exercises retries.
"""
from __future__ import annotations

import os
import random
import socket
import time

import redis
from celery.exceptions import SoftTimeLimitExceeded

from taskherd.worker import PermanentError
from taskherd.worker.idempotency import RedisStore

from . import db
from .worker import app

KINDS = ("normal", "permanent", "oom", "socket-wedge")
STORES = ("postgres", "redis")


class InvalidEntry(PermanentError):
    """The entry itself is wrong: no retry can fix it."""


class UpstreamFlaked(ConnectionError):
    """A dependency did not answer this time (transient: retried with backoff)."""


def _store_client() -> redis.Redis:
    url = os.environ.get("LEDGER_STORE_URL", "")
    if not url:
        raise RuntimeError("LEDGER_STORE_URL is not set: the Redis of the idempotency store")
    # Timeouts, so that an unreachable store fails the claim (transient: retried) instead of
    # blocking the task until its time limit.
    return redis.Redis.from_url(url, socket_timeout=3, socket_connect_timeout=3)


redis_store = RedisStore(client=_store_client(), prefix="ledger:key:", lease_seconds=15)


def _transient_rate() -> float:
    rate = float(os.environ.get("LEDGER_TRANSIENT_RATE", "0.05"))
    if not 0 <= rate < 1:
        raise ValueError(f"LEDGER_TRANSIENT_RATE={rate!r}; valid: 0 <= rate < 1")
    return rate


def _build_in_memory(megabytes: int) -> int:
    chunks = []
    for _ in range(max(1, megabytes // 16)):
        chunk = bytearray(16 * 1024 * 1024)
        chunk[::4096] = b"x" * len(chunk[::4096])  # touch every page: resident, not just reserved
        chunks.append(chunk)
    return sum(len(c) for c in chunks)


def _block_on_socket() -> None:
    reader, _writer = socket.socketpair()  # nothing is ever written: recv blocks for ever
    while True:
        try:
            reader.recv(1)
        except SoftTimeLimitExceeded:
            continue


@app.task(name="ledger.apply", bind=True)
def apply(self, *, key: str, store: str, seconds: float, kind: str = "normal", megabytes: int = 0) -> str:
    if kind not in KINDS or store not in STORES:
        raise InvalidEntry(f"entry {key}: kind={kind!r} (valid: {', '.join(KINDS)}), "
                           f"store={store!r} (valid: {', '.join(STORES)})")
    if kind == "permanent":
        raise InvalidEntry(f"entry {key} is invalid by construction")
    if kind == "oom":
        _build_in_memory(megabytes)
    if kind == "socket-wedge":
        _block_on_socket()
    time.sleep(seconds)
    if random.random() < _transient_rate():
        raise UpstreamFlaked(f"entry {key}: upstream did not answer")
    if store == "postgres":
        conn = db.connection()
        with db.store.guard(f"entry:{key}", conn=conn) as claim:
            if not claim.done:
                db.apply_effect(conn, key)
                claim.set_result(db.pod_name())
    else:
        with redis_store.guard(f"entry:{key}") as claim:
            if not claim.done:
                entry = f"{key}|{db.pod_name()}|{time.time():.3f}"
                claim.in_transaction(lambda pipe: pipe.rpush(db.EFFECTS_LIST, entry))
                claim.set_result(db.pod_name())
    return claim.result
