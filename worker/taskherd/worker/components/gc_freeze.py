"""Freezes the worker's boot-time objects out of the garbage collector before the pool forks.

Celery's prefork pool runs a full ``gc.collect()`` in the main process before it forks each child
(celery/concurrency/asynpool.py, issue #2927: no garbage holding a socket may be inherited). After
the imports, a worker holds ~50,000 tracked objects (modules, classes, functions: all alive for
good), and each of those collections walked all of them: ~40 ms of CPU per child here, twice at
boot with two children, again each time a child is replaced (``max_tasks_per_child``, a crash).

Before the first child is forked, this component runs that collection once and then ``gc.freeze()``
moves every survivor to the permanent generation (the use the Python documentation gives for it):
Celery's own collections before each fork then walk only what was created since, and a forked
child's collections never write to the inherited objects' GC headers, so it shares more pages with
the main process instead of copying them. Garbage is still collected before each fork (the issue's
point); an object alive at the freeze that later becomes cyclic garbage is not reclaimed, a bounded
cost: what exists before the first fork is the boot's, built once.
"""
from __future__ import annotations

import dataclasses
import gc
from typing import Any

from . import Component

_DISPATCH_UID = "taskherd.worker.components.gc_freeze"


#: whether freeze_once has looked at this process's heap already. Not ``gc.get_freeze_count()`` on
#: every call: it walks the whole permanent generation (~50,000 objects, ~3 ms of CPU in the main
#: process per child replaced: a fifth of what replacing a child cost it; docs/benchmarks.md,
#: "Replacing a pool child").
_looked = False


def freeze_once(**_: Any) -> None:
    """Collects and freezes the heap, the first time only (later forks must not freeze the garbage
    of running tasks; a heap someone froze already is left as it is)."""
    global _looked
    if _looked:
        return
    _looked = True
    if gc.get_freeze_count() == 0:
        gc.collect()
        gc.freeze()


@dataclasses.dataclass(frozen=True, kw_only=True)
class GcFreeze(Component):
    """Connects :func:`freeze_once` to Celery's ``worker_before_create_process`` (prefork only)."""

    def install(self, app: Any, profile: Any = None) -> None:
        from celery.signals import worker_before_create_process

        worker_before_create_process.connect(freeze_once, weak=False, dispatch_uid=_DISPATCH_UID)
