"""An app that takes back, after configure(), what configure() set: the worker must refuse to start
(tests/worker/test_profile_undone.py).

TEST_BROKER_URL, TEST_QUEUE, and TEST_UNDO: a comma-separated list of what is changed after
configure(): ``acks_late`` (app.conf.task_acks_late = False), ``task_acks_late`` (a task
``@app.task(acks_late=False)``), ``transport_options`` (app.conf.broker_transport_options = {...}),
``prefetch`` (app.conf.worker_prefetch_multiplier = 8), ``config_from_object`` (configure() runs
before any broker URL is set, then config_from_object() sets it, and resets everything else).
"""
import os
import time

from celery import Celery

from taskherd.worker import configure

env = os.environ.get
undo = set(filter(None, env("TEST_UNDO", "").split(",")))


class Config:
    broker_url = env("TEST_BROKER_URL")
    broker_connection_retry_on_startup = True


app = Celery("undone", broker=None if "config_from_object" in undo else env("TEST_BROKER_URL"))
app.conf.broker_connection_retry_on_startup = True
configure(app, queues=[env("TEST_QUEUE", "undone")], soft_time_limit=8, time_limit=10)

if "acks_late" in undo:
    app.conf.task_acks_late = False
if "transport_options" in undo:
    app.conf.broker_transport_options = {"max_retries": 3}
if "prefetch" in undo:
    app.conf.worker_prefetch_multiplier = 8
if "config_from_object" in undo:
    app.config_from_object(Config)


@app.task(name="shop.sleep")
def sleep(seconds):
    time.sleep(seconds)


if "task_acks_late" in undo:
    @app.task(name="shop.charge", acks_late=False)
    def charge(order_id):
        time.sleep(4)
