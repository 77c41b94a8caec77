"""Reading the run's ledger: the shop's effect and attempt rows, and the dead-letter queue.

The shell around `verdict`: it turns rows and envelopes into `Attempt`s and `DeadLetter`s and
nothing else. Works against any broker URL the host can reach (the demo's own, or a test's).
"""
from __future__ import annotations

import collections
import json
from typing import Iterable, Mapping
from urllib.parse import quote, urlsplit

import httpx
import psycopg

from .verdict import Attempt, DeadLetter

#: task name -> the keyword argument that names the thing it acts on (the shop's LEDGER_KEYS)
KEY_ARGUMENTS: dict[str, str] = {"shop.charge": "charge_id", "shop.build_report": "report_id"}


def read_effects(conn: psycopg.Connection) -> dict[str, int]:
    """charge id -> number of effect rows (more than one is a duplicated charge)."""
    rows = conn.execute("SELECT charge_id, count(*) FROM shop_charges GROUP BY charge_id").fetchall()
    return {charge_id: n for charge_id, n in rows}


def read_attempts(conn: psycopg.Connection) -> tuple[Attempt, ...]:
    rows = conn.execute(
        "SELECT task_id, key, task_name, worker, extract(epoch FROM started_at)::float8, "
        "extract(epoch FROM finished_at)::float8, outcome FROM shop_attempts ORDER BY id").fetchall()
    return tuple(Attempt(task_id=r[0], key=r[1], task_name=r[2], worker=r[3], started_at=r[4],
                         finished_at=r[5], outcome=r[6]) for r in rows)


def dead_letter_from_envelope(envelope: Mapping) -> DeadLetter:
    """A taskherd DLQ envelope (see taskherd.worker.deadletter.Envelope) as a ledger row."""
    task = envelope.get("task") or "?"
    kwargs = envelope.get("kwargs") or {}
    key_arg = KEY_ARGUMENTS.get(task)
    key = str(kwargs.get(key_arg)) if key_arg and key_arg in kwargs else str(envelope.get("task_id"))
    reason = envelope.get("reason") or "?"
    detail = envelope.get("detail")
    return DeadLetter(task_name=task, key=key, reason=f"{reason}: {detail}" if detail else reason,
                      attempts=envelope.get("attempts"), exception_type=envelope.get("exception_type"))


def read_dead_letters(broker_url: str, queue: str, *, management_url: str | None = None) -> tuple[DeadLetter, ...]:
    """Every envelope in the DLQ, oldest first, left in place."""
    return tuple(dead_letter_from_envelope(e) for e in read_envelopes(broker_url, queue, management_url=management_url))


def read_envelopes(broker_url: str, queue: str, *, management_url: str | None = None) -> list[dict]:
    scheme = urlsplit(broker_url).scheme
    if scheme.startswith("redis"):
        import redis

        client = redis.Redis.from_url(broker_url)
        try:
            raw = client.lrange(queue, 0, -1)  # LPUSHed: newest first
        finally:
            client.close()
        return [_envelope_body(json.loads(r)) for r in reversed(raw)]
    return [_envelope_body(m) for m in _rabbitmq_peek(broker_url, queue, management_url)]


def _envelope_body(message: Mapping) -> dict:
    """kombu's Redis transport wraps the body in a message dict; unwrap to the envelope."""
    if "body" in message and "properties" in message:
        body = message["body"]
        if message.get("properties", {}).get("body_encoding") == "base64":
            import base64

            body = base64.b64decode(body)
        return json.loads(body)
    return dict(message)


def _rabbitmq_peek(amqp_url: str, queue: str, management_url: str | None) -> list[dict]:
    amqp = urlsplit(amqp_url)
    api = urlsplit(management_url) if management_url else amqp._replace(scheme="http", netloc=f"{amqp.hostname}:15672")
    vhost = amqp.path[1:] or "/"
    user, password = (api.username or amqp.username or "guest"), (api.password or amqp.password or "guest")
    base = f"{api.scheme}://{api.hostname}:{api.port}"
    out: list[dict] = []
    with httpx.Client(base_url=base, auth=(user, password), timeout=30) as client:
        # ack_requeue_true: a peek, the messages stay in the queue in their order
        r = client.post(f"/api/queues/{quote(vhost, safe='')}/{quote(queue, safe='')}/get",
                        json={"count": 10_000, "ackmode": "ack_requeue_true", "encoding": "auto"})
        if r.status_code == 404:
            return []
        r.raise_for_status()
        for m in r.json():
            payload = m["payload"]
            if m.get("payload_encoding") == "base64":
                import base64

                payload = base64.b64decode(payload)
            out.append(json.loads(payload))
    return out


def attempts_by_key(attempts: Iterable[Attempt]) -> dict[str, int]:
    return dict(collections.Counter(a.key for a in attempts))
