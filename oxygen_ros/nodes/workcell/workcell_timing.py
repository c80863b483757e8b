"""Pacing of the simulation loop (ROS-free): sim time -> wall-clock deadlines, rate dividers.

Invariants:
- The loop is paced on absolute deadlines: sim time `t` may be published at wall time
  `anchor_wall + (t - anchor_sim) / factor`. A slow tick (a camera render) is caught up by the
  following ticks running without sleeping, so rendering costs no drift; only when the loop is
  more than `max_lag_s` of wall time behind does the pacer give up on the backlog and re-anchor
  at now (counted as a resync: the achieved real-time factor then falls below the target).
- A factor change re-anchors at the current sim time: no burst and no pause.
- `Every` fires at most once per call, on the first tick at or after each multiple of its
  period of sim time (rate changes apply from the next firing on).
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable

MAX_LAG_S = 0.25  # wall seconds behind schedule before the backlog is dropped
TIME_EPS = 1e-6  # sim seconds; a tick this close to a due time counts as on time


class Pacer:
    """Wall-clock deadlines for simulated time at a real-time factor."""

    def __init__(
        self,
        factor: float,
        max_lag_s: float = MAX_LAG_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.factor = factor
        self.max_lag_s = max_lag_s
        self.resyncs = 0  # times the backlog was dropped
        self._clock = clock
        self._anchor: tuple[float, float] | None = None  # (sim, wall)

    def set_factor(self, factor: float, sim_now: float) -> None:
        """Changes the real-time factor from `sim_now` on."""
        self.factor = factor
        self._anchor = (sim_now, self._clock())

    def wait_s(self, sim_time: float) -> tuple[float, float]:
        """How long to sleep before `sim_time` may be published, and how late it already is.

        Returns:
            (seconds to sleep, >= 0; seconds behind the deadline, >= 0).
        """
        now = self._clock()
        if self._anchor is None:
            self._anchor = (sim_time, now)
        anchor_sim, anchor_wall = self._anchor
        deadline = anchor_wall + (sim_time - anchor_sim) / self.factor
        if now - deadline > self.max_lag_s:
            self.resyncs += 1
            self._anchor = (sim_time, now)
            return 0.0, now - deadline
        return max(deadline - now, 0.0), max(now - deadline, 0.0)


class RateMeter:
    """Sim seconds per wall second over the last `window_s` of wall time."""

    def __init__(self, window_s: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.window_s = window_s
        self._clock = clock
        self._samples: collections.deque[tuple[float, float]] = collections.deque()

    def add(self, sim_time: float) -> None:
        now = self._clock()
        self._samples.append((now, sim_time))
        while len(self._samples) > 2 and now - self._samples[1][0] >= self.window_s:
            self._samples.popleft()

    def factor(self) -> float:
        """0.0 until two samples exist; stale (no sample for a window) also gives 0.0."""
        if len(self._samples) < 2 or self._clock() - self._samples[-1][0] > self.window_s:
            return 0.0
        (w0, s0), (w1, s1) = self._samples[0], self._samples[-1]
        return (s1 - s0) / (w1 - w0) if w1 > w0 else 0.0


class Every:
    """A rate divider in sim time: `due(t)` is true once per period."""

    def __init__(self, rate_hz: float) -> None:
        self.period = 1.0 / rate_hz
        self._next: float | None = None

    def set_rate(self, rate_hz: float) -> None:
        self.period = 1.0 / rate_hz

    def due(self, t: float) -> bool:
        if self._next is not None and t + TIME_EPS < self._next:
            return False
        following = (self._next if self._next is not None else t) + self.period
        self._next = following if following > t + TIME_EPS else t + self.period
        return True
