"""Timed samples over a sliding window, for diagnostics (ROS-free): percentiles, minimum, rate.

Invariants:
- A query at `now` sees exactly the samples added at times in [now - window_s, now]; the
  window may change between queries (a reader sets it to the span it measured).
- At most `max_samples` are kept (the oldest are dropped first), so memory is bounded whatever
  the window; a window longer than `max_samples` covers reports fewer samples, never stale ones.
- Thread-safe: one thread adds, another queries.
- Cheap for the threads around it: samples live in two numpy ring buffers, so `add` is a few
  stores and a query is a handful of vectorised calls (tens of microseconds for thousands of
  samples), not a Python loop over the samples. The inference node's diagnostics query about
  thirty windows per status, holding the GIL of a process with time-critical threads
  (docs/NODES.md, "Tick timing").
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence

import numpy as np

MAX_SAMPLES = 4096  # at 70 Hz: the last ~58 s; at 5 frames/s: the last ~13 min


class SlidingWindow:
    """(time, value) samples; statistics over those at most `window_s` old."""

    def __init__(self, window_s: float, max_samples: int = MAX_SAMPLES) -> None:
        self.window_s = window_s
        self._times = np.zeros(max_samples, dtype=np.float64)
        self._values = np.zeros(max_samples, dtype=np.float64)
        self._added = 0  # samples added so far; sample k sits at index k % max_samples
        self._lock = threading.Lock()

    def add(self, value: float, t: float) -> None:
        """Adds a sample taken at time `t`."""
        with self._lock:
            i = self._added % len(self._times)
            self._times[i] = t
            self._values[i] = value
            self._added += 1

    def values(self, now: float) -> np.ndarray:
        """Values of the samples taken in [now - window_s, now], oldest first."""
        start = now - self.window_s
        with self._lock:
            capacity = len(self._times)
            if self._added <= capacity:
                times, values = self._times[: self._added], self._values[: self._added]
            else:  # wrapped: the oldest kept sample is at the next write index
                head = self._added % capacity
                times = np.concatenate((self._times[head:], self._times[:head]))
                values = np.concatenate((self._values[head:], self._values[:head]))
            inside = (times >= start) & (times <= now)
            return values[inside]  # a copy: later adds never change it

    def percentile(self, q: float, now: float) -> float:
        """The q-th percentile (0..100, linear interpolation as numpy's default) of the
        window; NaN when it is empty."""
        return self.percentiles((q,), now)[0]

    def percentiles(self, qs: Sequence[float], now: float) -> list[float]:
        """`percentile` for each of `qs`, from one selection and one sort."""
        ordered = np.sort(self.values(now))
        n = len(ordered)
        if not n:
            return [math.nan] * len(qs)
        out = []
        for q in qs:
            position = q / 100.0 * (n - 1)
            lo = math.floor(position)
            hi = min(lo + 1, n - 1)
            low, high = float(ordered[lo]), float(ordered[hi])
            out.append(low + (high - low) * (position - lo) if high != low else low)
        return out

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
