"""Builds each task's request context (``task.request``) without rescanning Celery's whole class.

For every task a pool child runs, Celery's tracer builds a ``Context`` from the request, and
``Context._get_custom_headers`` copies the request, rebuilds the set of the class's ~60 attribute
names and pops each of them from the copy, to find the headers a producer added. That is ~63k
instructions of a ~400k no-op task in the child (docs/benchmarks.md, "Celery's own hot paths").
:class:`OnePassContext` is that Context with the names kept as a frozenset (rebuilt if the class ever
gains an attribute) and the copy filtered in one pass: the same headers, in the same order, or
None — ~40k. The component makes it the tracer's Context when the worker starts, before the pool
forks; a task called directly (``apply``, ``push_request``) keeps Celery's own.
"""
from __future__ import annotations

from typing import Any

from celery.app.task import Context

from taskherd import compat

from . import AtWorkerStart

#: What Context._get_custom_headers leaves out besides the class's own attribute names.
_PROTOCOL_KEYS = ("lang", "task", "argsrepr", "kwargsrepr", "compression")
#: (len(Context.__dict__) when built, the names): a class that gains an attribute gets new names.
_known: tuple[int, frozenset[str]] = (-1, frozenset())


def celery_keys() -> frozenset[str]:
    """The request keys that are no custom header, as Celery's Context computes them."""
    global _known
    names = Context.__dict__
    if _known[0] != len(names):
        _known = (len(names), frozenset({*names.keys(), *_PROTOCOL_KEYS}))
    return _known[1]


class OnePassContext(Context):
    """Celery's Context, its custom headers found in one pass (module docstring)."""

    def _get_custom_headers(self, *args: Any, **kwargs: Any) -> dict | None:
        headers: dict = {}
        headers.update(*args, **kwargs)
        known = celery_keys()
        return {key: value for key, value in headers.items() if key not in known} or None


class RequestContext(AtWorkerStart):
    """Makes :class:`OnePassContext` the tracer's Context as the worker starts."""

    @staticmethod
    def at_worker_start(**_: Any) -> None:
        compat.use_tracer_context_class(OnePassContext)
