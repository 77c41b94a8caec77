"""Headers taskherd reads numbers from — its own (``taskherd_redeliveries``, ``taskherd_redrives``,
``taskherd_first_failure_at``, ``taskherd_published_at``) and Celery's ``retries`` — with any value a
producer can send: no worker exits, no message is lost.

Before: on Redis a ``retries`` or ``taskherd_redrives`` of Infinity, or a count of '²' or of 5000
digits, ended the worker's main process ("Unrecoverable error: OverflowError") as it took the
message, and every worker restarted after it; on RabbitMQ such a count raised in the pool child
before the task ran, and a ``taskherd_first_failure_at`` that is no time made a failing task's
dead-lettering raise: acknowledged, in no queue and no DLQ. ``taskherd dlq redrive`` of a letter
with ``taskherd_redrives: "abc"`` was a traceback.
"""
from __future__ import annotations

import io
import math
import time
import uuid

import pytest
import redis
from kombu import Connection, Producer

from e2e.lib.waiting import wait_for
from raw_messages import Wire, consuming_worker, json_body, settle, task_headers
from taskherd.contract import shown
from taskherd.commands.dlq import main as dlq_main, parse, redrive_message
from taskherd.worker import deliveries
from taskherd.worker.components.recovery import returned
from taskherd.worker.deadletter import FIRST_FAILURE_HEADER, REDRIVES_HEADER
from taskherd.worker.task import soft_limit_applied
from worker_support import core_env, dead_letters

INF, NAN = float("inf"), float("nan")
FIVE_THOUSAND_NINES = "9" * 5000
#: Values no count or time can be: int() refuses '²' (a digit to str.isdigit()) and 5000 digits,
#: and Infinity cannot become an int.
HOSTILE = [INF, -INF, NAN, "abc", "\u00b2", "\u0663", FIVE_THOUSAND_NINES, "", " 3", "-1", True, False,
           {"a": 1}, [1], -1, 2.5, 10 ** 30, 1e300]
HOSTILE_IDS = ["inf", "-inf", "nan", "abc", "superscript-two", "arabic-three", "5000-nines", "empty",
               "space-3", "minus-1-text", "true", "false", "dict", "list", "minus-1", "2.5", "10**30", "1e300"]


# -- the lenient readers, pure ---------------------------------------------------------------
@pytest.mark.parametrize("value", HOSTILE, ids=HOSTILE_IDS)
def test_a_count_that_is_none_reads_as_none_never_an_exception(value):
    assert deliveries.header_count(value) is None


@pytest.mark.parametrize("value, count", [(0, 0), (3, 3), ("3", 3), ("007", 7), (4.0, 4), ("9" * 18, 10 ** 18 - 1)])
def test_a_count_is_read_from_an_int_a_whole_float_or_ascii_digits(value, count):
    assert deliveries.header_count(value) == count


@pytest.mark.parametrize("value", [INF, -INF, NAN, "not-a-time", "1700000000", {"x": 1}, [1], True, None, -1,
                                   10 ** 5000, 1e300], ids=lambda value: _label(value))
def test_a_timestamp_that_is_none_reads_as_none_never_an_exception(value):
    assert deliveries.header_timestamp(value) is None


def test_a_timestamp_is_a_number_of_epoch_seconds():
    assert deliveries.header_timestamp(1700000000.5) == 1700000000.5
    assert deliveries.header_timestamp(1700000000) == 1700000000.0


# -- counting returns, pure: what the Redis QoS runs in the worker's main process ---------------
def _returned_n_times(headers: dict, n: int) -> dict:
    for _ in range(n):
        headers = deliveries.returned_headers(headers)
    return headers


def _count(headers: dict, *, retries=0, redelivered=True):
    return deliveries.count(task_id="t1", retries=retries, headers=headers, redelivered=redelivered,
                            queue_type="classic", counter_url=None, counter_ttl=60)


@pytest.mark.parametrize("value", HOSTILE, ids=HOSTILE_IDS)
@pytest.mark.parametrize("header", ["retries", REDRIVES_HEADER])
def test_returns_of_a_message_with_an_unreadable_attempt_number_are_counted_exactly(header, value):
    """An unreadable retry or redrive number reads as 0 where the count is written and where it is
    read: three returns are three earlier deliveries, so max_deliveries still bounds the message."""
    headers = _returned_n_times({"id": "t1", "task": "x", "retries": 0, header: value}, 3)
    assert headers[deliveries.HEADER] == "t1:0:0:3"
    assert _count(headers, retries=headers["retries"]) == deliveries.Count(3, "header")


