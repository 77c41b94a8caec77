"""taskherd's reliability profile (configure) plus the runtime installers, as a user's app would be.

Environment: TEST_BROKER_URL, TEST_QUEUE, TASKHERD_HEARTBEAT_DIR, TASKHERD_HEARTBEAT_INTERVAL,
TASKHERD_METRICS_PORT.
"""
import os

from celery import Celery

from taskherd.worker import draining, heartbeat, metrics
from taskherd.worker.profile import configure

app = Celery("runtime_profile_app", broker=os.environ["TEST_BROKER_URL"])
app.conf.task_default_queue = os.environ["TEST_QUEUE"]
profile = configure(app, soft_time_limit=20, time_limit=30)
for module in (heartbeat, draining, metrics):  # until configure() runs these installers itself
    module.install(app, profile)


@app.task(name="runtime_profile.add")
def add(x: int, y: int) -> int:
    return x + y
