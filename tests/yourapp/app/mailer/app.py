"""The mailer's Celery app. Putting it under taskherd took the `configure()` call; the rest is the
app as it was. The broker URL comes from the chart (`TASKHERD_BROKER_URL`, from a Secret)."""
from celery import Celery

from taskherd.worker import configure

app = Celery("mailer", include=["mailer.tasks"])
app.conf.update(task_default_queue="mailer", task_ignore_result=True)

configure(app, queues=["mailer"], soft_time_limit=20, time_limit=30)
