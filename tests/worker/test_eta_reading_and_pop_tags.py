"""What the message check accepts is what the worker can hold safely, on the real Redis and real workers:

- an ETA Celery reads but Python's ``datetime.fromisoformat`` does not (``…z`` lowercase,
  ``T24:00:00``), or that kombu's JSON decodes to a datetime, is parked in the delay set — never
  held unacknowledged past the visibility timeout and run again — because the check and the delay
  set read it with one function (Celery's reading); an absurd ETA (year 9999) is refused with the
  limit named;
- a Redis item the pop records under one tag is acknowledged under that very tag, whatever Python
  makes of it (an empty tag, a header nested too deep for Python's JSON parser): dead-lettered
  once, nothing left in ``unacked``;
- kombu's restore sweep goes on past an ``unacked`` entry Python cannot read, in one log line.
"""
from __future__ import annotations

import base64
import datetime as dt
import json
import time
import uuid

import pytest
import redis

from e2e.lib.waiting import wait_for
from raw_messages import json_body, kombu_payload, task_headers
from taskherd.worker import delayed, task_messages
from taskherd.worker.components import recovery
from worker_support import core_env, dead_letters

DEPTH = 975  # Python's JSON parser gives up (RecursionError) in the worker; Redis's cjson (1000) does not

#: ETA strings as producers write them, each with what Celery itself reads (or refuses)
ETAS = ["2026-12-05T03:30:36.287501z", "2026-12-05T03:30:36Z", "2026-12-05T24:00:00", "2026-12-05T24:00:00+01:00",
        "2026-12-05T03:30:36", "2026-12-05T03:30:36.5+05:30", "2026-12-05 03:30:36", "20261205T033036Z",
        "2026-12-05T03:30", "2026-W49-6T03:30:36Z", "2026-339T03:30:36", "2026-12-05T03:30:36,5Z",
        "0001-01-01T00:00:00+14:00", "tomorrow", "2026-13-01T00:00:00", "2026-12-05T25:00:00", "2026-12-05T03:30:36zz"]


@pytest.mark.parametrize("eta", ETAS)
def test_the_check_and_the_delay_set_read_an_eta_alike(eta):
    """One reading: an ETA the check accepts has a time in the delay set, and one it refuses has none
    (the old delay set used fromisoformat: '…z' and 'T24:00:00' were accepted but not parked)."""
    from celery.utils.time import maybe_iso8601, maybe_make_aware

    headers = {"id": "i", "task": "t", "eta": eta}
    accepted = task_messages.date_time_problem(eta) is None
    due = delayed.due_time(headers, default_timezone=dt.timezone(dt.timedelta(hours=3)))
    assert accepted == (due is not None), (eta, task_messages.date_time_problem(eta), due)
    if accepted:  # the time Celery's worker reads (naive = UTC, whatever the app's time zone)
        assert due == maybe_make_aware(maybe_iso8601(eta), dt.timezone.utc).timestamp()


def test_a_datetime_eta_is_read_too():
    when = dt.datetime(2026, 12, 5, 3, 30, 36, tzinfo=dt.timezone.utc)
    assert task_messages.date_time_problem(when) is None
    assert delayed.due_time({"task": "t", "eta": when}, default_timezone=dt.timezone.utc) == when.timestamp()
    raw = {"headers": {"task": "t", "eta": when, "expires": when}, "properties": {"delivery_tag": "x"}}
    parked = delayed.parked_message(raw)  # kombu's JSON: a datetime header survives the copy
    assert parked["headers"] == {"task": "t", "taskherd_eta": when, "expires": when}


def test_an_eta_too_far_ahead_is_refused_with_the_limit_named():
    now = time.time()
    days = task_messages.MAX_ETA_AHEAD_DAYS
    near = dt.datetime.fromtimestamp(now + (days - 1) * 86400, dt.timezone.utc).isoformat()
    far = dt.datetime.fromtimestamp(now + (days + 1) * 86400, dt.timezone.utc).isoformat()
    assert task_messages.header_problem({"id": "i", "task": "t", "eta": near}) is None
    problem = task_messages.header_problem({"id": "i", "task": "t", "eta": "9999-12-31T23:59:59Z"})
    assert problem.startswith("header 'eta' is ") and f"valid: at most {days} days ahead" in problem, problem
    assert f"at most {days} days ahead" in task_messages.header_problem({"id": "i", "task": "t", "eta": far})
    assert task_messages.header_problem({"id": "i", "task": "t", "expires": "9999-12-31T23:59:59Z"}) is None, (
        "a far expiry harms nothing: only the ETA is bounded")


