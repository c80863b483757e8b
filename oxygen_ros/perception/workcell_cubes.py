"""The workcell's cube detector: the top camera's calibration read from the workcell's MJCF.

The cubes' positions on the table, as this perception module sees them in the top camera,
extend the robot state that the workcell policy is trained and served with (state = the 14
joints, then x, y of each cube in `CUBE_NAMES` order). A cube that is not seen keeps the
position it was last seen at (`CubeTracker`); one not seen since the episode began is at the
table's centre.

Invariants:
- The same function gives training (recorded images) and serving (live images) the same
  detector for an image size, so the state the model sees is computed the same way.
- Nothing here imports rclpy; the MuJoCo model is built without a renderer.
"""

from __future__ import annotations

import functools

import numpy as np

from oxygen_ros.perception.cube_detector import CubeDetector, CubeTracker, PinholeCamera
from oxygen_ros.sim import tasks
from oxygen_ros.sim.scene import COLOURS, DEFAULT_OBJECTS

CAMERA = "top"
CUBE_NAMES: tuple[str, ...] = tuple(f"{colour}_cube" for colour in COLOURS)
STATE_NAMES: tuple[str, ...] = tuple(f"{name}.{axis}" for name in CUBE_NAMES for axis in "xy")
TABLE_CENTRE_XY = tuple(float(np.mean(r)) for r in tasks.TABLE_REGION)


@functools.cache
def detector(width: int, height: int) -> CubeDetector:
    """The detector for top-camera images of width x height pixels."""
    from oxygen_ros.sim.workcell import Workcell, WorkcellConfig

    cell = Workcell(WorkcellConfig(render=False))
    try:
        camera = PinholeCamera.from_mujoco(cell.model, cell.data, CAMERA, width, height)
    finally:
        cell.close()
    half = {o.name: o.half_size for o in DEFAULT_OBJECTS}
    if len(set(half.values())) != 1:
        raise ValueError(f"cubes of different sizes need one plane each: {half}")
    colours = {f"{colour}_cube": rgba for colour, rgba in COLOURS.items()}
    return CubeDetector(camera, colours, plane_z=next(iter(half.values())))


def tracker() -> CubeTracker:
    return CubeTracker(CUBE_NAMES, TABLE_CENTRE_XY)


def episode_cube_states(top_images: np.ndarray) -> np.ndarray:
    """[T, 2 * len(CUBE_NAMES)] float32: the tracked cube positions of one episode's top-camera
    frames [T, H, W, 3], in order, from a fresh tracker."""
    cubes = CubeState()
    return np.stack([cubes.update(image) for image in top_images]).astype(np.float32)


class CubeState:
    """The cube part of the state, frame by frame: each call takes the newest top-camera image
    (None when the frame has none) and returns the tracked positions in `STATE_NAMES` order."""

    names = STATE_NAMES

    def __init__(self) -> None:
        self._tracker = tracker()

    def update(self, image: np.ndarray | None) -> np.ndarray:
        if image is None:
            return self._tracker.update({})
        height, width = image.shape[:2]
        return self._tracker.update(detector(width, height).detect(image))

    @property
    def seen(self) -> dict[str, bool]:
        """Per cube: whether it has been seen at least once."""
        return dict(self._tracker.seen)
