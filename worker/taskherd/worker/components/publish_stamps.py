"""Stamps every task message with its publish time, so queue age and queue wait are measurable.

Celery's protocol-2 headers carry no publish time. ``before_task_publish`` adds:

- header ``taskherd_published_at``: float epoch seconds — read by taskherd.queues on Redis (the
  age of the oldest ready message) and by the worker's queue-wait histogram;
- the AMQP ``timestamp`` property (whole epoch seconds) — what RabbitMQ's management API reports
  as ``head_message_timestamp`` for classic queues. On Redis it travels in the JSON envelope.

Every publish is stamped anew, including ``Task.retry()`` messages: the stamp says when THIS
message entered the broker. The signal is process-wide (it carries no app), so installing it for
one app stamps what any app of the process publishes; connecting is idempotent.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

from . import Component

PUBLISHED_AT_HEADER = "taskherd_published_at"
_DISPATCH_UID = "taskherd.worker.components.publish_stamps"


def stamp(headers: dict[str, Any], properties: dict[str, Any], *, now: float) -> None:
    """Writes the publish stamp into a message's headers and properties (both mutated)."""
    headers[PUBLISHED_AT_HEADER] = now
    properties["timestamp"] = int(now)


def _on_before_task_publish(sender=None, headers=None, properties=None, clock: Callable[[], float] = time.time,
                            **_: Any) -> None:
    if headers is None or properties is None:
        return
    stamp(headers, properties, now=clock())


def connect() -> None:
    """Connects the publish hook (once per process, whatever the number of apps)."""
    from celery.signals import before_task_publish

    before_task_publish.connect(_on_before_task_publish, weak=False, dispatch_uid=_DISPATCH_UID)


def disconnect() -> None:
    from celery.signals import before_task_publish

    before_task_publish.disconnect(dispatch_uid=_DISPATCH_UID)


@dataclasses.dataclass(frozen=True, kw_only=True)
class PublishStamps(Component):
    """Stamps what the app publishes (the hook is process-wide: see the module docstring)."""

    def install(self, app: Any, profile: Any) -> None:
        connect()
