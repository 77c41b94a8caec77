"""The one bounded wait every test uses."""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(predicate: Callable[[], T], *, timeout: float, what: str, interval: float = 0.2,
               explain: Callable[[], str] | None = None) -> T:
    """Calls `predicate` until it returns something truthy and returns that; after `timeout`
    seconds raises AssertionError naming `what` (and whatever `explain()` adds)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            detail = f"\n{explain()}" if explain else ""
            raise AssertionError(f"timed out after {timeout}s waiting for {what}{detail}")
        time.sleep(interval)
