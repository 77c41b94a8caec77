"""Where a delivery's count comes from (taskherd.worker.deliveries), without a broker."""
import pytest

from taskherd.worker import deliveries
from taskherd.worker.components.recovery import returned


def count(headers=None, *, redelivered=False, queue_type="classic", counter_url=None, task_id="t1", retries=0):
    return deliveries.count(task_id=task_id, retries=retries, headers=headers, redelivered=redelivered,
                            queue_type=queue_type, counter_url=counter_url, counter_ttl=60)


def test_a_first_delivery_costs_nothing_even_with_a_counter_configured():
    found = count(counter_url="redis://127.0.0.1:1/0")  # nothing listens there: it must not be asked
    assert (found.redeliveries, found.source, found.counter) == (0, "first delivery", None)


def test_each_return_adds_one_to_the_count_the_message_carries():
    headers = {"id": "t1", "retries": 0, "task": "x"}
    for expected in (1, 2, 3):
        headers = deliveries.returned_headers(headers)
        assert count(headers, redelivered=True) == deliveries.Count(expected, "header")
    # the copy a RabbitMQ classic queue's worker publishes is not flagged redelivered: still counted
    assert count(headers, redelivered=False).redeliveries == 3


@pytest.mark.parametrize("other", [{"task_id": "t2"}, {"retries": 1}])
def test_a_count_copied_into_another_attempt_is_ignored(other):
    headers = deliveries.returned_headers(deliveries.returned_headers({"id": "t1", "retries": 0}))
    assert count(headers, **other).source == "first delivery"


def test_a_redrive_starts_a_fresh_count():
    headers = deliveries.returned_headers({"id": "t1", "retries": 0})
    assert count(headers).redeliveries == 1
    assert count({**headers, "taskherd_redrives": 1}).redeliveries == 0


def test_quorum_queues_count_with_x_delivery_count_on_a_redelivery_only():
    assert count({"x-delivery-count": 2}, redelivered=True, queue_type="quorum") == deliveries.Count(
        2, "x-delivery-count")
    assert count({"x-delivery-count": 2}, redelivered=False, queue_type="quorum").redeliveries == 0, \
        "a header copied into a fresh message is not the broker's count"


def test_an_uncounted_redelivery_runs_and_says_so(caplog):
    found = count({}, redelivered=True)
    assert found == deliveries.Count(None, "unknown")
    assert not deliveries.exceeds(found.redeliveries, 1)
    assert "running it uncounted" in caplog.text


@pytest.mark.parametrize("value", ["t1:0:0:x", "t1:0:3", 7, None, "t1:0:0:-1"])
def test_a_malformed_count_header_is_no_count(value):
    assert deliveries.carried(value, "t1:0:0") is None


def test_the_redis_restore_marks_the_message_redelivered_and_counts_the_return():
    payload = {"body": "e30=", "headers": {"id": "t1", "retries": 2, "task": "x"},
               "properties": {"delivery_info": {"exchange": "q", "routing_key": "q"}, "delivery_tag": "d"}}
    back = returned(returned(payload))
    assert back["headers"]["redelivered"] is True and back["properties"]["delivery_info"]["redelivered"] is True
    assert back["headers"][deliveries.HEADER] == "t1:2:0:2"
    assert returned({"body": "raw, not a task message"}) == {"body": "raw, not a task message"}


def test_exceeds_counts_this_delivery_too():
    assert not deliveries.exceeds(2, 3) and deliveries.exceeds(3, 3) and not deliveries.exceeds(None, 1)
