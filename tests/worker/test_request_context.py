"""Each task's request context is built with the same custom headers Celery's own Context finds —
the same keys, values and order, or None — on any request, and a real worker's task sees the
headers its producer added (RabbitMQ and Redis). The RequestContext component installs it when
the worker starts."""
from __future__ import annotations

import ast

import pytest
from celery.app import trace
from celery.app.task import Context
from hypothesis import given
from hypothesis import strategies as st

from e2e.lib.waiting import wait_for
from raw_messages import Wire, consuming_worker, json_body, task_headers
from worker_support import before_and_after_worker_start
from taskherd.worker.components.request_context import OnePassContext, RequestContext, celery_keys

# Request keys as a worker's request dict holds them: Celery's (the class's attributes and the
# protocol's), and a producer's own.
_keys = st.sampled_from(sorted(celery_keys())) | st.text(min_size=1, max_size=8)
_values = st.none() | st.booleans() | st.integers() | st.text(max_size=8) | st.lists(st.integers(), max_size=2)


def _built(context_class, request, keywords):
    """The context's attributes in order (its headers among them), or the error building it raised."""
    try:
        return list(context_class(request, **keywords).__dict__.items())
    except Exception as exc:  # noqa: BLE001 - a request naming one of Context's methods breaks both
        return type(exc), str(exc)


@given(request=st.dictionaries(_keys, _values), keywords=st.dictionaries(_keys, _values, max_size=3))
def test_the_context_is_the_one_celery_builds(request, keywords):
    keywords.pop("self", None)
    assert _built(OnePassContext, request, keywords) == _built(Context, request, keywords)


def test_a_request_of_celerys_keys_only_has_no_custom_headers():
    request = {"id": "1", "task": "t", "lang": "py", "argsrepr": "()", "timelimit": [None, None], "retries": 0}
    assert OnePassContext(request, args=[], called_directly=False, kwargs={}).headers is None


def test_an_attribute_added_to_celerys_context_is_no_custom_header(monkeypatch):
    assert OnePassContext({"x-new": 1}).headers == {"x-new": 1}
    monkeypatch.setattr(Context, "x-new", None, raising=False)
    assert OnePassContext({"x-new": 1}).headers is None
    assert Context({"x-new": 1}).headers is None


def test_the_worker_builds_contexts_with_it_once_it_starts(monkeypatch):
    monkeypatch.setattr(trace, "Context", Context)  # as before any worker started here; put back after
    assert before_and_after_worker_start(RequestContext(), lambda: trace.Context) == (Context, OnePassContext)


@pytest.mark.parametrize("broker", ["rabbitmq", "redis"])
def test_a_task_sees_the_headers_its_producer_added(broker, tmp_path):
    added = {"x-tenant": "acme", "x-trace": {"span": 7, "sampled": True}, "priority_hint": None}
    with consuming_worker(broker, tmp_path) as consuming:
        consuming.publish(Wire(json_body([["seen"], {}, {"callbacks": None, "errbacks": None, "chain": None,
                                                         "chord": None}]),
                               headers=task_headers(task="core.custom_headers", argsrepr="('seen',)", **added)))

        seen = wait_for("the task to record its headers", lambda: consuming.recorded("seen"), timeout=20,
                        explain=consuming.worker.tail)
        assert len(seen) == 1
        headers = dict(ast.literal_eval(seen[0]))
        if broker == "redis":  # fast recovery's bookkeeping is in the request too, as with Celery's Context
            headers.pop("taskherd_held_as")
        assert headers == added
        consuming.assert_alive_and_unchanged()
