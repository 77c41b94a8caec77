"""The quorum-queue age estimate from the publish counter: pure, clock injected."""
from taskherd.queues.publish_history import PublishHistory
from taskherd.queues.stats import AGE_FROM_PUBLISH_COUNTER, AGE_LOWER_BOUND


def test_head_age_is_bracketed_by_the_observations_around_its_publish():
    history = PublishHistory(stats_lag_seconds=0)
    assert history.observe("q", now=0, published_total=0, ready=0) is None
    assert history.observe("q", now=10, published_total=0, ready=0) is None
    # Three messages were published between t=10 and t=20.
    estimate = history.observe("q", now=20, published_total=3, ready=3)
    assert (estimate.age_seconds, estimate.error_seconds, estimate.method) == (5.0, 5.0, AGE_FROM_PUBLISH_COUNTER)
    # Two more between 30 and 40; the first three are consumed by t=50: the head is message 4.
    history.observe("q", now=30, published_total=3, ready=3)
    history.observe("q", now=40, published_total=5, ready=4)
    estimate = history.observe("q", now=50, published_total=5, ready=2)
    assert (estimate.age_seconds, estimate.error_seconds) == (15.0, 5.0)


def test_statistics_lag_widens_the_bracket_on_its_early_side():
    history = PublishHistory(stats_lag_seconds=5)
    history.observe("q", now=10, published_total=0, ready=0)
    estimate = history.observe("q", now=20, published_total=1, ready=1)
    # Published in [10 - 5, 20]: midpoint 12.5, age 7.5 ± 7.5.
    assert (estimate.age_seconds, estimate.error_seconds) == (7.5, 7.5)


def test_a_head_older_than_the_history_is_a_lower_bound():
    history = PublishHistory()
    first = history.observe("q", now=100, published_total=7, ready=3)
    later = history.observe("q", now=160, published_total=7, ready=3)
    assert (first.age_seconds, first.method) == (0.0, AGE_LOWER_BOUND)
    assert (later.age_seconds, later.error_seconds, later.method) == (60.0, None, AGE_LOWER_BOUND)


def test_a_counter_that_goes_backwards_restarts_the_history():
    history = PublishHistory(stats_lag_seconds=0)
    history.observe("q", now=0, published_total=50, ready=0)
    estimate = history.observe("q", now=10, published_total=2, ready=2)  # queue re-declared
    assert estimate.method == AGE_LOWER_BOUND


def test_history_stays_small_for_a_queue_that_keeps_moving():
    history = PublishHistory(stats_lag_seconds=0)
    for t in range(1000):
        history.observe("q", now=t, published_total=t * 10, ready=15)
    assert len(history._runs["q"]) <= 3
    estimate = history.observe("q", now=1000, published_total=10000, ready=15)
    assert estimate.method == AGE_FROM_PUBLISH_COUNTER and estimate.age_seconds <= 2


def test_a_ready_count_lagging_the_counter_keeps_the_bracket():
    history = PublishHistory(stats_lag_seconds=0)
    history.observe("q", now=0, published_total=0, ready=0)
    history.observe("q", now=10, published_total=3, ready=0)  # counts not yet reported (new quorum queue)
    history.observe("q", now=12, published_total=3, ready=0)
    estimate = history.observe("q", now=20, published_total=3, ready=3)
    assert (estimate.age_seconds, estimate.error_seconds, estimate.method) == (15.0, 5.0, AGE_FROM_PUBLISH_COUNTER)
