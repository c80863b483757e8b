"""A state-feedback expert: every control tick, targets from the measured joints (ROS-free).

The scripted expert (`expert.py`) plans once and its targets are a function of time. A policy
cloned from such demonstrations never sees what to do off the plan's path: with the joints as
input it learns targets that follow the measured joints (they move together in every
demonstration), and in closed loop a small deviation is fed back and grows
(`diagnostics.state_policy`, docs/TRAINING.md). This expert's command is a function of the
state it sees, so the demonstrations label every visited state, noisy ones included, with a
command that steers back:

- a phase machine over waypoints of the episode's arm, read from the true cube pose (the same
  privileged state the scripted expert plans from): above the cube (`approach_height_m`), down
  to the cube centre, close the gripper and wait, lift; then hold (pick) or carry to the goal,
  put down, open and wait, rise (move). A waypoint is reached when the pinch point is within
  its tolerance; the gripper phases last a fixed time;
- the waypoint's joints by inverse kinematics (top-down grasp, fingers along the cube face
  normal nearest the arm's natural wrist, as the scripted expert grasps), seeded from the
  previous solution;
- the command: the measured arm joints plus the step towards the waypoint's joints, scaled
  down uniformly so that no joint leads by more than `lead_rad` (a straight line in joint space,
  at a speed the position servos set). The other arm is held at its joints at reset; the
  gripper target is absolute.

Phase labels are `tasks.subtask_labels(spec)`.

Invariants:
- `command` depends only on the workcell's state and the phase machine (phase index, time in
  phase, the last inverse-kinematics solution): no plan, no clock beyond the phase timers.
- Every label returned is one of `tasks.subtask_labels(spec)`, in order over an episode
  (with `regrasp_m`, a lost grasp starts the order again).
- `snapshot()` then `restore()` puts the phase machine back exactly: with the workcell's
  `physics_state`, a caller can ask what the expert would do from any state (DAgger's labels,
  `training/dagger.py`) and continue as if it had not.
"""

from __future__ import annotations

import dataclasses

import mujoco
import numpy as np

from oxygen_ros.sim import robot, tasks
from oxygen_ros.sim.expert import DOWN, ExpertConfig, ScriptedExpert, _up
from oxygen_ros.sim.kinematics import ArmKinematics, gripper_rotation
from oxygen_ros.sim.workcell import Workcell


def lead_command(
    hold: np.ndarray,
    measured: np.ndarray,
    arm: str,
    goal: np.ndarray,
    lead_rad: float,
    gripper: float,
) -> np.ndarray:
    """The 14 targets of a state-feedback step: `hold`, with `arm`'s joints at the `measured`
    ones plus the step towards `goal` [6] (scaled down uniformly so that no joint leads by more
    than `lead_rad`: a straight line in joint space) and its gripper target at `gripper`."""
    columns = robot.arm_columns(arm)
    step = goal - measured[columns]
    largest = float(np.max(np.abs(step)))
    if largest > lead_rad:
        step *= lead_rad / largest
    target = np.array(hold, dtype=np.float64)
    target[columns] = measured[columns] + step
    target[robot.gripper_index(arm)] = gripper
    return target


@dataclasses.dataclass(frozen=True)
class FeedbackConfig:
    """Tolerances and timing of the feedback expert; waypoints and gripper values are the
    scripted expert's (`waypoints`)."""

    waypoints: ExpertConfig = dataclasses.field(default_factory=ExpertConfig)  # heights, grippers
    lead_rad: float = 0.04  # largest joint lead of the command over the measured joints
    reached_m: float = 0.01  # a travel waypoint counts as reached within this distance
    grasp_reached_m: float = 0.004  # the grasp point (cube centre) within this
    place_reached_m: float = 0.006  # the put-down point within this
    close_s: float = 0.8  # gripper closing + settling before the lift
    release_s: float = 0.6  # gripper opening before the retreat
    regrasp_m: float | None = None  # with the cube's centre further than this from the pinch
    #   point while the gripper holds it (close to put-down), the grasp is lost: back to the
    #   first phase (None: never; the demonstrations never lose a cube, a learner does)


# (label index, waypoint kind, gripper) of each phase; kind names the pinch target.
_PICK_PHASES = (
    (0, "above", "open"),
    (0, "grasp", "open"),
    (1, "close", "closed"),
    (2, "lift", "closed"),
    (3, "hold", "closed"),
)
_HOLDING = frozenset(("close", "lift", "hold", "carry", "place"))  # kinds with the cube held
_MOVE_PHASES = (
    *_PICK_PHASES[:4],  # reach, grasp and lift as for a pick
    (3, "carry", "closed"),
    (4, "place", "closed"),
    (5, "release", "open"),
    (5, "retreat", "open"),
)


