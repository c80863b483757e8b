"""Fusion of camera images and joint states into one observation per tick (ROS-free).

The perception node feeds every accepted sample in (`add_image`, `add_joint_state`) and asks
for a frame (`fuse`): on a timer at `observation_rate_hz`, or, with `frame_trigger:
joint_state`, when a new joint snapshot completes, thinned to at most `observation_rate_hz` by
`SnapshotTrigger`. Images are opaque payloads here (the node converts only the ones a frame
uses), so this module is pure bookkeeping over stamps.

Invariants:
- The frame stamp is the stamp of a joint-state snapshot; a snapshot exists only once every
  configured joint has a value, and its positions are in the configured joint order (joints
  from several JointState messages are merged; names not configured are ignored and reported).
  A snapshot is taken only while every joint's value is at most `stale_after_s` older than the
  message completing it: when one source of a merged state stops (an arm's joint states), the
  others do not keep producing frames that carry its frozen values.
- Every image a frame uses lies, together with the joint stamp, inside one window of width
  `max_skew_s` (so images are within `max_skew_s` of each other and of the joint state).
  Among the windows that qualify, the frame uses as many cameras as possible, then the newest
  joint snapshot, then the newest images. Only snapshots within `max_skew_s` of the newest one
  are candidates, so a frame never trades freshness of the state for one more camera.
- A camera older than `stale_after_s` (relative to `now`) or absent is marked invalid in its
  slot; it never blocks the frame. No frame is produced when the joint state is stale or
  absent, or when cameras are configured but none is valid.
- Rejected input (non-finite values, mismatched lengths, stamps out of order or further than
  `future_tolerance_s` in the future) raises `RejectedInputError` and leaves the state unchanged.
- `SnapshotTrigger` passes each joint snapshot stamp at most once, only stamps newer than the
  last one it passed, and at most `rate_hz` of them per second over any span (a token bucket
  of `RATE_BURST_FRAMES` tokens refilled at `rate_hz`: at most rate_hz * span + 2), so a
  source at the same nominal rate passes every snapshot despite each arrival being up to half
  a period off its grid.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np

FRAME_TRIGGERS = ("timer", "joint_state")  # perception's `frame_trigger` values
RATE_BURST_FRAMES = 2.0  # SnapshotTrigger's bucket: tolerates +-half a period of jitter


class RejectedInputError(ValueError):
    """A sample that must not reach the model; `reason` is a short counter name."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclasses.dataclass(frozen=True)
class CameraSpec:
    """One configured camera."""

    name: str  # camera name (the YAML key under `cameras`)
    slot: str  # model image slot it fills, e.g. base_0_rgb
    topic: str  # image topic (image_transport's base topic: raw or <topic>/compressed)
    encoding: str = ""  # expected encoding; "" accepts every supported encoding


@dataclasses.dataclass(frozen=True)
class FusionConfig:
    """Everything that shapes a frame."""

    slots: tuple[str, ...]  # model image slots, in model order
    cameras: tuple[CameraSpec, ...]  # at most one camera per slot
    joint_names: tuple[str, ...]  # model joint order
    max_skew_s: float = 0.05  # width of the window all used stamps must fit in
    stale_after_s: float = 0.5  # a sample older than this (vs now) is not used
    future_tolerance_s: float = 0.5  # stamps further ahead of now are rejected

    def __post_init__(self) -> None:
        slots = [c.slot for c in self.cameras]
        unknown = sorted(set(slots) - set(self.slots))
        if unknown:
            raise ValueError(f"cameras use unknown slots {unknown}; slots are {list(self.slots)}")
        if len(set(slots)) != len(slots):
            raise ValueError(f"two cameras share a slot: {slots}")
        if len({c.name for c in self.cameras}) != len(self.cameras):
            raise ValueError("camera names must be unique")
        if len(set(self.joint_names)) != len(self.joint_names) or not self.joint_names:
            raise ValueError(f"joint_names must be unique and non-empty: {list(self.joint_names)}")
        if not (self.max_skew_s >= 0 and self.stale_after_s > 0 and self.future_tolerance_s >= 0):
            raise ValueError("max_skew_s >= 0, stale_after_s > 0, future_tolerance_s >= 0")

    @property
    def history_s(self) -> float:
        """How long samples are kept: long enough for every candidate window."""
        return self.stale_after_s + 2 * self.max_skew_s


