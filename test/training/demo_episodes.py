"""Small recorded workcell episodes (real task specs, synthetic sensor values) for training."""

from __future__ import annotations

import pathlib

import numpy as np

from oxygen_ros.sim import robot, tasks
from oxygen_ros.sim.recorder import EpisodeWriter, episode_path

CAMERAS = ("left_wrist", "right_wrist", "top")
IMAGE_SHAPE = (48, 64)  # not the model's 96 x 96: samples must be resized with pad
STEPS = 12
SEEDS = (1000, 1001, 1002)


def write_episode(
    directory: pathlib.Path, index: int, seed: int, steps: int = STEPS, success: bool = True
) -> None:
    """One episode (successful unless `success=False`): phases in order, distinct images and
    states per step."""
    spec = tasks.sample_episode(seed)
    labels = tasks.subtask_labels(spec)
    rng = np.random.default_rng(seed)
    writer = EpisodeWriter(
        episode_path(directory, index),
        joint_names=robot.JOINT_NAMES,
        camera_names=CAMERAS,
        image_shape=IMAGE_SHAPE,
        instruction=spec.instruction,
        seed=seed,
        episode_index=index,
        fps=10.0,
        task_template=spec.template,
    )
    home = np.asarray(robot.HOME, np.float64)
    with writer:
        for t in range(steps):
            qpos = home + rng.normal(scale=0.2, size=home.shape)
            writer.add_step(
                timestamp=0.1 * t,
                qpos=qpos,
                qvel=np.zeros(14, np.float32),
                images={
                    c: rng.integers(0, 256, (*IMAGE_SHAPE, 3), dtype=np.uint8) for c in CAMERAS
                },
                action=qpos + 0.05,
                subtask=labels[min(t * len(labels) // steps, len(labels) - 1)],
            )
        writer.close(success=success)
