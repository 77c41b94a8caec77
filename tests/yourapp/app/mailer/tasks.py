"""The mailer's one task, a plain `@app.task` (configure() made taskherd's Task its base)."""
from __future__ import annotations

import os
import socket
import time

from celery import signals

from taskherd.worker import PermanentError

from . import store
from .app import app

#: how long the mail server takes to accept a mail
SEND_SECONDS = float(os.environ.get("MAILER_SEND_SECONDS", "1"))


@signals.worker_init.connect
def _migrate(**_):
    store.migrate()


@app.task(name="mailer.send_welcome")
def send_welcome(user_id: str) -> None:
    """Sends a user's welcome mail once, however often the message is delivered: the key row and
    the mail's row commit together, and a redelivery finds the key and does nothing."""
    if not user_id.startswith("user-"):
        raise PermanentError(f"user id {user_id!r} does not start with 'user-': no such user")
    with store.connect() as conn, store.keys.guard(f"welcome:{user_id}", conn=conn) as claim:
        if claim.done:
            return
        time.sleep(SEND_SECONDS)  # the mail server
        conn.execute("INSERT INTO mailer_sent (user_id, pod) VALUES (%s, %s)", (user_id, socket.gethostname()))
        claim.set_result({"sent": user_id})
