"""The workcell's task family: instructions whose words decide the goal (ROS-free).

Three cubes (red, green, blue) lie on the table; an instruction names one of them, and
sometimes the arm or a direction:

- `pick`: "pick up the {colour} cube". The arm on the cube's side of the table (x < 0: left)
  lifts it.
- `pick_with_arm`: "pick up the {colour} cube with the {arm} arm". That arm lifts it; the cube
  lies in the middle, where both arms reach.
- `move`: "move the {colour} cube to the {left|right}". The arm on the cube's side puts it down
  `MOVE_DISTANCE_M` further that way and lets go.

"Left" is towards the left arm (world -x), "right" towards the right arm (+x).

An episode (`EpisodeSpec`) is drawn from a seed: template, colour, arm, direction, then the
three cube poses (x, y, yaw) on the table with at least `MIN_SEPARATION_M` between cube centres
(and between a `move` goal and the other cubes). The named cube is drawn from its template's
target region; the other two are distractors anywhere in `TABLE_REGION`, so the model has to find
the named colour. With an instruction, the words fix template, colour, arm and direction, and the
seed draws the rest; the random stream is consumed in the same order either way, so a seed gives
the same cube positions for instructions of the same template and side.

`subtask_labels(spec)` are the phase names shared by the scripted expert (`expert.py`) and
`evaluate`, which names the phase that the simulator state corresponds to:

- `pick`, `pick_with_arm`: reach the {c} cube -> grasp the {c} cube -> lift the {c} cube ->
  hold the {c} cube. Success: the episode's arm holds the cube (both finger pads on it, the
  "held" test in `_held_by`, or, off the table, a finger on it: `_carried_by`) and its bottom
  is at least `LIFT_HEIGHT_M` above the table.
- `move`: reach -> grasp -> lift -> move the {c} cube to the {d} -> put down the {c} cube ->
  release the {c} cube. Success: the cube rests on the table (on any face), no finger touches
  it, and it moved at least `MOVE_SUCCESS_M` the named way and at most `MOVE_SIDEWAYS_M` across.

`evaluate` looks at one state; `SuccessTracker` adds the dwell (`SUCCESS_DWELL_S`): an episode
succeeds once `evaluate` has reported success continuously for that long.

Invariants:
- `sample_episode(seed, instruction)` is a pure function of its arguments.
- Every instruction that `sample_episode` produces parses back to the same template, colour,
  arm and direction (`parse_instruction`).
- `evaluate(...).stage` is always one of `subtask_labels(spec)`.
"""

from __future__ import annotations

import dataclasses
import math
import re

import mujoco
import numpy as np

from oxygen_ros.sim import robot
from oxygen_ros.sim.scene import COLOURS
from oxygen_ros.sim.workcell import Workcell

TEMPLATES: dict[str, str] = {
    "pick": "pick up the {colour} cube",
    "pick_with_arm": "pick up the {colour} cube with the {arm} arm",
    "move": "move the {colour} cube to the {direction}",
}
ACTIONS = {"pick": "pick", "pick_with_arm": "pick", "move": "move"}  # template -> action
DIRECTIONS = ("left", "right")  # towards the left arm (-x), towards the right arm (+x)
TIME_LIMIT_S = {"pick": 12.0, "pick_with_arm": 12.0, "move": 16.0}

CUBE_HALF_SIZE_M = 0.02  # scene.ObjectSpec's default (4 cm cubes)
TABLE_REGION = ((-0.25, 0.25), (0.40, 0.60))  # (x range, y range) of every cube centre [m]
TARGET_Y = (0.42, 0.58)  # y range of the named cube
PICK_SIDE_X = (0.08, 0.22)  # |x| of the named cube for `pick` (its sign picks the arm)
SHARED_X = (-0.04, 0.04)  # x of the named cube for `pick_with_arm` (both arms reach it)
MOVE_SIDE_X = (0.10, 0.20)  # |x| of the named cube for `move` (either direction stays reachable)
MOVE_DISTANCE_M = 0.10  # how far `move` carries the cube (the expert's goal)
MIN_SEPARATION_M = 0.09  # between cube centres (and a move goal and the other cubes)

