"""`taskherd dlq list|show|redrive|delete|purge` against real brokers and a real worker."""
import base64
import io
import json
import os
import subprocess
import sys
import time

import pytest
import redis

from taskherd.commands.dlq import main
from taskherd.worker.deadletter import dead_letter_queue_declaration

from e2e.lib.waiting import wait_for
from worker_support import core_env, dead_letters


def dlq(*argv, stdin=""):
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), stdin=io.StringIO(stdin), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def test_list_show_redrive_purge(broker_url, record_url, recorded, producer, unique_name, worker_factory):
    q = unique_name
    flags = redis.Redis.from_url(record_url)
    flags.set("bug", 1)  # the tasks fail until "the bug is fixed"
    worker_factory("apps.core_app", queues=[q], concurrency=1, env=core_env(broker_url, q, record_url))
    first = producer.send_task("core.fails_while_flag", args=("a", "bug"), queue=q)
    second = producer.send_task("core.fails_while_flag", args=("b", "bug"), queue=q)
    wait_for("two dead letters", lambda: len(dead_letters(broker_url, q)), timeout=30, equals=2)
    where = ["-b", broker_url, "-Q", q]

    code, out, _ = dlq("list", *where)
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["REF", "TASK", "REASON", "QUEUE", "ATTEMPTS", "DEAD-LETTERED"]
    assert [line.split()[:5] for line in lines[1:]] == [
        [first.id, "core.fails_while_flag", "permanent-error", q, "1"],
        [second.id, "core.fails_while_flag", "permanent-error", q, "1"]]
    code, out, _ = dlq("list", "--json", *where)
    listed = [json.loads(line) for line in out.splitlines()]  # JSON Lines
    assert [entry["task_id"] for entry in listed] == [first.id, second.id]
    assert listed[0]["args"] == ["a", "bug"] and listed[0]["kwargs"] == {}
    assert listed[0]["reason"] == "permanent-error" and listed[0]["attempts"] == 1
    assert listed[0]["first_failure_at"] <= listed[0]["last_failure_at"] <= listed[0]["dead_lettered_at"]

    code, out, _ = dlq("show", "--json", first.id, second.id, *where)
    shown = [json.loads(line) for line in out.splitlines()]  # one whole dead letter per line
    assert code == 0 and [s["task_id"] for s in shown] == [first.id, second.id]
    assert shown[0]["envelope"]["args"] == ["a", "bug"]
    assert shown[0]["envelope"]["exception_type"] == "taskherd.worker.transient.PermanentError"
    code, out, _ = dlq("show", first.id, *where)  # for a person: fields, then the traceback
    assert code == 0 and "reason:            \"permanent-error\"" in out
    assert "exception_message: bug is set" in out, "every label has a space before its value"
    assert "traceback:" in out and "PermanentError: bug is set" in out
    code, _, err = dlq("show", "no-such-id", *where)
    assert code == 1 and "no-such-id is not in" in err
    assert len(dead_letters(broker_url, q)) == 2, "list and show change nothing"

    flags.delete("bug")  # fixed: redrive the first one, it runs again and succeeds
    code, out, _ = dlq("redrive", first.id, *where)
    assert code == 0 and f"redriven {first.id}" in out
    wait_for("the redriven task to run again", lambda: len(recorded("a")), timeout=30, equals=2)
    time.sleep(1)
    assert [l.task_id for l in dead_letters(broker_url, q)] == [second.id], "it succeeded and left the DLQ"

    # delete removes the named letters only, after asking; the others stay, in their order
    flags.set("bug-too", 1)
    third = producer.send_task("core.fails_while_flag", args=("c", "bug-too"), queue=q)
    wait_for("another dead letter", lambda: len(dead_letters(broker_url, q)), timeout=30, equals=2)
    code, out, _ = dlq("delete", third.id, *where, stdin="n\n")
    assert code == 1 and f"Delete 1 dead letter(s) from {q}.dlq ({third.id})?" in out
    assert "aborted: nothing deleted" in out and len(dead_letters(broker_url, q)) == 2
    code, out, err = dlq("delete", third.id, "no-such-id", *where, stdin="y\n")
    assert code == 1 and f"deleted {third.id} (core.fails_while_flag) from {q}.dlq" in out
    assert "no-such-id is not in" in err, "an ID not found is named, and the status says so"
    assert [l.task_id for l in dead_letters(broker_url, q)] == [second.id]
    code, out, err = dlq("delete", "--force", "no-such-id", *where)
    assert (code, out) == (1, "") and "no-such-id is not in" in err

    # purge asks first (through the real `taskherd` entry point); "n" keeps everything
    env = {**os.environ, "TASKHERD_BROKER_URL": broker_url}
    asked = subprocess.run([sys.executable, "-m", "taskherd.cli", "dlq", "purge", "-Q", q],
                           input="n\n", capture_output=True, text=True, env=env, timeout=60)
    assert asked.returncode == 1
    assert f"Purge every message in {q}.dlq?" in asked.stdout and "aborted: nothing purged" in asked.stdout
    assert len(dead_letters(broker_url, q)) == 1
    code, out, _ = dlq("purge", *where, stdin="y\n")
    assert code == 0 and f"purged 1 message(s) from {q}.dlq" in out
    assert dead_letters(broker_url, q) == []

    flags.set("bug-again", 1)
    producer.send_task("core.fails_while_flag", args=("c", "bug-again"), queue=q)
    wait_for("a dead letter", lambda: dead_letters(broker_url, q), timeout=30)
    code, out, _ = dlq("purge", "--force", *where)
    assert code == 0 and "Purge every" not in out and "purged" in out
    assert dead_letters(broker_url, q) == []