@pytest.mark.parametrize("count", ["\u00b2", FIVE_THOUSAND_NINES, "-1", "", "9" * 19])
@pytest.mark.parametrize("form", ["scoped", "bare"])
def test_an_unreadable_carried_count_is_no_count_and_the_first_return_writes_a_good_one(form, count, caplog):
    value = f"t1:0:0:{count}" if form == "scoped" else count
    headers = {"id": "t1", "task": "x", "retries": 0, deliveries.HEADER: value}
    assert deliveries.carried(value, "t1:0:0") is None
    assert _count(headers, redelivered=False) == deliveries.FIRST_DELIVERY, "a first delivery: it runs"
    assert deliveries.returned_headers(headers)[deliveries.HEADER] == "t1:0:0:1"
    if form == "scoped":
        assert "is not a count of its deliveries" in caplog.text


@pytest.mark.parametrize("value", [INF, {"a": 1}, [1], True, 7], ids=lambda value: _label(value))
def test_a_count_header_that_is_no_string_is_no_count(value):
    assert _count({deliveries.HEADER: value}, redelivered=False) == deliveries.FIRST_DELIVERY


def test_an_unreadable_x_delivery_count_falls_back_to_the_next_source():
    found = deliveries.count(task_id="t1", retries=0, headers={"x-delivery-count": "many"}, redelivered=True,
                             queue_type="quorum", counter_url=None, counter_ttl=60)
    assert found == deliveries.Count(None, "unknown")


@pytest.mark.parametrize("headers", [
    {"id": "t1", "task": "x", "retries": INF},
    {"id": "t1", "task": "x", "retries": 0, REDRIVES_HEADER: INF},
    {"id": "t1", "task": "x", "retries": 0, deliveries.HEADER: "t1:0:0:\u00b2"},
    {"id": "t1", "task": "x", "retries": 0, deliveries.HEADER: "t1:0:0:" + FIVE_THOUSAND_NINES},
    {"id": [[[[]]]], "task": "x", "retries": 0},
], ids=["retries-inf", "redrives-inf", "count-superscript", "count-5000-digits", "id-a-list"])
def test_the_redis_restore_of_a_hostile_message_counts_the_return(headers):
    """recovery.returned runs in the worker's main process on every delivery (the held record)."""
    payload = {"body": "e30=", "headers": headers,
               "properties": {"delivery_info": {"exchange": "", "routing_key": "q"}, "delivery_tag": "d"}}
    back = returned(payload)
    assert back["headers"]["redelivered"] is True
    assert back["headers"][deliveries.HEADER].endswith(":0:0:1")


# -- the soft time limit an envelope names ---------------------------------------------------------
@pytest.mark.parametrize("timelimit, task_limit, expected", [
    ([None, 1e-9], None, 1e-9), ((30, 5), 7, 5), ([None, None], 7, 7), (None, None, 20), ([10, 0], None, 20)])
def test_the_soft_time_limit_named_is_the_one_that_applied(timelimit, task_limit, expected):
    assert soft_limit_applied(timelimit, task_limit, 20) == expected


# -- redrive, pure -----------------------------------------------------------------------------
@pytest.mark.parametrize("value", HOSTILE + [None], ids=HOSTILE_IDS + ["none"])
def test_a_redrive_of_a_native_letter_with_an_unreadable_redrive_number_is_redrive_1(value):
    headers = {**task_headers(), REDRIVES_HEADER: value, "x-death": [{"count": "x", "reason": "rejected",
                                                                       "queue": "q", "time": INF}]}
    letter = parse(b"[[], {}, {}]", headers, "application/json", "utf-8")
    assert letter.kind == "native" and letter.attempts == 1 and letter.dead_lettered_at is None
    _, redriven, _, _ = redrive_message(letter)
    assert redriven[REDRIVES_HEADER] == 1 and "x-death" not in redriven


# -- real workers, both brokers --------------------------------------------------------------------
@pytest.fixture(scope="module", params=["redis", "rabbitmq"])
def consuming(request, tmp_path_factory):
    with consuming_worker(request.param, tmp_path_factory.mktemp(f"hostile-{request.param}")) as worker:
        yield worker


