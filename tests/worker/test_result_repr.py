"""A task's result text is Celery's saferepr text for every value and limit; the ResultRepr
component makes it the tracer's when the worker starts."""
from __future__ import annotations

from celery.app import trace
from celery.utils.saferepr import saferepr
from hypothesis import given
from hypothesis import strategies as st

from worker_support import before_and_after_worker_start
from taskherd.worker.components.result_repr import ResultRepr, result_repr

_limits = st.none() | st.integers(0, 40)
_values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=30) | st.floats(),
                       lambda children: st.lists(children, max_size=4)
                       | st.dictionaries(st.text(max_size=5), children, max_size=4), max_leaves=10)


@given(_values, _limits)
def test_the_text_is_saferepr_s(value, maxlen):
    assert result_repr(value, maxlen) == saferepr(value, maxlen)


def test_none_and_bools_at_every_limit():
    for value in (None, True, False):
        for maxlen in (None, *range(0, 12), 1024):
            assert result_repr(value, maxlen) == saferepr(value, maxlen), (value, maxlen)


def test_the_worker_writes_results_with_it_once_it_starts(monkeypatch):
    monkeypatch.setattr(trace, "saferepr", saferepr)  # as before any worker started here; put back after
    assert before_and_after_worker_start(ResultRepr(), lambda: trace.saferepr) == (saferepr, result_repr)
