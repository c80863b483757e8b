"""Sliding-window statistics for diagnostics: exact window edges, bounded memory."""

import math

import pytest

from oxygen_ros.nodes.common.sliding_window import SlidingWindow


def test_statistics_cover_exactly_the_window() -> None:
    w = SlidingWindow(window_s=2.0)
    for t, v in [(0.0, 9.0), (1.0, 1.0), (2.0, 2.0), (3.0, 3.0)]:
        w.add(v, t)
    assert list(w.values(3.0)) == [1.0, 2.0, 3.0]  # [1, 3]: the sample at 0 is out
    assert w.minimum(3.0) == 1.0
    assert w.percentile(50, 3.0) == 2.0
    assert w.rate(3.0) == pytest.approx(1.5)
    w.window_s = 10.0  # a reader widens it: the older sample is back
    assert w.count(3.0) == 4 and w.minimum(3.0) == 1.0 and w.percentile(100, 3.0) == 9.0


def test_empty_window_gives_nan_and_memory_is_bounded() -> None:
    w = SlidingWindow(window_s=100.0, max_samples=3)
    assert math.isnan(w.percentile(99, 0.0)) and math.isnan(w.minimum(0.0))
    for t in range(5):
        w.add(float(t), float(t))
    assert list(w.values(4.0)) == [2.0, 3.0, 4.0]