def _scoped(count: str):
    """A ``taskherd_redeliveries`` of this message's own attempt (its id is known only when sent)."""
    return lambda task_id: f"{task_id}:0:0:{count}"


#: (header, value): core.record must run exactly once, and nothing is dead-lettered
RUNS_ONCE = [
    *[(REDRIVES_HEADER, value) for value in (INF, NAN, "abc", "\u00b2", FIVE_THOUSAND_NINES, True, {"a": 1}, [1],
                                             -1, None)],
    *[(deliveries.HEADER, value) for value in (_scoped("\u00b2"), _scoped(FIVE_THOUSAND_NINES), _scoped("-1"),
                                               INF, {"a": 1}, [1], True, "abc")],
    *[("taskherd_published_at", value) for value in (INF, NAN, "yesterday", {"a": 1}, -1e308)],
]
#: values of ``retries``: the message checks dead-letter the message as invalid-message
REFUSED_RETRIES = [INF, NAN, "abc", "\u00b2", FIVE_THOUSAND_NINES, True, {"a": 1}, [1], -1]
#: values of ``taskherd_first_failure_at`` on a task that fails: dead-lettered, the value ignored
IGNORED_FIRST_FAILURES = ["not-a-time", {"x": 1}, INF, NAN, [1], True, FIVE_THOUSAND_NINES, -1]


def _not_finite(value) -> bool:
    return isinstance(value, float) and not math.isfinite(value)


def _ids(cases):
    return [f"{header}={_label(value)}" for header, value in cases]


def _label(value) -> str:
    if callable(value):
        return "scoped:" + _label(value("")[len(":0:0:"):])
    return shown(value, 24)  # repr() of an int of 5000 digits raises


def _refused_by_rabbitmq(broker_url: str, queue: str, task: str, headers: dict) -> bool:
    """RabbitMQ refuses a message with an Infinity or NaN header (541 INTERNAL_ERROR, the
    connection closed), so no producer can send one there: True once that refusal is seen and the
    queue holds nothing; False where the message can be sent (Redis, or finite values)."""
    if not broker_url.startswith("amqp") or not any(_not_finite(value) for value in headers.values()):
        return False
    with Connection(broker_url, transport_options={"confirm_publish": True}) as connection:
        with pytest.raises(Exception, match="INTERNAL_ERROR|541|closed|Connection") as refused:
            Producer(connection.default_channel).publish(
                json_body([[], {}, {}]), exchange="", routing_key=queue, declare=[],
                headers=task_headers(task, **headers), content_type="application/json",
                content_encoding="utf-8", serializer=None)
    with Connection(broker_url) as connection:
        waiting = connection.default_channel.queue_declare(queue, passive=True).message_count
    assert waiting == 0, f"RabbitMQ took the message after all ({refused.value!r})"
    return True


def _publish(consuming, task: str, args: list, **headers) -> str | None:
    """Publishes a protocol-2 message as Celery sends it, with ``headers`` set; returns its id, or
    None when the broker refused it (see :func:`_refused_by_rabbitmq`)."""
    if _refused_by_rabbitmq(consuming.broker_url, consuming.queue, task, headers):
        return None
    task_id = str(uuid.uuid4())
    headers = {name: value(task_id) if callable(value) else value for name, value in headers.items()}
    body = json_body([args, {}, {"callbacks": None, "errbacks": None, "chain": None, "chord": None}])
    consuming.publish(Wire(body, headers=task_headers(task, id=task_id, **headers)))
    return task_id


#: What the worker's log said when a hostile header broke it (main process or pool child)
BROKEN = ("Unrecoverable error", "Connection to broker lost", "OverflowError", "could not convert",
          "Exceeds the limit", "invalid literal", "float() argument")


def _then_good_tasks_run_once(consuming, key: str, log_before: int, *, symptoms=BROKEN + ("Traceback",)) -> None:
    """Two good tasks published after the hostile one each ran once; the worker and its pool are
    the ones from before, and nothing in its log says it broke."""
    goods = [f"{key}-good-{i}" for i in range(2)]
    for good in goods:
        consuming.publish_good(good)
    for good in goods:
        wait_for(f"the good task {good}", lambda: consuming.recorded(good), timeout=30, explain=consuming.worker.tail)
        assert consuming.recorded(good) == ["ok"]
    consuming.assert_alive_and_unchanged()
    log = consuming.worker.log()[log_before:]
    for symptom in symptoms:
        assert symptom not in log, log[-3000:]
    settle(consuming)


