"""Task family: instruction parsing, seeded episode sampling (determinism, regions, separation),
words that change the goal, and evaluate's success and stages on hand-made states."""

from __future__ import annotations

import dataclasses
import itertools
import math

import mujoco
import numpy as np
import pytest
from grips import grip_above_centre, specs

from oxygen_ros.sim import robot, tasks
from oxygen_ros.sim.scene import COLOURS
from oxygen_ros.sim.workcell import Workcell, WorkcellConfig

SEEDS = range(300)


@pytest.fixture(scope="module")
def cell():
    workcell = Workcell(WorkcellConfig(render=False))
    yield workcell
    workcell.close()


# ---------------------------------------------------------------------- parsing
def test_parse_each_template() -> None:
    assert tasks.parse_instruction("pick up the red cube") == tasks.ParsedInstruction(
        "pick", "red", None, None
    )
    assert tasks.parse_instruction("pick up the blue cube with the left arm") == (
        tasks.ParsedInstruction("pick_with_arm", "blue", "left", None)
    )
    assert tasks.parse_instruction("move the green cube to the right") == (
        tasks.ParsedInstruction("move", "green", None, "right")
    )


def test_parse_tolerates_case_spacing_and_a_full_stop() -> None:
    parsed = tasks.parse_instruction("  Pick UP the\tGreen  cube   with the RIGHT arm. ")
    assert parsed == tasks.ParsedInstruction("pick_with_arm", "green", "right", None)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "pick up the yellow cube",
        "pick up the red ball",
        "pick up the red cube with the middle arm",
        "move the red cube to the front",
        "push the red cube to the left",
        "pick up the red cube please",
    ],
)
def test_parse_rejects_what_fits_no_template(text: str) -> None:
    with pytest.raises(ValueError, match="matches no task template"):
        tasks.parse_instruction(text)


def test_sample_episode_rejects_an_unknown_instruction() -> None:
    with pytest.raises(ValueError, match="matches no task template"):
        tasks.sample_episode(0, "stack the cubes")


# ---------------------------------------------------------------------- sampling
def test_sampling_is_deterministic_per_seed_and_varies_across_seeds() -> None:
    assert tasks.sample_episode(7) == tasks.sample_episode(7)
    assert tasks.sample_episode(7, "move the red cube to the left") == tasks.sample_episode(
        7, "move the red cube to the left"
    )
    layouts = {tuple(tasks.sample_episode(s).objects["red_cube"]) for s in range(50)}
    assert len(layouts) == 50


def test_samples_cover_every_template_colour_arm_and_direction() -> None:
    specs = [tasks.sample_episode(s) for s in SEEDS]
    assert {s.template for s in specs} == set(tasks.TEMPLATES)
    assert {s.colour for s in specs} == set(COLOURS)
    for template in tasks.TEMPLATES:
        assert {s.arm for s in specs if s.template == template} == set(robot.ARMS)
    assert {s.direction for s in specs if s.template == "move"} == set(tasks.DIRECTIONS)


def test_instruction_round_trips_through_the_parser() -> None:
    for seed in SEEDS:
        spec = tasks.sample_episode(seed)
        parsed = tasks.parse_instruction(spec.instruction)
        assert (parsed.template, parsed.colour) == (spec.template, spec.colour)
        assert parsed.arm == (spec.arm if spec.template == "pick_with_arm" else None)
        assert (parsed.direction or "") == spec.direction
        assert tasks.sample_episode(seed, spec.instruction) == spec
        assert spec.target == f"{spec.colour}_cube"
        assert spec.action == tasks.ACTIONS[spec.template]
        assert spec.time_limit_s == tasks.TIME_LIMIT_S[spec.template]


def _in(value: float, bounds: tuple[float, float]) -> bool:
    return bounds[0] <= value <= bounds[1]


