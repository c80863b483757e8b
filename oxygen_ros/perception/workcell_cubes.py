"""The workcell's cube detector: the top camera's calibration read from the workcell's MJCF.

The cubes' positions on the table, as this perception module sees them in the top camera,
extend the robot state that the workcell policy is trained and served with (state = the 14
joints, then x, y of each cube in `CUBE_NAMES` order). A cube that is not seen keeps the
position it was last seen at (`CubeTracker`); one not seen since the episode began is at the
table's centre. `cube_poses` gives each cube's full pose (height, yaw, start) from the same
camera and the arms' measured joints (`cube_poses.CubePoses`), with the arms' forward
kinematics read from the same MJCF; `CubeReachState` adds each cube's offset from each hand,
`CubeTargetState` reports only the instructed cube (pose and offsets), `CubeTargetMetresState`
the same with the offsets in metres.

Invariants:
- The same function gives training (recorded images) and serving (live images) the same
  detector for an image size, so the state the model sees is computed the same way.
- Nothing here imports rclpy; the MuJoCo model is built without a renderer.
- The kinematics are the robot's, not the simulator's state: the pinch point comes from the
  measured joints alone.
"""

from __future__ import annotations

import functools

import numpy as np

from oxygen_ros.perception.cube_detector import CubeDetector, CubeTracker, PinholeCamera
from oxygen_ros.perception.cube_poses import CubePoses, GraspConfig, Hand
from oxygen_ros.sim import robot, tasks
from oxygen_ros.sim.scene import COLOURS, DEFAULT_OBJECTS

CAMERA = "top"
CUBE_NAMES: tuple[str, ...] = tuple(f"{colour}_cube" for colour in COLOURS)
STATE_NAMES: tuple[str, ...] = tuple(f"{name}.{axis}" for name in CUBE_NAMES for axis in "xy")
# `CubePoseState`: per cube its centre, yaw (a cube looks the same every 90 degrees: sin and cos
# of 4 x yaw) and how far it has moved from its first estimate
POSE_FIELDS = ("x", "y", "z", "sin4yaw", "cos4yaw", "moved_x", "moved_y")
POSE_STATE_NAMES: tuple[str, ...] = tuple(
    f"{name}.{field}" for name in CUBE_NAMES for field in POSE_FIELDS
)
# `CubeReachState`: the poses, then per cube and arm where the cube's centre is from the arm's
# pinch point (signed square root of the metres: finer near the cube, where grasps are decided)
REACH_FIELDS = ("dx", "dy", "dz")
REACH_STATE_NAMES: tuple[str, ...] = POSE_STATE_NAMES + tuple(
    f"{name}.{arm}.{field}" for name in CUBE_NAMES for arm in robot.ARMS for field in REACH_FIELDS
)
# `CubeTargetState`: the instructed cube's pose, then where its centre is from each arm's pinch
# point, at the same places whichever cube the instruction names
TARGET = "target"
TARGET_STATE_NAMES: tuple[str, ...] = tuple(f"{TARGET}.{field}" for field in POSE_FIELDS) + tuple(
    f"{TARGET}.{arm}.{field}" for arm in robot.ARMS for field in REACH_FIELDS
)
# `CubeTargetMetresState`: the same, with the offsets in metres (not square-rooted)
METRE_FIELDS = tuple(f"{field}_m" for field in REACH_FIELDS)
TARGET_METRES_STATE_NAMES: tuple[str, ...] = tuple(
    f"{TARGET}.{field}" for field in POSE_FIELDS
) + tuple(f"{TARGET}.{arm}.{field}" for arm in robot.ARMS for field in METRE_FIELDS)
TABLE_CENTRE_XY = tuple(float(np.mean(r)) for r in tasks.TABLE_REGION)
# `POSE_FIELDS` of a cube resting at the table's centre, unmoved, yaw 0: every cube before the
# first image, and the target state's cube when the instruction names none
RESTING_AT_CENTRE = np.array(
    (*TABLE_CENTRE_XY, tasks.CUBE_HALF_SIZE_M, 0.0, 1.0, 0.0, 0.0), np.float32
)
RESTING_AT_CENTRE.setflags(write=False)


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


@functools.cache
def hands() -> dict[str, Hand]:
    """Per arm: the 14 measured joints (`robot.JOINT_NAMES` order) -> its gripper value, pinch
    point and fingers' axis yaw (forward kinematics of the workcell's MJCF)."""
    from oxygen_ros.sim.kinematics import ArmKinematics
    from oxygen_ros.sim.workcell import Workcell, WorkcellConfig

    cell = Workcell(WorkcellConfig(render=False))
    try:
        arms = {arm: ArmKinematics(cell.model, arm) for arm in robot.ARMS}
    finally:
        cell.close()

    def hand(arm: str) -> Hand:
        kinematics, columns = arms[arm], robot.arm_columns(arm)
        gripper = robot.gripper_index(arm)

        def read(joints: np.ndarray) -> tuple[float, np.ndarray, float]:
            pinch, rotation = kinematics.forward(joints[columns])
            fingers = rotation[:, 1]  # the gripper frame's y: the axis the fingers close on
            return float(joints[gripper]), pinch, float(np.arctan2(fingers[1], fingers[0]))

        return read

    return {arm: hand(arm) for arm in robot.ARMS}


