"""The action stream between the engine thread and the publishing timer (ROS-free).

The engine thread `offer`s each new action chunk; the publishing timer asks for a `slice`
at its own rate. Every chunk row k has a time: `start + k * dt`, with `start` = the
observation stamp + `time_offset_s`, so the inference latency shows up as rows that have
already passed when the chunk arrives.

Invariants:
- A published slice never holds a row whose time is before the publish time: its first row
  is the first one at or after `now` (re-based to the publish time).
- Nothing stale is published: no slice when the chunk's observation is older than
  `max_chunk_age_s`, or when every row has passed.
- A chunk with a NaN/inf value or the wrong width is refused whole (`RejectedChunkError`), and the
  previous chunk stays current.
- Rows are clamped to the position limits and, between consecutive rows, to the velocity
  limits; the first published row is limited relative to the previous chunk's row before it
  while that chunk is live, else relative to the measured joint state (the first chunk, or the
  first after a gap, never jumps from where the robot is; a pose outside the position limits
  counts as the nearest limit, so nothing published ever leaves them); the clamps are counted.
- A hold (`offer_hold`) is a chunk like any other: the measured joint state repeated, through
  the same clamps (no blending: it starts where the robot is), current until a newer chunk;
  its chunk_id is `HOLD_CHUNK_ID`.
- Every slice carries its expiry: `valid_until` = the chunk's observation stamp +
  `max_chunk_age_s`, the time after which the stream itself publishes nothing of it.
- On a new chunk, rows from `now` on are blended with the previous chunk sampled at the same
  times: `replace` switches at once; `blend` moves the weight of the new chunk linearly from
  1 / (N + 1) to 1 over `blend_steps` = N rows. Rows after the previous chunk's end are the
  new chunk's own values.
- Every chunk belongs to a task (`offer(task=...)`: the engine thread counts instructions). A
  chunk of another task than the live one neither blends with it nor starts its velocity limits
  from it: it starts from the measured joint state, as the first chunk does. The previous
  task's plan is no guide to the new one, and after an episode reset (the robot put back at its
  rest pose) blending with it would drive the arms back towards where the last episode left
  them.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

BLEND_MODES = ("replace", "blend")
TIME_EPS = 1e-9  # seconds; a row exactly at `now` counts as not yet passed
HOLD_CHUNK_ID = 2**63  # chunk_id of hold chunks (model chunks count from 0)


class RejectedChunkError(ValueError):
    """A chunk that must never be published; `reason` is a counter name."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclasses.dataclass(frozen=True)
class StreamConfig:
    """Timing, blending and safety limits of the stream."""

    dt: float  # seconds between chunk rows
    num_joints: int  # J: columns of every chunk
    blend_mode: str = "blend"  # one of BLEND_MODES
    blend_steps: int = 5  # rows over which `blend` hands over to the new chunk
    max_chunk_age_s: float = 1.0  # a chunk whose observation is older is not published
    time_offset_s: float = 0.0  # row 0 time = observation stamp + this
    position_lower: tuple[float, ...] = ()  # per joint, or () for no lower limit
    position_upper: tuple[float, ...] = ()  # per joint, or () for no upper limit
    max_velocity: tuple[float, ...] = ()  # per joint, units per second, or () for none

    def __post_init__(self) -> None:
        if not (self.dt > 0 and math.isfinite(self.dt)):
            raise ValueError(f"dt must be positive, got {self.dt}")
        if self.blend_mode not in BLEND_MODES:
            raise ValueError(f"blend_mode must be one of {BLEND_MODES}, got {self.blend_mode!r}")
        if self.blend_steps < 0:
            raise ValueError("blend_steps must be >= 0")
        if not self.max_chunk_age_s > 0:
            raise ValueError("max_chunk_age_s must be > 0")
        for name in ("position_lower", "position_upper", "max_velocity"):
            value = getattr(self, name)
            if len(value) not in (0, self.num_joints):
                raise ValueError(f"{name} needs 0 or {self.num_joints} values, got {len(value)}")
        if self.max_velocity and min(self.max_velocity) <= 0:
            raise ValueError("max_velocity values must be > 0")
        if (
            self.position_lower
            and self.position_upper
            and any(
                lo > hi for lo, hi in zip(self.position_lower, self.position_upper, strict=True)
            )
        ):
            raise ValueError("position_lower must not exceed position_upper")


