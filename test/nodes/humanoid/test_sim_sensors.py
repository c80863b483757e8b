"""Synthetic sensor content: moving images in the configured encoding, smooth joint motion."""

import numpy as np
import pytest

from oxygen_ros.nodes.common.image_conversion import ENCODING_CHANNELS, decode_image
from oxygen_ros.nodes.humanoid.sim_sensors_node import (
    FRAMES_PER_CYCLE,
    joint_values,
    render_frames,
)


@pytest.mark.parametrize("encoding", list(ENCODING_CHANNELS))
def test_frames_decode_and_move(encoding: str) -> None:
    step, frames = render_frames(64, 48, encoding, seed=1)
    assert len(frames) == FRAMES_PER_CYCLE and step == 64 * ENCODING_CHANNELS[encoding]
    first = decode_image(48, 64, encoding, step, frames[0])
    later = decode_image(48, 64, encoding, step, frames[FRAMES_PER_CYCLE // 4])
    assert first.shape == (48, 64, 3) and not np.array_equal(first, later)


def test_joint_velocities_are_the_derivative_of_positions() -> None:
    period, t, h = 4.0, 1.3, 1e-6
    pos, vel = joint_values(t, 5, period)
    ahead, _ = joint_values(t + h, 5, period)
    np.testing.assert_allclose((ahead - pos) / h, vel, rtol=1e-4, atol=1e-6)
    assert np.all(np.abs(pos) <= 0.5)
