"""A reactive expert: each control tick's command is a function of the current state alone
(ROS-free).

`FeedbackExpert` steers from the measured joints but keeps a phase machine: which waypoint it
is on, how long the gripper has been closing, where the grasp began, the wrist angle chosen at
the start. A learner sees none of that, so at one observed state the demonstrations hold
different labels (above the cube or descending, wait or lift), and behaviour cloning averages
them: in runs 12-14 (docs/TRAINING.md) the learner stalls a centimetre from the cube with its
gripper command copying the measured gripper. DAgger's labels from a phase machine that
follows the learner have the same ambiguity.

Here nothing is remembered between ticks. From the measured joints (14, grippers included),
the true pose of the named cube and the episode (`tasks.EpisodeSpec`: arm, action, and for
`move` the goal), each tick:

- fingers: the measured gripper tells open (above `closing_below`), closing or holding a cube
  (between `held_min` and `closing_below`, with the cube centre within `near_m` of the pinch
  point) or closed on nothing (below `held_min`);
- not holding: the pinch target is above the cube centre by a funnel height, the approach
  height while the horizontal error is above `funnel_m`, linear down to the centre as it
  shrinks to `aligned_m`; the gripper command closes once the pinch point is within
  `close_xy_m` / `close_z_m` of the centre (and stays closed while the fingers close on the
  cube), and opens otherwise (a grasp closed on nothing opens again);
- holding, fingers still closing (above `held_max`): stay at the cube centre;
- holding: pick lifts to `lift_height_m` above the table and stays; move lifts, carries
  towards the goal as the cube rises (all the way within `goal_funnel_m` of it) and lowers it
  as the goal nears; on the table at the goal, opens;
- move, the cube resting at the goal and not held: the gripper opens and the pinch point rises
  `retreat_height_m` above the cube;
- with `keep_held` (off by default; DAgger's `--keep-held`): a cube the fingers hold off the
  centre (the task's held test, both pads on it, while the pinch point is beyond `near_m` or
  the gripper reads above `closing_below`) and have lifted at least `kept_lift_m` counts as
  held: the gripper stays closed and the cube is steered as above, the pinch target offset by
  where the grip sits on it. Without it such a grip reads as open and the command lets go to
  grasp again at the centre, a recovery the expert makes but a learner copying the label only
  half-way (a gripper target between open and closed) turns into a dropped cube;
- with `grip_high_m` (off by default; DAgger's `--grip-high-m`): fingers on a cube still on
  the table (its bottom at most `resting_m` up) with the pinch point more than `grip_high_m`
  above its centre read as not holding, so the command opens and descends to grasp at the
  centre: a learner that closes its fingers on the cube's top edge, where the default lifts
  and the cube slips out, is labelled to let go before lifting, where nothing can drop.

The pinch target's joints come from inverse kinematics seeded at the measured arm joints
(waist turned towards the target), with the grasp's wrist from the cube's current yaw (the face
normal nearest the arm's natural wrist, `ScriptedExpert.finger_axis`). The command is the
measured arm joints plus the step towards them, scaled so no joint leads by more than
`lead_rad`; the other arm is held at `robot.HOME`, the gripper target is absolute.

Invariants:
- `command(workcell)` depends only on the workcell's current state and the episode: the same
  state gives the same command whatever came before (no phase, timer or seed is kept).
- `subtask` is `tasks.evaluate(...).stage` of the last commanded state (what the
  demonstrations record), one of `tasks.subtask_labels(spec)`.
- `snapshot()` / `restore()` exist for `training.dagger` and keep nothing but the counters.
"""

from __future__ import annotations

import dataclasses

import mujoco
import numpy as np

from oxygen_ros.sim import robot, tasks
from oxygen_ros.sim.expert import DOWN, ExpertConfig, ScriptedExpert, _up
from oxygen_ros.sim.feedback_expert import lead_command
from oxygen_ros.sim.kinematics import ArmKinematics, gripper_rotation
from oxygen_ros.sim.workcell import Workcell