LIFT_HEIGHT_M = 0.05  # pick success: cube bottom at least this far above the table
LIFT_STARTED_M = 0.01  # stage "lift" once the held cube's bottom is this far up
NEAR_M = 0.025  # stage "grasp" once the pinch point is this close to the cube centre
MOVE_SUCCESS_M = 0.06  # move success: displacement along the named direction
MOVE_SIDEWAYS_M = 0.04  # move success: largest displacement across it
MOVE_STARTED_M = 0.015  # stage "move" once the held cube has gone this far along the direction
HELD_GAP_M = 0.0015  # a finger pad closer to the cube than this is on it
# Finger geometry in the pinch frame (x approach, y finger axis), from the finger meshes'
# convex hulls (test_tasks checks FINGER_FACE_INSET_M against the model):
FINGER_JOINTS = ("left_finger", "right_finger")
FINGER_FACE_INSET_M = 0.0224  # a finger's inner face lies this far inside its slide position
PAD_APPROACH_RANGE_M = (-0.09, 0.03)  # cube centre along x for the pads to reach it
PAD_HALF_WIDTH_M = 0.025  # cube centre along z (across the pads) for them to reach it
RESTING_M = 0.005  # "on the table": centre at most this far above its resting height
RESTING_SPEED_M_S = 0.02  # "at rest": centre speed below this
SUCCESS_DWELL_S = 0.3  # success must hold this long (SuccessTracker)

_COLOUR_WORDS = "|".join(COLOURS)
_PATTERNS = {
    "pick": re.compile(rf"pick up the (?P<colour>{_COLOUR_WORDS}) cube"),
    "pick_with_arm": re.compile(
        rf"pick up the (?P<colour>{_COLOUR_WORDS}) cube with the (?P<arm>left|right) arm"
    ),
    "move": re.compile(
        rf"move the (?P<colour>{_COLOUR_WORDS}) cube to the (?P<direction>left|right)"
    ),
}


@dataclasses.dataclass(frozen=True)
class ParsedInstruction:
    """What the words of an instruction fix."""

    template: str  # key of TEMPLATES
    colour: str  # key of scene.COLOURS
    arm: str | None  # "left" | "right" when the words name it
    direction: str | None  # "left" | "right" for `move`


@dataclasses.dataclass(frozen=True)
class EpisodeSpec:
    """One episode: instruction, goal and initial cube poses."""

    seed: int  # the seed it was drawn from
    instruction: str  # canonical text (TEMPLATES filled in)
    template: str  # key of TEMPLATES
    colour: str  # colour of the named cube
    arm: str  # the arm that must do it ("left" | "right")
    action: str  # "pick" | "move"
    target: str  # object name of the named cube, e.g. "red_cube"
    objects: dict[str, tuple[float, float, float]]  # name -> (x, y, yaw) on the table at start
    time_limit_s: float  # episode length budget in simulated seconds
    direction: str = ""  # "left" | "right" for `move`, else ""

    def goal_xy(self) -> np.ndarray | None:
        """Where `move` should leave the cube (x, y); None for the pick templates."""
        if self.action != "move":
            return None
        x, y, _ = self.objects[self.target]
        return np.array((x + _direction_sign(self.direction) * MOVE_DISTANCE_M, y))


@dataclasses.dataclass(frozen=True)
class Evaluation:
    """What one simulator state says about an episode."""

    success: bool  # the goal condition holds in this state (SuccessTracker adds the dwell)
    stage: str  # one of subtask_labels(spec): the phase this state belongs to
    held: bool  # both finger pads of the episode's arm are on the named cube (HELD_GAP_M)
    lift_m: float  # height of the cube's bottom above the table
    pinch_distance_m: float  # episode arm's pinch point to the cube centre


def object_name(colour: str) -> str:
    return f"{colour}_cube"


def _direction_sign(direction: str) -> float:
    return -1.0 if direction == "left" else 1.0


def _normalise(text: str) -> str:
    return " ".join(text.lower().split()).rstrip(".!")


def parse_instruction(text: str) -> ParsedInstruction:
    """Matches `text` (case, spacing and a final full stop ignored) against the templates.

    Raises:
        ValueError: the text fits no template.
    """
    normalised = _normalise(text)
    for template, pattern in _PATTERNS.items():
        match = pattern.fullmatch(normalised)
        if match:
            groups = match.groupdict()
            return ParsedInstruction(
                template=template,
                colour=groups["colour"],
                arm=groups.get("arm"),
                direction=groups.get("direction"),
            )
    examples = "; ".join(f"'{t}'" for t in TEMPLATES.values())
    raise ValueError(
        f"instruction {text!r} matches no task template ({examples}; colour one of "
        f"{', '.join(COLOURS)}, arm and direction left or right)"
    )


def subtask_labels(spec: EpisodeSpec) -> tuple[str, ...]:
    """The episode's phases in order; the expert's phase names and evaluate's stages."""
    cube = f"the {spec.colour} cube"
    if spec.action == "move":
        return (
            f"reach {cube}",
            f"grasp {cube}",
            f"lift {cube}",
            f"move {cube} to the {spec.direction}",
            f"put down {cube}",
            f"release {cube}",
        )
    return (f"reach {cube}", f"grasp {cube}", f"lift {cube}", f"hold {cube}")


