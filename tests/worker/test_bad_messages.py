"""Bad messages go to the DLQ with the reason, and the worker keeps consuming."""
import base64
import pickle

from kombu import Connection, Producer

from raw_messages import DROP, task_headers
from worker_support import core_env, dead_letters, wait_for  # noqa: F401


class _Exploit:
    """Unpickling this creates a file: the proof that pickle was never loaded."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def _publish_raw(broker_url, queue, body, *, headers, content_type, content_encoding="utf-8"):
    with Connection(broker_url) as connection:
        Producer(connection.default_channel).publish(
            body, exchange="", routing_key=queue, headers=headers,
            content_type=content_type, content_encoding=content_encoding)


def test_bad_messages_are_dead_lettered_with_the_reason_and_consuming_goes_on(
        broker_url, record_url, recorded, producer, unique_name, worker_factory, tmp_path):
    worker = worker_factory("apps.core_app", queues=[unique_name], concurrency=1,
                            env=core_env(broker_url, unique_name, record_url))
    q = unique_name
    proof = tmp_path / "unpickled"
    pickled = pickle.dumps([[_Exploit(str(proof))], {}, {}])
    not_json = b"{this is not json"

    _publish_raw(broker_url, q, not_json, headers={}, content_type="application/json")
    _publish_raw(broker_url, q, not_json, headers=task_headers(id="garbage-body"),
                 content_type="application/json")
    unknown = producer.send_task("core.no_such_task", args=(1,), queue=q)
    broken = task_headers(id=DROP)
    _publish_raw(broker_url, q, b'[["x"], {}, {}]', headers=broken, content_type="application/json")
    _publish_raw(broker_url, q, pickled, headers=task_headers(id="pickled"),
                 content_type="application/x-python-serialize", content_encoding="binary")
    producer.send_task("core.record", args=("after", "ok"), queue=q)

    wait_for(lambda: recorded("after"), timeout=30, what="the normal task after the bad ones")
    letters = wait_for(lambda: (lambda l: l if len(l) == 5 else None)(dead_letters(broker_url, q)),
                       timeout=30, what="five envelopes")
    by_reason = {}
    for letter in letters:
        by_reason.setdefault(letter.envelope.reason, []).append(letter.envelope)

    undecodable = by_reason["undecodable-message"]
    assert len(undecodable) == 2
    assert {base64.b64decode(e.raw_body_b64) for e in undecodable} == {not_json}
    assert {e.task_id for e in undecodable} == {None, "garbage-body"}
    assert all("could not be decoded" in e.detail for e in undecodable)

    (unknown_env,) = by_reason["unknown-task"]
    assert unknown_env.task == "core.no_such_task" and unknown_env.task_id == unknown.id
    assert "no task named 'core.no_such_task'" in unknown_env.detail

    (broken_env,) = by_reason["invalid-message"]
    assert broken_env.task == "core.record"
    assert broken_env.detail == "header 'id' must be a non-empty string, got None"
    assert "id" not in broken_env.headers

    (refused,) = by_reason["content-refused"]
    assert refused.task_id == "pickled"
    assert "application/x-python-serialize" in refused.detail
    assert base64.b64decode(refused.raw_body_b64) == pickled, "the raw pickle is kept, base64-encoded"
    assert refused.content_type == "application/x-python-serialize"
    assert not proof.exists(), "the pickle was never loaded"

    assert all(e.queue == q for e in (l.envelope for l in letters))
    assert worker.is_running()
    assert recorded("after")[0][2] == "ok"
