"""A vanilla Celery app (no taskherd): the baseline the fixtures are checked against."""
import os

from celery import Celery

app = Celery("plain", broker=os.environ["TEST_BROKER_URL"])
app.conf.update(task_default_queue=os.environ.get("TEST_QUEUE", "celery"), broker_connection_retry_on_startup=True)


@app.task(name="plain.add")
def add(x, y):
    return x + y
