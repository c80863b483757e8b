"""Demonstration episodes on disk: the ALOHA HDF5 layout plus language fields (ROS-free).

One HDF5 file per episode, `episode_<index:06d>.hdf5` (`episode_path`). T steps, J joints
(14 for the bimanual ALOHA), cameras of H x W RGB, S physics-state values:

| dataset | dtype, shape | meaning |
| --- | --- | --- |
| `/observations/qpos` | float32 [T, J] | joint positions, `joint_names` order |
| `/observations/qvel` | float32 [T, J] | joint velocities |
| `/observations/images/<camera>` | uint8 [T, H, W, 3] | RGB per camera, one chunk per frame |
| `/observations/sim_state` | float64 [T, S] | full physics state (S may be 0) |
| `/action` | float32 [T, J] | position targets commanded at the step |
| `/timestamps` | float64 [T] | sim time of the step, seconds, strictly increasing |
| `/language/subtask` | UTF-8 string [T] | subtask label at the step |
| `/action_chunk` (optional) | float32 [T, A, J] | an expert's A targets from the step's state |

`/action_chunk` is written only by relabelling (DAgger, `training/dagger.py`): the policy that
ran the episode is not the one the chunk comes from, so the next steps' `/action` are not its
labels. Demonstrations have none (their chunk is the next A steps' `/action`).

Root attributes: `sim` (True), `format_version` (1), `instruction` (str), `task_template`
(str), `seed` (int), `success` (bool), `episode_index` (int), `joint_names` and `camera_names`
(str arrays), `fps` (float, steps per second) and `extra` (a JSON object as a string).
Images are compressed per frame with gzip level 4 (IMAGE_COMPRESSION); everything else with
`COMPRESSION`. Readers that know the original ALOHA layout read the first five datasets as is.

Invariants:
- A file exists under its final name only once complete: `EpisodeWriter` writes
  `<name>.partial` and renames it atomically on `close`; a crash or `abort` leaves no final file.
- A step is validated whole before anything of it is written, so a refused step (ValueError)
  leaves the episode as it was.
- `list_episodes` lists only final names, in episode index order.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from pathlib import Path

import h5py
import numpy as np

FORMAT_VERSION = 1
TEMP_SUFFIX = ".partial"
EPISODE_NAME = re.compile(r"episode_(\d{6,})\.hdf5")
IMAGE_COMPRESSION = {"compression": "gzip", "compression_opts": 4}  # per-frame image chunks
COMPRESSION = {"compression": "gzip", "compression_opts": 4}  # joint and time series
_STR = h5py.string_dtype("utf-8")


def episode_path(directory: str | os.PathLike, episode_index: int) -> Path:
    """The file name of episode `episode_index` in `directory`."""
    return Path(directory) / f"episode_{episode_index:06d}.hdf5"


def list_episodes(directory: str | os.PathLike) -> list[Path]:
    """Complete episode files in `directory`, in episode index order (unfinished ones skipped)."""
    found = [(EPISODE_NAME.fullmatch(p.name), p) for p in Path(directory).iterdir()]
    return [p for _, p in sorted((int(m[1]), p) for m, p in found if m and p.is_file())]


@dataclasses.dataclass(frozen=True)
class Episode:
    """One recorded episode, read whole into memory."""

    path: Path  # file it was read from
    qpos: np.ndarray  # float32 [T, J]
    qvel: np.ndarray  # float32 [T, J]
    images: dict[str, np.ndarray]  # camera -> uint8 [T, H, W, 3]
    sim_state: np.ndarray  # float64 [T, S]
    action: np.ndarray  # float32 [T, J]
    timestamps: np.ndarray  # float64 [T], sim seconds
    subtasks: tuple[str, ...]  # T labels
    instruction: str  # the episode's language instruction
    task_template: str  # template the instruction was made from ("" if none)
    seed: int  # seed of the episode's initial state
    success: bool  # whether the task succeeded
    episode_index: int  # index in the file name
    joint_names: tuple[str, ...]  # J names, column order of qpos/qvel/action
    camera_names: tuple[str, ...]  # keys of `images`, in recording order
    fps: float  # steps per second
    format_version: int  # FORMAT_VERSION of the writer
    extra: dict  # free-form metadata
    action_chunk: np.ndarray | None = None  # float32 [T, A, J], relabelled episodes only

    @property
    def num_steps(self) -> int:
        return len(self.timestamps)


class EpisodeWriter:
    """Writes one episode step by step; `close` publishes it under its final name.

    Also a context manager: leaving the block by an exception (or with no steps) aborts, leaving
    it normally without `close` closes with `success=False`.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        joint_names: list[str] | tuple[str, ...],
        camera_names: list[str] | tuple[str, ...],
        image_shape: tuple[int, ...],
        instruction: str,
        seed: int,
        episode_index: int,
        fps: float,
        task_template: str = "",
        sim_state_size: int = 0,
        chunk_horizon: int = 0,
    ) -> None:
        """`chunk_horizon` > 0: every step also takes an `action_chunk` of that many rows."""
        self.path = Path(path)
        self.temp_path = self.path.with_name(self.path.name + TEMP_SUFFIX)
        names, cams = tuple(joint_names), tuple(camera_names)
        if not names or len(set(names)) != len(names):
            raise ValueError(f"joint_names must be unique and non-empty, got {names}")
        if len(set(cams)) != len(cams) or any(not c or "/" in c for c in cams):
            raise ValueError(f"camera_names must be unique names without '/', got {cams}")
        if len(image_shape) not in (2, 3) or tuple(image_shape[2:]) not in ((), (3,)):
            raise ValueError(f"image_shape must be (H, W) or (H, W, 3), got {image_shape}")
        if min(image_shape[:2]) < 1 or not (fps > 0 and math.isfinite(fps)):
            raise ValueError(f"need positive image_shape and fps, got {image_shape}, {fps}")
        if sim_state_size < 0 or chunk_horizon < 0:
            raise ValueError(
                f"sim_state_size and chunk_horizon must be >= 0, got {sim_state_size}, "
                f"{chunk_horizon}"
            )
        if self.path.exists():
            raise FileExistsError(f"{self.path} already exists")
        self.joint_names, self.camera_names = names, cams
        self.image_shape = (int(image_shape[0]), int(image_shape[1]), 3)
        self.sim_state_size = int(sim_state_size)
        self.chunk_horizon = int(chunk_horizon)
        self.num_steps = 0
        self._last_time = -math.inf
        self.temp_path.parent.mkdir(parents=True, exist_ok=True)
        self._file: h5py.File | None = h5py.File(self.temp_path, "w")
        j, s = len(names), self.sim_state_size
        series = {
            "observations/qpos": ((j,), np.float32),
            "observations/qvel": ((j,), np.float32),
            "observations/sim_state": ((s,), np.float64),
            "action": ((j,), np.float32),
            "timestamps": ((), np.float64),
            "language/subtask": ((), _STR),
        }
        if s == 0:  # no chunked layout for zero-width rows: written (T, 0) on close
            del series["observations/sim_state"]
        if self.chunk_horizon:
            series["action_chunk"] = ((self.chunk_horizon, j), np.float32)
        self._series = {name: self._create(name, *spec) for name, spec in series.items()}
        self._images = {
            cam: self._create(f"observations/images/{cam}", self.image_shape, np.uint8, True)
            for cam in cams
        }
        attrs = self._file.attrs
        attrs["sim"] = True
        attrs["format_version"] = FORMAT_VERSION
        attrs["instruction"] = str(instruction)
        attrs["task_template"] = str(task_template)
        attrs["seed"] = int(seed)
        attrs["episode_index"] = int(episode_index)
        attrs["fps"] = float(fps)
        attrs.create("joint_names", np.array(names, dtype=_STR))
        attrs.create("camera_names", np.array(cams, dtype=_STR))
        attrs["success"] = False
        attrs["extra"] = "{}"

    def _create(self, name: str, row: tuple, dtype, image: bool = False) -> h5py.Dataset:
        return self._file.create_dataset(
            name,
            shape=(0, *row),
            maxshape=(None, *row),
            dtype=dtype,
            chunks=(1 if image else 256, *row),
            **(IMAGE_COMPRESSION if image else COMPRESSION),
        )

    def add_step(
        self,
        timestamp: float,
        qpos: np.ndarray,
        qvel: np.ndarray,
        images: dict[str, np.ndarray],
        action: np.ndarray,
        subtask: str,
        sim_state: np.ndarray | None = None,
        action_chunk: np.ndarray | None = None,
    ) -> None:
        """Appends one step; validates it whole first (`action_chunk` [A, J]: given exactly
        when the writer has a `chunk_horizon`).

        Raises:
            ValueError: A wrong shape, dtype or key, a non-finite value, a timestamp not after
                the previous one, or a writer already closed.
        """
        if self._file is None:
            raise ValueError("the episode writer is closed")
        if not (math.isfinite(timestamp) and timestamp > self._last_time):
            raise ValueError(f"timestamp {timestamp} must be finite and after {self._last_time}")
        j = len(self.joint_names)
        values = {
            "observations/qpos": _vector("qpos", qpos, j),
            "observations/qvel": _vector("qvel", qvel, j),
            "action": _vector("action", action, j),
            "observations/sim_state": _vector(
                "sim_state", np.zeros(0) if sim_state is None else sim_state, self.sim_state_size
            ),
            "timestamps": float(timestamp),
            "language/subtask": subtask,
        }
        if (action_chunk is None) != (self.chunk_horizon == 0):
            raise ValueError("action_chunk is needed exactly when chunk_horizon > 0")
        if action_chunk is not None:
            chunk = np.asarray(action_chunk)
            if chunk.shape != (self.chunk_horizon, j) or not np.all(np.isfinite(chunk)):
                raise ValueError(
                    f"action_chunk: {chunk.shape}, expected finite [{self.chunk_horizon}, {j}]"
                )
            values["action_chunk"] = chunk
        if not isinstance(subtask, str):
            raise ValueError(f"subtask must be a str, got {type(subtask).__name__}")
        if set(images) != set(self.camera_names):
            raise ValueError(f"images for {sorted(images)}, expected {sorted(self.camera_names)}")
        for cam, image in images.items():
            image = np.asarray(image)
            if image.dtype != np.uint8 or image.shape != self.image_shape:
                raise ValueError(
                    f"image {cam!r}: {image.dtype} {image.shape}, expected uint8 "
                    f"{self.image_shape}"
                )
        t = self.num_steps
        for name, dataset in self._series.items():
            dataset.resize(t + 1, axis=0)
            dataset[t] = values[name]
        for cam, image in images.items():
            self._images[cam].resize(t + 1, axis=0)
            self._images[cam][t] = image
        self.num_steps, self._last_time = t + 1, float(timestamp)

    def close(self, success: bool, extra: dict | None = None) -> Path:
        """Finishes the episode and renames it to its final name, which it returns.

        Raises:
            ValueError: No step was recorded, `extra` is not JSON-serialisable, or the writer
                is already closed. The writer stays open (call `abort` to discard it).
        """
        if self._file is None:
            raise ValueError("the episode writer is closed")
        if self.num_steps == 0:
            raise ValueError("an episode needs at least one step")
        try:
            extra_json = json.dumps(extra or {}, sort_keys=True)
        except TypeError as err:
            raise ValueError(f"extra is not JSON-serialisable: {err}") from err
        if self.sim_state_size == 0:
            self._file.create_dataset("observations/sim_state", (self.num_steps, 0), np.float64)
        self._file.attrs["success"] = bool(success)
        self._file.attrs["extra"] = extra_json
        self._file.close()
        self._file = None
        fd = os.open(self.temp_path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(self.temp_path, self.path)
        return self.path

    def abort(self) -> None:
        """Discards the episode: nothing is left on disk. Idempotent."""
        if self._file is not None:
            self._file.close()
            self._file = None
        self.temp_path.unlink(missing_ok=True)

    def __enter__(self) -> EpisodeWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._file is None:
            return
        if exc_type is not None or self.num_steps == 0:
            self.abort()
        else:
            self.close(success=False)


def _vector(name: str, value: np.ndarray, size: int) -> np.ndarray:
    array = np.asarray(value)
    if array.shape != (size,) or not (np.issubdtype(array.dtype, np.number) or size == 0):
        raise ValueError(f"{name}: {array.dtype} {array.shape}, expected numbers [{size}]")
    if np.iscomplexobj(array) or not np.all(np.isfinite(array)):
        raise ValueError(f"{name} must be real and finite, got {array}")
    return array


def read_episode(path: str | os.PathLike) -> Episode:
    """Reads a whole episode file.

    Raises:
        ValueError: The file is not a format-version-1 simulated episode.
    """
    path = Path(path)
    with h5py.File(path, "r") as f:
        attrs = f.attrs
        if attrs.get("format_version") != FORMAT_VERSION or not attrs.get("sim"):
            raise ValueError(f"{path} is not a format {FORMAT_VERSION} simulated episode")
        cams = tuple(str(c) for c in attrs["camera_names"])
        return Episode(
            path=path,
            qpos=f["observations/qpos"][()],
            qvel=f["observations/qvel"][()],
            images={cam: f[f"observations/images/{cam}"][()] for cam in cams},
            sim_state=f["observations/sim_state"][()],
            action=f["action"][()],
            timestamps=f["timestamps"][()],
            subtasks=tuple(f["language/subtask"].asstr()[()]),
            instruction=str(attrs["instruction"]),
            task_template=str(attrs["task_template"]),
            seed=int(attrs["seed"]),
            success=bool(attrs["success"]),
            episode_index=int(attrs["episode_index"]),
            joint_names=tuple(str(n) for n in attrs["joint_names"]),
            camera_names=cams,
            fps=float(attrs["fps"]),
            format_version=int(attrs["format_version"]),
            extra=json.loads(attrs["extra"]),
            action_chunk=f["action_chunk"][()] if "action_chunk" in f else None,
        )
