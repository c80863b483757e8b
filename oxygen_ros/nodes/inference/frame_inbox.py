"""The inference node's frame inbox: the newest serialized ObservationFrame and the task prompt,
handed from the node's callbacks to the engine thread (`engine_loop`), and the pick-up policy.

Pick-up (`frame_pickup`): `newest` starts the newest frame the moment the engine is free.
`on_arrival` is for a saturated engine (a frame takes longer than the observation period, so
the newest frame has usually waited 0..1 period when the engine becomes free): if the newest
frame has waited longer than `frame_pickup_fresh_s` (or was already used), the engine waits
for the next frame to arrive and starts it at once; the wait is bounded by
`PICKUP_MAX_WAIT_PERIODS` frame periods (the median interval of recent arrivals), after which
the newest frame is taken, so nothing stalls. Counted: `frames_waited_for` (a new frame came),
`frame_wait_timeouts` (the bound was hit), `pickup_idle_s` (engine time spent waiting).

Invariants:
- Only the newest frame matters: a frame not taken yet is overwritten by the next one.
- Each instruction is a task (`FrameInbox.set_prompt` counts them, also one repeated word for
  word: a new episode); the task's start (its instruction, or a later reported world reset,
  `FrameInbox.note_reset`) follows perception's rule (`TaskWindow`).
"""

from __future__ import annotations

import collections
import dataclasses
import math
import statistics
import threading
import time
from collections.abc import Callable

from oxygen_ros.perception.task_window import TaskWindow

PICKUP_MAX_WAIT_PERIODS = 1.5  # on_arrival: longest wait for a new frame, in frame periods
ARRIVAL_HISTORY = 16  # arrival intervals the frame period is the median of


@dataclasses.dataclass(frozen=True)
class PickupPolicy:
    """How the engine picks its next frame (`frame_pickup`, `frame_pickup_fresh_s`)."""

    wait_for_arrival: bool = False  # on_arrival: wait for a new frame when the newest is old
    fresh_s: float = 0.001  # a frame that has waited at most this long is started at once


def pickup_wait_s(policy: PickupPolicy, age_s: float, used: bool, period_s: float) -> float:
    """How long the engine, free now, waits for a newer frame (0: take the newest now).

    Args:
        policy: The pick-up policy.
        age_s: How long the newest frame has waited since it arrived.
        used: The newest frame already ran (it is offered again for queued requests).
        period_s: Median interval between frame arrivals (NaN while unknown).
    """
    if not policy.wait_for_arrival or not math.isfinite(period_s):
        return 0.0
    if not used and age_s <= policy.fresh_s:
        return 0.0
    return PICKUP_MAX_WAIT_PERIODS * period_s


@dataclasses.dataclass(frozen=True)
class Pickup:
    """A frame the engine took, with when (monotonic seconds unless noted)."""

    data: bytes  # serialized ObservationFrame
    key: int  # its number among the frames received
    prompt: str  # the task prompt when it was taken
    arrival_clock_s: float  # node clock when it arrived (compared with its stamp)
    arrival_s: float  # when it arrived
    taken_s: float  # when the engine took it
    policy_wait_s: float = 0.0  # time the pick-up policy waited for a newer frame
    # The policy's wait: "" (none), "arrived" (this frame came meanwhile) or "timed_out"
    # (none came within the bound; this is the newest older frame).
    wait_outcome: str = ""
    # Wall-clock (system time) seconds of its trip, NaN where unknown: the sender's DDS write
    # (source timestamp), the DDS reception in this process, its hand-over to the inbox.
    sent_wall_s: float = math.nan
    received_wall_s: float = math.nan
    arrival_wall_s: float = math.nan
    task: int = 0  # the prompt's task number (`FrameInbox.set_prompt` counts them)
    task_since: float = -math.inf  # the node's clock when that prompt was set


