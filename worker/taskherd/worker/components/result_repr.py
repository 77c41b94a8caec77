"""Writes the text of a task's None, True or False result without Celery's general repr machinery.

After each task the pool child's tracer writes its result's text for the main process's log and
events with ``saferepr`` (celery.utils.saferepr): a streaming, truncating repr that costs ~23k
instructions even for ``None`` — what most tasks return — out of a ~400k no-op task in the child
(docs/benchmarks.md, "Celery's own hot paths"). :func:`result_repr` gives ``'None'``, ``'True'``
or ``'False'`` itself when the limit leaves them whole (saferepr truncates them under a limit of
six), and hands every other value to saferepr: the same text always. The component makes
it the tracer's ``saferepr`` when the worker starts, before the pool forks.
"""
from __future__ import annotations

from typing import Any

from celery.utils.saferepr import saferepr

from taskherd import compat

from . import AtWorkerStart

#: The smallest limit at which saferepr leaves all three whole ('False', the longest, needs six).
_WHOLE_FROM = 6
_TEXT = {None: "None", True: "True", False: "False"}


def result_repr(o: Any, maxlen: int | None = None, maxlevels: int = 3, seen: Any = None) -> str:
    """``celery.utils.saferepr.saferepr``, with None, True and False written directly."""
    if (o is None or o is True or o is False) and (maxlen is None or maxlen >= _WHOLE_FROM):
        return _TEXT[o]
    return saferepr(o, maxlen, maxlevels, seen)


class ResultRepr(AtWorkerStart):
    """Makes :func:`result_repr` the tracer's saferepr as the worker starts."""

    @staticmethod
    def at_worker_start(**_: Any) -> None:
        compat.use_tracer_result_repr(result_repr)