def _uniform(rng: np.random.Generator, bounds: tuple[float, float]) -> float:
    return float(rng.uniform(*bounds))


def _far_enough(xy: np.ndarray, others: list[np.ndarray]) -> bool:
    return all(np.linalg.norm(xy - o) >= MIN_SEPARATION_M for o in others)


def sample_episode(seed: int, instruction: str = "") -> EpisodeSpec:
    """Draws an episode from `seed`; with `instruction`, its words fix what they name.

    Raises:
        ValueError: `instruction` is not empty and fits no template.
    """
    rng = np.random.default_rng(seed)
    # Always draw these four, so the stream (and the cube poses) does not depend on
    # whether the instruction was given.
    template = str(rng.choice(list(TEMPLATES)))
    colour = str(rng.choice(list(COLOURS)))
    arm = str(rng.choice(robot.ARMS))
    direction = str(rng.choice(DIRECTIONS))
    if instruction:
        parsed = parse_instruction(instruction)
        template, colour = parsed.template, parsed.colour
        arm = parsed.arm or arm
        direction = parsed.direction or direction
    side = -1.0 if arm == "left" else 1.0  # pick / move: the arm is the cube's side
    for _ in range(1000):
        # Target position by template.
        if template == "pick_with_arm":
            target_xy = np.array((_uniform(rng, SHARED_X), _uniform(rng, TARGET_Y)))
        else:
            side_x = PICK_SIDE_X if template == "pick" else MOVE_SIDE_X
            target_xy = np.array((side * _uniform(rng, side_x), _uniform(rng, TARGET_Y)))
        keep_clear = [target_xy]
        if template == "move":
            goal_xy = target_xy.copy()
            goal_xy[0] += _direction_sign(direction) * MOVE_DISTANCE_M
            keep_clear.append(goal_xy)
        distractors: list[np.ndarray] = []
        for _ in range(2):
            xy = np.array([_uniform(rng, TABLE_REGION[0]), _uniform(rng, TABLE_REGION[1])])
            if not _far_enough(xy, keep_clear + distractors):
                break
            distractors.append(xy)
        if len(distractors) == 2:
            break
    else:  # pragma: no cover (the regions leave ample room: about 1 in 3 draws fits)
        raise RuntimeError(f"seed {seed}: no cube layout found")
    others = [c for c in COLOURS if c != colour]
    rng.shuffle(others)
    yaws = rng.uniform(-math.pi / 4, math.pi / 4, size=3)
    positions = [target_xy, *distractors]
    objects = {
        object_name(c): (float(xy[0]), float(xy[1]), float(yaw))
        for c, xy, yaw in zip([colour, *others], positions, yaws, strict=True)
    }
    objects = {object_name(c): objects[object_name(c)] for c in COLOURS}  # fixed key order
    fields = {"colour": colour, "arm": arm, "direction": direction}
    return EpisodeSpec(
        seed=seed,
        instruction=TEMPLATES[template].format(**fields),
        template=template,
        colour=colour,
        arm=arm,
        action=ACTIONS[template],
        target=object_name(colour),
        objects=objects,
        time_limit_s=TIME_LIMIT_S[template],
        direction=direction if template == "move" else "",
    )


# ---------------------------------------------------------------------- evaluation
def _finger_qpos(workcell: Workcell, arm: str) -> tuple[float, float]:
    """Slide positions of the arm's left (+y) and right (-y, negative) fingers [m]."""
    prefix = robot.mjcf_prefix(arm)
    left, right = (workcell.model.joint(prefix + f).qposadr[0] for f in FINGER_JOINTS)
    return float(workcell.data.qpos[left]), float(workcell.data.qpos[right])


def _held_by(workcell: Workcell, arm: str, name: str) -> bool:
    """Both fingers of `arm` on the cube, from geometry: the cube lies between the finger pads
    and each pad's inner face is within HELD_GAP_M of the cube's extent along the finger axis.

    Not from contacts: a held cube's finger contacts drop out for single steps while the grip
    settles (and MuJoCo's mesh distance query returned spurious zeros at 7 mm, measured).
    """
    site = workcell.data.site(f"{arm}_pinch")
    frame = site.xmat.reshape(3, 3)  # columns: approach, finger axis, their cross product
    pose = workcell.object_pose(name)
    local = frame.T @ (pose.position - site.xpos)
    cube_rotation = np.empty(9)
    mujoco.mju_quat2Mat(cube_rotation, pose.quaternion)
    # Half extent of the cube along the finger axis (4 cm cube: 2 cm when face-on).
    half = CUBE_HALF_SIZE_M * float(np.abs(frame[:, 1] @ cube_rotation.reshape(3, 3)).sum())
    left, right = _finger_qpos(workcell, arm)
    left_gap = (left - FINGER_FACE_INSET_M) - (local[1] + half)
    right_gap = (local[1] - half) - (right + FINGER_FACE_INSET_M)
    return (
        left_gap <= HELD_GAP_M
        and right_gap <= HELD_GAP_M
        and PAD_APPROACH_RANGE_M[0] <= local[0] <= PAD_APPROACH_RANGE_M[1]
        and abs(local[2]) <= PAD_HALF_WIDTH_M
    )