def test_cubes_lie_in_their_regions_apart_from_each_other() -> None:
    for seed in SEEDS:
        spec = tasks.sample_episode(seed)
        assert list(spec.objects) == [f"{c}_cube" for c in COLOURS]
        positions = {n: np.array(p[:2]) for n, p in spec.objects.items()}
        for x, y, yaw in spec.objects.values():
            assert _in(x, tasks.TABLE_REGION[0]) and _in(y, tasks.TABLE_REGION[1])
            assert -math.pi / 4 <= yaw < math.pi / 4
        for a, b in itertools.combinations(positions.values(), 2):
            assert np.linalg.norm(a - b) >= tasks.MIN_SEPARATION_M
        x, y, _ = spec.objects[spec.target]
        assert _in(y, tasks.TARGET_Y)
        side = -1.0 if spec.arm == "left" else 1.0
        if spec.template == "pick":
            assert _in(side * x, tasks.PICK_SIDE_X)  # the arm on the cube's side
        elif spec.template == "pick_with_arm":
            assert _in(x, tasks.SHARED_X)
        else:
            assert _in(side * x, tasks.MOVE_SIDE_X)
            goal = spec.goal_xy()
            assert goal[0] == pytest.approx(
                x + (-1 if spec.direction == "left" else 1) * tasks.MOVE_DISTANCE_M
            )
            for name, other in positions.items():
                if name != spec.target:
                    assert np.linalg.norm(goal - other) >= tasks.MIN_SEPARATION_M


def test_the_colour_word_changes_the_target_in_the_same_layout() -> None:
    for seed in range(20):
        specs = {c: tasks.sample_episode(seed, f"pick up the {c} cube") for c in COLOURS}
        assert {s.target for s in specs.values()} == {f"{c}_cube" for c in COLOURS}
        positions = {tuple(sorted(p[:2] for p in s.objects.values())) for s in specs.values()}
        assert len(positions) == 1  # the same cube positions; the named colour is the target


def test_the_arm_word_changes_the_arm_and_the_direction_word_the_goal() -> None:
    for seed in range(20):
        left = tasks.sample_episode(seed, "pick up the red cube with the left arm")
        right = tasks.sample_episode(seed, "pick up the red cube with the right arm")
        assert (left.arm, right.arm) == ("left", "right")
        assert left.objects == right.objects  # the arm word leaves the layout alone
        to_left = tasks.sample_episode(seed, "move the blue cube to the left")
        to_right = tasks.sample_episode(seed, "move the blue cube to the right")
        assert to_left.goal_xy()[0] < to_left.objects["blue_cube"][0]
        assert to_right.goal_xy()[0] > to_right.objects["blue_cube"][0]


def test_pick_chooses_the_arm_on_the_cube_side() -> None:
    for seed in range(50):
        spec = tasks.sample_episode(seed, "pick up the green cube")
        assert spec.arm == ("left" if spec.objects["green_cube"][0] < 0 else "right")


def test_subtask_labels() -> None:
    pick = tasks.sample_episode(0, "pick up the red cube")
    assert tasks.subtask_labels(pick) == (
        "reach the red cube", "grasp the red cube", "lift the red cube", "hold the red cube",
    )  # fmt: skip
    move = tasks.sample_episode(0, "move the blue cube to the left")
    assert tasks.subtask_labels(move) == (
        "reach the blue cube", "grasp the blue cube", "lift the blue cube",
        "move the blue cube to the left", "put down the blue cube", "release the blue cube",
    )  # fmt: skip


# ---------------------------------------------------------------------- evaluation
def test_finger_face_inset_matches_the_finger_meshes(cell: Workcell) -> None:
    """The inner face of each finger's convex hull, relative to its slide position."""
    m, d = cell.model, cell.data
    cell.reset(robot.HOME, {})
    for arm in robot.ARMS:
        prefix = robot.mjcf_prefix(arm)
        frame = d.site(f"{arm}_pinch").xmat.reshape(3, 3)
        origin = d.site(f"{arm}_pinch").xpos
        for finger, sign in (("left", 1.0), ("right", -1.0)):
            geom = m.geom(f"{prefix}10_{finger}_gripper_finger")
            start = m.mesh_vertadr[geom.dataid[0]]
            vertices = m.mesh_vert[start : start + m.mesh_vertnum[geom.dataid[0]]]
            world = vertices @ d.geom(geom.id).xmat.reshape(3, 3).T + d.geom(geom.id).xpos
            across = (world - origin) @ frame[:, 1]
            inner = across.min() if sign > 0 else across.max()
            slide = d.qpos[m.joint(f"{prefix}{finger}_finger").qposadr[0]]
            assert sign * (slide - inner) == pytest.approx(tasks.FINGER_FACE_INSET_M, abs=2e-4)