@dataclasses.dataclass(frozen=True)
class JointSnapshot:
    """All configured joints at one stamp."""

    stamp: float  # seconds
    positions: np.ndarray  # float64 [n], configured order
    velocities: np.ndarray  # float64 [n], or [0] when any joint lacks a velocity


@dataclasses.dataclass(frozen=True)
class FusedFrame:
    """One observation: slot i holds `payloads[i]` when `valid[i]`."""

    stamp: float  # the joint snapshot's stamp
    slots: tuple[str, ...]  # model slot order
    payloads: tuple[Any, ...]  # per slot: the image payload, or None when invalid
    valid: tuple[bool, ...]
    image_stamps: tuple[float, ...]  # per slot: the used (or newest known) image stamp, 0 if none
    joint_names: tuple[str, ...]
    positions: np.ndarray  # float64 [n]
    velocities: np.ndarray  # float64 [n] or [0]
    max_skew: float  # largest |image stamp - joint stamp| over used images


class Fuser:
    """Keeps recent samples per camera and joint snapshots; builds frames on demand."""

    def __init__(self, config: FusionConfig) -> None:
        self.config = config
        self._joint_index = {name: i for i, name in enumerate(config.joint_names)}
        self._camera_by_name = {c.name: c for c in config.cameras}
        # Per camera: ascending stamps and their payloads.
        self._image_stamps: dict[str, deque[float]] = {c.name: deque() for c in config.cameras}
        self._image_payloads: dict[str, deque[Any]] = {c.name: deque() for c in config.cameras}
        n = len(config.joint_names)
        self._positions = np.full(n, np.nan)
        self._velocities = np.full(n, np.nan)
        self._joint_stamps = np.full(n, -np.inf)  # stamp of each joint's latest value
        self._snapshots: deque[JointSnapshot] = deque()

    # ---------------------------------------------------------------- input
    def add_image(self, camera: str, stamp: float, payload: Any, now: float) -> None:
        """Stores an image payload of `camera` taken at `stamp`.

        Raises:
            RejectedInputError: Unknown camera, non-finite stamp, stamp in the future beyond the
                tolerance, or not newer than the camera's previous image.
        """
        if camera not in self._camera_by_name:
            raise RejectedInputError("unknown_camera", f"camera {camera!r} is not configured")
        self._check_stamp(stamp, now)
        stamps = self._image_stamps[camera]
        if stamps and stamp <= stamps[-1]:
            raise RejectedInputError(
                "out_of_order", f"camera {camera}: stamp {stamp:.6f} not after {stamps[-1]:.6f}"
            )
        stamps.append(stamp)
        self._image_payloads[camera].append(payload)
        self._prune(now)

    def add_joint_state(
        self,
        stamp: float,
        names: Sequence[str],
        positions: Sequence[float],
        velocities: Sequence[float],
        now: float,
    ) -> list[str]:
        """Merges one JointState message; returns the names it carried that are not configured.

        Args:
            stamp: Message stamp, seconds.
            names: Joint names of the message.
            positions: One per name.
            velocities: One per name, or empty.
            now: Current time, seconds.

        Raises:
            RejectedInputError: Mismatched lengths, duplicate names, non-finite values, no
                configured joint at all, or a bad stamp (see `add_image`).
        """
        self._check_stamp(stamp, now)
        if len(positions) != len(names):
            raise RejectedInputError(
                "length_mismatch", f"{len(names)} names but {len(positions)} positions"
            )
        if len(velocities) not in (0, len(names)):
            raise RejectedInputError(
                "length_mismatch", f"{len(names)} names but {len(velocities)} velocities"
            )
        if len(set(names)) != len(names):
            raise RejectedInputError("duplicate_names", "a joint name appears twice")
        pos = np.asarray(positions, dtype=np.float64)
        vel = np.asarray(velocities, dtype=np.float64)
        if not (np.all(np.isfinite(pos)) and np.all(np.isfinite(vel))):
            raise RejectedInputError("non_finite", "joint state contains NaN or inf")
        if self._snapshots and stamp < self._snapshots[-1].stamp:
            raise RejectedInputError(
                "out_of_order",
                f"joint state stamp {stamp:.6f} before {self._snapshots[-1].stamp:.6f}",
            )
        known = [(self._joint_index[n], i) for i, n in enumerate(names) if n in self._joint_index]
        unknown = [n for n in names if n not in self._joint_index]
        if not known:
            raise RejectedInputError(
                "unknown_names", f"no configured joint among {list(names)[:8]}"
            )
        dst, src = (np.array(x, dtype=np.int64) for x in zip(*known, strict=True))
        self._positions[dst] = pos[src]
        self._velocities[dst] = vel[src] if vel.size else np.nan
        self._joint_stamps[dst] = stamp
        complete = not np.any(np.isnan(self._positions))
        if complete and stamp - float(self._joint_stamps.min()) <= self.config.stale_after_s:
            velocities_out = (
                self._velocities.copy() if not np.any(np.isnan(self._velocities)) else np.zeros(0)
            )
            if self._snapshots and self._snapshots[-1].stamp == stamp:
                self._snapshots.pop()  # a second message with the same stamp completes it
            self._snapshots.append(JointSnapshot(stamp, self._positions.copy(), velocities_out))
        self._prune(now)
        return unknown

    @property
    def newest_snapshot_stamp(self) -> float | None:
        """Stamp of the newest complete joint snapshot (None before the first one)."""
        return self._snapshots[-1].stamp if self._snapshots else None

    def missing_joints(self) -> list[str]:
        """Configured joints that have never been received."""
        return [
            n
            for n, v in zip(self.config.joint_names, self._positions, strict=True)
            if math.isnan(v)
        ]

    def stale_joints(self, stamp: float) -> list[str]:
        """Configured joints whose latest value is older than `stale_after_s` at `stamp`
        (never-received joints included)."""
        limit = stamp - self.config.stale_after_s
        return [
            n
            for n, t in zip(self.config.joint_names, self._joint_stamps, strict=True)
            if t < limit
        ]

    # ---------------------------------------------------------------- fusion
    def fuse(self, now: float) -> tuple[FusedFrame | None, str]:
        """Builds the frame for `now`.

        Returns:
            (frame, "") or (None, reason) with reason one of "no_joint_state",
            "joint_state_stale", "no_valid_camera".
        """
        cfg = self.config
        self._prune(now)
        if not self._snapshots:
            return None, "no_joint_state"
        newest = self._snapshots[-1].stamp
        if now - newest > cfg.stale_after_s:
            return None, "joint_state_stale"
        best: tuple[tuple, JointSnapshot, dict[str, int]] | None = None
        for snap in reversed(self._snapshots):
            if snap.stamp < newest - cfg.max_skew_s:
                break
            if now - snap.stamp > cfg.stale_after_s:
                continue
            for lower in self._window_starts(snap.stamp):
                chosen = self._choose_images(lower, lower + cfg.max_skew_s, now)
                score = (
                    len(chosen),
                    snap.stamp,
                    sum(self._image_stamps[c][i] for c, i in chosen.items()),
                )
                if best is None or score > best[0]:
                    best = (score, snap, chosen)
        assert best is not None
        _, snap, chosen = best
        if cfg.cameras and not chosen:
            return None, "no_valid_camera"
        by_slot = {c.slot: c.name for c in cfg.cameras}
        payloads, valid, stamps = [], [], []
        for slot in cfg.slots:
            camera = by_slot.get(slot)
            if camera is not None and camera in chosen:
                index = chosen[camera]
                payloads.append(self._image_payloads[camera][index])
                valid.append(True)
                stamps.append(self._image_stamps[camera][index])
            else:
                payloads.append(None)
                valid.append(False)
                known = self._image_stamps[camera] if camera is not None else ()
                stamps.append(known[-1] if known else 0.0)
        skew = max(
            (abs(s - snap.stamp) for s, v in zip(stamps, valid, strict=True) if v), default=0.0
        )
        frame = FusedFrame(
            stamp=snap.stamp,
            slots=cfg.slots,
            payloads=tuple(payloads),
            valid=tuple(valid),
            image_stamps=tuple(stamps),
            joint_names=cfg.joint_names,
            positions=snap.positions,
            velocities=snap.velocities,
            max_skew=skew,
        )
        return frame, ""

    def _window_starts(self, joint_stamp: float) -> list[float]:
        """Lower bounds of the candidate windows [lower, lower + max_skew_s] holding the joint
        stamp: the earliest one, and one starting at each image stamp in between."""
        skew = self.config.max_skew_s
        starts = {joint_stamp - skew, joint_stamp}
        for stamps in self._image_stamps.values():
            lo = bisect.bisect_left(stamps, joint_stamp - skew)
            hi = bisect.bisect_right(stamps, joint_stamp)
            starts.update(stamps[i] for i in range(lo, hi))
        return sorted(starts)

    def _choose_images(self, lower: float, upper: float, now: float) -> dict[str, int]:
        """Per camera, the index of its newest fresh image inside [lower, upper]."""
        chosen = {}
        for camera, stamps in self._image_stamps.items():
            i = bisect.bisect_right(stamps, upper) - 1
            if i >= 0 and stamps[i] >= lower and now - stamps[i] <= self.config.stale_after_s:
                chosen[camera] = i
        return chosen

    # ---------------------------------------------------------------- helpers
    def _check_stamp(self, stamp: float, now: float) -> None:
        if not math.isfinite(stamp):
            raise RejectedInputError("bad_stamp", f"stamp {stamp} is not finite")
        if stamp > now + self.config.future_tolerance_s:
            raise RejectedInputError(
                "future_stamp", f"stamp {stamp:.3f} is {stamp - now:.3f} s in the future"
            )

    def _prune(self, now: float) -> None:
        horizon = now - self.config.history_s
        for camera, stamps in self._image_stamps.items():
            payloads = self._image_payloads[camera]
            while len(stamps) > 1 and stamps[0] < horizon:
                stamps.popleft()
                payloads.popleft()
        while len(self._snapshots) > 1 and self._snapshots[0].stamp < horizon:
            self._snapshots.popleft()


class SnapshotTrigger:
    """`frame_trigger: joint_state`: which new joint snapshots get a frame (see the module
    docstring). `offer` at most once per snapshot; times are seconds of one clock."""

    def __init__(self, rate_hz: float) -> None:
        self.rate_hz = rate_hz  # may change between offers (a runtime parameter)
        self._tokens = RATE_BURST_FRAMES
        self._last_time: float | None = None  # time of the last offer
        self._last_stamp = -math.inf  # newest stamp passed

    def offer(self, stamp: float, now: float) -> str:
        """Whether the snapshot stamped `stamp`, completed at `now`, gets a frame.

        Returns:
            "" (build it: the snapshot is passed) or why not: "not_newer" (a frame with this
            or a newer stamp was passed), "rate_limited" (more than `rate_hz`).
        """
        if self._last_time is not None:
            elapsed = max(now - self._last_time, 0.0)
            self._tokens = min(self._tokens + elapsed * self.rate_hz, RATE_BURST_FRAMES)
        self._last_time = now
        if stamp <= self._last_stamp:
            return "not_newer"
        if self._tokens < 1.0:
            return "rate_limited"
        self._tokens -= 1.0
        self._last_stamp = stamp
        return ""