def _finger_on(workcell: Workcell, arm: str, name: str) -> bool:
    """A finger of `arm` touches the object `name` (a contact, either finger)."""
    prefix = robot.mjcf_prefix(arm)
    return any(
        workcell.touching(f"{prefix}10_{side}_gripper_finger", name) for side in ("left", "right")
    )


def _carried_by(workcell: Workcell, arm: str, name: str, lift: float) -> bool:
    """The cube off the table (its bottom `lift` more than `RESTING_M` above the table, not
    touching the table top) with a finger of `arm` on it: nothing else holds a cube up. A grip
    by the top edge carries the cube with its centre beyond the reach of the pads that
    `_held_by` asks for (pinch point 3.0-3.2 cm above the centre, measured); without this the
    carry read as not held, and its stage as "reach"."""
    if lift <= RESTING_M or workcell.touching("table_top", name):
        return False
    return _finger_on(workcell, arm, name)


def _touched_by_any_finger(workcell: Workcell, name: str) -> bool:
    return any(
        _held_by(workcell, arm, name) or _finger_on(workcell, arm, name) for arm in robot.ARMS
    )


def _speed(workcell: Workcell, name: str) -> float:
    dof = int(workcell.model.joint(f"{name}_joint").dofadr[0])
    return float(np.linalg.norm(workcell.data.qvel[dof : dof + 3]))


def evaluate(workcell: Workcell, spec: EpisodeSpec) -> Evaluation:
    """Success and stage of `spec` in the workcell's current state (no history).

    Args:
        workcell: the simulation (only its state is read).
        spec: the episode.
    """
    labels = subtask_labels(spec)
    cube = workcell.object_pose(spec.target).position
    lift = float(cube[2] - CUBE_HALF_SIZE_M)
    pinch = workcell.site_position(f"{spec.arm}_pinch")
    pinch_distance = float(np.linalg.norm(pinch - cube))
    held = _held_by(workcell, spec.arm, spec.target) or _carried_by(
        workcell, spec.arm, spec.target, lift
    )
    near = pinch_distance <= NEAR_M
    success = False
    if spec.action == "move":
        start = np.asarray(spec.objects[spec.target][:2])
        sign = _direction_sign(spec.direction)
        along = float(sign * (cube[0] - start[0]))
        across = abs(float(cube[1] - start[1]))
        resting = lift <= RESTING_M
        arrived = along >= MOVE_SUCCESS_M
        if held:
            if arrived:
                stage = labels[4]  # put down
            elif along >= MOVE_STARTED_M:
                stage = labels[3]  # move
            elif lift >= LIFT_STARTED_M:
                stage = labels[2]  # lift
            else:
                stage = labels[1]  # grasp
        elif arrived and resting:
            stage = labels[5]  # release
            success = (
                across <= MOVE_SIDEWAYS_M
                and not _touched_by_any_finger(workcell, spec.target)
                and _speed(workcell, spec.target) < RESTING_SPEED_M_S
            )
        elif near:
            stage = labels[1]
        else:
            stage = labels[0]
    else:
        if held and lift >= LIFT_HEIGHT_M:
            stage = labels[3]  # hold
            success = not workcell.touching("table_top", spec.target)
        elif held and lift >= LIFT_STARTED_M:
            stage = labels[2]
        elif held or near:
            stage = labels[1]
        else:
            stage = labels[0]
    return Evaluation(
        success=success, stage=stage, held=held, lift_m=lift, pinch_distance_m=pinch_distance
    )


class SuccessTracker:
    """Turns per-state `evaluate` results into episode success: the goal condition must hold
    continuously for `dwell_s` simulated seconds."""

    def __init__(self, dwell_s: float = SUCCESS_DWELL_S) -> None:
        self.dwell_s = dwell_s
        self._since: float | None = None  # when the current run of successes began
        self.success_time: float | None = None  # start of the first run that lasted dwell_s

    def update(self, evaluation: Evaluation, time: float) -> bool:
        """Feeds the evaluation of the state at `time`; True once the episode succeeded."""
        if self.success_time is not None:
            return True
        if not evaluation.success:
            self._since = None
            return False
        if self._since is None:
            self._since = time
        if time - self._since >= self.dwell_s - 1e-9:
            self.success_time = self._since
        return self.success_time is not None

    @property
    def succeeded(self) -> bool:
        return self.success_time is not None