@pytest.mark.parametrize("broker_url", ["rabbitmq"], indirect=True)
def test_natively_dead_lettered_rabbitmq_message_is_listed_and_redriven(
        broker_url, record_url, recorded, producer, unique_name, worker_factory):
    q = unique_name
    # No worker yet: a message is rejected without requeue, and RabbitMQ's dead-lettering
    # (x-dead-letter-exchange on the work queue) moves it to the DLQ with an x-death header.
    with producer.connection_for_write() as connection:
        channel = connection.default_channel
        producer.conf.task_queues[0](channel).declare()
        dead_letter_queue_declaration(f"{q}.dlq")(channel).declare()
        task = producer.send_task("core.record", args=("native", "back"), queue=q)
        message = wait_for("the message", lambda: channel.basic_get(q, no_ack=False), timeout=10)
        channel.basic_reject(message.delivery_tag, requeue=False)

    (letter,) = wait_for("native dead letter", lambda: dead_letters(broker_url, q), timeout=10)
    assert letter.kind == "native" and letter.reason == "rabbitmq:rejected" and letter.queue == q
    code, out, _ = dlq("list", "-b", broker_url, "-Q", q)
    assert task.id in out and "rabbitmq:rejected" in out

    worker_factory("apps.core_app", queues=[q], concurrency=1, env=core_env(broker_url, q, record_url))
    code, out, _ = dlq("redrive", "--all", "-b", broker_url, "-Q", q)
    assert code == 0 and f"redriven {task.id}" in out
    wait_for("the redriven task to run", lambda: recorded("native"), timeout=30)
    assert recorded("native")[0][2] == "back"
    assert dead_letters(broker_url, q) == []


@pytest.mark.parametrize("broker_url", ["rabbitmq"], indirect=True)
def test_a_dlq_that_does_not_exist_is_a_clear_error(broker_url, unique_name):
    code, _, err = dlq("list", "-b", broker_url, "-Q", unique_name)
    assert code == 1 and f"there is no queue '{unique_name}.dlq' on the broker" in err


def test_a_redis_queue_never_declared_is_a_clear_error_not_an_empty_table(redis_url, unique_name):
    """On Redis an empty list and a queue that was never there look alike: a mistyped -Q printed an
    empty table and `purge --force` "purged 0 message(s)", both exit 0."""
    for command in (["list"], ["purge", "--force"], ["show", "--all"]):
        code, out, err = dlq(*command, "-b", redis_url, "-Q", unique_name)
        assert (code, out) == (1, ""), (command, out)
        assert (f"there is no queue '{unique_name}' on this Redis (nor its DLQ '{unique_name}.dlq'): no worker or "
                f"producer declared it") in err