def cube_poses(
    width: int,
    height: int,
    grasp: GraspConfig | None = None,
    follow_partial_views: bool = True,
    with_hands: bool = True,
) -> CubePoses:
    """Every cube's pose from top-camera images of width x height and the measured joints
    (`follow_partial_views`: `CubePoses`'s; False reads whole views only, the tracker before
    2026-11-29, for comparisons; `with_hands` False: no hand's account of a held cube, the
    images alone)."""
    return CubePoses(
        detector(width, height),
        CUBE_NAMES,
        TABLE_CENTRE_XY,
        hands() if with_hands else {},
        grasp or GraspConfig(),
        follow_partial_views=follow_partial_views,
    )


def tracker() -> CubeTracker:
    return CubeTracker(CUBE_NAMES, TABLE_CENTRE_XY)


def episode_cube_states(top_images: np.ndarray) -> np.ndarray:
    """[T, 2 * len(CUBE_NAMES)] float32: the tracked cube positions of one episode's top-camera
    frames [T, H, W, 3], in order, from a fresh tracker."""
    cubes = CubeState()
    return np.stack([cubes.update(image) for image in top_images]).astype(np.float32)


# What follows the joints in the state: nothing, the cubes' positions, their poses, their
# poses and where each is from each hand, or only the instructed cube's pose and offsets (as
# sign(d) * sqrt(|d|), or with target_m in metres).
OBJECT_STATES = ("", "positions", "poses", "reach", "target", "target_m")
# The object states told the instructed cube (`object_state`'s `target`)
TARGET_KINDS = ("target", "target_m")


def object_state(
    kind: str, target: str | None = None, follow_partial_views: bool = True
) -> CubeState | CubePoseState | None:
    """A fresh per-episode source of the state's object part (`update(image, joints)`);
    `target` (a `CUBE_NAMES` entry, for `TARGET_KINDS` only) is the instructed cube;
    `follow_partial_views` goes to the pose tracker (`cube_poses`; not read by "positions")."""
    if kind not in OBJECT_STATES:
        raise ValueError(f"object state must be one of {OBJECT_STATES}, got {kind!r}")
    if target is not None and kind not in TARGET_KINDS:
        raise ValueError(f"only the target state takes a target, not {kind!r}")
    if kind == "positions":
        return CubeState()
    if kind == "poses":
        return CubePoseState(follow_partial_views=follow_partial_views)
    if kind == "reach":
        return CubeReachState(follow_partial_views=follow_partial_views)
    if kind == "target":
        return CubeTargetState(target, follow_partial_views=follow_partial_views)
    if kind == "target_m":
        return CubeTargetMetresState(target, follow_partial_views=follow_partial_views)
    return None


def episode_object_states(
    kind: str, top_images: np.ndarray, joints: np.ndarray, target: str | None = None
) -> np.ndarray:
    """[T, K] float32: the object part (`OBJECT_STATES`) of one episode's states, from its
    recorded top-camera frames [T, H, W, 3] and measured joints [T, 14] (and, for
    `TARGET_KINDS`, the instructed cube's name)."""
    if not kind:
        raise ValueError(f"object state must be one of {OBJECT_STATES[1:]}, got {kind!r}")
    if kind == "positions":
        return episode_cube_states(top_images)
    return episode_cube_pose_states(top_images, joints, object_state(kind, target))


class CubeState:
    """The cube part of the state, frame by frame: each call takes the newest top-camera image
    (None when the frame has none) and returns the tracked positions in `STATE_NAMES` order."""

    names = STATE_NAMES

    def __init__(self) -> None:
        self._tracker = tracker()

    def update(self, image: np.ndarray | None, joints: np.ndarray | None = None) -> np.ndarray:
        """`joints` is not read (the same call as `CubePoseState.update`)."""
        if image is None:
            return self._tracker.update({})
        height, width = image.shape[:2]
        return self._tracker.update(detector(width, height).detect(image))

    @property
    def seen(self) -> dict[str, bool]:
        """Per cube: whether it has been seen at least once."""
        return dict(self._tracker.seen)


