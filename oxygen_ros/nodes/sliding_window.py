"""Timed samples over a sliding window, for diagnostics (ROS-free): percentiles, minimum, rate.

Invariants:
- A query at `now` sees exactly the samples added at times in [now - window_s, now]; the
  window may change between queries (a reader sets it to the span it measured).
- At most `max_samples` are kept (the oldest are dropped first), so memory is bounded whatever
  the window; a window longer than `max_samples` covers reports fewer samples, never stale ones.
- Thread-safe: one thread adds, another queries.
"""

from __future__ import annotations

import collections
import math
import threading

import numpy as np

MAX_SAMPLES = 4096  # at 70 Hz: the last ~58 s; at 5 frames/s: the last ~13 min


class SlidingWindow:
    """(time, value) samples; statistics over those at most `window_s` old."""

    def __init__(self, window_s: float, max_samples: int = MAX_SAMPLES) -> None:
        self.window_s = window_s
        self._samples: collections.deque[tuple[float, float]] = collections.deque(
            maxlen=max_samples
        )
        self._lock = threading.Lock()

    def add(self, value: float, t: float) -> None:
        """Adds a sample taken at time `t` (times must not decrease)."""
        with self._lock:
            self._samples.append((t, float(value)))

    def values(self, now: float) -> np.ndarray:
        """Values of the samples taken in [now - window_s, now], oldest first."""
        start = now - self.window_s
        with self._lock:
            return np.array([v for t, v in self._samples if start <= t <= now], dtype=np.float64)

    def percentile(self, q: float, now: float) -> float:
        """The q-th percentile (0..100) of the window; NaN when it is empty."""
        values = self.values(now)
        return float(np.percentile(values, q)) if len(values) else math.nan

    def minimum(self, now: float) -> float:
        """The smallest value of the window; NaN when it is empty."""
        values = self.values(now)
        return float(values.min()) if len(values) else math.nan

    def count(self, now: float) -> int:
        """Samples in the window."""
        return len(self.values(now))

    def rate(self, now: float) -> float:
        """Samples per second over the window."""
        return self.count(now) / self.window_s
