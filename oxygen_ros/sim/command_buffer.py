"""Timed joint-position commands -> the position targets of the current sim tick (ROS-free).

The sim node turns each `oxygen_ros/ActionChunk` or `trajectory_msgs/JointTrajectory` into
`TimedTargets` (an absolute sim time per row; the robot joint of each column) and submits it;
once per control tick it asks `target(now)` for the J position targets of the actuators.

Rules:
- Newest wins, per joint, from its first row on: a command replaces, for its own joints, every
  older command from `times[0]` on. Before `times[0]` a joint keeps following the older command
  (or holds, if it has none); older commands that would start at or after `times[0]` are
  dropped unexecuted.
- Between rows the target is linear in time (`interpolate=True`) or the latest row
  (`interpolate=False`); at a row time it is exactly that row (within `TIME_EPS`).
- Deadline: nothing of a command runs after `min(valid_until, times[0] + max_age_s)`.
  `valid_until` is the sender's bound; `max_age_s` the receiver's: how long after its first row
  a command may drive the robot open loop (so it must exceed the longest legitimate command).
- A command ends exhausted (its last row time passed before the deadline: hold the last row)
  or expired (the deadline came first: hold its value at the deadline, never jump back). The
  joint then holds until a newer command starts.
- A tick's status is "active" if any joint follows a live command row, else "hold_expired" if
  any joint's command expired, else "hold_exhausted", else "hold_none" (no command has started
  since construction or the last `reset`).

Invariants:
- `target(now)` returns J finite values; a joint with no started command holds its initial (or
  last `reset`) position.
- A `TimedTargets` is valid by construction; a refused command raises `RejectedCommandError`,
  is counted under its reason, and changes nothing.
- `now` does not decrease between resets: commands superseded before `now` are forgotten.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Callable

import numpy as np

TIME_EPS = 1e-9  # seconds; a time this close to a row time counts as that row's time
SOURCES = ("chunk", "trajectory")
# Tick statuses, most to least alive; a tick reports the first one any joint is in.
STATUSES = ("active", "hold_expired", "hold_exhausted", "hold_none")


class RejectedCommandError(ValueError):
    """A command that must not be executed; `reason` is a counter name."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclasses.dataclass(frozen=True)
class CommandBufferConfig:
    """Size and timing rules of the buffer."""

    num_joints: int  # J: the robot's joints, in the order `target` returns them
    max_age_s: float  # nothing of a command runs later than this after its first row time
    interpolate: bool = True  # linear between rows; False: each row holds until the next

    def __post_init__(self) -> None:
        if self.num_joints < 1:
            raise ValueError(f"num_joints must be >= 1, got {self.num_joints}")
        if not self.max_age_s > 0:
            raise ValueError(f"max_age_s must be > 0 (inf for no limit), got {self.max_age_s}")


@dataclasses.dataclass(frozen=True)
class TimedTargets:
    """Joint position targets with an absolute sim time per row; validated on construction."""

    times: np.ndarray  # float64 [K], strictly increasing, absolute sim seconds; read-only
    rows: np.ndarray  # float64 [K, n], row k is the target at times[k]; read-only
    joint_indices: tuple[int, ...]  # the robot joint of each of the n columns, unique
    valid_until: float  # absolute time after which nothing of it may run; inf for no bound
    source: str  # one of SOURCES
    command_id: int  # caller's identifier, for logs

    def __post_init__(self) -> None:
        times = _float_array(self.times, "times")
        rows = _float_array(self.rows, "rows")
        try:
            indices = tuple(int(i) for i in self.joint_indices)
        except (TypeError, ValueError) as err:
            raise RejectedCommandError("bad_joint", f"joint indices are not ints: {err}") from err
        if rows.ndim != 2 or rows.shape[0] < 1 or rows.shape[1] != len(indices) or not indices:
            raise RejectedCommandError(
                "bad_shape", f"rows shape {rows.shape}, expected [K>=1, {len(indices)}>=1]"
            )
        if times.shape != (rows.shape[0],):
            raise RejectedCommandError(
                "bad_shape", f"{times.shape[0] if times.ndim else 0} times for {len(rows)} rows"
            )
        if len(set(indices)) != len(indices) or min(indices) < 0:
            raise RejectedCommandError("bad_joint", f"joint indices {indices} not unique and >= 0")
        if not (np.all(np.isfinite(rows)) and np.all(np.isfinite(times))) or math.isnan(
            self.valid_until
        ):
            raise RejectedCommandError("non_finite", "command contains NaN or inf")
        if np.any(np.diff(times) <= 0):
            raise RejectedCommandError("times_not_increasing", "row times must strictly increase")
        if self.source not in SOURCES:
            raise ValueError(f"source must be one of {SOURCES}, got {self.source!r}")
        times.flags.writeable = False
        rows.flags.writeable = False
        object.__setattr__(self, "times", times)
        object.__setattr__(self, "rows", rows)
        object.__setattr__(self, "joint_indices", indices)
        object.__setattr__(self, "valid_until", float(self.valid_until))


