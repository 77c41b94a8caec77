"""The demo's timeline drawn from fabricated samples: a real PNG, in-flight counted right."""
import struct

import pytest

from e2e.demo.timeline import Mark, Sample, in_flight_series, render


def test_in_flight_counts_overlapping_attempts():
    intervals = [(0, 10), (2, 4), (3, 12), (11, 13)]
    assert in_flight_series(intervals, [0, 2, 3.5, 4, 10, 11, 12, 20]) == [1, 2, 3, 2, 1, 2, 1, 0]


def test_render_writes_a_png_of_a_sensible_size(tmp_path):
    samples = [Sample(t=float(t), depth=max(0, 100 - 3 * t) if t > 2 else None, oldest_age_seconds=t / 2,
                      replicas=1 + min(t // 5, 4), ready_replicas=1 + min(t // 6, 4), desired_replicas=5,
                      dlq_depth=0 if t < 20 else 2) for t in range(60)]
    marks = [Mark(1, "burst", "200 tasks"), Mark(15, "kill", "killed pod a"), Mark(25, "alert", "page")]
    path = render(samples, marks, in_flight_series([(0, 30), (5, 40)], [s.t for s in samples]),
                  tmp_path / "run" / "timeline.png")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert width >= 1000 and height >= 800
    assert len(data) > 20_000  # lines and labels were drawn, not an empty canvas


def test_render_refuses_mismatched_series(tmp_path):
    with pytest.raises(ValueError, match="in_flight has 1 values for 2 samples"):
        render([Sample(0, 0, 0, 1, 1, 1, 0)] * 2, [], [0], tmp_path / "x.png")


def test_marks_of_one_kind_close_together_become_one():
    from e2e.demo.timeline import group_marks

    marks = [Mark(38.1, "poison", "DLQ: shop.charge"), Mark(38.2, "poison", "DLQ: shop.build_report"),
             Mark(38.3, "alert", "page"), Mark(50, "poison", "DLQ: later")]
    assert [(m.t, m.label) for m in group_marks(marks)] == [
        (38.1, "DLQ: shop.charge (+1)"), (38.3, "page"), (50, "DLQ: later")]
