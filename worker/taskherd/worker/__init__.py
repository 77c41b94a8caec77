"""taskherd.worker — what runs inside a user's Celery worker.

The reliability profile, retries, dead-lettering, the delivery counter, idempotency and the outbox;
the runtime components configure() installs (taskherd.worker.components: heartbeat, drain,
metrics, publish stamps, Redis fast recovery). Each concern is one module.

    from taskherd.worker import configure
    profile = configure(app, soft_time_limit=50, time_limit=60, queues=["orders"])

Names are resolved lazily (PEP 562) so that importing `taskherd.worker` stays cheap and a module
that needs only, say, the backoff function does not import Celery.
"""
from __future__ import annotations

import importlib
from typing import Any

#: public name -> module defining it
_EXPORTS: dict[str, str] = {
    # reliability core (profile, retries, dead-letter queue)
    "configure": "taskherd.worker.profile",
    "Profile": "taskherd.worker.profile",
    "ProfileError": "taskherd.worker.profile",
    "ProfileWarning": "taskherd.worker.profile",
    "get_profile": "taskherd.worker.profile",
    "Settings": "taskherd.worker.profile",
    "default_components": "taskherd.worker.components",
    "without": "taskherd.worker.components",
    "Task": "taskherd.worker.task",
    "DeadLettered": "taskherd.worker.task",
    "TransientError": "taskherd.worker.transient",
    "PermanentError": "taskherd.worker.transient",
    "ErrorClassifier": "taskherd.worker.transient",
    "backoff_delay": "taskherd.worker.backoff",
    "Envelope": "taskherd.worker.deadletter",
    "idempotent": "taskherd.worker.idempotency",
    "RedisStore": "taskherd.worker.idempotency",
    "PostgresStore": "taskherd.worker.idempotency",
    "InProgress": "taskherd.worker.idempotency",
    "enqueue": "taskherd.worker.outbox",
    "record_outcome": "taskherd.worker.components.metrics",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'taskherd.worker' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
