"""taskherd's reliability profile (configure, which runs the runtime installers), as a user's app is.

Environment: TEST_BROKER_URL, TEST_QUEUE, TASKHERD_HEARTBEAT_DIR, TASKHERD_HEARTBEAT_INTERVAL,
TASKHERD_METRICS_PORT.
"""
import os

import celery
from celery import Celery

from taskherd.worker import PermanentError
from taskherd.worker.profile import configure

app = Celery("runtime_profile_app", broker=os.environ["TEST_BROKER_URL"])
app.conf.task_default_queue = os.environ["TEST_QUEUE"]
profile = configure(app, soft_time_limit=20, time_limit=30)  # installs heartbeat, drain, metrics


@app.task(name="runtime_profile.add")
def add(x: int, y: int) -> int:
    return x + y


@app.task(name="runtime_profile.refuse")
def refuse() -> None:
    raise PermanentError("never succeeds")


class PlainTask(celery.Task):
    """A task class of the app's own registered as an instance, so no taskherd Task: its metrics
    come from Celery's signals while the app's other tasks record their own."""

    name = "runtime_profile.plain"

    def run(self) -> str:
        return "plain"


app.register_task(PlainTask())
