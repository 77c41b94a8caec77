"""A payment gateway that fails now and then, as real ones do.

`authorize` raises `GatewayUnavailable` — a `ConnectionError`, which taskherd classifies as
transient — for a fraction of calls (`SHOP_GATEWAY_FAILURE_RATE`, default 0.2), and otherwise
returns an authorization code. The charge id is passed as the provider's idempotency key: a real
gateway uses it to refuse a second authorization of the same charge, the one effect outside our
database that PostgreSQL cannot guard.
"""
from __future__ import annotations

import hashlib
import os
import random
import time


class GatewayUnavailable(ConnectionError):
    """The gateway did not answer (or answered 503): try again later."""


def failure_rate() -> float:
    rate = float(os.environ.get("SHOP_GATEWAY_FAILURE_RATE", "0.2"))
    if not 0 <= rate < 1:
        raise ValueError(f"SHOP_GATEWAY_FAILURE_RATE={rate!r}; valid: 0 <= rate < 1")
    return rate


def authorize(*, idempotency_key: str, amount_cents: int, latency_seconds: float = 0.05) -> str:
    time.sleep(latency_seconds)
    if random.random() < failure_rate():
        raise GatewayUnavailable(f"payment gateway timed out authorizing {idempotency_key}")
    return "auth-" + hashlib.sha256(f"{idempotency_key}:{amount_cents}".encode()).hexdigest()[:12]