@dataclasses.dataclass(frozen=True)
class TimedChunk:
    """An action chunk with a time for every row."""

    chunk_id: int  # increments per accepted chunk
    start: float  # time of rows[0], seconds
    dt: float  # seconds between rows
    rows: np.ndarray  # float32 [A, J], read-only
    observation_stamp: float  # stamp of the observation it was inferred from
    latency_s: float  # seconds from the observation stamp until the chunk was ready
    task: int = 0  # the task (instruction) it was inferred for

    @property
    def end(self) -> float:
        """Time of the last row."""
        return self.start + (len(self.rows) - 1) * self.dt

    def first_row_at_or_after(self, t: float) -> int:
        """Index of the first row whose time is >= t (len(rows) when none is)."""
        k = math.ceil((t - self.start) / self.dt - TIME_EPS)
        return min(max(k, 0), len(self.rows))

    def sample(self, t: float) -> np.ndarray:
        """Row values at time t, linearly interpolated, held constant beyond both ends."""
        x = (t - self.start) / self.dt
        if x <= 0:
            return self.rows[0].astype(np.float64)
        if x >= len(self.rows) - 1:
            return self.rows[-1].astype(np.float64)
        k = math.floor(x)
        frac = x - k
        return (1 - frac) * self.rows[k].astype(np.float64) + frac * self.rows[k + 1]


@dataclasses.dataclass(frozen=True)
class Slice:
    """What one publish sends: the chunk's rows from `first_row` on."""

    chunk: TimedChunk
    first_row: int  # index into chunk.rows of rows[0]
    stamp: float  # time of rows[0] (>= the publish time)
    rows: np.ndarray  # float32 [n, J], n >= 1
    valid_until: float = math.inf  # no row may run after this time (the chunk's age limit)


@dataclasses.dataclass
class StreamCounters:
    """Cumulative counts, reported in diagnostics."""

    chunks_accepted: int = 0
    chunks_non_finite: int = 0
    chunks_bad_shape: int = 0
    chunks_stale: int = 0  # refused because the observation was already too old
    chunks_position_clamped: int = 0  # accepted chunks with at least one position clamp
    chunks_velocity_clamped: int = 0  # accepted chunks with at least one velocity clamp
    chunks_new_task: int = 0  # accepted chunks that did not continue a live one of another task