def _push(client: redis.Redis, queue: str, payload: dict | str) -> None:
    client.lpush(queue, payload if isinstance(payload, str) else json.dumps(payload))


def _record_payload(queue: str, key: str, **headers) -> dict:
    body = json_body([[key, "ok"], {}, {"callbacks": None, "errbacks": None, "chain": None, "chord": None}])
    return kombu_payload(body, task_headers(**headers), queue=queue)


def _recorded(client: redis.Redis, key: str) -> list[str]:
    return [raw.decode().split("|", 2)[2] for raw in client.lrange(key, 0, -1)]


def _fast_sweeping_worker(worker_factory, broker_url: str, queue: str):
    """A worker whose deliveries come back after 8 s, kombu sweeping for them every second."""
    return worker_factory("apps.core_app", queues=[queue], concurrency=1,
                          env=core_env(broker_url, queue, broker_url, soft_time_limit=5, time_limit=6,
                                       visibility_timeout=8, restore_sweep=1))


def _assert_alive(worker, pid: int) -> None:
    assert worker.is_running() and worker.pid == pid, f"the worker exited or was replaced:\n{worker.tail()}"
    assert "Traceback" not in worker.log() and "Error in timer" not in worker.log(), worker.tail(80)


@pytest.mark.parametrize("broker_url", ["redis"], indirect=True)
def test_etas_celery_reads_are_parked_and_run_once(broker_url, unique_name, worker_factory):
    """Visibility timeout 8 s, kombu's sweep every second, ETAs 14 s ahead: an ETA held by the
    worker instead of parked would be restored and run twice (three times, seen on the old code)."""
    q = unique_name
    client = redis.Redis.from_url(broker_url)
    worker = _fast_sweeping_worker(worker_factory, broker_url, q)
    pid = worker.pid
    when = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=14)
    lower_z = when.strftime("%Y-%m-%dT%H:%M:%S.%f") + "z"
    as_datetime = {"__type__": "datetime", "__value__": when.isoformat()}  # kombu's JSON: a datetime header
    midnight = (dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=1)).replace(hour=0, minute=0, second=0,
                                                                                  microsecond=0)
    t24 = (midnight - dt.timedelta(days=1)).strftime("%Y-%m-%dT24:00:00+00:00")
    _push(client, q, _record_payload(q, "lower-z", eta=lower_z))
    _push(client, q, _record_payload(q, "as-datetime", eta=as_datetime))
    _push(client, q, _record_payload(q, "t24", eta=t24))
    _push(client, q, _record_payload(q, "year-9999", eta="9999-12-31T23:59:59Z", id="year-9999"))

    parked = wait_for("three ETA messages parked", lambda: client.zcard(delayed.DELAYED_KEY), timeout=20, equals=3,
                      explain=worker.tail)
    letters = wait_for("the year-9999 ETA refused", lambda: dead_letters(broker_url, q), timeout=20,
                       explain=worker.tail)
    assert client.hlen("unacked") == 0, "nothing held by the worker"
    scores = sorted(score for _, score in client.zrange(delayed.DELAYED_KEY, 0, -1, withscores=True))
    assert scores[-1] == midnight.timestamp(), "T24:00:00 is the next midnight, as Celery reads it"
    assert abs(scores[0] - when.timestamp()) < 0.01 and abs(scores[1] - when.timestamp()) < 0.01

    wait_for("both near ETAs run", lambda: _recorded(client, "lower-z") and _recorded(client, "as-datetime"),
             timeout=30, explain=worker.tail)
    time.sleep(8 + 4)  # past the visibility timeout and a few sweeps: a held copy would have run again
    assert (_recorded(client, "lower-z"), _recorded(client, "as-datetime"), _recorded(client, "t24")) == (
        ["ok"], ["ok"], []), "each ran exactly once, at its ETA"
    (letter,) = dead_letters(broker_url, q)
    assert letter.envelope.reason == "invalid-message" and letter.envelope.task_id == "year-9999"
    assert (f"header 'eta' is " in letter.envelope.detail
            and f"at most {task_messages.MAX_ETA_AHEAD_DAYS} days ahead" in letter.envelope.detail), letter.envelope
    assert parked == 3 and len(letters) == 1
    assert client.zcard(delayed.DELAYED_KEY) == 1 and client.hlen("unacked") == 0  # t24 still waits, parked
    _assert_alive(worker, pid)


