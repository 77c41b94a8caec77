"""The DelayedMessages component: on Redis, ETA/countdown messages wait in a sorted set, not in a worker.

Installs a worker bootstep that, on a Redis broker, starts the mover thread of
taskherd.worker.delayed and makes the taskherd Task's strategy park ETA messages there; in every
process of the app (a worker's ``--purge``, ``celery purge``) purging a queue erases the messages
parked for it too. Without it
(or on RabbitMQ) Celery holds ETA messages unacknowledged in the worker, as it always does.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Any

from taskherd.contract import broker_kind, shown

from . import Component, is_seconds, too_long
from .recovery import first_broker_url, key_prefix

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, kw_only=True)
class DelayedMessages(Component):
    """Redis only: park ETA/countdown messages in ``taskherd.delayed`` (see taskherd.worker.delayed)."""

    #: seconds between two looks for due messages (a message parked by this worker that falls due
    #: sooner is moved on time; one parked by a worker that died waits at most this long extra)
    interval: float = 1.0

    def problems(self) -> list[str]:
        if not (is_seconds(self.interval) and self.interval > 0):
            return [f"DelayedMessages(interval={shown(self.interval)}) must be > 0 seconds"]
        return too_long("DelayedMessages(interval", self.interval)  # a due message would wait that long

    def install(self, app: Any, profile: Any = None) -> None:
        from celery import bootsteps

        if broker_kind(first_broker_url(app)) == "redis":
            from taskherd.worker.delayed import erase_parked_on_purge

            # a purge (worker --purge, celery purge, app.control.purge) erases the queue's parked messages too
            erase_parked_on_purge()

        settings = self

        class DelayedMessagesStep(bootsteps.StartStopStep):
            """Started before the consumer: its task strategies are built knowing the delay set."""

            label = "taskherd delayed messages"

            def start(self, worker):
                url = first_broker_url(worker.app)
                if broker_kind(url) != "redis" or url.lower().startswith("sentinel"):
                    return
                import redis

                from taskherd.worker import delayed

                timeout = max(1.0, settings.interval * 5)
                client = redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)
                self.mover = delayed.activate(
                    delayed.DelaySet(client, prefix=key_prefix(worker.app)),
                    interval=settings.interval)
                logger.info("taskherd: ETA/countdown messages wait in %s, moved every %.1f s",
                            self.mover.delays.key, settings.interval)

            def stop(self, worker):
                mover = getattr(self, "mover", None)
                if mover is not None:
                    mover.stop()

        app.steps["worker"].add(DelayedMessagesStep)
