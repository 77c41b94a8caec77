"""The head's age from the broker's history of the publish counter: pure, clock injected."""
from taskherd.queues.publish_history import head_age, samples_of
from taskherd.queues.stats import AGE_FROM_PUBLISH_COUNTER, AGE_LOWER_BOUND


def series(start: float, spacing: float, values: list[int]) -> list[tuple[float, int]]:
    return [(start + i * spacing, value) for i, value in enumerate(values)]


def test_the_head_is_bracketed_by_the_samples_around_its_publish():
    # Three messages published between the samples at 10 and 20; none consumed.
    samples = series(0, 10, [0, 0, 3, 3, 3])
    estimate = head_age(samples, published_total=3, ready=3, now=40, stats_lag_seconds=0)
    assert (estimate.age_seconds, estimate.error_seconds, estimate.method) == (25.0, 5.0, AGE_FROM_PUBLISH_COUNTER)
    # Two more between 30 and 40; the first three consumed: the head is message 4.
    samples = series(0, 10, [0, 0, 3, 3, 5, 5])
    estimate = head_age(samples, published_total=5, ready=2, now=50, stats_lag_seconds=0)
    assert (estimate.age_seconds, estimate.error_seconds) == (15.0, 5.0)


def test_the_statistics_lag_widens_the_bracket_on_its_early_side():
    estimate = head_age(series(10, 10, [0, 1]), published_total=1, ready=1, now=20, stats_lag_seconds=5)
    # Published in [10 - 5, 20]: midpoint 12.5, age 7.5 ± 7.5.
    assert (estimate.age_seconds, estimate.error_seconds) == (7.5, 7.5)


def test_a_backlog_older_than_the_observer_is_seen_as_old_at_once():
    """The broker kept the history: an observer that starts now learns when the backlog arrived
    (the old in-process history could only say "at least 0 s" on its first poll)."""
    samples = series(1000, 5, [0] * 4 + [7] * 17)  # 7 published between 1015 and 1020
    estimate = head_age(samples, published_total=7, ready=7, now=1100, stats_lag_seconds=5)
    assert estimate.method == AGE_FROM_PUBLISH_COUNTER
    assert estimate.age_seconds - estimate.error_seconds <= 85 <= estimate.age_seconds + estimate.error_seconds
    assert estimate.age_seconds >= 80


def test_a_head_older_than_the_window_is_a_lower_bound():
    estimate = head_age(series(500, 5, [40] * 121), published_total=40, ready=3, now=1100)
    assert (estimate.age_seconds, estimate.error_seconds, estimate.method) == (600.0, None, AGE_LOWER_BOUND)


def test_a_reset_counter_only_counts_its_own_run():
    # The node restarted between 20 and 30; four messages published since, one consumed.
    samples = series(0, 10, [50, 50, 50, 2, 4, 4])
    estimate = head_age(samples, published_total=4, ready=3, now=60, stats_lag_seconds=0)
    assert estimate.method == AGE_FROM_PUBLISH_COUNTER  # message 2 of the new run: in [20, 30]
    assert (estimate.age_seconds, estimate.error_seconds) == (35.0, 5.0)


def test_a_head_that_was_never_counted_has_an_unknown_age_not_a_young_one():
    # 100 durable messages recovered after a restart: the counter only saw the 3 published since.
    assert head_age(series(0, 10, [0, 3, 3]), published_total=3, ready=103, now=30) is None
    assert head_age(series(0, 10, [0, 0]), published_total=0, ready=0, now=30) is None


def test_samples_that_lag_the_document_bracket_up_to_now():
    estimate = head_age(series(0, 5, [0, 0, 0]), published_total=2, ready=2, now=14, stats_lag_seconds=5)
    assert (estimate.age_seconds, estimate.error_seconds) == (4.5, 4.5)  # published in [5, 14]


def test_samples_are_read_from_the_management_api_shape():
    details = {"samples": [{"sample": 7, "timestamp": 1796131075000}, {"sample": 3, "timestamp": 1796131070000},
                           {"timestamp": 1}]}
    assert samples_of(details) == [(1796131075.0, 7), (1796131070.0, 3)]
    assert samples_of(None) == []
