"""The exporter's poll and the failover memory as pure logic: any error of an inspection is a
failed poll (never the end of the process), a partial answer exports the queues that were read,
and a failover list is tried from the URL that answered last. The behaviour against real brokers
is in test_exporter_errors.py."""
from __future__ import annotations

import json
import logging

import httpx
import pytest
import redis

from taskherd.commands.exporter import QueuePoller, metric_families
from taskherd.queues import BrokerRefused, BrokerUnreachable, FailoverMemory, QueueStats, QueuesUnreadable


def stats(name: str, ready: int = 1) -> QueueStats:
    return QueueStats(name, ready, 0, None, None, None, 3600.0)


def _http_error(status: int) -> httpx.HTTPStatusError:
    request = httpx.Request("GET", "http://rabbit:15672/api/queues/%2F/q")
    return httpx.HTTPStatusError("refused", request=request, response=httpx.Response(status, request=request))


@pytest.mark.parametrize("error", [
    redis.exceptions.ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value"),
    redis.exceptions.NoPermissionError("this user has no permissions to access one of the keys"),
    redis.exceptions.ReadOnlyError("You can't write against a read only replica."),
    json.JSONDecodeError("Expecting value", "<html>", 0),
    _http_error(500), _http_error(403),
    BrokerUnreachable("Redis at redis://u:***@h/0: timed out"),
    RuntimeError("redis://u:hunter2@cache:6379/0 said something new"),
], ids=lambda e: type(e).__name__)
def test_any_error_of_an_inspection_is_a_failed_poll_logged_in_one_line(error, caplog):
    def inspect(names):
        raise error

    poller = QueuePoller(dead_letters={"q": "q.dlq"}, inspect=inspect, clock=lambda: 5.0)
    with caplog.at_level(logging.WARNING, logger="taskherd.exporter"):
        snapshot = poller.poll()
    assert not snapshot.success and snapshot.stats == {} and snapshot.polled_at == 5.0
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "'q'" in lines[0] and type(error).__name__ in lines[0], lines
    assert "hunter2" not in lines[0]
    families = {m.name: m.samples for m in poller.collect()}
    assert families["taskherd_exporter_poll_success"][0].value == 0 and families["taskherd_queue_messages"] == []
    assert {s.labels["queue"]: s.value for s in families["taskherd_exporter_queue_poll_success"]} == \
        {"q": 0.0, "q.dlq": 0.0}


def test_one_unreadable_queue_hides_only_its_own_figures(caplog):
    def inspect(names):
        raise QueuesUnreadable({"bad": "key 'bad' holds a string, not a list"},
                               {"good": stats("good", 3), "good.dlq": stats("good.dlq", 2), "bad.dlq": stats("bad.dlq", 4)},
                               where="Redis at redis://h/0")

    poller = QueuePoller(dead_letters={"good": "good.dlq", "bad": "bad.dlq"}, inspect=inspect)
    with caplog.at_level(logging.WARNING, logger="taskherd.exporter"):
        snapshot = poller.poll()
    assert [r.getMessage() for r in caplog.records] == \
        ["poll failed for queue 'bad': Redis at redis://h/0: key 'bad' holds a string, not a list"]
    assert snapshot.queue_errors == {"bad": "key 'bad' holds a string, not a list"} and not snapshot.success
    families = {m.name: m.samples for m in metric_families(snapshot, poller.dead_letters)}
    assert {(s.labels["queue"], s.labels["state"]): s.value for s in families["taskherd_queue_messages"]} == \
        {("good", "ready"): 3, ("good", "unacked"): 0}
    assert {s.labels["queue"]: s.value for s in families["taskherd_exporter_queue_poll_success"]} == \
        {"good": 1, "bad": 0, "good.dlq": 1, "bad.dlq": 1}
    assert {(s.labels["queue"], s.value) for s in families["taskherd_dlq_messages"]} == {("good", 2), ("bad", 4)}
    assert families["taskherd_exporter_poll_success"][0].value == 0


def test_a_whole_failure_after_a_success_exports_nothing_stale_and_recovery_is_logged(caplog):
    answers = [{"q": stats("q")}, BrokerUnreachable("down"), {"q": stats("q", 2)}]

    def inspect(names):
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    poller = QueuePoller(dead_letters={"q": "q.dlq"}, inspect=inspect)
    with caplog.at_level(logging.INFO, logger="taskherd.exporter"):
        assert poller.poll().success
        failed = poller.poll()
        assert not failed.success and not failed.answered
        assert {m.name: m.samples for m in poller.collect()}["taskherd_queue_messages"] == []
        assert poller.poll().success
    assert [r.getMessage() for r in caplog.records][-1] == "poll succeeded again: every queue read"


def test_failover_memory_starts_from_the_url_that_answered_last():
    calls = []
    down = {"a"}

    def call(url):
        calls.append(url)
        if url in down:
            raise BrokerUnreachable(url)
        return url

    memory = FailoverMemory()
    assert memory.call(["a", "b", "c"], call) == "b" and calls == ["a", "b"]
    calls.clear()
    assert memory.call(["a", "b", "c"], call) == "b" and calls == ["b"], "not the one that did not answer"
    down = {"b"}
    calls.clear()
    assert memory.call(["a", "b", "c"], call) == "c" and calls == ["b", "c"]
    down = {"c"}
    calls.clear()
    assert memory.call(["a", "b", "c"], call) == "a" and calls == ["c", "a"]
    calls.clear()
    assert memory.call(["a", "b", "c"], call) == "a" and calls == ["a"] and memory.start(["a", "b", "c"]) == 0


def test_a_broker_that_answers_with_an_error_is_the_one_answering():
    """A wrong-typed key on the broker the workers are connected to is no reason to read another
    broker's (empty) queues: the error is raised, and the next poll starts at that broker too."""
    calls = []

    def call(url):
        calls.append(url)
        if url == "a":
            raise BrokerUnreachable("a")
        if url == "b":
            raise QueuesUnreadable({"q": "WRONGTYPE"}, {})
        return {}

    memory = FailoverMemory()
    with pytest.raises(QueuesUnreadable) as refused:
        memory.call(["a", "b", "c"], call)
    assert calls == ["a", "b"] and refused.value.answered_index == 1 and isinstance(refused.value, BrokerRefused)
    calls.clear()
    with pytest.raises(QueuesUnreadable):
        memory.call(["a", "b", "c"], call)
    assert calls == ["b"]