class CubePoseState:
    """The cubes' poses as state, frame by frame: each call takes the newest top-camera image
    (None when the frame has none) and the 14 measured joints (`robot.JOINT_NAMES` order) and
    returns `POSE_STATE_NAMES` (`cube_poses.CubePoses`: whole views, the cube in the hand).
    Before the first image every cube is at the table's centre, unmoved, yaw 0."""

    names = POSE_STATE_NAMES

    def __init__(
        self, grasp: GraspConfig | None = None, follow_partial_views: bool = True
    ) -> None:
        self._grasp = grasp
        self._follow_partial_views = follow_partial_views
        self._poses: CubePoses | None = None

    def update(self, image: np.ndarray | None, joints: np.ndarray) -> np.ndarray:
        if image is not None:
            height, width = image.shape[:2]
            if self._poses is None:
                self._poses = cube_poses(width, height, self._grasp, self._follow_partial_views)
            else:  # the same cubes seen through another image size
                self._poses.detector = detector(width, height)
        if self._poses is None:
            return np.tile(RESTING_AT_CENTRE, len(CUBE_NAMES))
        poses = self._poses.update(image, np.asarray(joints, np.float64))
        rows = [
            (
                *p.xy,
                p.z,
                np.sin(4 * p.yaw),
                np.cos(4 * p.yaw),
                *(p.xy - p.start),
            )
            for p in (poses[name] for name in CUBE_NAMES)
        ]
        return np.asarray(rows, np.float32).reshape(-1)


class CubeReachState(CubePoseState):
    """`CubePoseState`, then per cube (`CUBE_NAMES` order) and arm (`robot.ARMS` order) the
    cube's centre minus the arm's pinch point (forward kinematics of the measured joints), each
    axis as sign(d) * sqrt(|d| in metres): `REACH_STATE_NAMES`. The hand-to-cube error the
    reactive expert's law reads (docs/TRAINING.md run 16: an MLP acted only once it was given
    it) is then in the state instead of left to the policy's own kinematics."""

    names = REACH_STATE_NAMES

    def update(self, image: np.ndarray | None, joints: np.ndarray) -> np.ndarray:
        poses = super().update(image, joints)
        return np.concatenate([poses, reach_offsets(poses, joints)])


class CubeTargetState(CubePoseState):
    """The instructed cube alone: its `POSE_FIELDS`, then its centre minus each arm's pinch
    point (`robot.ARMS` order, as in `CubeReachState`): `TARGET_STATE_NAMES`, the same places
    whichever cube it is, so the policy need not find the named colour's numbers among all
    cubes'. `target` (a `CUBE_NAMES` entry) is fixed for the state's life (one task; a new
    instruction gets a new state). Without a target the numbers are a cube resting at the
    table's centre, unmoved, yaw 0 (`RESTING_AT_CENTRE`, as before the first image)."""

    names = TARGET_STATE_NAMES
    metres = False  # the offsets as sign(d) * sqrt(|d|) (`reach_offsets`)

    def __init__(
        self,
        target: str | None = None,
        grasp: GraspConfig | None = None,
        follow_partial_views: bool = True,
    ) -> None:
        if target is not None and target not in CUBE_NAMES:
            raise ValueError(f"target must be one of {CUBE_NAMES}, got {target!r}")
        super().__init__(grasp, follow_partial_views)
        self.target = target

    def update(self, image: np.ndarray | None, joints: np.ndarray) -> np.ndarray:
        poses = super().update(image, joints).reshape(len(CUBE_NAMES), len(POSE_FIELDS))
        pose = RESTING_AT_CENTRE if self.target is None else poses[CUBE_NAMES.index(self.target)]
        return np.concatenate([pose, reach_offsets(pose, joints, self.metres)])


class CubeTargetMetresState(CubeTargetState):
    """`CubeTargetState` with each offset from a hand in metres, d itself rather than sign(d)
    * sqrt(|d|): `TARGET_METRES_STATE_NAMES`. An MLP fit on the demonstrations alone acts on
    these and not on the roots (docs/TRAINING.md, "The demonstrations alone, again")."""

    names = TARGET_METRES_STATE_NAMES
    metres = True


def reach_offsets(poses: np.ndarray, joints: np.ndarray, metres: bool = False) -> np.ndarray:
    """[3 * len(robot.ARMS) per cube] float32: the reach part of `CubeReachState` (per cube
    and arm) from pose rows (`POSE_FIELDS` per cube, any number of cubes) and the 14 measured
    joints; with `metres` the offsets d themselves instead of sign(d) * sqrt(|d|)."""
    rows = np.asarray(poses, np.float64).reshape(-1, len(POSE_FIELDS))
    q = np.asarray(joints, np.float64)
    pinches = np.stack([hands()[arm](q)[1] for arm in robot.ARMS])  # [arms, 3]
    d = rows[:, None, :3] - pinches[None, :, :]  # [cubes, arms, 3]
    if not metres:
        d = np.sign(d) * np.sqrt(np.abs(d))
    return d.reshape(-1).astype(np.float32)


def episode_cube_pose_states(
    top_images: np.ndarray, joints: np.ndarray, cubes: CubePoseState | None = None
) -> np.ndarray:
    """[T, len(cubes.names)] float32: `cubes` (a fresh `CubePoseState` by default) over one
    episode's top-camera frames [T, H, W, 3] and measured joints [T, 14], in order."""
    if len(top_images) != len(joints):
        raise ValueError(f"{len(top_images)} images but {len(joints)} joint rows")
    cubes = cubes or CubePoseState()
    return np.stack([cubes.update(i, q) for i, q in zip(top_images, joints, strict=True)])