@pytest.mark.parametrize("header, value", RUNS_ONCE, ids=_ids(RUNS_ONCE))
def test_a_task_with_an_unreadable_taskherd_count_or_stamp_runs_once(consuming, header, value):
    consuming.purge_dead_letters()
    log_before = len(consuming.worker.log())
    key = f"hostile-{uuid.uuid4().hex[:8]}"
    sent = _publish(consuming, "core.record", [key, "ran"], **{header: value})
    _then_good_tasks_run_once(consuming, key, log_before)
    if sent is None:
        return
    wait_for("the hostile task to run", lambda: consuming.recorded(key), timeout=10, explain=consuming.worker.tail)
    assert consuming.recorded(key) == ["ran"], "it ran exactly once"
    assert consuming.letters() == []


@pytest.mark.parametrize("value", REFUSED_RETRIES, ids=[_label(v) for v in REFUSED_RETRIES])
def test_a_task_whose_retries_is_no_count_is_dead_lettered_as_invalid_and_the_worker_stays(consuming, value):
    consuming.purge_dead_letters()
    log_before = len(consuming.worker.log())
    key = f"hostile-{uuid.uuid4().hex[:8]}"
    task_id = _publish(consuming, "core.record", [key, "ran"], retries=value)
    _then_good_tasks_run_once(consuming, key, log_before)
    if task_id is None:
        return
    (letter,) = wait_for("the envelope", consuming.letters, timeout=10, explain=consuming.worker.tail)
    envelope = letter.envelope
    assert (envelope.reason, envelope.task_id) == ("invalid-message", task_id)
    assert "header 'retries' must be an integer >= 0" in envelope.detail
    assert consuming.recorded(key) == [], "it did not run"


@pytest.mark.parametrize("value", IGNORED_FIRST_FAILURES, ids=[_label(v) for v in IGNORED_FIRST_FAILURES])
def test_a_failing_task_with_an_unreadable_first_failure_is_dead_lettered_not_lost(consuming, value):
    consuming.purge_dead_letters()
    log_before = len(consuming.worker.log())
    key = f"hostile-{uuid.uuid4().hex[:8]}"
    before = time.time()
    task_id = _publish(consuming, "core.validation", [key, -1], **{FIRST_FAILURE_HEADER: value})
    if task_id is None:
        _then_good_tasks_run_once(consuming, key, log_before)
        return
    (letter,) = wait_for("the envelope", consuming.letters, timeout=30, explain=consuming.worker.tail)
    envelope = letter.envelope
    assert (envelope.reason, envelope.task_id) == ("permanent-error", task_id)
    assert before <= envelope.first_failure_at <= envelope.last_failure_at <= time.time(), "the header ignored"
    assert consuming.recorded(key) == ["0"], "it ran once"
    consuming.purge_dead_letters()
    _then_good_tasks_run_once(consuming, key, log_before, symptoms=BROKEN)  # the task's own error has a traceback


def test_a_transient_failure_with_an_unreadable_first_failure_is_retried_then_dead_lettered(consuming):
    consuming.purge_dead_letters()
    log_before = len(consuming.worker.log())
    key = f"hostile-{uuid.uuid4().hex[:8]}"
    before = time.time()
    task_id = _publish(consuming, "core.always_transient", [key], **{FIRST_FAILURE_HEADER: "garbage"})
    (letter,) = wait_for("the envelope", consuming.letters, timeout=60, explain=consuming.worker.tail)
    envelope = letter.envelope
    assert (envelope.reason, envelope.task_id, envelope.attempts) == ("retries-exhausted", task_id, 4)
    assert len(consuming.recorded(key)) == 4, "it ran 1 + max_retries=3 times"
    assert before <= envelope.first_failure_at < envelope.last_failure_at, "the first failure is the first run's"
    consuming.purge_dead_letters()
    _then_good_tasks_run_once(consuming, key, log_before, symptoms=BROKEN)


def test_a_soft_time_limit_envelope_names_the_limit_of_the_message_not_the_profiles(consuming):
    """apply_async(soft_time_limit=1) puts [hard, soft] = [None, 1] in the message; the profile's is 20 s."""
    consuming.purge_dead_letters()
    key = f"soft-{uuid.uuid4().hex[:8]}"
    task_id = _publish(consuming, "core.slow", [key, 10], timelimit=[None, 1])
    (letter,) = wait_for("the envelope", consuming.letters, timeout=30, explain=consuming.worker.tail)
    envelope = letter.envelope
    assert (envelope.reason, envelope.task_id) == ("soft-time-limit", task_id)
    assert "exceeded its soft time limit (1s)" in envelope.detail, envelope.detail
    assert consuming.recorded(f"{key}:done") == []
    consuming.purge_dead_letters()


