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

# A pool child forked while one of the worker's threads was importing a module inherits that
# module's import lock held (CPython keeps per-module import locks across fork) and deadlocks on
# its own first import of it. getaddrinfo() imports the IDNA codec on its first use with a host
# name, in whichever thread resolves first (the lease renewer, a store client); the child's first
# task that resolves a name then hung until its hard time limit and was dead-lettered (chaos suite:
# "a new worker's first task"). Imported here, in the parent, before any thread starts.
importlib.import_module("encodings.idna")

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
