"""The queue-wait histogram's reading of the publish stamp (``taskherd_published_at``), which any
producer can set to anything: float() took Infinity, NaN, '-1e999' and digits of other scripts
('١٢' is 12), observing a queue wait of +Inf, NaN or 54 years. An unreadable stamp now counts as
no stamp (taskherd.worker.deliveries.header_timestamp): no observation, the task runs."""
from __future__ import annotations

import math
import time

import pytest
from celery.app.task import Context
from prometheus_client import CollectorRegistry

from taskherd.worker.components import metrics

PUBLISHED_AT = "taskherd_published_at"
HOSTILE = [float("nan"), float("inf"), float("-inf"), "\u0661\u0662", "1e999", "-1e999", "Infinity", "-Infinity",
           "NaN", "1700000000.5", True, -5, 10 ** 400, 1e300, {"a": 1}, [1700000000]]


def _label(value) -> str:
    text = repr(value)
    return text if len(text) < 24 else text[:20] + "…"


@pytest.mark.parametrize("stamp", HOSTILE, ids=_label)
def test_an_unreadable_stamp_is_no_stamp_on_the_request_or_in_its_headers(stamp):
    assert metrics.published_at(Context({PUBLISHED_AT: stamp})) is None  # Celery's custom headers
    assert metrics.published_at(Context({"headers": {PUBLISHED_AT: stamp}})) is None


def test_a_readable_stamp_is_read_and_headers_that_are_no_object_are_none():
    assert metrics.published_at(Context({PUBLISHED_AT: 1700000000.5})) == 1700000000.5
    assert metrics.published_at(Context({"headers": {PUBLISHED_AT: 1700000000}})) == 1700000000.0
    assert metrics.published_at(object()) is None
    for headers in ([1], "x", 5):
        assert metrics.published_at(Context({"headers": headers})) is None


class _Task:
    name = "shop.charge"
    request = None


@pytest.fixture
def updates(monkeypatch):
    """What task_started writes (one list per call), into a fresh registry's metric objects."""
    fresh = metrics.TaskMetrics(registry=CollectorRegistry())
    monkeypatch.setattr(metrics, "default_metrics", lambda: fresh)
    written: list[list] = []
    monkeypatch.setattr(metrics, "add_all", lambda pairs: written.append(list(pairs)))
    return fresh, written


@pytest.mark.parametrize("stamp", HOSTILE, ids=_label)
def test_a_task_with_a_hostile_stamp_counts_in_flight_and_observes_no_queue_wait(updates, stamp):
    fresh, written = updates
    assert metrics.task_started(_Task(), Context({PUBLISHED_AT: stamp})) is not None
    (pairs,) = written
    assert pairs == [(fresh.value("in_flight", "shop.charge"), 1.0)], "one update: in flight, no observation"


def test_a_task_with_a_good_stamp_observes_a_finite_wait(updates):
    fresh, written = updates
    metrics.task_started(_Task(), Context({PUBLISHED_AT: time.time() - 5}))
    (pairs,) = written
    (in_flight, _), (total, waited), (_bucket, one) = pairs
    assert in_flight is fresh.value("in_flight", "shop.charge") and one == 1.0
    assert math.isfinite(waited) and 5 <= waited < 15
