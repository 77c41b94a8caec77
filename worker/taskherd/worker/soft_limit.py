"""Holding the soft time limit back while a task's outcome is being published.

billiard raises ``SoftTimeLimitExceeded`` in the pool child from a signal handler, wherever the
child happens to be. If that is inside the publish of a dead-letter envelope or of a retry (or in
the pause after a failed one), the exception replaces the outcome being published: Celery records
an ordinary failure and acknowledges the message, with no envelope and no retry — the task is
gone. While :func:`deferred` is active the signal only records that it came; the outcome that is
being published is final anyway (envelope, retry, or the message put back), so the late soft limit
is logged and dropped. The hard time limit still applies: it kills the child, and the main process
dead-letters the task (taskherd.worker.task.Request).
"""
from __future__ import annotations

import contextlib
import logging
import signal
from typing import Iterator

from taskherd import compat

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def deferred(what: str) -> Iterator[None]:
    """No SoftTimeLimitExceeded inside the block; one that arrives there is logged at its end."""
    signum = compat.soft_time_limit_signal()
    if signum is None:  # not a prefork pool child: no soft limit signal to hold back
        yield
        return
    arrived: list[bool] = []
    previous = signal.signal(signum, lambda *_: arrived.append(True))
    try:
        yield
    finally:
        signal.signal(signum, previous)
        if arrived:
            logger.warning("taskherd: the soft time limit expired while %s; the outcome stands", what)
