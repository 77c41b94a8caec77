"""The TaskClass component: taskherd's Task becomes the app's default task class.

A plain ``@app.task`` then retries transient errors only, dead-letters the rest with an envelope and
bounds messages that kill their worker (taskherd.worker.task). So does a task with a base class of
the app's own (``@app.task(base=DatabaseTask)`` where ``DatabaseTask(celery.Task)``, as Celery's
guide writes it): Celery would make that class the task's only base, silently without taskherd's
Task, so the component gives such a task a class deriving from both (:func:`with_taskherd_task`).
Tasks that still end up without it — created before configure(), or registered as classes with
``app.register_task`` — are named in a warning (at configure() and when a worker starts).
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Any

from taskherd import compat

from . import Component

logger = logging.getLogger(__name__)

#: (a user's base class, taskherd's Task) -> the class deriving from both, made once per base
_COMBINED: dict[tuple[type, type], type] = {}


def with_taskherd_task(base: type | None, task_class: type) -> type | None:
    """The base class a task created with ``base=`` gets: ``base`` when it already derives from
    ``task_class`` (or is None: Celery then uses the app's default), else a subclass of both.

    taskherd's Task comes first: its ``__call__`` (retries, dead letters, the poison bound) runs the
    base's own ``__call__`` in turn, and its Request (combined with the base's own, if any) and
    Strategy are the ones the worker uses. The base's hooks (``on_success``, ``before_start`` …) and
    options (``autoretry_for`` …) still apply, taskherd's Task defining none of them."""
    import celery

    if base is None or not isinstance(base, type) or issubclass(base, task_class) \
            or not issubclass(base, celery.Task):
        return base
    combined = _COMBINED.get((base, task_class))
    if combined is None:
        attributes = {"__module__": base.__module__, "__qualname__": base.__qualname__, "__doc__": base.__doc__}
        request = _combined_request(base, task_class)
        if request is not None:
            attributes["Request"] = request
        combined = type(base.__name__, (task_class, base), attributes)
        _COMBINED[(base, task_class)] = combined
    return combined


def _combined_request(base: type, task_class: type) -> type | None:
    """A base with a Request class of its own (Celery's guide: ``Request = MyRequest`` for its own
    ``on_timeout``/``on_failure``) would lose it to taskherd's; both then, taskherd's first: each of
    its hooks calls ``super()``, so the base's run too. None when the base keeps Celery's."""
    from celery.utils.imports import symbol_by_name
    from celery.worker.request import Request as CeleryRequest

    theirs, ours = symbol_by_name(base.Request), symbol_by_name(task_class.Request)
    if theirs is CeleryRequest or not isinstance(theirs, type) or issubclass(theirs, ours) \
            or not issubclass(theirs, CeleryRequest):
        return None
    return type(theirs.__name__, (ours, theirs), {"__module__": theirs.__module__,
                                                  "__qualname__": theirs.__qualname__})


def tasks_without(app: Any, task_class: type) -> list[str]:
    """The app's own tasks (not Celery's built-ins) that are not instances of ``task_class``."""
    return sorted(name for name, task in app.tasks.items()
                  if not name.startswith("celery.") and not isinstance(task, task_class))


@dataclasses.dataclass(frozen=True, kw_only=True)
class TaskClass(Component):
    def install(self, app: Any, profile: Any) -> None:
        from celery import signals
        from celery.app.task import Task as CeleryTask
        from celery.utils.imports import symbol_by_name

        from taskherd.worker.task import Task

        # `Celery(task_cls=MyBase)` keeps MyBase under taskherd's Task, as @app.task(base=MyBase)
        # does: replaced by Task alone, its tasks silently lost MyBase's attributes and hooks. (A
        # second configure() finds the class the first one made: a Task already.)
        own = symbol_by_name(app.task_cls)
        mine = isinstance(own, type) and issubclass(own, CeleryTask) and own is not CeleryTask
        app.task_cls = with_taskherd_task(own, Task) if mine else Task
        app.__dict__.pop("Task", None)  # `app.Task` is a cached_property built from task_cls
        compat.set_task_base_chooser(app, lambda base: with_taskherd_task(base, Task))
        if app.finalized:
            plain = tasks_without(app, Task)
            if plain:
                logger.warning("taskherd: tasks %s were created before configure(app) and do not retry/"
                               "dead-letter; call configure() before the app is finalized", plain)

        def after_setup(sender: Any = None, instance: Any = None, **_: Any) -> None:
            # The worker has imported every task module by now: the last chance to say which tasks
            # would fail without an envelope and loop on a poison message.
            if getattr(instance, "app", None) is not app:
                return
            plain = tasks_without(app, Task)
            if plain:
                logger.warning("taskherd: tasks %s are not taskherd Tasks: they neither retry transient errors "
                               "nor dead-letter, and a message that kills their worker loops; create them with "
                               "@app.task (a base= class of yours is fine) after configure(app)", plain)

        signals.celeryd_after_setup.connect(after_setup, weak=False,
                                            dispatch_uid=f"taskherd.task_class.plain.{id(app)}")
