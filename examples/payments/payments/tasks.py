"""The service's tasks: plain `@app.task` functions (configure() made taskherd's Task their base)."""
from __future__ import annotations

import os
import socket
import time

from celery import signals

from taskherd.worker import PermanentError

from . import db
from .app import app

CAPTURE_SECONDS = float(os.environ.get("PAYMENTS_CAPTURE_SECONDS", "2"))


@signals.worker_init.connect
def _migrate(**_):
    db.migrate()


@app.task(name="payments.capture")
def capture(payment_id: str, amount_cents: int) -> dict:
    """Captures a payment once, however often its message is delivered: the key row and the capture
    commit together, and a redelivery finds the key and returns the first result."""
    with db.connect() as conn, db.store.guard(f"capture:{payment_id}", conn=conn) as claim:
        if claim.done:
            return claim.result
        time.sleep(CAPTURE_SECONDS)  # the card network
        conn.execute("INSERT INTO payments_captures (payment_id, amount_cents, pod) VALUES (%s, %s, %s)",
                     (payment_id, amount_cents, socket.gethostname()))
        claim.set_result({"captured": payment_id})
        return claim.result


@app.task(name="payments.refund")
def refund(payment_id: str) -> dict:
    """Refunds a captured payment; a payment never captured cannot succeed later: dead-lettered at once."""
    with db.connect() as conn, db.store.guard(f"refund:{payment_id}", conn=conn) as claim:
        if claim.done:
            return claim.result
        if conn.execute("SELECT 1 FROM payments_captures WHERE payment_id = %s", (payment_id,)).fetchone() is None:
            raise PermanentError(f"refund of {payment_id}: no such captured payment")
        conn.execute("INSERT INTO payments_refunds (payment_id) VALUES (%s)", (payment_id,))
        claim.set_result({"refunded": payment_id})
        return claim.result


@app.task(name="payments.settle_batch")
def settle_batch(megabytes: int) -> None:
    """The nightly settlement file, built in memory: more than the pod's memory limit, and the
    kernel's OOM killer takes the process."""
    held = bytearray(megabytes * 1024 * 1024)
    for offset in range(0, len(held), 4096):
        held[offset] = 1
