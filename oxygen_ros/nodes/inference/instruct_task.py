"""Bookkeeping of the `Instruct` action's task (ROS-free): at most one active goal, what the
model said while it ran, and how it ended.

`instruct_server.InstructServer` feeds it from the executor thread (goals, cancels, the
completion signal, ticks of `poll`) and from the engine thread (`on_speech`), and turns what
`poll` and `start` return into feedback and results.

Invariants:
- At most one task is active. `start` ends the previous one (SUPERSEDED), so every started
  goal ends exactly once: its `Ended` is returned by exactly one call of `start` or `poll`.
- The first ending wins: an ending recorded while one is pending (not yet returned by `poll`)
  is ignored, and a goal that is no longer active is never ended again.
- Times are node-clock seconds passed in by the caller (simulated time under use_sim_time).
  A clock at or below zero has not started (sim time before the first /clock): the task's
  start is then taken at the first positive time `poll` sees. Elapsed time never goes below
  zero (a clock that jumps back restarts nothing, it only clamps).
- Feedback is returned only when the subtask or narration changed since the last feedback.
- The completion signal is edge-triggered (`on_task_status`): success counts only after the
  signal was seen false during this task, so a latched success of the previous task (the
  workcell republishes `success: true` until the next reset) never ends a new goal at once.
- Thread-safe: one lock guards all state.
"""

from __future__ import annotations

import dataclasses
import enum
import threading
from collections.abc import Hashable

# `on_speech` kinds that update the task (the engine's `RequestKind` values).
SUBTASK = "subtask"
NARRATION = "narration"
DONE_MESSAGE = "task completion signalled"


class Status(enum.IntEnum):
    """How a task ended; the values are `Instruct.Result.STATUS_*`."""

    SUCCEEDED = 1  # the completion signal came while it ran
    TIME_LIMIT = 2  # its time limit passed first
    CANCELED = 3  # the client canceled it
    SUPERSEDED = 4  # another goal or a topic instruction replaced it
    FAILED = 5  # the node ended it (deactivated, shutting down, instruction not applied)


@dataclasses.dataclass(frozen=True)
class Feedback:
    """What the active task's goal is told when the model's words change."""

    goal_id: Hashable  # the goal it is for
    subtask: str  # latest finished subtask ("" until the first)
    narration: str  # latest finished narration ("" until the first)
    elapsed_s: float  # node-clock seconds since the task started


@dataclasses.dataclass(frozen=True)
class Ended:
    """A task's ending: its goal's result."""

    goal_id: Hashable  # the goal that ended
    status: Status  # how it ended
    message: str  # human-readable detail
    last_subtask: str  # latest finished subtask while it ran ("" if none)
    last_narration: str  # latest finished narration while it ran ("" if none)
    elapsed_s: float  # node-clock seconds from its start to the call that returned this


@dataclasses.dataclass(frozen=True)
class Poll:
    """What one `poll` found."""

    feedback: Feedback | None  # the active task's words changed since the last feedback
    ended: Ended | None  # the active task ended (it is no longer active)


@dataclasses.dataclass
class _Task:
    goal_id: Hashable
    text: str  # the instruction
    time_limit_s: float  # 0: none
    started: float | None  # node-clock start; None until the clock runs
    subtask: str = ""
    narration: str = ""
    reported: tuple[str, str] = ("", "")  # (subtask, narration) of the last feedback
    ending: tuple[Status, str] | None = None  # recorded, not yet returned by poll
    armed: bool = False  # the completion signal was false during this task

    def elapsed(self, now: float) -> float:
        return 0.0 if self.started is None else max(0.0, now - self.started)

    def ended(self, status: Status, message: str, now: float) -> Ended:
        return Ended(
            self.goal_id,
            status,
            message,
            self.subtask,
            self.narration,
            self.elapsed(now),
        )


def format_seconds(seconds: float) -> str:
    """`30` for whole seconds, `2.5` otherwise (messages)."""
    return f"{seconds:g}"


