"""The shop's tasks.

`charge` is the one to copy: validate, call the outside world (retried when it flakes), then record
the effect inside the idempotency guard, in the same transaction as the key. However many times the
message is delivered — a worker killed after the commit but before the acknowledgement, a
redelivery after a crash — the charge is recorded once.
"""
from __future__ import annotations

import os
import time

from taskherd.worker.transient import PermanentError

from . import db, gateway
from .app import app


class InvalidCharge(PermanentError):
    """The charge itself is wrong: no retry can fix it, it goes to the dead-letter queue."""


def _work_seconds() -> float:
    """How long a charge takes besides the gateway (fetching the order, sending the receipt)."""
    return float(os.environ.get("SHOP_CHARGE_SECONDS", "2"))


@app.task(name="shop.charge", bind=True)
def charge(self, *, charge_id: str, customer: str, amount_cents: int) -> str:
    if not isinstance(amount_cents, int) or amount_cents <= 0:
        raise InvalidCharge(f"charge {charge_id}: amount_cents={amount_cents!r}; valid: a positive integer")
    time.sleep(_work_seconds() / 2)  # load the order (a worker killed here has done nothing yet)
    authorization = gateway.authorize(idempotency_key=charge_id, amount_cents=amount_cents)
    conn = db.connection()
    with db.store.guard(f"charge:{charge_id}", conn=conn) as claim:
        if not claim.done:
            conn.execute("INSERT INTO shop_charges (charge_id, customer, amount_cents, auth_code, worker) "
                         "VALUES (%s, %s, %s, %s, %s)",
                         (charge_id, customer, amount_cents, authorization, db.worker_name(self)))
            claim.set_result(authorization)
    # send the receipt (a worker killed here has charged: the redelivery finds the key and skips)
    time.sleep(_work_seconds() / 2)
    return claim.result


@app.task(name="shop.build_report", bind=True)
def build_report(self, *, report_id: str, megabytes: int) -> int:
    """Builds a report in memory. A big one outgrows the container's memory limit: the kernel
    kills the process (OOM) every time, and taskherd dead-letters it after `max_deliveries`."""
    chunks = []
    for _ in range(megabytes // 16):
        chunk = bytearray(16 * 1024 * 1024)
        chunk[::4096] = b"x" * len(chunk[::4096])  # touch every page: resident, not just reserved
        chunks.append(chunk)
    return sum(len(c) for c in chunks)
