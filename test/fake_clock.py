"""A settable clock for tests of timed code (ticks, watchdogs) that never sleep."""

from __future__ import annotations


class FakeClock:
    """Monotonic time `t` (set by the test); `node()` is the node clock, `epoch` + `t`."""

    def __init__(self, t: float = 0.0, epoch: float = 1000.0) -> None:
        self.t = t
        self.epoch = epoch

    def __call__(self) -> float:
        return self.t

    def node(self) -> float:
        return self.epoch + self.t
