"""The one bounded wait of the tests, the e2e harness and the benchmarks.

``wait_for(what, observe, ...)`` calls ``observe()`` until what it returns meets the condition
(truthy by default, ``== equals`` or ``until(value)``) and returns that value. While it waits it
logs what it waits for, the value it sees now and the target, like KEDA's
``WaitForDeploymentReplicaReadyCount``; when time runs out it raises :class:`WaitTimeout` naming
both, with whatever ``explain()`` adds (a log tail, the objects involved).

The clock and the sleep are parameters so that the loop itself is tested without waiting.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

log = logging.getLogger("taskherd.e2e.wait")

T = TypeVar("T")
_UNSET: Any = object()


class WaitTimeout(AssertionError):
    """A bounded wait ran out; the message says what was awaited and what was last seen."""


def wait_for(what: str, observe: Callable[[], T], timeout: float, interval: float = 0.2, *,
             equals: Any = _UNSET, until: Callable[[T], Any] | None = None,
             ignoring: tuple[type[BaseException], ...] = (), explain: Callable[[], str] | None = None,
             progress_every: float = 10.0, clock: Callable[[], float] = time.monotonic,
             sleep: Callable[[float], None] = time.sleep) -> T:
    """Calls `observe` every `interval` seconds until its value is done, and returns that value.

    Done means ``value == equals`` when `equals` is given, ``until(value)`` when `until` is, else a
    truthy value. An exception of a type in `ignoring` counts as "not yet" (a kubectl call before
    the object exists); any other exception ends the wait at once. After `timeout` seconds raises
    WaitTimeout with `what`, the target and the last value (or exception) seen.
    """
    if equals is not _UNSET and until is not None:
        raise TypeError("wait_for: pass equals= or until=, not both")
    done = (lambda value: value == equals) if equals is not _UNSET else (until or bool)
    target = f" (want {equals!r})" if equals is not _UNSET else ""
    start = clock()
    next_report = start
    while True:
        try:
            last: Any = observe()
            if done(last):
                if clock() - start >= progress_every:
                    log.info("%s: %r after %.0fs", what, last, clock() - start)
                return last
        except ignoring as error:
            last = error
        elapsed = clock() - start
        if elapsed >= timeout:
            detail = f"\n{explain()}" if explain else ""
            raise WaitTimeout(f"timed out after {timeout:g}s waiting for {what}{target}; "
                              f"last seen: {last!r}{detail}") from (last if isinstance(last, BaseException) else None)
        if clock() >= next_report:
            log.info("waiting for %s%s: now %r (%.0fs of %gs)", what, target, last, elapsed, timeout)
            next_report = clock() + progress_every
        sleep(min(interval, max(timeout - elapsed, 0)))
