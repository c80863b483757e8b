"""The scripted expert: a joint-space plan for one episode from privileged state (ROS-free).

`ScriptedExpert.plan` reads the episode (`tasks.EpisodeSpec`), the 14 current joint positions
and the true cube poses, and returns a `Plan`: 14-joint position targets as a function of
absolute simulated time, in phases named by `tasks.subtask_labels(spec)`. Only the episode's arm
moves; the other arm keeps its joints.

Phases (pinch point = the arm's `<arm>_pinch` site; grasps are top-down, the fingers closing
along the cube face normal nearest to the arm's natural wrist orientation):
- reach: joint-space move to `approach_height_m` above the cube while opening the gripper, then
  a straight line down to the cube centre;
- grasp: close the gripper (target fully closed: the cube stops the fingers and the position
  error squeezes it), then dwell;
- lift: a straight line up by `lift_height_m`;
- pick: hold there. move: carry the cube `tasks.MOVE_DISTANCE_M` sideways (move), lower it to
  just above the table (put down), open the gripper and rise (release).

Each segment interpolates joint knots (inverse kinematics along straight lines, warm-started
knot to knot) under a minimum-jerk time scaling: zero velocity and acceleration at every
waypoint, peak joint speeds bounded by `ExpertConfig`.

Invariants:
- A plan is fixed once made (planned once at episode start); `sample(t)` before `start_time` is
  the first pose and after `end_time` the final pose (held).
- `subtask(t)` is always one of `tasks.subtask_labels(spec)`, in that order over time.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Mapping
from typing import NamedTuple

import mujoco
import numpy as np

from oxygen_ros.sim import robot, tasks
from oxygen_ros.sim.kinematics import ArmKinematics, gripper_rotation
from oxygen_ros.sim.workcell import ObjectPose, Workcell, WorkcellConfig

DOWN = np.array((0.0, 0.0, -1.0))


def _up(height_m: float) -> np.ndarray:
    return np.array((0.0, 0.0, height_m))


class PlanningError(RuntimeError):
    """No plan: a waypoint is out of reach (inverse kinematics did not converge)."""


@dataclasses.dataclass(frozen=True)
class ExpertConfig:
    """Waypoints and timing of the scripted motions."""

    approach_height_m: float = 0.10  # pinch above the cube centre before descending
    lift_height_m: float = 0.10  # how far the cube is lifted
    place_clearance_m: float = 0.002  # cube bottom above the table when let go (move)
    retreat_height_m: float = 0.08  # rise after letting go (move)
    gripper_open: float = 0.8  # gripper value while approaching (5.5 cm between the fingers)
    gripper_closed: float = 0.0  # commanded while holding (fingers stop on the cube)
    reach_joint_speed_rad_s: float = 1.0  # peak joint speed of the joint-space reach
    min_reach_s: float = 1.5  # shortest joint-space reach
    descend_s: float = 1.0  # straight line down onto the cube
    close_s: float = 0.5  # gripper closing
    grasp_dwell_s: float = 0.3  # fingers settle before lifting
    lift_s: float = 1.0
    hold_s: float = 1.0  # pick: hold the cube up before the plan ends
    carry_s: float = 1.2  # move: sideways carry
    put_down_s: float = 1.0  # move: lower the cube
    release_s: float = 0.4  # move: gripper opening
    release_dwell_s: float = 0.2  # move: fingers clear the cube before rising
    retreat_s: float = 0.8  # move: rise
    knot_spacing_m: float = 0.01  # inverse kinematics knots along straight lines


def min_jerk(u: np.ndarray | float) -> np.ndarray | float:
    """Minimum-jerk time scaling of u in [0, 1]: 0 -> 0, 1 -> 1, flat at both ends."""
    u = np.clip(u, 0.0, 1.0)
    return u**3 * (10.0 - 15.0 * u + 6.0 * u**2)


MIN_JERK_PEAK_SPEED = 1.875  # max ds/du of min_jerk


@dataclasses.dataclass(frozen=True)
class Segment:
    """Joint targets from `knots[0]` to `knots[-1]` over [start, end], through the knots
    (evenly spaced in path parameter s; s follows `min_jerk` in time)."""

    start: float  # absolute sim time [s]
    end: float
    label: str  # subtask label
    knots: np.ndarray  # [K >= 2, 14]

    def sample(self, t: float) -> np.ndarray:
        u = (t - self.start) / (self.end - self.start)
        position = float(min_jerk(u)) * (len(self.knots) - 1)
        i = min(int(position), len(self.knots) - 2)
        f = position - i
        return self.knots[i] + f * (self.knots[i + 1] - self.knots[i])


class Plan:
    """14-joint targets over absolute sim time, in labelled phases."""

    def __init__(self, segments: list[Segment], labels: tuple[str, ...]) -> None:
        if not segments:
            raise ValueError("a plan needs at least one segment")
        self.segments = tuple(segments)
        self.labels = labels  # every phase label, in order (tasks.subtask_labels)
        self._ends = [s.end for s in segments]

    @property
    def start_time(self) -> float:
        return self.segments[0].start

    @property
    def end_time(self) -> float:
        return self.segments[-1].end

    def _segment(self, t: float) -> Segment:
        i = bisect.bisect_left(self._ends, t)
        return self.segments[min(i, len(self.segments) - 1)]

    def sample(self, t: float) -> np.ndarray:
        """Joint targets [14] at absolute sim time `t`."""
        return self._segment(t).sample(t)

    def rows(self, t_start: float, dt: float, n: int) -> np.ndarray:
        """Targets [n, 14] at t_start, t_start + dt, ... (an action chunk)."""
        return np.stack([self.sample(t_start + k * dt) for k in range(n)])

    def subtask(self, t: float) -> str:
        """The phase label at absolute sim time `t` (the last one after the end)."""
        return self._segment(t).label


class ScriptedExpert:
    """Plans an episode's motion with inverse kinematics on a private copy of the model data."""

    def __init__(self, model: mujoco.MjModel, config: ExpertConfig = ExpertConfig()) -> None:
        self.config = config
        self.kinematics = {arm: ArmKinematics(model, arm) for arm in robot.ARMS}

    def plan_for(self, workcell: Workcell, spec: tasks.EpisodeSpec) -> Plan:
        """`plan` from the workcell's current joints, cube poses and time."""
        objects = {name: workcell.object_pose(name) for name in workcell.object_names()}
        return self.plan(spec, workcell.joint_positions(), objects, workcell.time)

    def plan(
        self,
        spec: tasks.EpisodeSpec,
        joints: np.ndarray,
        objects: Mapping[str, ObjectPose],
        start_time: float,
    ) -> Plan:
        """The episode's plan, starting at `start_time` from `joints` [14].

        Args:
            spec: the episode (target cube, arm, action, direction).
            joints: current joint positions [14] (robot.JOINT_NAMES order).
            objects: true poses of the objects (at least the target).
            start_time: absolute sim time at which the plan starts.

        Raises:
            PlanningError: a waypoint is out of the arm's reach.
        """
        c = self.config
        kin = self.kinematics[spec.arm]
        labels = tasks.subtask_labels(spec)
        cube = objects[spec.target]
        centre = np.asarray(cube.position, dtype=np.float64)
        rotation = gripper_rotation(DOWN, self.finger_axis(kin, cube))
        columns = robot.arm_slice(spec.arm)
        arm_cols = np.arange(columns.start, columns.start + len(robot.ARM_JOINTS))
        grip_col = robot.gripper_index(spec.arm)
        builder = _PlanBuilder(np.asarray(joints, dtype=np.float64).copy(), start_time)

        above = centre + _up(c.approach_height_m)
        seed = np.array(robot.HOME_ARM)
        seed[0] = kin.waist_towards(centre)
        q_above = self._ik(kin, above, rotation, seed, spec)
        q_now = builder.last[arm_cols]
        joint_distance = float(np.max(np.abs(q_above - q_now)))
        reach_s = max(
            c.min_reach_s, MIN_JERK_PEAK_SPEED * joint_distance / c.reach_joint_speed_rad_s
        )
        target = builder.last.copy()
        target[arm_cols], target[grip_col] = q_above, c.gripper_open
        builder.add(labels[0], reach_s, [target])
        q_grasp = self._line(builder, kin, arm_cols, rotation, above, centre, spec)
        builder.add(labels[0], c.descend_s, q_grasp)
        builder.add(labels[1], c.close_s, [builder.with_value(grip_col, c.gripper_closed)])
        builder.hold(labels[1], c.grasp_dwell_s)
        lifted = centre + _up(c.lift_height_m)
        builder.add(
            labels[2], c.lift_s, self._line(builder, kin, arm_cols, rotation, centre, lifted, spec)
        )
        if spec.action == "move":
            goal_xy = spec.goal_xy()
            carried = np.array((goal_xy[0], goal_xy[1], lifted[2]))
            builder.add(
                labels[3],
                c.carry_s,
                self._line(builder, kin, arm_cols, rotation, lifted, carried, spec),
            )
            placed = carried.copy()
            placed[2] = tasks.CUBE_HALF_SIZE_M + c.place_clearance_m
            builder.add(
                labels[4],
                c.put_down_s,
                self._line(builder, kin, arm_cols, rotation, carried, placed, spec),
            )
            builder.add(labels[5], c.release_s, [builder.with_value(grip_col, c.gripper_open)])
            builder.hold(labels[5], c.release_dwell_s)
            risen = placed + _up(c.retreat_height_m)
            builder.add(
                labels[5],
                c.retreat_s,
                self._line(builder, kin, arm_cols, rotation, placed, risen, spec),
            )
        else:
            builder.hold(labels[3], c.hold_s)
        return Plan(builder.segments, labels)

    # ------------------------------------------------------------------ helpers
    @staticmethod
    def finger_axis(kin: ArmKinematics, cube: ObjectPose) -> np.ndarray:
        """The cube face normal (horizontal) closest to the arm's natural finger axis, which
        is horizontal and perpendicular to the line from the arm's base to the cube."""
        matrix = np.empty(9)
        mujoco.mju_quat2Mat(matrix, np.asarray(cube.quaternion, dtype=np.float64))
        cube_x = matrix.reshape(3, 3)[:, 0]
        yaw = np.arctan2(cube_x[1], cube_x[0])
        towards = np.asarray(cube.position)[:2] - kin.base_position[:2]
        natural = np.arctan2(towards[0], -towards[1])  # z cross (base -> cube)
        k = np.round((natural - yaw) / (np.pi / 2))
        angle = yaw + k * np.pi / 2
        return np.array((np.cos(angle), np.sin(angle), 0.0))

    @staticmethod
    def _ik(
        kin: ArmKinematics,
        position: np.ndarray,
        rotation: np.ndarray,
        seed: np.ndarray,
        spec: tasks.EpisodeSpec,
    ) -> np.ndarray:
        result = kin.solve(position, rotation, seed)
        if not result.converged:
            raise PlanningError(
                f"seed {spec.seed} ({spec.instruction!r}): the {kin.arm} arm cannot put its "
                f"pinch point at {np.round(position, 3).tolist()} (error "
                f"{result.position_error_m * 1e3:.1f} mm, "
                f"{np.degrees(result.orientation_error_rad):.1f} deg)"
            )
        return result.q

    def _line(
        self,
        builder: _PlanBuilder,
        kin: ArmKinematics,
        arm_cols: np.ndarray,
        rotation: np.ndarray,
        start: np.ndarray,
        end: np.ndarray,
        spec: tasks.EpisodeSpec,
    ) -> list[np.ndarray]:
        """Knots [14] along the straight pinch line start -> end (start excluded)."""
        count = max(1, int(np.ceil(np.linalg.norm(end - start) / self.config.knot_spacing_m)))
        knots, seed = [], builder.last[arm_cols]
        for s in np.linspace(0.0, 1.0, count + 1)[1:]:
            seed = self._ik(kin, start + s * (end - start), rotation, seed, spec)
            knot = builder.last.copy()
            knot[arm_cols] = seed
            knots.append(knot)
        return knots


