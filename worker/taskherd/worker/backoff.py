"""Exponential backoff with full jitter and a cap: a pure function, the randomness injected.

Full jitter (AWS Architecture Blog, "Exponential Backoff And Jitter"): the delay before retry
number ``attempt`` (0-based) is uniform in ``[0, min(cap, base * 2**attempt)]``. Spreading the
whole interval, rather than adding a little noise to a fixed delay, is what stops a fleet of
workers that failed together from retrying together and knocking the dependency over again.
"""
from __future__ import annotations

import math
import random
from typing import Callable

#: Source of uniform floats in [0, 1]; ``random.random`` unless a test or a caller injects one.
Rng = Callable[[], float]


def backoff_ceiling(attempt: int, *, base: float, cap: float) -> float:
    """The upper bound of the delay before retry ``attempt``: ``min(cap, base * 2**attempt)``."""
    if attempt < 0:
        raise ValueError(f"attempt={attempt!r} must be >= 0")
    if base <= 0 or cap < base:
        raise ValueError(f"backoff base={base!r} must be > 0 and cap={cap!r} >= base")
    # 2**attempt overflows a float near 1024; by then the cap has long applied.
    if attempt >= math.log2(cap / base) + 1:
        return float(cap)
    return min(float(cap), base * 2.0 ** attempt)


def backoff_delay(attempt: int, *, base: float, cap: float, rng: Rng | None = None) -> float:
    """Seconds to wait before retry ``attempt`` (0 = first retry): full jitter under the ceiling."""
    draw = (rng or random.random)()
    if not 0.0 <= draw <= 1.0:
        raise ValueError(f"rng returned {draw!r}; it must return a float in [0, 1]")
    return backoff_ceiling(attempt, base=base, cap=cap) * draw