# -- the poison bound holds with hostile counters --------------------------------------------------
@pytest.mark.parametrize("headers", [
    {REDRIVES_HEADER: INF}, {REDRIVES_HEADER: "abc"},
    {deliveries.HEADER: _scoped("\u00b2")}, {deliveries.HEADER: _scoped(FIVE_THOUSAND_NINES)},
], ids=["redrives-inf", "redrives-abc", "count-superscript", "count-5000-digits"])
def test_a_task_killing_its_worker_with_hostile_counters_is_dead_lettered_after_max_deliveries(
        headers, broker_url, record_url, recorded, unique_name, worker_factory):
    q = unique_name
    env = core_env(broker_url, q, record_url, max_deliveries=3, counter_url="")
    worker = worker_factory("apps.core_app", queues=[q], env=env, concurrency=1)
    if _refused_by_rabbitmq(broker_url, q, "core.kill_worker", headers):
        assert worker.is_running(), worker.tail()
        return
    task_id = str(uuid.uuid4())
    headers = {name: value(task_id) if callable(value) else value for name, value in headers.items()}
    with Connection(broker_url, transport_options={"confirm_publish": True}) as connection:
        producer = Producer(connection.default_channel)
        producer.publish(json_body([["poison"], {}, {}]), exchange="", routing_key=q, declare=[],
                         headers=task_headers("core.kill_worker", id=task_id, **headers),
                         content_type="application/json", content_encoding="utf-8", serializer=None)
    (letter,) = wait_for("the poison envelope", lambda: dead_letters(broker_url, q), timeout=90, explain=worker.tail)
    assert (letter.envelope.reason, letter.envelope.task_id) == ("killed-worker", task_id)
    assert len(recorded("poison")) == 3, "it ran max_deliveries=3 times, never a 4th"
    assert worker.is_running() and "Unrecoverable error" not in worker.log(), worker.tail()


# -- taskherd dlq redrive ------------------------------------------------------------------------------
def _dlq(*argv):
    out, err = io.StringIO(), io.StringIO()
    code = dlq_main(list(argv), stdin=io.StringIO(""), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def test_redrive_all_of_letters_with_unreadable_redrive_numbers_redrives_each(
        broker_url, record_url, recorded, unique_name, worker_factory):
    """Each failed with a hostile taskherd_redrives (kept in its envelope): `redrive --all` sends every
    one back as redrive 1, and each runs again."""
    q = unique_name
    flags = redis.Redis.from_url(record_url)
    flags.set("bug", 1)
    worker = worker_factory("apps.core_app", queues=[q], concurrency=1, env=core_env(broker_url, q, record_url))
    values = ["abc", "\u00b2", FIVE_THOUSAND_NINES, {"a": 1}] + ([INF] if broker_url.startswith("redis") else [])
    with Connection(broker_url, transport_options={"confirm_publish": True}) as connection:
        producer = Producer(connection.default_channel)
        for i, value in enumerate(values):
            producer.publish(json_body([[f"redriven-{i}", "bug"], {}, {}]), exchange="", routing_key=q, declare=[],
                             headers=task_headers("core.fails_while_flag", **{REDRIVES_HEADER: value}),
                             content_type="application/json", content_encoding="utf-8", serializer=None)
    letters = wait_for("the dead letters", lambda: dead_letters(broker_url, q),
                       until=lambda found: len(found) == len(values), timeout=30, explain=worker.tail)
    assert [redrive_message(letter)[1][REDRIVES_HEADER] for letter in letters] == [1] * len(values)
    flags.delete("bug")

    code, out, err = _dlq("redrive", "--all", "--broker", broker_url, "--queue", q)
    assert (code, err) == (0, ""), err
    assert out.count("redriven ") == len(values)
    for i in range(len(values)):
        wait_for(f"redriven-{i} to run again", lambda: len(recorded(f"redriven-{i}")), timeout=30, equals=2,
                 explain=worker.tail)
    assert dead_letters(broker_url, q) == []
    assert worker.is_running()
