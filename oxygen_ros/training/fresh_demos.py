"""Demonstrations generated straight into training arrays, in worker processes (ROS-free).

For a machine with many cores (a GPU machine, where the episodes' 224 x 224 HDF5 files would
not fit its disk): each worker process runs `sim.generate_demos` on its own contiguous range
of seeds, exactly as `generate_demos.generate` splits them (a fresh workcell per worker, so a
seed gives the arrays that `scripts/generate_demos --workers N` writes with the same N), reads
each episode back with `data.load_episodes` (the training-time conversion: model resolution,
the cube detector's state) and deletes its file at once. Only successful episodes come back.

Invariant: the arrays are those `load_episodes` gives for the files `generate_demos` writes
with the same seeds, noise and worker split; nothing here imports rclpy.
"""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

from oxygen_ros.engine.config import ModelConfig
from oxygen_ros.sim import generate_demos
from oxygen_ros.training import data as _data


@dataclasses.dataclass(frozen=True)
class DemoSet:
    """One block of seeds: seed_start .. seed_start + episodes - 1, with command noise, from
    one of `generate_demos.EXPERTS`."""

    seed_start: int
    episodes: int
    command_noise_rad: float = 0.0
    expert: str = "plan"

    @classmethod
    def parse(cls, text: str) -> DemoSet:
        """ "START:COUNT", "START:COUNT:NOISE_RAD" or "START:COUNT:NOISE_RAD:EXPERT"."""
        parts = text.split(":")
        if len(parts) not in (2, 3, 4):
            raise ValueError(f"demo set {text!r}: expected START:COUNT[:NOISE_RAD[:EXPERT]]")
        noise = float(parts[2]) if len(parts) >= 3 else 0.0
        expert = parts[3] if len(parts) == 4 else "plan"
        if expert not in generate_demos.EXPERTS:
            raise ValueError(f"demo set {text!r}: expert must be one of {generate_demos.EXPERTS}")
        return cls(int(parts[0]), int(parts[1]), noise, expert)


SCRATCH_MIN_FREE_BYTES = 1 << 30  # an episode file is a few MB; one per worker at a time


def _scratch_dir() -> str | None:
    """Memory-backed scratch space where there is enough of it (a container's /dev/shm can be
    64 MB), else None: the system's temporary directory. A file lives for one episode."""
    shm = "/dev/shm"
    usable = os.path.isdir(shm) and os.access(shm, os.W_OK)
    return shm if usable and shutil.disk_usage(shm).free >= SCRATCH_MIN_FREE_BYTES else None


def _worker(
    demo_set: DemoSet, first: int, count: int, config: ModelConfig, object_state: str
) -> tuple[_data.Episodes | None, list[int]]:
    """Episodes first .. first + count - 1 of `demo_set` in one fresh workcell
    (`generate_demos.generate_range`), each file read back and deleted before the next runs;
    returns the successful episodes' training arrays and the seeds that failed."""
    parts, failed = [], []
    with tempfile.TemporaryDirectory(dir=_scratch_dir()) as scratch:
        for seed, path, ok in generate_demos.generate_range(
            Path(scratch),
            demo_set.seed_start,
            first,
            count,
            demo_set.command_noise_rad,
            demo_set.expert,
        ):
            if ok:
                parts.append(_data.load_episodes([path], config, object_state=object_state))
            else:
                failed.append(seed)
            path.unlink()
    return (_data.merge_episodes(parts) if parts else None), failed


def generate_episodes(
    demo_sets: Sequence[DemoSet],
    config: ModelConfig,
    workers: int,
    object_state: str = "",
) -> tuple[_data.Episodes, list[int]]:
    """Training arrays of every successful episode of `demo_sets` (in seed order within a set,
    sets in the given order) and the seeds that failed."""
    if workers < 1:
        raise ValueError(f"need workers >= 1, got {workers}")
    jobs = [
        (demo_set, first, count, config, object_state)
        for demo_set in demo_sets
        for first, count in generate_demos.split_range(demo_set.episodes, workers)
    ]
    if workers == 1:
        results = [_worker(*job) for job in jobs]
    else:
        # spawn: each worker starts its own MuJoCo / EGL context, nothing inherited.
        context = multiprocessing.get_context("spawn")
        level = logging.getLogger().getEffectiveLevel()
        with context.Pool(workers, generate_demos.log_to_stderr, (level,)) as pool:
            pending = [pool.apply_async(_worker, job) for job in jobs]
            results = [p.get() for p in pending]
    parts = [episodes for episodes, _ in results if episodes is not None]
    failed = [seed for _, seeds in results for seed in seeds]
    if not parts:
        raise ValueError("no successful episode")
    return _data.merge_episodes(parts), failed