class FrameInbox:
    """The newest serialized ObservationFrame and the task prompt, from the node's callbacks to
    the engine thread (only the newest frame matters; older ones are overwritten)."""

    def __init__(
        self,
        prompt: str,
        *,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._cond = threading.Condition()
        self._clock = clock  # the node's clock (stamps)
        self._monotonic = monotonic
        self._wall = wall  # system time (DDS source / reception timestamps)
        self._frame: bytes | None = None
        self._key = 0  # frames received so far
        self._used_key = 0  # key of the last frame taken
        self._arrival_clock = math.nan  # of the newest frame
        self._arrival = math.nan
        self._trip = (math.nan, math.nan, math.nan)  # its sent, received, arrival (wall)
        self._intervals: collections.deque[float] = collections.deque(maxlen=ARRIVAL_HISTORY)
        self._prompt = prompt
        self._task = 0  # prompts set so far (each instruction is a task)
        # When the task began (node clock): its instruction, or a later world reset; the rule
        # and its clock-went-back bound are perception's (`TaskWindow`).
        self._window = TaskWindow()
        self.waiting_for_arrival = False  # `take` is in the pick-up policy's wait

    @property
    def prompt(self) -> str:
        with self._cond:
            return self._prompt

    def put_frame(
        self, data: bytes, sent_wall_s: float = math.nan, received_wall_s: float = math.nan
    ) -> None:
        """A new frame; `sent_wall_s` / `received_wall_s`: its DDS source and reception
        timestamps (system time, seconds) when known."""
        arrival_clock, arrival, arrival_wall = self._clock(), self._monotonic(), self._wall()
        with self._cond:
            if self._key:
                self._intervals.append(arrival - self._arrival)
            self._frame = data
            self._key += 1
            self._arrival_clock, self._arrival = arrival_clock, arrival
            self._trip = (sent_wall_s, received_wall_s, arrival_wall)
            self._cond.notify_all()

    def set_prompt(self, prompt: str) -> None:
        """A new instruction: the prompt of the frames taken from now on, and a new task (also
        when the words are the same as before: a new episode of the same instruction)."""
        since = self._clock()
        with self._cond:
            self._prompt = prompt
            self._task += 1
            self._window.on_instruction(since)

    def note_reset(self, reset_s: float) -> None:
        """The world was reset at `reset_s` (node clock; a workcell episode): no frame observed
        at or before it runs from now on, under this task or a later one."""
        with self._cond:
            self._window.on_reset(reset_s)  # later than the start, or the clock went back

    def wake(self) -> None:
        """Makes a waiting `take` look again (new requests, shutdown)."""
        with self._cond:
            self._cond.notify_all()

    def frame_period_s(self) -> float:
        """Median interval between the last `ARRIVAL_HISTORY` + 1 arrivals (NaN before two)."""
        with self._cond:
            return statistics.median(self._intervals) if self._intervals else math.nan

    def take(
        self,
        has_requests: Callable[[], bool],
        stop: threading.Event,
        timeout_s: float,
        policy: PickupPolicy = PickupPolicy(),
    ) -> Pickup | None:
        """Waits up to `timeout_s` for a new frame, or for requests and any frame, then applies
        the pick-up `policy` (`pickup_wait_s`); returns the frame taken, or None (nothing to do,
        or `stop` is set)."""

        def ready() -> bool:
            return self._frame is not None and (self._key != self._used_key or has_requests())

        with self._cond:
            self._cond.wait_for(lambda: stop.is_set() or ready(), timeout=timeout_s)
            if stop.is_set() or not ready():
                return None
            now = self._monotonic()
            used = self._key == self._used_key
            intervals = self._intervals
            period = statistics.median(intervals) if intervals else math.nan
            wait = pickup_wait_s(policy, now - self._arrival, used, period)
            policy_wait, outcome = 0.0, ""
            if wait > 0:
                key = self._key
                self.waiting_for_arrival = True
                try:
                    self._cond.wait_for(lambda: stop.is_set() or self._key != key, timeout=wait)
                finally:
                    self.waiting_for_arrival = False
                if stop.is_set():
                    return None
                outcome = "arrived" if self._key != key else "timed_out"
                policy_wait = self._monotonic() - now
            self._used_key = self._key
            return Pickup(
                self._frame,
                self._key,
                self._prompt,
                self._arrival_clock,
                self._arrival,
                self._monotonic(),
                policy_wait,
                outcome,
                *self._trip,
                task=self._task,
                task_since=self._window.start_s,
            )

    def drop(self, key: int) -> None:
        """Forgets frame `key` if it is still the newest (it is not used again)."""
        with self._cond:
            if self._key == key:
                self._frame = None
