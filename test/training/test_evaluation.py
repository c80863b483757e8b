"""Held-out evaluation during training (training/evaluation.py)."""

from __future__ import annotations

import numpy as np

from oxygen_ros.sim import robot
from oxygen_ros.training.evaluation import moved_arm


def test_moved_arm_is_the_arm_whose_joints_move_further() -> None:
    state = np.asarray(robot.HOME, np.float32)
    for arm in robot.ARMS:
        chunk = np.tile(state, (10, 1))
        chunk[:, robot.arm_slice(arm)] += np.linspace(0.0, 0.3, 10)[:, None]
        other = robot.ARMS[1 - robot.ARMS.index(arm)]
        chunk[:, robot.arm_slice(other)] += 0.01
        assert moved_arm(chunk, state) == arm