def _float_array(values: np.ndarray, what: str) -> np.ndarray:
    """A float64 copy of `values`; ragged or non-numeric input is a "bad_shape" rejection."""
    try:
        return np.array(values, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise RejectedCommandError("bad_shape", f"{what} is not a numeric array: {err}") from err


def from_chunk(
    start: float,
    dt: float,
    rows: np.ndarray,
    joint_indices: tuple[int, ...],
    valid_until: float = math.inf,
    command_id: int = 0,
) -> TimedTargets:
    """An action chunk: row k is the target at `start + k * dt`.

    Raises:
        RejectedCommandError: Invalid shape, values, times or joint indices.
    """
    rows = _float_array(rows, "rows")
    times = start + dt * np.arange(rows.shape[0] if rows.ndim else 0, dtype=np.float64)
    return TimedTargets(times, rows, tuple(joint_indices), valid_until, "chunk", command_id)


def from_trajectory(
    start: float,
    times_from_start: np.ndarray,
    rows: np.ndarray,
    joint_indices: tuple[int, ...],
    valid_until: float = math.inf,
    command_id: int = 0,
) -> TimedTargets:
    """A joint trajectory: row k is the target at `start + times_from_start[k]`.

    Raises:
        RejectedCommandError: Invalid shape, values, times or joint indices.
    """
    times = start + _float_array(times_from_start, "times_from_start")
    return TimedTargets(times, rows, tuple(joint_indices), valid_until, "trajectory", command_id)


@dataclasses.dataclass
class CommandCounters:
    """Cumulative counts, reported in diagnostics; never reset."""

    commands_accepted: int = 0
    # reason -> number of refused commands
    commands_rejected: Counter[str] = dataclasses.field(default_factory=Counter)
    ticks_active: int = 0
    ticks_hold_exhausted: int = 0
    ticks_hold_expired: int = 0
    ticks_hold_none: int = 0
    starvation_events: int = 0  # ticks whose status fell from active to hold_exhausted/expired


@dataclasses.dataclass(frozen=True)
class _Command:
    targets: TimedTargets
    deadline: float  # min(valid_until, times[0] + max_age_s)


class CommandBuffer:
    """Per-joint queues of timed commands; not thread-safe (the node guards it with a lock)."""

    def __init__(self, config: CommandBufferConfig, initial_positions: np.ndarray) -> None:
        self.config = config
        self.counters = CommandCounters()
        self._next_id = 0
        self.reset(initial_positions)

    @property
    def last_target(self) -> np.ndarray:
        """The J targets of the last tick (the held positions before the first tick)."""
        return self._last_target.copy()

    def reset(self, positions: np.ndarray) -> None:
        """Forgets every command and holds `positions` (J values), e.g. on an episode reset."""
        held = np.array(positions, dtype=np.float64)
        if held.shape != (self.config.num_joints,) or not np.all(np.isfinite(held)):
            raise ValueError(f"need {self.config.num_joints} finite positions, got {held}")
        self._held = held
        self._last_target = held.copy()
        # Per joint: (command, column) ordered by strictly increasing first row time; entry 0 is
        # the one executing once its first row time has come.
        self._queues: list[list[tuple[_Command, int]]] = [[] for _ in range(len(held))]
        self._last_status = "hold_none"

    def submit(self, targets: TimedTargets, now: float) -> None:
        """Makes `targets` the newest command for its joints from its first row time on.

        Raises:
            RejectedCommandError: A joint index >= J ("bad_joint"), or the command's deadline
                is already past or before its first row ("stale"). Nothing changes.
        """
        if max(targets.joint_indices) >= self.config.num_joints:
            self._reject(
                "bad_joint",
                f"joint indices {targets.joint_indices} out of range 0..{self.config.num_joints}",
            )
        start = float(targets.times[0])
        deadline = min(targets.valid_until, start + self.config.max_age_s)
        if deadline < start or now > deadline + TIME_EPS:
            self._reject(
                "stale", f"command {targets.command_id} deadline {deadline:.6f} (now {now:.6f})"
            )
        command = _Command(targets, deadline)
        for column, joint in enumerate(targets.joint_indices):
            queue = self._queues[joint]
            queue[:] = [e for e in queue if e[0].targets.times[0] < start - TIME_EPS]
            queue.append((command, column))
        self.counters.commands_accepted += 1

    def submit_chunk(
        self,
        start: float,
        dt: float,
        rows: np.ndarray,
        joint_indices: tuple[int, ...],
        valid_until: float,
        now: float,
    ) -> TimedTargets:
        """`from_chunk` + `submit`, counting any rejection; the buffer numbers the command."""
        return self._build_and_submit(
            from_chunk, (start, dt, rows, joint_indices, valid_until), now
        )

    def submit_trajectory(
        self,
        start: float,
        times_from_start: np.ndarray,
        rows: np.ndarray,
        joint_indices: tuple[int, ...],
        valid_until: float,
        now: float,
    ) -> TimedTargets:
        """`from_trajectory` + `submit`, counting any rejection; the buffer numbers the command."""
        return self._build_and_submit(
            from_trajectory, (start, times_from_start, rows, joint_indices, valid_until), now
        )

    def target(self, now: float) -> tuple[np.ndarray, str]:
        """The J position targets at `now` and the tick's status (one of STATUSES).

        Call it once per control tick: it counts the tick and starvation events.
        """
        values = self._held.copy()
        seen: set[str] = set()
        evaluated: dict[int, tuple[np.ndarray, str]] = {}
        for joint, queue in enumerate(self._queues):
            while len(queue) > 1 and queue[1][0].targets.times[0] <= now + TIME_EPS:
                queue.pop(0)
            if not queue or queue[0][0].targets.times[0] > now + TIME_EPS:
                seen.add("hold_none")
                continue
            command, column = queue[0]
            if id(command) not in evaluated:
                evaluated[id(command)] = self._evaluate(command, now)
            row, status = evaluated[id(command)]
            values[joint] = row[column]
            seen.add(status)
        status = next(s for s in STATUSES if s in seen)
        setattr(self.counters, f"ticks_{status}", getattr(self.counters, f"ticks_{status}") + 1)
        if self._last_status == "active" and status in ("hold_exhausted", "hold_expired"):
            self.counters.starvation_events += 1
        self._last_status = status
        self._last_target = values
        return values.copy(), status

    # ---------------------------------------------------------------- internals
    def _build_and_submit(
        self, build: Callable[..., TimedTargets], args: tuple, now: float
    ) -> TimedTargets:
        try:
            targets = build(*args, command_id=self._next_id)
        except RejectedCommandError as err:
            self.counters.commands_rejected[err.reason] += 1
            raise
        self.submit(targets, now)
        self._next_id += 1
        return targets

    def _reject(self, reason: str, message: str) -> None:
        self.counters.commands_rejected[reason] += 1
        raise RejectedCommandError(reason, message)

    def _evaluate(self, command: _Command, now: float) -> tuple[np.ndarray, str]:
        times = command.targets.times
        if command.deadline < times[-1] and now > command.deadline + TIME_EPS:
            return self._sample(command.targets, command.deadline), "hold_expired"
        if now > times[-1] + TIME_EPS:
            return command.targets.rows[-1], "hold_exhausted"
        return self._sample(command.targets, now), "active"

    def _sample(self, targets: TimedTargets, t: float) -> np.ndarray:
        times, rows = targets.times, targets.rows
        k = int(np.searchsorted(times, t + TIME_EPS, side="right")) - 1
        k = min(max(k, 0), len(times) - 1)
        if k == len(times) - 1 or t <= times[k] + TIME_EPS or not self.config.interpolate:
            return rows[k]
        w = (t - times[k]) / (times[k + 1] - times[k])
        return rows[k] + w * (rows[k + 1] - rows[k])
