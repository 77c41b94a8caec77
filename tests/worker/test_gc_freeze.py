"""GcFreeze: the heap is collected and frozen before the pool's first fork, and only then."""
import gc
import weakref

import pytest
from celery import Celery, signals

from taskherd.worker.components import default_components
from taskherd.worker.components import gc_freeze
from taskherd.worker.components.gc_freeze import GcFreeze, freeze_once


class _Node:
    pass


def _tracked_by_collections(obj) -> bool:
    """Whether gc.collect() walks ``obj`` (frozen objects are in no generation)."""
    return any(candidate is obj for candidate in gc.get_objects())


@pytest.fixture
def unfrozen(monkeypatch):
    if gc.get_freeze_count():
        pytest.skip("this process's heap was frozen before the test")
    monkeypatch.setattr(gc_freeze, "_looked", False)  # as in a worker that has not forked yet
    yield
    gc.unfreeze()


def test_the_first_fork_collects_the_garbage_then_freezes_the_survivors(unfrozen):
    garbage = _Node()
    garbage.itself = garbage  # a cycle: only the collector reclaims it
    dead = weakref.ref(garbage)
    alive = _Node()
    del garbage

    freeze_once()

    assert dead() is None, "garbage present before the fork must be collected (celery issue #2927), not frozen"
    assert gc.get_freeze_count() > 0
    assert not _tracked_by_collections(alive), "a survivor must be left out of later collections"


def test_later_forks_do_not_freeze_what_tasks_left_behind(unfrozen):
    freeze_once()
    frozen = gc.get_freeze_count()
    later = [_Node() for _ in range(1000)]

    freeze_once()

    # Not equal: a frozen object that dies (another thread's, say) leaves the count; a second
    # freeze would have added the 1000 nodes.
    assert gc.get_freeze_count() <= frozen
    assert all(_tracked_by_collections(node) for node in later[:3])


def test_later_forks_do_not_walk_the_frozen_heap(unfrozen, monkeypatch):
    freeze_once()

    def walks_the_permanent_generation():
        raise AssertionError("gc.get_freeze_count() walks every frozen object: milliseconds per child replaced")

    monkeypatch.setattr(gc, "get_freeze_count", walks_the_permanent_generation)
    freeze_once()


def test_the_component_hooks_celerys_before_fork_signal(unfrozen):
    assert any(isinstance(component, GcFreeze) for component in default_components())
    GcFreeze().install(Celery("gc-freeze-test", set_as_current=False))

    signals.worker_before_create_process.send(sender=None)

    assert gc.get_freeze_count() > 0
