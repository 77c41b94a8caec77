"""Reading a scenario's ledger: effects, duplicate applications and attempts from PostgreSQL, the
Redis-guarded effects from the store's Redis, and the dead-letter queue — every row of the keys
that start with the scenario's prefix, as checker types. The shell around checker.py."""
from __future__ import annotations

from datetime import datetime, timezone

import httpx
import psycopg
import redis

from e2e.demo.ledger import read_envelopes
from e2e.lib.cluster import CommandFailed
from taskherd.contract import broker_kind
from taskherd.queues import BrokerUnreachable

from .checker import Attempt, DeadLetter
from .deploy import Release, ledger_modules

#: what reading the ledger, the queues or the cluster raises while a fault is on (a database or a
#: broker restarting, a port-forward being replaced): a poll that meets one looks again later
UNAVAILABLE = (psycopg.Error, redis.RedisError, OSError, httpx.HTTPError, BrokerUnreachable, CommandFailed)


def effects(release: Release, prefix: str) -> tuple[list[str], list[str], list[str]]:
    """(PostgreSQL effect keys, duplicate-application keys, Redis effect keys) of the prefix."""
    _, db = ledger_modules()
    like = f"{prefix}-%"
    with psycopg.connect(release.tenancy.host.database, autocommit=True, connect_timeout=10) as conn:
        pg = [r[0] for r in conn.execute("SELECT key FROM ledger_effects WHERE key LIKE %s", (like,))]
        dup = [r[0] for r in conn.execute("SELECT key FROM ledger_duplicates WHERE key LIKE %s", (like,))]
    with redis.Redis.from_url(release.tenancy.host.store, socket_timeout=10) as client:
        entries = [e.decode().split("|", 1)[0] for e in client.lrange(db.EFFECTS_LIST, 0, -1)]
    return pg, dup, [k for k in entries if k.startswith(prefix + "-")]


def attempts(release: Release, prefix: str) -> list[Attempt]:
    with psycopg.connect(release.tenancy.host.database, autocommit=True, connect_timeout=10) as conn:
        rows = conn.execute(
            "SELECT key, task_id, pod, extract(epoch FROM started_at)::float8, "
            "extract(epoch FROM finished_at)::float8, outcome FROM ledger_attempts WHERE key LIKE %s ORDER BY id",
            (f"{prefix}-%",)).fetchall()
    return [Attempt(*row) for row in rows]


def dead_letters(release: Release, prefix: str | None = None) -> list[DeadLetter]:
    """The envelopes in the ledger's DLQ (of the prefix, when given), left in place."""
    app, _ = ledger_modules()
    urls = release.tenancy.host
    out = []
    for envelope in read_envelopes(urls.broker, app.DEAD_LETTER_QUEUE, management_url=urls.management):
        key = str((envelope.get("kwargs") or {}).get("key", envelope.get("task_id")))
        if prefix is None or key.startswith(prefix + "-"):
            out.append(DeadLetter(key=key, reason=envelope.get("reason") or "?", attempts=envelope.get("attempts"),
                                  context=_envelope_context(envelope)))
    return out


def _envelope_context(envelope: dict) -> str:
    """'by <pod> at <UTC time>, first failure <time>: <detail>' from a dead-letter envelope."""
    def at(stamp) -> str:
        try:
            return datetime.fromtimestamp(float(stamp), timezone.utc).strftime("%H:%M:%S")
        except (TypeError, ValueError, OverflowError):
            return "?"
    return (f"by {envelope.get('hostname') or '?'} at {at(envelope.get('dead_lettered_at'))}, first failure "
            f"{at(envelope.get('first_failure_at'))}: {envelope.get('detail') or '?'}")


def whereabouts(release: Release, task_ids: dict[str, str]) -> dict[str, str]:
    """Where each lost task (key -> task id) still is, for the report: the Redis broker keys whose
    value holds its id (a queue list, kombu's ``unacked`` hash, taskherd's delayed set, …) and its
    outbox row. A task found nowhere was dropped between a pop and its bookkeeping; one found in
    ``unacked`` with no live owner waits for a sweep. RabbitMQ's queues cannot be searched from
    outside without taking the messages: only the outbox is read there."""
    found: dict[str, list[str]] = {key: [] for key in task_ids}
    urls = release.tenancy.host
    on_redis = broker_kind(urls.broker) == "redis"
    if on_redis:
        with redis.Redis.from_url(urls.broker, socket_timeout=10) as client:
            for name in client.scan_iter(count=500):
                values = _redis_values(client, name)
                for key, task_id in task_ids.items():
                    hits = [where for where, value in values if task_id.encode() in value]
                    found[key] += [f"redis {name.decode(errors='replace')}{hit}" for hit in hits]
    try:
        with psycopg.connect(urls.database, autocommit=True, connect_timeout=10) as conn:
            for key, task_id in task_ids.items():
                for sent_at, relayed_by in conn.execute(
                        "SELECT sent_at, relayed_by FROM taskherd_outbox WHERE id::text = %s", (task_id,)):
                    found[key].append(f"outbox row (sent_at {sent_at}, relayed by {relayed_by})")
    except psycopg.Error as exc:
        for places in found.values():
            places.append(f"outbox not read ({type(exc).__name__})")
    searched = "in no Redis key" if on_redis else "RabbitMQ's queues not searched"
    return {key: "; ".join(places if any(p.startswith("redis ") for p in places) else [searched, *places])
            or searched for key, places in found.items()}


def _redis_values(client: redis.Redis, name: bytes) -> list[tuple[str, bytes]]:
    kind = client.type(name)
    if kind == b"list":
        return [(f"[{i}]", v) for i, v in enumerate(client.lrange(name, 0, -1))]
    if kind == b"hash":
        return [(f"[{k.decode(errors='replace')}]", v) for k, v in client.hgetall(name).items()]
    if kind == b"zset":
        return [(f" (score {score})", v) for v, score in client.zrange(name, 0, -1, withscores=True)]
    if kind == b"set":
        return [("", v) for v in client.smembers(name)]
    if kind == b"string":
        return [("", client.get(name) or b"")]
    return []


def pending_outbox_rows(release: Release) -> int:
    with psycopg.connect(release.tenancy.host.database, autocommit=True, connect_timeout=10) as conn:
        return conn.execute("SELECT count(*) FROM taskherd_outbox WHERE sent_at IS NULL").fetchone()[0]
