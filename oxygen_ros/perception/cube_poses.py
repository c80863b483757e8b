"""Each cube's pose from the top camera and the arms' measured joints (ROS-free).

The colour detector (`cube_detector`) places a blob's centroid on the table. A gripper over a
cube hides part of it, and the centroid and yaw of what stays visible are off by up to 2 cm
and 45 degrees before the blob vanishes (docs/TRAINING.md run 16). `CubePoses` keeps, per cube:
- from the camera, whole views: a blob with at least `whole_fraction` of the pixels that a
  cube at the detected position and yaw would cover (the convex hull of its eight projected
  corners; whole views measure 0.87-1.03 of it). A partial view (a hand over the cube hides
  part of it) must still be explained by the estimate: each of its pixels sees the cube
  somewhere along its ray between the table and the cube's top, so the ray's segment there
  must meet the cube's square footprint. While it does, the estimate stays; when the cube was
  pushed while hidden (no whole view may come while the hand stays over it), the estimate
  moves to the nearest position, yaw kept, that explains the view (`nearest_consistent_xy`),
  or to the partial view's placement when none within `SEARCH_RADIUS_M` does.
- while a gripper holds the cube, the hand's account of it. An arm takes hold of a cube when
  its measured gripper has closed to between `held_min` and the window's top with its pinch
  point (forward kinematics of the measured joints) within `near_m` of the cube's estimate
  (the expert grips within 2 cm of the centre, the learner also on the upper edge, up to 3
  cm). The top is `held_max` (the fingers close on a 4 cm cube near 0.6, on one turned
  between them up to about 0.67, and on nothing below 0.45), or `close_margin` below the
  widest the gripper has opened since it last let go, when that is higher: a learner that
  opens to 1.0 stops on a cube it holds turned or by an edge as high as 0.83
  (docs/TRAINING.md "Perception holds the learner's wide grips"), while the expert, which opens
  to 0.8, keeps `held_max`. The arm holds the cube while the gripper stays above `held_min`
  and no more than `release_margin` above the narrowest it has closed in this hold (or below
  `held_max`): opening further lets go. Held, the cube's centre is the pinch point in x and y,
  its height the table's plus how far the pinch point has risen above the lowest it has been
  since the gripper began to close from its widest (a grip on the upper edge lifts the cube
  from the table, not from the pinch point's height; a hold first seen a frame after the lift
  began still counts the lift from the grip), and its yaw the yaw at the grasp turned by as
  much as the fingers' axis has turned since; the camera is not read.
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
import functools
from collections.abc import Callable, Mapping

import numpy as np

from oxygen_ros.perception.cube_detector import CubeDetector

# arm -> (joints [N] -> (gripper value, pinch point [3], fingers' axis yaw in radians))
Hand = Callable[[np.ndarray], tuple[float, np.ndarray, float]]


@dataclasses.dataclass(frozen=True)
class GraspConfig:
    held_min: float = 0.45  # measured gripper above this (and below held_max): on something
    held_max: float = 0.72  # ... at or above this: open or still closing
    near_m: float = 0.04  # the cube's estimate this close to the pinch point: between fingers
    # a hold may also begin this far below the widest the gripper opened since it let go ...
    close_margin: float = 0.12
    # ... and lasts until the gripper opens this far above the narrowest it closed in the hold
    release_margin: float = 0.08
    # held, the cube rises from the table as far as the pinch point has from its lowest in the
    # hold (False: the cube's centre is at the pinch point's height, as before 2026-12-03)
    lift_from_lowest_pinch: bool = True

    @classmethod
    def before_2026_12_03(cls) -> GraspConfig:
        """The window before wide grips: held only below `held_max`, the cube's centre at the
        pinch point (for comparisons)."""
        return cls(close_margin=1.0, release_margin=0.0, lift_from_lowest_pinch=False)


@dataclasses.dataclass
class CubePose:
    xy: np.ndarray  # [2] world metres
    z: float  # the centre's height
    yaw: float  # radians; the cube looks the same every 90 degrees
    start: np.ndarray  # [2] the first estimate's xy
    held_by: str | None = None  # the arm holding it


def _silhouette(detector: CubeDetector, xy: np.ndarray, yaw: float):
    """The image-plane convex hull (scipy `ConvexHull`) of the eight projected corners of a
    cube of half size `detector.plane_z` resting on the table at `xy` with `yaw`."""
    from scipy.spatial import ConvexHull

    half = detector.plane_z
    c, s = np.cos(yaw), np.sin(yaw)
    corners = [
        detector.camera.project(np.array([xy[0] + c * dx - s * dy, xy[1] + s * dx + c * dy, z]))
        for dx in (-half, half)
        for dy in (-half, half)
        for z in (0.0, 2 * half)
    ]
    return ConvexHull(np.array(corners))


def silhouette_pixels(detector: CubeDetector, xy: np.ndarray, yaw: float) -> float:
    """The pixel area of a cube resting on the table at `xy` with `yaw` (`_silhouette`)."""
    return float(_silhouette(detector, xy, yaw).volume)


PIXEL_TOLERANCE_M = 0.001  # the footprint grown by this much for pixels on its edge
STRAY_PIXELS = 0.02  # this share of a view's pixels may be unexplained (edge pixels)
OPEN_TOLERANCE = 0.02  # a gripper this close to its widest is still open, not closing
SEARCH_RADIUS_M = 0.06  # how far from the estimate a partial view's cube is looked for
SEARCH_STEP_M = 0.002
SEARCH_BATCH = 256  # candidates tested at once, nearest first


def _segments(detector: CubeDetector, pixels: tuple[np.ndarray, np.ndarray]):
    """Per pixel (rows, cols), its ray's segment between the table (z = 0) and the top of a
    cube resting on it (z = 2 plane_z): the ends, world (x, y) [N, 2] each."""
    rows, cols = pixels
    u, v = cols + 0.5, rows + 0.5
    low = detector.camera.on_plane_many(u, v, 0.0)
    high = detector.camera.on_plane_many(u, v, 2 * detector.plane_z)
    finite = np.all(np.isfinite(low), axis=1) & np.all(np.isfinite(high), axis=1)
    return low[finite], high[finite]


def _explained(low: np.ndarray, high: np.ndarray, centres: np.ndarray, yaw: float, half: float):
    """[C] share of the segments (ends [N, 2]) that meet the square footprint of half size
    `half` and `yaw` centred at each of `centres` [C, 2] (Liang-Barsky clipping)."""
    c, s = np.cos(yaw), np.sin(yaw)
    to_local = np.array([[c, -s], [s, c]])  # world offset @ to_local = the cube's frame
    a = (low[None, :, :] - centres[:, None, :]) @ to_local  # [C, N, 2]
    d = (high - low) @ to_local  # [N, 2]
    enter, leave = np.zeros(a.shape[:2]), np.ones(a.shape[:2])
    for k in range(2):
        step = d[None, :, k]
        with np.errstate(divide="ignore", invalid="ignore"):
            t1, t2 = (-half - a[..., k]) / step, (half - a[..., k]) / step
        moving = np.abs(step) > 1e-12
        inside = np.abs(a[..., k]) <= half  # a segment parallel to this side: in or out
        enter = np.where(moving, np.maximum(enter, np.minimum(t1, t2)), enter)
        leave = np.where(moving, np.minimum(leave, np.maximum(t1, t2)), leave)
        leave = np.where(~moving & ~inside, -1.0, leave)
    return np.mean(enter <= leave, axis=1)


@functools.lru_cache(maxsize=8)
def _search_offsets(radius_m: float) -> np.ndarray:
    """[N, 2] read-only: the `SEARCH_STEP_M` grid's offsets within `radius_m`, nearest first
    (built once per radius, not per partial view)."""
    steps = np.arange(-radius_m, radius_m + 1e-9, SEARCH_STEP_M)
    grid = np.stack(np.meshgrid(steps, steps), axis=-1).reshape(-1, 2)
    grid = grid[np.hypot(grid[:, 0], grid[:, 1]) <= radius_m]
    grid = grid[np.argsort(np.hypot(grid[:, 0], grid[:, 1]), kind="stable")]
    grid.flags.writeable = False
    return grid


def nearest_consistent_xy(
    detector: CubeDetector,
    pixels: tuple[np.ndarray, np.ndarray],
    xy: np.ndarray,
    yaw: float,
    search_radius_m: float = SEARCH_RADIUS_M,
) -> np.ndarray | None:
    """Where a cube seen partly (its pixels (rows, cols)) is, given its estimate `xy`, `yaw`:
    `xy` itself when it explains the view (all but `STRAY_PIXELS` of the pixels' segments meet
    its footprint), else the nearest point on a `SEARCH_STEP_M` grid within
    `search_radius_m` that does, yaw kept; None when none does."""
    low, high = _segments(detector, pixels)
    if len(low) == 0:
        return np.asarray(xy, np.float64)
    half = detector.plane_z + PIXEL_TOLERANCE_M
    xy = np.asarray(xy, np.float64)
    if _explained(low, high, xy[None], yaw, half)[0] >= 1.0 - STRAY_PIXELS:
        return xy
    grid = _search_offsets(search_radius_m)
    for first in range(0, len(grid), SEARCH_BATCH):  # nearest first: stop at the first batch
        batch = grid[first : first + SEARCH_BATCH]
        good = np.flatnonzero(_explained(low, high, xy + batch, yaw, half) >= 1 - STRAY_PIXELS)
        if good.size:
            return xy + batch[good[0]]
    return None


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
        follow_partial_views: bool = True,
    ) -> None:
        """
        Args:
            detector: the top camera's detector (its images go to `update`).
            names: the cubes, each one of the detector's colours.
            default_xy: where a cube never seen is taken to be.
            hands: per arm, its gripper value, pinch point and fingers' yaw from the joints;
                empty for the camera alone.
            whole_fraction: a view with this share of the silhouette's pixels is whole.
            follow_partial_views: a partial view that the estimate does not explain moves
                it (False: only whole views do, as before 2026-11-29).
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
        self.follow_partial_views = bool(follow_partial_views)
        self.reset()

    def reset(self) -> None:
        """A new episode: nothing seen, nothing held."""
        self.poses: dict[str, CubePose] = {}
        self._grasps: dict[str, tuple[float, float]] = {}  # cube -> (its yaw, fingers' yaw)
        self._opened: dict[str, float] = {}  # arm -> widest gripper since it last let go
        self._lowest: dict[str, float] = {}  # arm -> lowest pinch z since it began to close
        self._narrowest: dict[str, float] = {}  # holding arm -> narrowest gripper in the hold

    def update(self, image: np.ndarray | None, joints: np.ndarray) -> dict[str, CubePose]:
        """Takes the newest top-camera image [H, W, 3] (None: no image this frame; only the
        hands are read) and the measured joints; returns each cube's pose (the same objects,
        updated in place)."""
        hands = {arm: hand(np.asarray(joints, np.float64)) for arm, hand in self.hands.items()}
        self._take_hold(hands)
        blobs = yaws = pixels = None
        for name in self.names:
            pose = self.poses.get(name)
            if pose is not None and pose.held_by is not None:
                self._follow_hand(name, pose, hands[pose.held_by])
                continue
            xy = yaw = None
            if image is not None:
                if blobs is None:
                    pixels = self.detector.pixels(image)
                    blobs, yaws = self.detector.blobs_of(pixels), self.detector.yaws_of(pixels)
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
            elif xy is not None and self.follow_partial_views:
                moved = nearest_consistent_xy(self.detector, pixels[name], pose.xy, pose.yaw)
                pose.xy = np.asarray(xy if moved is None else moved, np.float64)
        return self.poses

    def _take_hold(self, hands: dict[str, tuple[float, np.ndarray, float]]) -> None:
        """Ends the holds whose gripper opened or closed out of the window (the cube drops to
        the table) and begins one for each other closed gripper with a cube's estimate near
        its pinch."""
        g = self.grasp
        for arm, (gripper, pinch, _) in hands.items():
            opened = self._opened[arm] = max(self._opened.get(arm, gripper), gripper)
            if arm in self._narrowest:  # holding: the hold's narrowest and lowest
                self._narrowest[arm] = min(self._narrowest[arm], gripper)
            elif gripper >= opened - OPEN_TOLERANCE:  # still open: the lowest is where it is
                self._lowest[arm] = float(pinch[2])
            self._lowest[arm] = min(self._lowest[arm], float(pinch[2]))
        holding = set()
        for name, pose in self.poses.items():
            arm = pose.held_by
            if arm is None:
                continue
            gripper, pinch = hands[arm][0], hands[arm][1]
            if g.held_min < gripper < max(g.held_max, self._narrowest[arm] + g.release_margin):
                holding.add(arm)
            else:
                pose.held_by, pose.z = None, self.detector.plane_z
                del self._grasps[name], self._narrowest[arm]
                self._opened[arm], self._lowest[arm] = gripper, float(pinch[2])
        for arm, (gripper, pinch, fingers_yaw) in hands.items():
            if arm in holding:
                continue
            if not g.held_min < gripper < max(g.held_max, self._opened[arm] - g.close_margin):
                continue
            free = [
                (float(np.linalg.norm(np.r_[pose.xy, pose.z] - pinch)), name)
                for name, pose in self.poses.items()
                if pose.held_by is None
            ]
            if free and min(free)[0] <= g.near_m:
                name = min(free)[1]
                self.poses[name].held_by = arm
                self._grasps[name] = (self.poses[name].yaw, fingers_yaw)
                self._narrowest[arm] = gripper

    def _follow_hand(self, name: str, pose: CubePose, hand: tuple) -> None:
        _, pinch, fingers_yaw = hand
        cube_yaw, fingers_at_grasp = self._grasps[name]
        pose.xy, pose.z = np.asarray(pinch[:2], np.float64).copy(), float(pinch[2])
        if self.grasp.lift_from_lowest_pinch:
            pose.z = self.detector.plane_z + max(0.0, pose.z - self._lowest[pose.held_by])
        pose.yaw = cube_yaw + fingers_yaw - fingers_at_grasp