def test_initial_state_is_the_first_stage_without_success(cell: Workcell) -> None:
    for seed in range(12):
        spec = tasks.sample_episode(seed)
        cell.reset(robot.HOME, spec.objects)
        result = tasks.evaluate(cell, spec)
        assert result.stage == tasks.subtask_labels(spec)[0]
        assert not result.success and not result.held
        assert result.lift_m == pytest.approx(0.0, abs=1e-3)


def _place_cube(cell: Workcell, name: str, position, yaw: float = 0.0) -> None:
    adr = cell.model.joint(f"{name}_joint").qposadr[0]
    cell.data.qpos[adr : adr + 3] = position
    cell.data.qpos[adr + 3 : adr + 7] = (math.cos(yaw / 2), 0.0, 0.0, math.sin(yaw / 2))
    mujoco.mj_forward(cell.model, cell.data)


def test_move_success_needs_the_named_direction_and_a_resting_released_cube(
    cell: Workcell,
) -> None:
    spec = tasks.sample_episode(3, "move the red cube to the left")
    x, y, yaw = spec.objects["red_cube"]
    cell.reset(robot.HOME, spec.objects)
    labels = tasks.subtask_labels(spec)
    _place_cube(cell, "red_cube", (x - 0.09, y + 0.01, 0.02), yaw)
    result = tasks.evaluate(cell, spec)
    assert result.success and result.stage == labels[-1]
    wrong_way = dataclasses.replace(spec, direction="right")
    assert not tasks.evaluate(cell, wrong_way).success
    _place_cube(cell, "red_cube", (x - 0.09, y + 0.06, 0.02), yaw)  # too far sideways
    assert not tasks.evaluate(cell, spec).success
    _place_cube(cell, "red_cube", (x - 0.03, y, 0.02), yaw)  # not far enough
    assert not tasks.evaluate(cell, spec).success
    _place_cube(cell, "red_cube", (x - 0.09, y, 0.08), yaw)  # in the air
    assert not tasks.evaluate(cell, spec).success


def test_pick_is_not_success_for_a_floating_cube_that_no_finger_holds(cell: Workcell) -> None:
    spec = tasks.sample_episode(1, "pick up the green cube")
    cell.reset(robot.HOME, spec.objects)
    x, y, _ = spec.objects["green_cube"]
    _place_cube(cell, "green_cube", (x, y, 0.15))
    result = tasks.evaluate(cell, spec)
    assert not result.success and not result.held
    assert result.lift_m == pytest.approx(0.13)


def test_success_tracker_needs_an_unbroken_dwell() -> None:
    yes = tasks.Evaluation(True, "hold the red cube", True, 0.1, 0.0)
    no = dataclasses.replace(yes, success=False)
    tracker = tasks.SuccessTracker(dwell_s=0.3)
    assert not tracker.update(yes, 1.0)
    assert not tracker.update(yes, 1.2)
    assert not tracker.update(no, 1.25)  # broken: starts over
    assert not tracker.update(yes, 1.3)
    assert not tracker.update(yes, 1.5)
    assert tracker.update(yes, 1.6)
    assert tracker.success_time == pytest.approx(1.3)
    assert tracker.update(no, 1.7) and tracker.succeeded  # success is final


def test_a_cube_carried_by_its_top_edge_is_held(cell: Workcell) -> None:
    """Fingers closed on the top edge (pinch point 3.1 cm above the centre) and lifted 3 cm:
    the pads' geometric test alone (`_held_by`, the positive control for the difference) says
    not held, yet the cube is up and a finger is on it, so it is held and its stage is lift
    (before 2026-12-03 it was "reach" all through such a carry). Gripped 3.4 cm above the
    centre the cube slips out onto the table: not held."""
    spec = specs("pick", 1, start=500)[0]
    labels = tasks.subtask_labels(spec)
    grip_above_centre(cell, spec, 0.031, lift_m=0.03)
    result = tasks.evaluate(cell, spec)
    assert not tasks._held_by(cell, spec.arm, spec.target)
    assert result.held and result.lift_m > tasks.LIFT_STARTED_M, result
    assert result.stage == labels[2]
    grip_above_centre(cell, spec, 0.034, lift_m=0.03)
    result = tasks.evaluate(cell, spec)
    assert not result.held and result.lift_m < tasks.RESTING_M and result.stage == labels[0]
