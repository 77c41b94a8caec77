"""Backoff: full jitter under an exponential ceiling with a cap (pure; hypothesis on the bounds)."""
import random
import statistics

import pytest
from hypothesis import given, strategies as st

from taskherd.worker.backoff import backoff_ceiling, backoff_delay

bases = st.floats(min_value=0.01, max_value=60, allow_nan=False)


@given(attempt=st.integers(min_value=0, max_value=5000), base=bases,
       extra=st.floats(min_value=0, max_value=3600), draw=st.floats(min_value=0, max_value=1))
def test_delay_is_within_zero_and_the_capped_ceiling(attempt, base, extra, draw):
    cap = base + extra
    delay = backoff_delay(attempt, base=base, cap=cap, rng=lambda: draw)
    assert 0 <= delay <= cap
    assert delay <= base * 2.0 ** min(attempt, 1000) + 1e-9


@given(attempt=st.integers(min_value=0, max_value=40), base=bases)
def test_ceiling_doubles_until_the_cap(attempt, base):
    cap = base * 1000
    assert backoff_ceiling(attempt, base=base, cap=cap) == pytest.approx(min(cap, base * 2 ** attempt))
    assert backoff_ceiling(attempt + 1, base=base, cap=cap) >= backoff_ceiling(attempt, base=base, cap=cap)


def test_the_rng_draw_scales_the_ceiling():
    assert backoff_delay(3, base=1, cap=100, rng=lambda: 1.0) == 8
    assert backoff_delay(3, base=1, cap=100, rng=lambda: 0.0) == 0
    assert backoff_delay(10, base=1, cap=100, rng=lambda: 0.5) == 50


def test_full_jitter_is_uniform_over_the_whole_interval():
    rng = random.Random(1234)
    delays = [backoff_delay(4, base=1, cap=60, rng=rng.random) for _ in range(20000)]
    ceiling = 16
    # Uniform on [0, 16]: mean 8, quartiles 4 and 12, values reaching both ends.
    assert statistics.fmean(delays) == pytest.approx(ceiling / 2, rel=0.03)
    q1, _, q3 = statistics.quantiles(delays, n=4)
    assert q1 == pytest.approx(ceiling / 4, rel=0.06) and q3 == pytest.approx(3 * ceiling / 4, rel=0.03)
    assert min(delays) < 0.05 * ceiling and max(delays) > 0.95 * ceiling


def test_bad_inputs_are_refused_with_the_value():
    with pytest.raises(ValueError, match="attempt=-1"):
        backoff_delay(-1, base=1, cap=2)
    with pytest.raises(ValueError, match="cap=0.5"):
        backoff_delay(0, base=1, cap=0.5)
    with pytest.raises(ValueError, match="rng returned 2"):
        backoff_delay(0, base=1, cap=2, rng=lambda: 2)