class ActionStream:
    """Holds the current chunk; not thread-safe (the node guards it with a lock)."""

    def __init__(self, config: StreamConfig) -> None:
        self.config = config
        self.counters = StreamCounters()
        self._current: TimedChunk | None = None
        self._next_id = 0

    @property
    def current(self) -> TimedChunk | None:
        return self._current

    def reconfigure(self, config: StreamConfig) -> None:
        """Takes new blending/age settings; the current chunk keeps its own timing."""
        if config.num_joints != self.config.num_joints:
            raise ValueError("num_joints cannot change at run time")
        self.config = config

    def clear(self) -> None:
        """Forgets the current chunk (nothing is published until the next one)."""
        self._current = None

    def offer(
        self,
        actions: np.ndarray,
        observation_stamp: float,
        latency_s: float,
        now: float,
        measured: np.ndarray | None = None,
        task: int = 0,
    ) -> TimedChunk:
        """Aligns, blends and clamps a new chunk and makes it current.

        Args:
            actions: float [A, J] from the engine, row 0 at the observation time.
            observation_stamp: Stamp of the observation the chunk was inferred from.
            latency_s: Seconds from the observation until the chunk was ready.
            now: Current time, seconds.
            measured: float [J], the joint state of that observation: where the velocity
                limits start from when no previous chunk of the same task is live (None:
                unlimited start).
            task: The task (instruction) the chunk was inferred for.

        Returns:
            The chunk as it will be published.

        Raises:
            RejectedChunkError: Wrong shape, non-finite values, or an observation older than
                `max_chunk_age_s`. The previous chunk stays current.
        """
        cfg = self.config
        rows = np.asarray(actions)
        if rows.ndim != 2 or rows.shape[0] < 1 or rows.shape[1] != cfg.num_joints:
            self.counters.chunks_bad_shape += 1
            raise RejectedChunkError(
                "bad_shape", f"chunk shape {rows.shape}, expected [A>=1, {cfg.num_joints}]"
            )
        if not np.all(np.isfinite(rows)):
            self.counters.chunks_non_finite += 1
            raise RejectedChunkError("non_finite", "chunk contains NaN or inf; discarded")
        if now - observation_stamp > cfg.max_chunk_age_s:
            self.counters.chunks_stale += 1
            raise RejectedChunkError(
                "stale",
                f"chunk's observation is {now - observation_stamp:.3f} s old "
                f"(max_chunk_age_s={cfg.max_chunk_age_s})",
            )
        rows = rows.astype(np.float64, copy=True)
        start = observation_stamp + cfg.time_offset_s
        first = math.ceil((now - start) / cfg.dt - TIME_EPS)
        first = min(max(first, 0), len(rows))
        old = self._live_previous(now)
        if old is not None and old.task != task:
            old = None  # another task's plan: start from the measured state
            self.counters.chunks_new_task += 1
        if old is not None:
            self._blend(rows, start, first, old)
            before = old.sample(start + (first - 1) * cfg.dt)
        else:
            before = None if measured is None else self._checked(measured)
        chunk = self._clamp_and_keep(
            rows, start, first, before, observation_stamp, latency_s, task=task
        )
        self._next_id += 1
        return chunk

    def offer_hold(self, measured: np.ndarray, now: float, horizon: int) -> TimedChunk:
        """Makes a hold of the measured joint state current: `horizon` rows from `now`,
        through the same clamps as a model chunk, observation stamp `now`, `HOLD_CHUNK_ID`."""
        held = self._checked(measured)
        rows = np.tile(held, (max(horizon, 1), 1))
        task = self._current.task if self._current is not None else 0  # the hold continues it
        return self._clamp_and_keep(
            rows, now, 0, held, now, 0.0, chunk_id=HOLD_CHUNK_ID, task=task
        )

    def _checked(self, measured: np.ndarray) -> np.ndarray:
        values = np.asarray(measured, dtype=np.float64).reshape(-1)
        if values.shape != (self.config.num_joints,) or not np.all(np.isfinite(values)):
            raise ValueError(
                f"measured joint state {values} is not {self.config.num_joints} finite values"
            )
        return values

    def _clamp_and_keep(
        self,
        rows: np.ndarray,
        start: float,
        first: int,
        before: np.ndarray | None,
        observation_stamp: float,
        latency_s: float,
        chunk_id: int | None = None,
        task: int = 0,
    ) -> TimedChunk:
        pos_clamped = self._clamp_positions(rows)
        if before is not None:  # a pose outside the limits: start from the nearest limit
            before = before.copy()
            self._clamp_positions(before[None])
        vel_clamped = self._clamp_velocities(rows, first, before)
        self.counters.chunks_position_clamped += int(pos_clamped)
        self.counters.chunks_velocity_clamped += int(vel_clamped)
        out = rows.astype(np.float32)
        out.flags.writeable = False
        chunk_id = self._next_id if chunk_id is None else chunk_id
        chunk = TimedChunk(
            chunk_id, start, self.config.dt, out, observation_stamp, latency_s, task
        )
        self.counters.chunks_accepted += int(chunk_id != HOLD_CHUNK_ID)
        self._current = chunk
        return chunk

    def slice(self, now: float) -> Slice | None:
        """The rows to publish at `now`, or None when nothing fresh is left (`empty_reason`)."""
        if self.empty_reason(now):
            return None
        chunk = self._current
        first = chunk.first_row_at_or_after(now)
        valid_until = chunk.observation_stamp + self.config.max_chunk_age_s
        return Slice(chunk, first, chunk.start + first * chunk.dt, chunk.rows[first:], valid_until)

    def empty_reason(self, now: float) -> str:
        """Why `slice(now)` is None: "no_chunk", "stale", "exhausted"; "" when it is not."""
        chunk = self._current
        if chunk is None:
            return "no_chunk"
        if now - chunk.observation_stamp > self.config.max_chunk_age_s:
            return "stale"
        if chunk.first_row_at_or_after(now) >= len(chunk.rows):
            return "exhausted"
        return ""

    # ---------------------------------------------------------------- internals
    def _live_previous(self, now: float) -> TimedChunk | None:
        old = self._current
        if old is None or now - old.observation_stamp > self.config.max_chunk_age_s:
            return None
        return old if old.end >= now else None

    def _blend(self, rows: np.ndarray, start: float, first: int, old: TimedChunk) -> None:
        cfg = self.config
        steps = cfg.blend_steps if cfg.blend_mode == "blend" else 0
        for i, k in enumerate(range(first, len(rows))):
            if i >= steps:
                break
            t = start + k * cfg.dt
            if t > old.end + TIME_EPS:
                break
            w = (i + 1) / (steps + 1)
            rows[k] = w * rows[k] + (1 - w) * old.sample(t)

    def _clamp_positions(self, rows: np.ndarray) -> bool:
        cfg = self.config
        lower = np.asarray(cfg.position_lower) if cfg.position_lower else -np.inf
        upper = np.asarray(cfg.position_upper) if cfg.position_upper else np.inf
        clamped = np.clip(rows, lower, upper)
        changed = bool(np.any(clamped != rows))
        rows[:] = clamped
        return changed

    def _clamp_velocities(self, rows: np.ndarray, first: int, before: np.ndarray | None) -> bool:
        """Limits row-to-row steps from `first` on; `before` stands for the row before it
        (None: the first row is not limited)."""
        cfg = self.config
        if not cfg.max_velocity or first >= len(rows):
            return False
        step = np.asarray(cfg.max_velocity) * cfg.dt
        # Rows before the first step over the limit stay as they are, so the row-by-row pass
        # (each row limited against the previous limited one) starts there; found with one
        # vectorised comparison of the unmodified rows (a new chunk is on the critical path:
        # the Python pass over 50 rows took ~0.3 ms). Non-finite values count as a violation
        # (the pass then handles them as it always did).
        start = _first_step_over(rows, first, before, step)
        if start is None:
            return False
        changed = False
        prev = before if start == first else rows[start - 1]
        for k in range(start, len(rows)):
            if prev is not None:
                limited = np.clip(rows[k], prev - step, prev + step)
                if np.any(limited != rows[k]):
                    changed = True
                    rows[k] = limited
            prev = rows[k]
        return changed


def _first_step_over(
    rows: np.ndarray, first: int, before: np.ndarray | None, step: np.ndarray
) -> int | None:
    """The first row index k >= `first` whose step from the row before it (`before` for
    k == `first`, none when that is None) leaves [prev - step, prev + step] (what `np.clip`
    would change), or where either row has a non-finite value; None when there is none."""

    def over(prev: np.ndarray, nxt: np.ndarray) -> np.ndarray:
        bad = (nxt < prev - step) | (nxt > prev + step) | ~np.isfinite(nxt) | ~np.isfinite(prev)
        return np.flatnonzero(bad.any(axis=1))

    if before is not None and len(over(np.asarray(before)[None], rows[first : first + 1])):
        return first
    later = over(rows[first:-1], rows[first + 1 :])
    return first + 1 + int(later[0]) if len(later) else None