class FeedbackExpert:
    """Closed-loop scripted control of one episode at a time (`reset`, then `command` per
    tick)."""

    def __init__(self, model: mujoco.MjModel, config: FeedbackConfig = FeedbackConfig()) -> None:
        self.config = config
        self.kinematics = {arm: ArmKinematics(model, arm) for arm in robot.ARMS}
        self._spec: tasks.EpisodeSpec | None = None
        self.unreachable_ticks = 0

    def reset(self, workcell: Workcell, spec: tasks.EpisodeSpec) -> None:
        """Starts `spec` from the workcell's current state."""
        self._spec = spec
        self.unreachable_ticks = 0  # ticks whose waypoint inverse kinematics did not reach
        self._labels = tasks.subtask_labels(spec)
        self._phases = _MOVE_PHASES if spec.action == "move" else _PICK_PHASES
        self._phase = 0
        self._phase_start = workcell.time
        self._hold = workcell.joint_positions().copy()  # the idle arm stays here
        self._grasp_point: np.ndarray | None = None  # cube centre when the grasp began
        self._aim(workcell)

    def _aim(self, workcell: Workcell) -> None:
        """The grasp rotation and the inverse kinematics' seed for the cube where it is now."""
        kin = self.kinematics[self._spec.arm]
        cube = workcell.object_pose(self._spec.target)
        self._rotation = gripper_rotation(DOWN, ScriptedExpert.finger_axis(kin, cube))
        self._ik_seed = np.array(robot.HOME_ARM)
        self._ik_seed[0] = kin.waist_towards(np.asarray(cube.position))

    def snapshot(self) -> tuple:
        """The phase machine's state (copies), for `restore`."""
        grasp = None if self._grasp_point is None else self._grasp_point.copy()
        return (
            self._phase,
            self._phase_start,
            grasp,
            self._ik_seed.copy(),
            self._rotation.copy(),
            self.unreachable_ticks,
        )

    def restore(self, snapshot: tuple) -> None:
        phase, start, grasp, seed, rotation, unreachable = snapshot
        self._phase, self._phase_start, self.unreachable_ticks = phase, start, unreachable
        self._grasp_point = None if grasp is None else grasp.copy()
        self._ik_seed, self._rotation = seed.copy(), rotation.copy()

    def _grasp_lost(self, workcell: Workcell, kind: str) -> bool:
        limit = self.config.regrasp_m
        if limit is None or kind not in _HOLDING:
            return False
        cube = np.asarray(workcell.object_pose(self._spec.target).position)
        pinch = workcell.site_position(f"{self._spec.arm}_pinch")
        return float(np.linalg.norm(cube - pinch)) > limit

    @property
    def subtask(self) -> str:
        """The label of the current phase."""
        return self._labels[self._phases[self._phase][0]]

    def _waypoint(self, workcell: Workcell, kind: str) -> np.ndarray:
        c, spec = self.config.waypoints, self._spec
        cube = np.asarray(workcell.object_pose(spec.target).position, np.float64)
        if kind in ("above", "grasp"):
            return cube + _up(c.approach_height_m if kind == "above" else 0.0)
        if self._grasp_point is None:
            self._grasp_point = cube
        lifted = self._grasp_point + _up(c.lift_height_m)
        if kind in ("close", "lift", "hold"):
            return self._grasp_point if kind == "close" else lifted
        goal_xy = spec.goal_xy()
        carried = np.array((goal_xy[0], goal_xy[1], lifted[2]))
        placed = carried.copy()
        placed[2] = tasks.CUBE_HALF_SIZE_M + c.place_clearance_m
        if kind == "carry":
            return carried
        if kind in ("place", "release"):
            return placed
        return placed + _up(c.retreat_height_m)  # retreat

    def _reached(self, workcell: Workcell, kind: str, waypoint: np.ndarray) -> bool:
        c = self.config
        elapsed = workcell.time - self._phase_start
        if kind == "close":
            return elapsed >= c.close_s
        if kind == "release":
            return elapsed >= c.release_s
        if kind in ("hold", "retreat"):
            return False  # the last phase
        pinch = workcell.site_position(f"{self._spec.arm}_pinch")
        tolerance = {"grasp": c.grasp_reached_m, "place": c.place_reached_m}.get(kind, c.reached_m)
        return float(np.linalg.norm(pinch - waypoint)) <= tolerance

    def command(self, workcell: Workcell) -> np.ndarray:
        """The 14 joint targets for this tick (advancing the phase first if its waypoint is
        reached). A waypoint out of reach is steered to as closely as inverse kinematics gets
        (counted in `unreachable_ticks`)."""
        if self._spec is None:
            raise RuntimeError("reset() before command()")
        spec = self._spec
        kind = self._phases[self._phase][1]
        if self._grasp_lost(workcell, kind):
            self._phase, self._phase_start, self._grasp_point = 0, workcell.time, None
            self._aim(workcell)
            kind = self._phases[0][1]
        waypoint = self._waypoint(workcell, kind)
        if self._phase + 1 < len(self._phases) and self._reached(workcell, kind, waypoint):
            self._phase += 1
            self._phase_start = workcell.time
            kind = self._phases[self._phase][1]
            waypoint = self._waypoint(workcell, kind)
        kin = self.kinematics[spec.arm]
        result = kin.solve(waypoint, self._rotation, self._ik_seed)
        if not result.converged:
            # A pushed cube can leave the arm's reach: steer to the closest pose found (the
            # episode then fails and is no training data) rather than stop the generator.
            self.unreachable_ticks += 1
        self._ik_seed = result.q
        waypoints = self.config.waypoints
        opened = self._phases[self._phase][2] == "open"
        return lead_command(
            self._hold,
            workcell.joint_positions(),
            spec.arm,
            result.q,
            self.config.lead_rad,
            waypoints.gripper_open if opened else waypoints.gripper_closed,
        )
