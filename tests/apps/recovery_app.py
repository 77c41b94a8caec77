"""Worker app for the queue-inspection and fast-recovery tests (configured by environment).

TEST_BROKER_URL, TEST_QUEUE; TEST_KEYPREFIX (Redis global_keyprefix); TEST_VISIBILITY_TIMEOUT;
TEST_RECOVERY=1 installs taskherd fast recovery with TEST_RECOVERY_HEARTBEAT / TEST_RECOVERY_TIMEOUT;
TEST_LEDGER_URL: a Redis URL where each run of ``recovery.hold`` is recorded.
Configured by hand like the reliability profile will (acks_late, reject_on_worker_lost, prefetch 1)
until taskherd.worker.configure() calls the installers itself.
"""
import json
import os
import socket
import time

import redis
from celery import Celery

from taskherd.worker import components
from taskherd.worker.components.publish_stamps import PublishStamps
from taskherd.worker.components.recovery import FastRecovery

app = Celery("recovery_app", broker=os.environ["TEST_BROKER_URL"])
transport_options = {"visibility_timeout": float(os.environ.get("TEST_VISIBILITY_TIMEOUT", "3600"))}
if os.environ.get("TEST_KEYPREFIX"):
    transport_options["global_keyprefix"] = os.environ["TEST_KEYPREFIX"]
app.conf.update(
    task_default_queue=os.environ.get("TEST_QUEUE", "celery"),
    broker_connection_retry_on_startup=True,
    broker_transport_options=transport_options,
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    accept_content=["json"],
    task_serializer="json",
    result_serializer="json",
)
components.install(app, [PublishStamps()])
if os.environ.get("TEST_RECOVERY") == "1":
    components.install(app, [FastRecovery(
        heartbeat_interval=float(os.environ.get("TEST_RECOVERY_HEARTBEAT", FastRecovery.heartbeat_interval)),
        timeout=float(os.environ.get("TEST_RECOVERY_TIMEOUT", FastRecovery.timeout)))])

_ledger = redis.Redis.from_url(os.environ["TEST_LEDGER_URL"]) if os.environ.get("TEST_LEDGER_URL") else None


@app.task(name="recovery.hold", bind=True)
def hold(self, token: str, seconds: float, redelivered_seconds: float | None = None):
    """Records its start and end in the ledger (list ``runs:<token>``), sleeping in between.

    ``redelivered_seconds``: how long a redelivered run sleeps (so recovery tests end quickly).
    """
    redelivered = bool((self.request.delivery_info or {}).get("redelivered"))
    record = {"host": self.request.hostname, "pid": os.getpid(), "node": socket.gethostname(),
              "redelivered": redelivered}
    if redelivered and redelivered_seconds is not None:
        seconds = redelivered_seconds
    if _ledger is not None:
        _ledger.rpush(f"runs:{token}", json.dumps({**record, "event": "start", "at": time.time()}))
    time.sleep(seconds)
    if _ledger is not None:
        _ledger.rpush(f"runs:{token}", json.dumps({**record, "event": "end", "at": time.time()}))
    return token


@app.task(name="recovery.count")
def count(token: str):
    """A no-op that counts itself: the throughput benchmark's task."""
    if _ledger is not None:
        _ledger.incr(f"count:{token}")
