"""Pure parts of inspection: routing unacked entries to queues, skipping ETA messages, API documents."""
import json

from taskherd.queues.publish_history import PublishHistory
from taskherd.queues.rabbitmq import stats_from_api
from taskherd.queues.redis import SEP, oldest_undelayed, queues_for_delivery
from taskherd.queues.stats import AGE_FROM_HEAD_TIMESTAMP, AGE_FROM_PUBLISH_COUNTER, QueueStats


def test_unacked_entries_are_routed_like_kombu_restores_them():
    bindings = [f"emails{SEP}{SEP}emails", f"reports{SEP}{SEP}reports"]
    assert queues_for_delivery("", "emails", []) == ["emails"]  # anonymous exchange: the routing key
    assert queues_for_delivery("tasks", "reports", bindings) == ["reports"]
    assert queues_for_delivery("tasks", "nothing", bindings) == []
    topic = [f"audit.*{SEP}^audit\\.[^.]+${SEP}audit"]  # kombu stores a topic key's regex
    assert queues_for_delivery("events", "audit.login", topic) == ["audit"]


def test_the_oldest_message_without_eta_decides_the_age():
    eta = json.dumps({"headers": {"eta": "2030-01-01T00:00:00+00:00", "taskherd_published_at": 1.0}})
    plain = json.dumps({"headers": {"eta": None, "taskherd_published_at": 50.0}})
    unstamped = json.dumps({"headers": {}})
    assert oldest_undelayed([eta, plain]) == (True, 50.0)
    assert oldest_undelayed([eta]) == (False, None)
    assert oldest_undelayed([unstamped, plain]) == (True, None)  # unknown, not the younger one's age


def test_classic_head_timestamp_or_the_counter_estimate_when_it_is_missing():
    history = PublishHistory(stats_lag_seconds=0)
    base = {"name": "q", "messages_unacknowledged": 1, "consumers": 2, "type": "classic"}
    stats_from_api({**base, "messages_ready": 0, "message_stats": {"publish": 0}}, vhost="/", base="b",
                   now=0, history=history)
    stamped = stats_from_api({**base, "messages_ready": 3, "head_message_timestamp": 90,
                              "message_stats": {"publish": 4}}, vhost="/", base="b", now=100, history=history)
    assert (stamped.ready, stamped.unacked, stamped.consumers) == (3, 1, 2)
    assert (stamped.oldest_age_seconds, stamped.oldest_age_method) == (10, AGE_FROM_HEAD_TIMESTAMP)
    paged_out = stats_from_api({**base, "messages_ready": 3, "head_message_timestamp": None,
                                "message_stats": {"publish": 4}}, vhost="/", base="b", now=110, history=history)
    assert paged_out.oldest_age_method == AGE_FROM_PUBLISH_COUNTER and paged_out.oldest_age_seconds == 60


def test_visibility_headroom():
    stats = QueueStats("q", 0, 1, None, None, 3000.0, visibility_timeout_seconds=3600.0)
    assert stats.depth == 1 and stats.visibility_timeout_remaining_seconds == 600.0
    assert QueueStats("q", 0, 0, 0, None, None).visibility_timeout_remaining_seconds is None
