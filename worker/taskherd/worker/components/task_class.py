"""The TaskClass component: taskherd's Task becomes the app's default task class.

A plain ``@app.task`` then retries transient errors only, dead-letters the rest with an envelope and
bounds messages that kill their worker (taskherd.worker.task). Tasks created before configure()
keep the class they were created with: a warning names them.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Any

from . import Component

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, kw_only=True)
class TaskClass(Component):
    def install(self, app: Any, profile: Any) -> None:
        from taskherd.worker.task import Task

        app.task_cls = Task
        app.__dict__.pop("Task", None)  # `app.Task` is a cached_property built from task_cls
        if app.finalized:
            plain = [name for name, task in app.tasks.items()
                     if not name.startswith("celery.") and not isinstance(task, Task)]
            if plain:
                logger.warning("taskherd: tasks %s were created before configure(app) and do not retry/"
                               "dead-letter; call configure() before the app is finalized", plain)
