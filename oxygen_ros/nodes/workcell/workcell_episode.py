"""Bookkeeping of the workcell's current episode (ROS-free, sim seconds).

Invariants:
- `episode_id` is 0 before the first episode and +1 per `start`.
- The phase is "idle" before the first episode, "running" after `start`, and leaves "running"
  at most once per episode: to "succeeded" once the task's success test has held for
  `tasks.SUCCESS_DWELL_S` (`tasks.SuccessTracker`), or to "failed" on the first update at or
  after the time limit (success wins a tie).
- Success is decided only while running and then stays true for the rest of the episode (a
  success after the time limit does not count); `time_to_success_s` (reset to the start of the
  successful dwell) is negative until then.
- Starvation events are counted only while the episode is running; `elapsed` stops growing
  when the episode ends.
"""

from __future__ import annotations

import dataclasses

from oxygen_ros.sim.tasks import EpisodeSpec, Evaluation, SuccessTracker

PHASES = ("idle", "running", "succeeded", "failed")


@dataclasses.dataclass
class EpisodeTracker:
    """Phase, timing and counters of the current episode."""

    episode_id: int = 0  # +1 per start
    spec: EpisodeSpec | None = None  # the current episode (None before the first)
    phase: str = "idle"  # one of PHASES
    start_s: float = 0.0  # sim time of the reset
    time_limit_s: float = 0.0  # sim seconds after which a running episode fails
    success: bool = False  # the success test held for the dwell
    time_to_success_s: float = -1.0  # sim seconds from the reset to success; < 0 until then
    stage: str = ""  # the stage of the last evaluation
    starvation_events: int = 0  # command starvation while running
    end_s: float = -1.0  # sim time the episode left "running"; < 0 while it runs
    _dwell: SuccessTracker = dataclasses.field(default_factory=SuccessTracker)

    def start(self, spec: EpisodeSpec, now: float, time_limit_s: float) -> int:
        """Begins a new episode at sim time `now`; returns its id."""
        self.episode_id += 1
        self.spec = spec
        self.phase = "running"
        self.start_s = now
        self.time_limit_s = time_limit_s
        self.success = False
        self.time_to_success_s = -1.0
        self.stage = ""
        self.starvation_events = 0
        self.end_s = -1.0
        self._dwell = SuccessTracker()
        return self.episode_id

    def elapsed(self, now: float) -> float:
        """Sim seconds from the reset to `now`, or to the end once the episode has ended."""
        if self.phase == "idle":
            return 0.0
        return (self.end_s if self.end_s >= 0 else now) - self.start_s

    def update(self, now: float, evaluation: Evaluation) -> bool:
        """Records the evaluation of the state at `now`; returns True when the phase changed."""
        if self.phase == "idle":
            return False
        self.stage = evaluation.stage
        if self.phase != "running":
            return False
        if self._dwell.update(evaluation, now):
            self.success = True
            self.time_to_success_s = self._dwell.success_time - self.start_s
            self.phase = "succeeded"
            self.end_s = now
            return True
        if self.elapsed(now) >= self.time_limit_s:
            self.phase = "failed"
            self.end_s = now
            return True
        return False

    def add_starvation(self, count: int) -> None:
        if self.phase == "running":
            self.starvation_events += count