@pytest.mark.parametrize("broker_url", ["redis"], indirect=True)
def test_a_forgotten_global_keyprefix_is_named_and_a_declared_queue_with_no_dead_letters_is_an_empty_list(
        broker_url, unique_name):
    from celery import Celery

    from taskherd.worker import configure

    producer = Celery("producer", broker=broker_url, set_as_current=False)
    producer.conf.broker_transport_options = {"global_keyprefix": "tenant-a:"}
    configure(producer, queues=[unique_name])
    with producer.connection_for_write() as connection:  # declares the queue, as a worker's start does
        producer.amqp.queues[unique_name].bind(connection.default_channel).declare()
    code, _, err = dlq("list", "-b", broker_url, "-Q", unique_name)
    assert code == 1 and "it is declared with --global-keyprefix='tenant-a:'" in err, err
    code, out, err = dlq("list", "-b", broker_url, "-Q", unique_name, "--global-keyprefix", "tenant-a:")
    assert (code, err) == (0, "") and out.splitlines() == [out.splitlines()[0]] and out.startswith("REF"), out
    producer.close()


def test_missing_arguments_are_usage_errors(monkeypatch, capsys):
    monkeypatch.delenv("TASKHERD_BROKER_URL", raising=False)
    with pytest.raises(SystemExit):
        main(["list", "-Q", "q"])
    assert "-b/--broker is required (or set TASKHERD_BROKER_URL)" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["redrive", "-b", "redis://127.0.0.1:6390/1", "-Q", "q"])
    assert "redrive: name at least one ID, or pass --all" in capsys.readouterr().err


@pytest.mark.parametrize("broker_url", ["redis"], indirect=True)
def test_redrive_honours_the_global_keyprefix_of_the_work_queue(broker_url, record_url, recorded, unique_name,
                                                                worker_factory):
    """With kombu's global_keyprefix the work queue is the list `<prefix><queue>`: the redriven task
    must land there (where the worker reads), not in an unprefixed list nobody reads."""
    from celery import Celery
    from taskherd.worker import configure

    q, prefix = unique_name, "tenant-a:"
    client = redis.Redis.from_url(broker_url)
    client.set("bug", 1)
    producer = Celery("producer", broker=broker_url, set_as_current=False)
    producer.conf.broker_transport_options = {"global_keyprefix": prefix}
    configure(producer, queues=[q], delivery_counter_url=record_url)
    worker_factory("apps.core_app", queues=[q], concurrency=1,
                   env=core_env(broker_url, q, record_url, keyprefix=prefix))
    task = producer.send_task("core.fails_while_flag", args=("prefixed", "bug"), queue=q)
    wait_for("the dead letter", lambda: dead_letters(broker_url, q, keyprefix=prefix), timeout=30)
    assert client.exists(f"{q}.dlq") == 0, "the DLQ is prefixed too"

    client.delete("bug")
    code, out, _ = dlq("redrive", task.id, "--broker", broker_url, "--queue", q, "--global-keyprefix", prefix)
    assert code == 0 and f"redriven {task.id}" in out
    wait_for("the redriven task to run again", lambda: len(recorded("prefixed")), timeout=30, equals=2)
    assert client.exists(q) == 0, "nothing was left in an unprefixed list"
    assert dead_letters(broker_url, q, keyprefix=prefix) == []
    producer.close()


def test_redrive_to_a_queue_that_does_not_exist_keeps_the_dead_letter(broker_url, record_url, producer,
                                                                     unique_name, worker_factory):
    """RabbitMQ confirms an unroutable message unless it is mandatory, and Redis has no such check at
    all (a newcomer's typo was "redriven" into a list no worker reads): a typo in --to must not
    delete the dead letter and report success."""
    q = unique_name
    worker_factory("apps.core_app", queues=[q], concurrency=1, env=core_env(broker_url, q, record_url))
    task = producer.send_task("core.validation", args=("typo", -1), queue=q)
    wait_for("the dead letter", lambda: dead_letters(broker_url, q), timeout=30)

    code, out, err = dlq("redrive", task.id, "--broker", broker_url, "--queue", q, "--to", f"{q}-typo")
    assert code == 1 and "redriven" not in out
    assert f"there is no queue '{q}-typo' on the broker" in err and "it stays in the DLQ" in err
    assert [letter.task_id for letter in dead_letters(broker_url, q)] == [task.id]