@dataclasses.dataclass(frozen=True)
class ReactiveConfig:
    """Thresholds of the reactive expert; heights and gripper values are the scripted
    expert's (`waypoints`)."""

    waypoints: ExpertConfig = dataclasses.field(default_factory=ExpertConfig)
    lead_rad: float = 0.04  # largest joint lead of the command over the measured joints
    funnel_m: float = 0.03  # horizontal error at (and above) which the pinch stays at approach
    aligned_m: float = 0.004  # horizontal error at (and below) which it descends to the centre
    close_xy_m: float = 0.008  # the gripper closes with the pinch this close horizontally
    close_z_m: float = 0.008  # ... and this close vertically to the cube centre
    near_m: float = 0.025  # the cube centre this close to the pinch: between the fingers
    closing_below: float = 0.75  # measured gripper below this: fingers closed or closing
    held_max: float = 0.66  # ... below this (and above held_min) with the cube near: holding
    held_min: float = 0.45  # ... below this: closed on nothing (a 4 cm cube stops them ~0.6)
    goal_funnel_m: float = 0.04  # move: within this of the goal the carry goes all the way
    at_goal_m: float = 0.01  # move: the cube this close to the goal counts as there
    resting_m: float = 0.004  # cube bottom at most this high rests on the table
    keep_held: bool = False  # a lifted cube held off the centre is kept (module docstring)
    kept_lift_m: float = tasks.LIFT_STARTED_M  # ... once the grip has lifted it this far
    # > 0: fingers on a cube resting on the table with the pinch point more than this above
    # its centre (a grip on the top edge) let go to grasp again lower (module docstring)
    grip_high_m: float = 0.0


