"""The apps the benchmarks compare, built in one place for bench/throughput_app.py and
bench/profile_cost.py: vanilla Celery with the profile's ack settings (the baseline), or
``configure(app)`` with some of its default components left out (to price each one).
"""
from __future__ import annotations

import warnings
from collections.abc import Iterable, Sequence

#: The baseline is vanilla Celery with the same acks as the profile (the issue's rule): late acks,
#: a task on a dead child rejected (redelivered), one message reserved per process, JSON only.
VANILLA_SETTINGS = dict(task_acks_late=True, task_reject_on_worker_lost=True, worker_prefetch_multiplier=1,
                        accept_content=["json"], task_serializer="json", result_serializer="json")


def make_vanilla(app) -> None:
    """Give ``app`` the baseline's settings."""
    app.conf.update(VANILLA_SETTINGS)


def configure_without(app, left_out: Iterable[str], *, queues: Sequence[str]) -> None:
    """``configure(app)`` with its default components except those whose class is named in
    ``left_out``; ValueError naming the valid classes for a name that is none of them."""
    from taskherd.worker import configure
    from taskherd.worker.components import default_components

    left_out = set(left_out)
    components = default_components()
    names = [type(component).__name__ for component in components]
    unknown = left_out - set(names)
    if unknown:
        raise ValueError(f"no component {', '.join(sorted(unknown))} (valid: {', '.join(names)})")
    with warnings.catch_warnings():
        # The profile warns about risky combinations of settings; a benchmark makes them on purpose.
        warnings.simplefilter("ignore")
        configure(app, queues=list(queues),
                  components=[component for component in components if type(component).__name__ not in left_out])
