"""Replay timing (ROS-free): each message leaves at its recorded time relative to the first
replayed message, divided by the rate, as `ros2 bag play --rate` does.

Invariants: times are monotonic-clock seconds; a message is never sent before it is due, and
one that is already due is sent at once (a slow replay falls behind, it never skips); the
lateness of each send is kept for the summary.
"""

from __future__ import annotations

import dataclasses
import math

NS_PER_S = 1e9


@dataclasses.dataclass
class ReplaySchedule:
    """Maps bag time (ns) to wall time (s) for one replay."""

    first_ns: int  # bag time of the first replayed message
    start_s: float  # monotonic time it is sent at
    rate: float = 1.0  # bag seconds per wall second
    num_sent: int = 0
    max_late_s: float = 0.0
    total_late_s: float = 0.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.rate) and self.rate > 0):
            raise ValueError(f"rate must be > 0, got {self.rate}")

    def due_s(self, timestamp_ns: int) -> float:
        """The wall time the message recorded at `timestamp_ns` is due."""
        return self.start_s + (timestamp_ns - self.first_ns) / NS_PER_S / self.rate

    def wait_s(self, timestamp_ns: int, now_s: float) -> float:
        """How long to wait from `now_s` before sending it (0 when due)."""
        return max(0.0, self.due_s(timestamp_ns) - now_s)

    def bag_time_ns(self, now_s: float) -> int:
        """The bag time playback has reached at wall time `now_s` (for a replayed /clock)."""
        return self.first_ns + round(max(0.0, now_s - self.start_s) * self.rate * NS_PER_S)

    def record_send(self, timestamp_ns: int, now_s: float) -> None:
        """Notes that the message recorded at `timestamp_ns` left at `now_s`."""
        late = max(0.0, now_s - self.due_s(timestamp_ns))
        self.num_sent += 1
        self.max_late_s = max(self.max_late_s, late)
        self.total_late_s += late

    @property
    def mean_late_s(self) -> float:
        return self.total_late_s / self.num_sent if self.num_sent else 0.0
