"""Each cube's pose from the top camera and the arms' measured joints (ROS-free).

The colour detector (`cube_detector`) places a blob's centroid on the table. A gripper over a
cube hides part of it, and the centroid and yaw of what stays visible are off by up to 2 cm
and 45 degrees before the blob vanishes (docs/TRAINING.md run 16). `CubePoses` keeps, per cube:
- from the camera, whole views only: a blob with at least `whole_fraction` of the pixels that a
  cube at the detected position and yaw would cover (the convex hull of its eight projected
  corners; whole views measure 0.87-1.03 of it). A partial view keeps the last estimate.
- while a gripper holds the cube, the hand's account of it. An arm takes hold of a cube when
  its measured gripper has stopped between `held_min` and `held_max` (the fingers close on a
  4 cm cube near 0.6 and on nothing below 0.45) with its pinch point (forward kinematics of
  the measured joints) within `near_m` of the cube's estimate, and holds it while the gripper
  stays in that range. Held, the cube's centre is the pinch point and its yaw the yaw at the
  grasp turned by as much as the fingers' axis has turned since; the camera is not read.
  Let go, the cube is on the table below where the hand left it, until the next whole view.
- its start: the first estimate of the episode (`reset`).

Invariants:
- `update` never raises on a well-formed image and joints; a cube never seen is at
  `default_xy` with yaw 0 until a view of it.
- The height is the table plane's (`detector.plane_z`) except while a hand holds the cube.
- Nothing here imports rclpy or MuJoCo: the arms come in as functions of the joints.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

import numpy as np

from oxygen_ros.perception.cube_detector import CubeDetector

# arm -> (joints [N] -> (gripper value, pinch point [3], fingers' axis yaw in radians))
Hand = Callable[[np.ndarray], tuple[float, np.ndarray, float]]


@dataclasses.dataclass(frozen=True)
class GraspConfig:
    held_min: float = 0.45  # measured gripper above this (and below held_max): on something
    held_max: float = 0.66  # ... at or above this: open or still closing
    near_m: float = 0.025  # the cube's estimate this close to the pinch point: between fingers


@dataclasses.dataclass
class CubePose:
    xy: np.ndarray  # [2] world metres
    z: float  # the centre's height
    yaw: float  # radians; the cube looks the same every 90 degrees
    start: np.ndarray  # [2] the first estimate's xy
    held_by: str | None = None  # the arm holding it


def silhouette_pixels(detector: CubeDetector, xy: np.ndarray, yaw: float) -> float:
    """The pixel area of a cube of half size `detector.plane_z` resting on the table at `xy`
    with `yaw`: the convex hull of its eight projected corners."""
    from scipy.spatial import ConvexHull

    half = detector.plane_z
    c, s = np.cos(yaw), np.sin(yaw)
    corners = [
        detector.camera.project(np.array([xy[0] + c * dx - s * dy, xy[1] + s * dx + c * dy, z]))
        for dx in (-half, half)
        for dy in (-half, half)
        for z in (0.0, 2 * half)
    ]
    return float(ConvexHull(np.array(corners)).volume)


class CubePoses:
    """Per named cube, its pose frame by frame (`update`), for one episode at a time."""

    def __init__(
        self,
        detector: CubeDetector,
        names: tuple[str, ...],
        default_xy: tuple[float, float],
        hands: Mapping[str, Hand],
        grasp: GraspConfig = GraspConfig(),
        whole_fraction: float = 0.85,
    ) -> None:
        """
        Args:
            detector: the top camera's detector (its images go to `update`).
            names: the cubes, each one of the detector's colours.
            default_xy: where a cube never seen is taken to be.
            hands: per arm, its gripper value, pinch point and fingers' yaw from the joints;
                empty for the camera alone.
        """
        unknown = set(names) - set(detector.channels)
        if unknown:
            raise ValueError(f"the detector has no colour for {sorted(unknown)}")
        self.detector = detector
        self.names = tuple(names)
        self.default_xy = np.asarray(default_xy, np.float64)
        self.hands = dict(hands)
        self.grasp = grasp
        self.whole_fraction = float(whole_fraction)
        self.reset()

    def reset(self) -> None:
        """A new episode: nothing seen, nothing held."""
        self.poses: dict[str, CubePose] = {}
        self._grasps: dict[str, tuple[float, float]] = {}  # cube -> (its yaw, fingers' yaw)

    def update(self, image: np.ndarray | None, joints: np.ndarray) -> dict[str, CubePose]:
        """Takes the newest top-camera image [H, W, 3] (None: no image this frame; only the
        hands are read) and the measured joints; returns each cube's pose (the same objects,
        updated in place)."""
        hands = {arm: hand(np.asarray(joints, np.float64)) for arm, hand in self.hands.items()}
        self._take_hold(hands)
        blobs = yaws = None
        for name in self.names:
            pose = self.poses.get(name)
            if pose is not None and pose.held_by is not None:
                self._follow_hand(name, pose, hands[pose.held_by])
                continue
            xy = yaw = None
            if image is not None:
                if blobs is None:
                    blobs, yaws = self.detector.blobs(image), self.detector.yaws(image)
                xy, yaw = self.detector.place(blobs[name]), yaws[name]
            whole = (
                xy is not None
                and yaw is not None
                and blobs[name].pixels
                >= self.whole_fraction * silhouette_pixels(self.detector, xy, yaw)
            )
            if pose is None:  # the first frame: whatever is seen, else the default
                first = self.default_xy if xy is None else np.asarray(xy, np.float64)
                pose = CubePose(
                    first.copy(), self.detector.plane_z, 0.0 if yaw is None else yaw, first.copy()
                )
                self.poses[name] = pose
            elif whole:
                pose.xy, pose.z, pose.yaw = np.asarray(xy, np.float64), self.detector.plane_z, yaw
        return self.poses

    def _take_hold(self, hands: dict[str, tuple[float, np.ndarray, float]]) -> None:
        """Ends the holds whose gripper left the held range (the cube drops to the table) and
        begins one for each other stopped gripper with a cube's estimate near its pinch."""
        g = self.grasp

        def stopped(arm: str) -> bool:
            return g.held_min < hands[arm][0] < g.held_max

        holding = set()
        for name, pose in self.poses.items():
            if pose.held_by is None:
                continue
            if stopped(pose.held_by):
                holding.add(pose.held_by)
            else:
                pose.held_by, pose.z = None, self.detector.plane_z
                del self._grasps[name]
        for arm in hands:
            if arm in holding or not stopped(arm):
                continue
            pinch = hands[arm][1]
            free = [
                (float(np.linalg.norm(np.r_[pose.xy, pose.z] - pinch)), name)
                for name, pose in self.poses.items()
                if pose.held_by is None
            ]
            if free and min(free)[0] <= g.near_m:
                name = min(free)[1]
                self.poses[name].held_by = arm
                self._grasps[name] = (self.poses[name].yaw, hands[arm][2])

    def _follow_hand(self, name: str, pose: CubePose, hand: tuple) -> None:
        _, pinch, fingers_yaw = hand
        cube_yaw, fingers_at_grasp = self._grasps[name]
        pose.xy, pose.z = np.asarray(pinch[:2], np.float64).copy(), float(pinch[2])
        pose.yaw = cube_yaw + fingers_yaw - fingers_at_grasp