def test_items_that_are_not_kombu_messages_are_listed_not_a_traceback_and_purge_still_works(redis_url, unique_name):
    """A raw LPUSH, a body that is not base64, an envelope header over a body that is not JSON: each was a
    JSONDecodeError (or binascii.Error) traceback that hid every other dead letter and blocked purge."""
    key = f"{unique_name}.dlq"
    client = redis.Redis.from_url(redis_url)
    client.lpush(key, b"garbage",
                 json.dumps({"body": "abc", "properties": {"body_encoding": "base64"}}),
                 json.dumps({"headers": {"taskherd_envelope": 1}, "body": "bm90IGpzb24=",
                             "properties": {"body_encoding": "base64"}}))
    where = ["-b", redis_url, "-Q", unique_name]
    code, out, err = dlq("list", "--json", *where)
    reasons = [json.loads(line)["reason"] for line in out.splitlines()]
    assert code == 0 and err == ""
    assert reasons[0].startswith("undecodable: JSONDecodeError") and reasons[1].startswith("undecodable: Error")
    assert reasons[2].startswith("unreadable-envelope: JSONDecodeError")
    code, out, err = dlq("redrive", "--all", *where)  # no queue to send them to: they stay
    assert code == 1 and "original queue unknown; pass --to QUEUE" in err and client.llen(key) == 3
    code, out, _ = dlq("purge", "--force", *where)
    assert code == 0 and "purged 3 message(s)" in out and client.llen(key) == 0


@pytest.mark.parametrize("broker_url", ["redis"], indirect=True)
def test_a_redis_item_that_was_never_a_task_message_is_shown_and_not_redriven(
        broker_url, record_url, recorded, producer, unique_name, worker_factory):
    """An item of a work queue's list that is no kombu message is dead-lettered as undecodable-message
    with its bytes. `redrive` sent them back as a kombu message (application/data), which the
    worker dead-lettered again as content-refused under a new ref, the original reason lost; `show`
    printed no bytes. Now: refused by name (exit 1), skipped and counted by --all, shown."""
    q = unique_name
    client = redis.Redis.from_url(broker_url)
    flags = redis.Redis.from_url(record_url)
    flags.set("bug", 1)
    worker_factory("apps.core_app", queues=[q], concurrency=1, env=core_env(broker_url, q, record_url))
    text, binary, long = b"hello, not a kombu message", b"\x80\x04 pickled? \xff\xfe", b"x" * 5000
    for item in (text, binary, long):
        client.lpush(q, item)
    task = producer.send_task("core.fails_while_flag", args=("never", "bug"), queue=q)
    wait_for("four dead letters", lambda: len(dead_letters(broker_url, q)), timeout=30, equals=4)
    where = ["-b", broker_url, "-Q", q]
    items = {base64.b64decode(l.envelope.raw_body_b64): l for l in dead_letters(broker_url, q) if l.task_id is None}
    assert set(items) == {text, binary, long}
    assert {l.envelope.reason for l in items.values()} == {"undecodable-message"}
    refs = {item: letter.ref for item, letter in items.items()}

    code, out, err = dlq("show", refs[text], refs[binary], refs[long], *where)
    assert code == 0 and err == ""
    assert f'raw_body:          {len(text)} bytes, UTF-8: "hello, not a kombu message"' in out
    assert f"raw_body:          {len(binary)} bytes, base64: {base64.b64encode(binary).decode()}" in out
    assert (f'5000 bytes, UTF-8: "{"x" * 2048}" …(first 2048 of 5000 characters shown; all of them: '
            f'dlq show --json)') in out
    code, out, _ = dlq("show", "--json", refs[long], *where)
    assert code == 0 and base64.b64decode(json.loads(out)["envelope"]["raw_body_b64"]) == long

    code, out, err = dlq("redrive", refs[text], *where)
    assert code == 1 and "redriven" not in out
    (line,) = err.splitlines()
    assert line.startswith(f"taskherd dlq: {refs[text]}: not redriven (undecodable-message: not a kombu message")
    assert "not a task" in line and f"taskherd dlq show {refs[text]}" in line
    assert f"taskherd dlq delete {refs[text]}" in line

    flags.delete("bug")  # the real task is fixed: --all redrives it and skips the three items
    code, out, err = dlq("redrive", "--all", *where)
    assert code == 0, err
    assert out.splitlines() == [f"redriven {task.id} (core.fails_while_flag) -> {q}"]
    (line,) = err.splitlines()
    assert line.startswith("taskherd dlq: skipped 3 dead letter(s) that were never task messages")
    assert all(ref in line for ref in refs.values()) and "taskherd dlq show REF" in line
    wait_for("the redriven task to run", lambda: len(recorded("never")), timeout=30, equals=2)
    time.sleep(2)  # had they been sent back, the worker would have dead-lettered them again by now
    letters = dead_letters(broker_url, q)
    assert sorted(l.ref for l in letters) == sorted(refs.values()), "the same letters, no new refs"
    assert {l.reason for l in letters} == {"undecodable-message"} and client.llen(q) == 0

    code, out, err = dlq("delete", "--force", refs[text], refs[binary], *where)  # as the refusal said
    assert (code, err) == (0, "")
    assert out.splitlines() == [f"deleted {refs[ref]} (message) from {q}.dlq" for ref in (text, binary)]
    assert [l.ref for l in dead_letters(broker_url, q)] == [refs[long]]