class _PlanBuilder:
    """Appends segments that each start where the previous one ended."""

    def __init__(self, joints: np.ndarray, start_time: float) -> None:
        self.last = joints
        self.time = start_time
        self.segments: list[Segment] = []

    def add(self, label: str, duration_s: float, knots: list[np.ndarray]) -> None:
        stacked = np.stack([self.last, *knots])
        self.segments.append(Segment(self.time, self.time + duration_s, label, stacked))
        self.time += duration_s
        self.last = stacked[-1].copy()

    def hold(self, label: str, duration_s: float) -> None:
        self.add(label, duration_s, [self.last])

    def with_value(self, column: int, value: float) -> np.ndarray:
        q = self.last.copy()
        q[column] = value
        return q


# ---------------------------------------------------------------------- rollouts
class RolloutResult(NamedTuple):
    """Outcome of one physics-only rollout."""

    success: bool  # tasks.SuccessTracker succeeded within the time limit
    stages: tuple[str, ...]  # evaluate's stage per control step, consecutive repeats merged
    time_to_success: float | None  # seconds from episode start to the start of the success dwell


def rollout(
    spec: tasks.EpisodeSpec,
    expert: ScriptedExpert | None = None,
    control_hz: float = 50.0,
    workcell: Workcell | None = None,
    stop_on_success: bool = True,
) -> RolloutResult:
    """Resets the workcell to the episode, plans once and tracks the plan at `control_hz`
    until the time limit (or success, with `stop_on_success`), evaluating every step."""
    workcell = workcell or Workcell(WorkcellConfig(render=False))
    expert = expert or ScriptedExpert(workcell.model)
    workcell.reset(robot.HOME, spec.objects)
    start = workcell.time
    plan = expert.plan_for(workcell, spec)
    tracker = tasks.SuccessTracker()
    dt = 1.0 / control_hz
    stages: list[str] = []
    for _ in range(round(spec.time_limit_s * control_hz)):
        workcell.set_targets(plan.sample(workcell.time))
        workcell.step(dt)
        evaluation = tasks.evaluate(workcell, spec)
        if not stages or stages[-1] != evaluation.stage:
            stages.append(evaluation.stage)
        if tracker.update(evaluation, workcell.time) and stop_on_success:
            break
    time_to_success = None if tracker.success_time is None else tracker.success_time - start
    return RolloutResult(tracker.succeeded, tuple(stages), time_to_success)
