"""Pure parts of inspection: routing unacked entries to queues, skipping ETA messages, API documents."""
import json

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
    base = {"name": "q", "messages_unacknowledged": 1, "consumers": 2, "type": "classic"}
    history = {"publish": 4, "publish_details": {"samples": [{"sample": 4, "timestamp": 50_000},
                                                             {"sample": 0, "timestamp": 45_000}]}}
    stamped = stats_from_api({**base, "messages_ready": 3, "head_message_timestamp": 90, "message_stats": history},
                             now=100)
    assert (stamped.ready, stamped.unacked, stamped.consumers) == (3, 1, 2)
    assert (stamped.oldest_age_seconds, stamped.oldest_age_method) == (10, AGE_FROM_HEAD_TIMESTAMP)
    paged_out = stats_from_api({**base, "messages_ready": 3, "head_message_timestamp": None, "message_stats": history},
                               now=110)
    assert paged_out.oldest_age_method == AGE_FROM_PUBLISH_COUNTER
    assert paged_out.oldest_age_seconds == 110 - (35 + 50) / 2  # published in [45 - 10 s lag, 50]


def test_a_fresh_broker_that_reports_counts_before_the_head_timestamp_never_calls_an_old_backlog_young():
    """Seen on a freshly installed RabbitMQ: the first documents carry no statistics, the next ones
    counts and the publish counter but no head timestamp yet. Seven messages have waited since
    t=1000; the observer starts at t=1040."""
    first = stats_from_api({"name": "q", "type": "classic"}, now=1040)
    assert first.pending and first.oldest_age_seconds is None
    history = {"publish": 7, "publish_details": {"samples": [{"sample": 7 if t >= 1000 else 0, "timestamp": t * 1000}
                                                             for t in range(945, 1050, 5)]}}
    counted = stats_from_api({"name": "q", "type": "classic", "messages_ready": 7, "messages_unacknowledged": 0,
                              "consumers": 0, "message_stats": history}, now=1047)
    assert not counted.pending and counted.ready == 7
    low = counted.oldest_age_seconds - counted.oldest_age_error_seconds
    assert low >= 40, counted


def test_a_queue_whose_head_age_cannot_be_known_says_so():
    never_counted = stats_from_api({"name": "q", "messages_ready": 5, "message_stats": {"publish": 1}}, now=10)
    assert never_counted.oldest_age_seconds is None and never_counted.oldest_age_is_lower_bound
    no_rates = stats_from_api({"name": "q", "messages_ready": 5}, now=10)
    assert no_rates.oldest_age_seconds is None and no_rates.oldest_age_is_lower_bound
    empty = stats_from_api({"name": "q", "messages_ready": 0}, now=10)
    assert not empty.oldest_age_is_lower_bound


def test_visibility_headroom():
    stats = QueueStats("q", 0, 1, None, None, 3000.0, visibility_timeout_seconds=3600.0)
    assert stats.depth == 1 and stats.visibility_timeout_remaining_seconds == 600.0
    assert QueueStats("q", 0, 0, 0, None, None).visibility_timeout_remaining_seconds is None