def _deep_item(queue: str) -> tuple[bytes, str]:
    payload = _record_payload(queue, "deep", x_deep="__DEEP__")
    text = json.dumps(payload).replace('"__DEEP__"', "[" * DEPTH + "]" * DEPTH)
    return text.encode(), payload["properties"]["delivery_tag"]


@pytest.mark.parametrize("broker_url", ["redis"], indirect=True)
def test_an_item_the_pop_recorded_is_acked_under_that_tag_and_dead_lettered_once(broker_url, unique_name,
                                                                                 worker_factory):
    """An empty delivery tag and a header nested too deep for Python: each dead-lettered once,
    through several restore sweeps and a warm shutdown; `unacked` empty, no traceback."""
    q = unique_name
    client = redis.Redis.from_url(broker_url)
    worker = _fast_sweeping_worker(worker_factory, broker_url, q)
    pid = worker.pid
    empty_tag = _record_payload(q, "empty-tag")
    empty_tag["properties"]["delivery_tag"] = ""
    deep, deep_tag = _deep_item(q)
    _push(client, q, empty_tag)
    client.lpush(q, deep)
    _push(client, q, _record_payload(q, "after"))

    wait_for("the good task after them", lambda: _recorded(client, "after"), timeout=30, explain=worker.tail)
    wait_for("two dead letters", lambda: len(dead_letters(broker_url, q)), timeout=20, equals=2, explain=worker.tail)
    wait_for("nothing unacked", lambda: client.hlen("unacked"), timeout=10, equals=0,
             explain=lambda: f"{client.hkeys('unacked')}\n{worker.tail()}")
    time.sleep(8 + 4)  # past the visibility timeout, through several sweeps (one a second)
    letters = dead_letters(broker_url, q)
    assert sorted(base64.b64decode(l.envelope.raw_body_b64) for l in letters) == sorted(
        [json.dumps(empty_tag).encode(), deep]), "each dead-lettered once, whole"
    assert {l.envelope.reason for l in letters} == {"undecodable-message"}
    assert client.hlen("unacked") == 0 and client.zcard("unacked_index") == 0
    assert not client.hexists(recovery.OWNER_KEY, deep_tag) and not client.hexists(recovery.OWNER_KEY, "")
    _assert_alive(worker, pid)

    assert worker.stop() == 0
    assert client.llen(q) == 0 and len(dead_letters(broker_url, q)) == 2, "nothing went back at shutdown"
    assert client.hlen("unacked") == 0


@pytest.mark.parametrize("broker_url", ["redis"], indirect=True)
def test_the_restore_sweep_goes_on_past_an_entry_python_cannot_read(broker_url, unique_name, worker_factory):
    """Left in `unacked` by a worker that died (or by an older version): an entry too deep for
    Python's parser, then a good one. Each sweep used to stop at the first with a RecursionError
    traceback; now it goes back from its holder's record (dead-lettered once), the good one runs."""
    q = unique_name
    client = redis.Redis.from_url(broker_url)
    deep, deep_tag = _deep_item(q)
    good = _record_payload(q, "restored")
    good_tag = good["properties"]["delivery_tag"]
    old = time.time() - 60
    client.hset("unacked", deep_tag, b"[" + deep + b',"","' + q.encode() + b'"]')
    client.hset("unacked", good_tag, json.dumps([good, "", q]))
    client.zadd("unacked_index", {deep_tag: old + 1, good_tag: old})  # the deep one comes first in the sweep
    client.hset(recovery.OWNER_KEY, deep_tag, "w-gone")
    client.hset(recovery.held_key("w-gone"), deep_tag, json.dumps({"lists": [q], "message": deep.decode()}))

    worker = _fast_sweeping_worker(worker_factory, broker_url, q)
    pid = worker.pid
    wait_for("the good entry restored and run", lambda: _recorded(client, "restored"), timeout=30,
             explain=worker.tail)
    wait_for("the deep one dead-lettered", lambda: len(dead_letters(broker_url, q)), timeout=20, equals=1,
             explain=worker.tail)
    time.sleep(4)  # more sweeps
    (letter,) = dead_letters(broker_url, q)
    assert base64.b64decode(letter.envelope.raw_body_b64) == deep and letter.envelope.reason == "undecodable-message"
    assert client.hlen("unacked") == 0 and client.hlen(recovery.held_key("w-gone")) == 0
    assert _recorded(client, "restored") == ["ok"]
    assert worker.log().count("cannot be read") == 1, worker.tail(80)
    _assert_alive(worker, pid)