class ReactiveExpert:
    """Memoryless scripted control (`reset` per episode, then `command` per tick)."""

    def __init__(self, model: mujoco.MjModel, config: ReactiveConfig = ReactiveConfig()) -> None:
        self.config = config
        self.kinematics = {arm: ArmKinematics(model, arm) for arm in robot.ARMS}
        self._spec: tasks.EpisodeSpec | None = None
        self._subtask = ""
        self.unreachable_ticks = 0

    def reset(self, workcell: Workcell, spec: tasks.EpisodeSpec) -> None:
        """Starts `spec` (nothing of the workcell's state is kept)."""
        self._spec = spec
        self._subtask = tasks.subtask_labels(spec)[0]
        self.unreachable_ticks = 0

    @property
    def subtask(self) -> str:
        """The stage of the state the last command was computed in."""
        return self._subtask

    def snapshot(self) -> tuple:
        return (self._subtask, self.unreachable_ticks)

    def restore(self, snapshot: tuple) -> None:
        self._subtask, self.unreachable_ticks = snapshot

    # ------------------------------------------------------------------ the control law
    def pinch_and_gripper(
        self, workcell: Workcell, evaluation: tasks.Evaluation | None = None
    ) -> tuple[np.ndarray, bool]:
        """This tick's pinch target [3] and whether the gripper is commanded open;
        `evaluation` is `tasks.evaluate` of this state when the caller already has it."""
        c, spec = self.config, self._spec
        w = c.waypoints
        cube = np.asarray(workcell.object_pose(spec.target).position, np.float64)
        pinch = workcell.site_position(f"{spec.arm}_pinch")
        gripper = float(workcell.joint_positions()[robot.gripper_index(spec.arm)])
        horizontal = float(np.linalg.norm(cube[:2] - pinch[:2]))
        near = float(np.linalg.norm(cube - pinch)) <= c.near_m
        on_cube = near and c.held_min < gripper < c.closing_below
        lift = float(cube[2]) - tasks.CUBE_HALF_SIZE_M  # cube bottom above the table
        # Held off the centre (keep_held): steer the cube; `grip` is where the pinch sits on it.
        off_centre = (
            c.keep_held
            and not on_cube
            and lift >= c.kept_lift_m
            and (evaluation if evaluation is not None else tasks.evaluate(workcell, spec)).held
        )
        grip = pinch - cube if off_centre else np.zeros(3)
        on_cube = on_cube or off_centre
        if on_cube and c.grip_high_m > 0 and lift <= c.resting_m:
            on_cube = float(pinch[2] - cube[2]) <= c.grip_high_m  # a top-edge grip lets go
        if spec.action == "move":
            goal = np.asarray(spec.goal_xy(), np.float64)
            to_goal = goal - cube[:2]
            at_goal = float(np.linalg.norm(to_goal)) <= c.at_goal_m
            if at_goal and lift <= c.resting_m and not (on_cube and gripper < c.held_max):
                # Put down (or pushed there): let go and rise clear of it.
                if gripper < c.closing_below:
                    return pinch.copy(), True  # open where it is
                return cube + _up(w.retreat_height_m), True
        if on_cube and gripper >= c.held_max and not off_centre:
            return cube.copy(), False  # fingers still closing: stay, keep closing
        if on_cube:
            if spec.action != "move":
                target = cube.copy()
                target[2] = tasks.CUBE_HALF_SIZE_M + w.lift_height_m
                return target + grip, False
            distance = float(np.linalg.norm(to_goal))
            risen = float(np.clip(lift / w.lift_height_m, 0.0, 1.0))
            nearby = float(np.clip(1.0 - distance / c.goal_funnel_m, 0.0, 1.0))
            xy = cube[:2] + max(risen, nearby) * to_goal
            height = w.lift_height_m * float(
                np.clip((distance - c.at_goal_m / 2) / c.goal_funnel_m, 0.0, 1.0)
            )
            if at_goal and lift <= c.resting_m:
                return cube + grip, True  # on the table at the goal: open
            z = tasks.CUBE_HALF_SIZE_M + w.place_clearance_m + height
            return np.array((xy[0], xy[1], z)) + grip, False
        # Not holding: above the cube by the funnel's height, close once at the centre.
        share = float(np.clip((horizontal - c.aligned_m) / (c.funnel_m - c.aligned_m), 0, 1))
        target = cube + _up(share * w.approach_height_m)
        at_centre = horizontal <= c.close_xy_m and abs(float(pinch[2] - cube[2])) <= c.close_z_m
        return target, not at_centre

    def command(self, workcell: Workcell) -> np.ndarray:
        """The 14 joint targets for this tick. A target out of reach is steered to as closely
        as inverse kinematics gets (counted in `unreachable_ticks`)."""
        if self._spec is None:
            raise RuntimeError("reset() before command()")
        evaluation = tasks.evaluate(workcell, self._spec)
        self._subtask = evaluation.stage
        position, open_gripper = self.pinch_and_gripper(workcell, evaluation)
        waypoints = self.config.waypoints
        gripper = waypoints.gripper_open if open_gripper else waypoints.gripper_closed
        return self.steer(workcell, position, gripper)

    def steer(self, workcell: Workcell, position: np.ndarray, gripper: float) -> np.ndarray:
        """The 14 joint targets that move the episode's arm's pinch point towards `position`
        (fingers down, across the cube's current yaw) by at most `lead_rad` per joint, with
        the gripper target `gripper`; the other arm is held at home."""
        spec = self._spec
        kin = self.kinematics[spec.arm]
        cube = workcell.object_pose(spec.target)
        rotation = gripper_rotation(DOWN, ScriptedExpert.finger_axis(kin, cube))
        measured = workcell.joint_positions()
        seed = measured[robot.arm_columns(spec.arm)].copy()
        seed[0] = kin.waist_towards(position)
        result = kin.solve(position, rotation, seed)
        if not result.converged:
            self.unreachable_ticks += 1
        return lead_command(
            robot.HOME, measured, spec.arm, result.q, self.config.lead_rad, gripper
        )
