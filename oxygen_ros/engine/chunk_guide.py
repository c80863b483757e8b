"""What real-time chunking continues: the previous chunk, aligned to a new observation.

`rtc.denoise_rtc` needs the previous chunk in the new chunk's model space, row for row, and
how many rows to freeze and to guide. This module keeps the last chunk the engine handed over
(absolute robot units, its observation stamp) and the measured hand-off latencies, and turns
them into that target for each new observation:
- alignment: row i of a chunk is the target at its observation stamp + i * row_dt_s, so the
  new chunk's row i is the previous chunk's row i + offset, offset = round(stamp gap / dt);
- frozen rows (d): the rows whose time passes before the new chunk is handed over, from the
  measured delay (the largest latency of the last `delay_window` frames), rounded up;
- guided rows (H - offset): where the previous chunk still has rows; later rows are free;
- model space: openpi's `DeltaActions` relative to the NEW observation's state (for delta
  checkpoints), then the action norm stats, zero-padded to the model's action dim (what
  training regresses; padded dims are zero there too).

Invariants:
- Without a usable previous chunk (none yet, a stamp before the previous one, no overlap)
  the guidance weight is 0, so the denoise equals the plain one; shapes never change.
- 0 <= frozen_rows <= guided_rows <= A.
- Pure numpy on the host; no JAX, no ROS.
"""

from __future__ import annotations

import collections
import dataclasses
import math

import numpy as np

from oxygen_ros.engine.checkpoint import Normalizer
from oxygen_ros.engine.config import RtcConfig

_ROUNDING_S = 1e-9  # a latency of exactly k rows freezes k rows, not k + 1


@dataclasses.dataclass(frozen=True)
class Guidance:
    """Inputs of one guided denoise."""

    previous: np.ndarray  # float32 [1, A, D]: normalised target, aligned to the new rows
    frozen_rows: int  # d: rows pinned to the target
    guided_rows: int  # rows < this are guided (decaying weights after d); later rows free
    max_guidance: float  # beta; 0 when there is nothing to continue
    offset_rows: int  # previous-chunk rows that had passed at the new observation


class ChunkGuide:
    """The previous chunk and the measured delays; `plan` before a denoise, `record` after."""

    def __init__(
        self,
        config: RtcConfig,
        normalizer: Normalizer,
        delta_mask: tuple[bool, ...],
        horizon: int,
        model_action_dim: int,
    ) -> None:
        self.config = config
        self._normalizer = normalizer
        self._delta_mask = delta_mask
        self._horizon = horizon
        self._model_dim = model_action_dim
        self._latencies: collections.deque[float] = collections.deque(maxlen=config.delay_window)
        self._previous: np.ndarray | None = None  # float32 [A, J] absolute robot units
        self._previous_stamp = 0.0

    def reset(self) -> None:
        """Forgets the previous chunk and the measured delays (after warm-up)."""
        self._latencies.clear()
        self.forget_chunk()

    def forget_chunk(self) -> None:
        """Forgets the previous chunk only (a new task: its plan is not continued; the delays
        are the machine's and stay)."""
        self._previous = None

    @property
    def delay_s(self) -> float:
        """The delay estimate: the largest recent hand-off latency (0 before any)."""
        return max(self._latencies, default=0.0)

    def plan(self, stamp: float, state: np.ndarray) -> Guidance:
        """The guidance for a chunk of the observation at `stamp` with raw `state`."""
        horizon, dt = self._horizon, self.config.row_dt_s
        offset = 0 if self._previous is None else round((stamp - self._previous_stamp) / dt)
        if self._previous is None or stamp < self._previous_stamp or offset >= horizon:
            return Guidance(
                np.zeros((1, horizon, self._model_dim), np.float32), 0, 0, 0.0, max(offset, 0)
            )
        guided = horizon - offset
        frozen = min(max(math.ceil(self.delay_s / dt - _ROUNDING_S), 0), guided)
        rows = self._previous[offset:]
        rows = np.concatenate([rows, np.repeat(rows[-1:], offset, axis=0)])  # free rows: unused
        relative = self._normalizer.relative_actions(rows, state, self._delta_mask)
        normalised = self._normalizer.normalize_actions(relative)
        target = np.zeros((1, horizon, self._model_dim), np.float32)
        target[0, :, : normalised.shape[-1]] = normalised
        return Guidance(target, frozen, guided, self.config.max_guidance, offset)

    def record(self, actions: np.ndarray, stamp: float, latency_s: float) -> None:
        """The chunk just handed over (absolute robot units [A, J]) and its measured latency."""
        self._previous = np.array(actions, np.float32)
        self._previous_stamp = stamp
        self._latencies.append(max(float(latency_s), 0.0))