class InstructTask:
    """At most one active task (goal); see the module docstring for the invariants."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._task: _Task | None = None

    @property
    def active_goal(self) -> Hashable | None:
        """The goal of the active task (None when idle)."""
        with self._lock:
            return None if self._task is None else self._task.goal_id

    @property
    def instruction(self) -> str:
        """The active task's instruction ("" when idle)."""
        with self._lock:
            return "" if self._task is None else self._task.text

    def start(self, goal_id: Hashable, text: str, time_limit_s: float, now: float) -> Ended | None:
        """Makes `goal_id` the active task.

        Args:
            goal_id: The new goal (distinct from the active one).
            text: Its instruction.
            time_limit_s: Seconds it may run on the node clock; 0: no limit.
            now: The node clock.

        Returns:
            The previous task's ending (SUPERSEDED, or the ending it had already recorded), or
            None when no task was active.
        """
        if time_limit_s < 0:
            raise ValueError(f"time_limit_s must be >= 0, got {time_limit_s}")
        with self._lock:
            previous = self._task
            if previous is not None and previous.goal_id == goal_id:
                raise ValueError(f"goal {goal_id!r} is already active")
            self._task = _Task(goal_id, text, time_limit_s, now if now > 0 else None)
            if previous is None:
                return None
            status, message = previous.ending or (Status.SUPERSEDED, "superseded by a new goal")
            return previous.ended(status, message, now)

    def on_speech(self, kind: str, text: str, prompt: str | None = None) -> bool:
        """A finished language output (engine thread).

        Args:
            kind: `SUBTASK` or `NARRATION` (other kinds are ignored).
            text: Its whole text (stripped; empty text is ignored).
            prompt: The instruction the request started under; when given and not the active
                task's instruction, the output belongs to an earlier task and is ignored.

        Returns:
            True when it changed the active task's subtask or narration.
        """
        text = text.strip()
        if kind not in (SUBTASK, NARRATION) or not text:
            return False
        with self._lock:
            task = self._task
            if task is None or task.ending is not None:
                return False
            if prompt is not None and prompt != task.text:
                return False
            field = "subtask" if kind == SUBTASK else "narration"
            if getattr(task, field) == text:
                return False
            setattr(task, field, text)
            return True

    def on_task_status(self, success: bool) -> bool:
        """The task-completion signal (for example `EpisodeStatus.success`); edge-triggered:
        true after a false seen during this task ends it SUCCEEDED. Returns True when it did."""
        with self._lock:
            task = self._task
            if task is None:
                return False
            if not success:
                task.armed = True
                return False
            if not task.armed:
                return False  # a success latched from before this task
            return self._record_locked(None, Status.SUCCEEDED, DONE_MESSAGE)

    def on_done(self) -> bool:
        """The active task is complete (an unconditional completion signal)."""
        return self._record(None, Status.SUCCEEDED, DONE_MESSAGE)

    def cancel(self, goal_id: Hashable) -> bool:
        """The client canceled `goal_id`; False when it is not the active task or the task is
        already ending."""
        return self._record(goal_id, Status.CANCELED, "canceled by the client")

    def supersede(self, message: str) -> bool:
        """Something other than a goal replaced the active task (an instruction on the topic)."""
        return self._record(None, Status.SUPERSEDED, message)

    def abort(self, reason: str) -> bool:
        """The node ends the active task (deactivated, shutting down): FAILED with `reason`."""
        return self._record(None, Status.FAILED, reason)

    def poll(self, now: float) -> Poll:
        """Feedback if the words changed; the ending if one was recorded or the time limit
        passed at `now` (the active task is then cleared)."""
        with self._lock:
            task = self._task
            if task is None:
                return Poll(None, None)
            if task.started is None and now > 0:
                task.started = now
            feedback = None
            words = (task.subtask, task.narration)
            if words != task.reported:
                task.reported = words
                feedback = Feedback(task.goal_id, *words, task.elapsed(now))
            ending = task.ending
            if (
                ending is None
                and task.time_limit_s > 0
                and task.started is not None
                and task.elapsed(now) >= task.time_limit_s
            ):
                limit = format_seconds(task.time_limit_s)
                ending = (Status.TIME_LIMIT, f"time limit of {limit} s reached")
            if ending is None:
                return Poll(feedback, None)
            self._task = None
            return Poll(feedback, task.ended(*ending, now))

    def _record(self, goal_id: Hashable | None, status: Status, message: str) -> bool:
        """Records an ending of the active task (of `goal_id` when given) unless one is
        pending. Returns True when it was recorded."""
        with self._lock:
            return self._record_locked(goal_id, status, message)

    def _record_locked(self, goal_id: Hashable | None, status: Status, message: str) -> bool:
        task = self._task
        if task is None or task.ending is not None:
            return False
        if goal_id is not None and task.goal_id != goal_id:
            return False
        task.ending = (status, message)
        return True