def _bad_message_letter(**fields):
    from taskherd.commands.dlq import parse
    from taskherd.worker.deadletter import ENVELOPE_HEADER, Envelope

    envelope = Envelope(queue="orders", raw_body_b64=base64.b64encode(b"\x80\x04raw").decode(), **fields)
    return parse(json.dumps(envelope.to_dict()).encode(), {ENVELOPE_HEADER: 1}, "application/json", "utf-8")


@pytest.mark.parametrize("fields,never", [
    # what the worker writes for a Redis item that is no kombu message (bad_messages)
    (dict(reason="undecodable-message", detail="not a kombu message: not valid kombu JSON (…)"), "Redis list item"),
    (dict(reason="undecodable-message", detail="?", content_type="application/x-taskherd-unreadable-item",
          headers={"taskherd_unreadable_item": "…"}), "Redis list item"),
    (dict(reason="content-refused", detail="no content type"), "no headers and no content type"),
    (dict(reason="undecodable-message", detail="AMQP headers could not be decoded: …",
          content_type="application/json", headers={"taskherd_unreadable_headers": "nested too deep"}),
     "AMQP headers could not be read"),
    # bad task messages: sent back as they came (a serializer accepted since, a task deployed since)
    (dict(reason="content-refused", detail="pickle", content_type="application/x-python-serialize",
          content_encoding="binary", headers={"id": "p", "task": "x"}), None),
    (dict(reason="unknown-task", detail="no task named 'x'", content_type="application/json",
          headers={"id": "p", "task": "x"}), None),
])
def test_which_bad_messages_were_never_task_messages(fields, never):
    from taskherd.commands.dlq import never_a_task

    why = never_a_task(_bad_message_letter(**fields))
    assert (why is None) if never is None else (never in why), why


def test_a_named_letter_that_was_never_a_task_is_refused_before_anything_is_published():
    """No broker needed: the refusal comes before the queue checks and the publish."""
    from taskherd.commands.dlq import _redrive

    letter = _bad_message_letter(reason="undecodable-message", detail="not a kombu message: a JSON string\nand more")
    for select_all, code, said in ((False, 1, f"taskherd dlq: {letter.ref}: not redriven (undecodable-message: "
                                                  f"not a kombu message: a JSON string and more): it was a Redis"),
                                   (True, 0, f"taskherd dlq: skipped 1 dead letter(s) that were never task messages")):
        out, err = io.StringIO(), io.StringIO()
        assert _redrive(None, [letter], "redis://127.0.0.1:1/0", to=None, keyprefix="", stdout=out, stderr=err,
                        select_all=select_all) == code
        assert out.getvalue() == "" and len(err.getvalue().splitlines()) == 1 and err.getvalue().startswith(said)
