"""Scripted expert: inverse kinematics, the Plan API (sampling, chunks, phases, smoothness),
reach over the task regions, and physics-only rollouts that succeed through every stage in
order (and fail when judged against another arm or direction)."""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np
import pytest

from oxygen_ros.sim import robot, tasks
from oxygen_ros.sim.expert import ExpertConfig, ScriptedExpert, min_jerk, rollout
from oxygen_ros.sim.kinematics import ArmKinematics, gripper_rotation, rotation_error
from oxygen_ros.sim.workcell import ObjectPose, Workcell, WorkcellConfig

ROLLOUTS_PER_TEMPLATE = 8
MAX_ARM_JOINT_SPEED = 1.2  # rad/s, a bound on every planned arm joint


@pytest.fixture(scope="module")
def cell():
    workcell = Workcell(WorkcellConfig(render=False))
    yield workcell
    workcell.close()


@pytest.fixture(scope="module")
def expert(cell: Workcell) -> ScriptedExpert:
    return ScriptedExpert(cell.model)


def _specs(template: str, count: int) -> list[tasks.EpisodeSpec]:
    specs = (tasks.sample_episode(s) for s in itertools.count())
    return list(itertools.islice((s for s in specs if s.template == template), count))


def _pose(x: float, y: float, yaw: float) -> ObjectPose:
    return ObjectPose(
        np.array((x, y, tasks.CUBE_HALF_SIZE_M)),
        np.array((math.cos(yaw / 2), 0.0, 0.0, math.sin(yaw / 2))),
    )


# ---------------------------------------------------------------------- kinematics
def test_gripper_rotation_is_a_rotation_with_the_given_axes() -> None:
    rotation = gripper_rotation([0, 0, -2], [1, 1, 0.3])
    np.testing.assert_allclose(rotation.T @ rotation, np.eye(3), atol=1e-12)
    assert np.linalg.det(rotation) == pytest.approx(1.0)
    np.testing.assert_allclose(rotation[:, 0], (0, 0, -1))
    np.testing.assert_allclose(rotation[:, 1], np.array((1, 1, 0)) / math.sqrt(2))
    with pytest.raises(ValueError):
        gripper_rotation([0, 0, 1], [0, 0, 3])


@pytest.mark.parametrize("arm", robot.ARMS)
def test_ik_recovers_a_reachable_pose_within_limits_deterministically(
    cell: Workcell, arm: str
) -> None:
    kin = ArmKinematics(cell.model, arm)
    rng = np.random.default_rng(0)
    for _ in range(10):
        q = np.array(robot.HOME_ARM) + rng.uniform(-0.5, 0.5, 6)
        q = np.clip(q, kin.lower + 0.05, kin.upper - 0.05)
        position, rotation = kin.forward(q)
        seed = q + rng.uniform(-0.15, 0.15, 6)
        result = kin.solve(position, rotation, seed)
        assert result.converged
        assert result.position_error_m < 2e-4 and result.orientation_error_rad < 2e-3
        reached, reached_rotation = kin.forward(result.q)
        np.testing.assert_allclose(reached, position, atol=2e-4)
        assert np.linalg.norm(rotation_error(reached_rotation, rotation)) < 2e-3
        assert np.all(result.q >= kin.lower) and np.all(result.q <= kin.upper)
        np.testing.assert_array_equal(kin.solve(position, rotation, seed).q, result.q)


def test_ik_reports_an_unreachable_target(cell: Workcell) -> None:
    kin = ArmKinematics(cell.model, "left")
    far = kin.base_position + np.array((1.5, 0.0, 0.1))
    result = kin.solve(far, gripper_rotation((0, 0, -1), (0, 1, 0)), np.array(robot.HOME_ARM))
    assert not result.converged and result.position_error_m > 0.5


def test_waist_towards_points_each_arm_at_the_middle(cell: Workcell) -> None:
    for arm in robot.ARMS:
        kin = ArmKinematics(cell.model, arm)
        assert kin.waist_towards((0.0, 0.5, 0.0)) == pytest.approx(0.0, abs=1e-4)
        assert kin.waist_towards((0.0, 0.6, 0.0)) * (1 if arm == "left" else -1) > 0.1


# ---------------------------------------------------------------------- plans
def test_min_jerk_is_flat_at_both_ends() -> None:
    assert min_jerk(0.0) == 0.0 and min_jerk(1.0) == 1.0 and min_jerk(0.5) == 0.5
    assert min_jerk(-1.0) == 0.0 and min_jerk(2.0) == 1.0
    assert min_jerk(1e-3) < 1e-8 and 1.0 - min_jerk(1.0 - 1e-3) < 1e-8


@pytest.mark.parametrize("template", list(tasks.TEMPLATES))
def test_plan_api_phases_and_smoothness(
    cell: Workcell, expert: ScriptedExpert, template: str
) -> None:
    spec = _specs(template, 1)[0]
    cell.reset(robot.HOME, spec.objects)
    plan = expert.plan_for(cell, spec)
    labels = tasks.subtask_labels(spec)
    assert plan.labels == labels
    assert plan.start_time == pytest.approx(cell.time)
    assert plan.end_time - plan.start_time < 0.8 * spec.time_limit_s
    np.testing.assert_allclose(plan.sample(plan.start_time), robot.HOME, atol=1e-12)
    np.testing.assert_array_equal(plan.sample(plan.start_time - 1.0), plan.sample(plan.start_time))
    np.testing.assert_array_equal(plan.sample(plan.end_time + 5.0), plan.sample(plan.end_time))
    assert plan.subtask(plan.start_time - 1.0) == labels[0]
    assert plan.subtask(plan.end_time + 5.0) == labels[-1]

    dt = 0.01
    times = np.arange(plan.start_time, plan.end_time + dt, dt)
    rows = plan.rows(plan.start_time, dt, len(times))
    assert rows.shape == (len(times), robot.NUM_JOINTS)
    np.testing.assert_array_equal(rows[17], plan.sample(plan.start_time + 17 * dt))
    phases = [plan.subtask(t) for t in times]
    assert [label for label, _ in itertools.groupby(phases)] == list(labels)

    arm = robot.arm_slice(spec.arm)
    arm_joints = np.arange(arm.start, arm.start + len(robot.ARM_JOINTS))
    other = np.setdiff1d(np.arange(robot.NUM_JOINTS), np.arange(arm.start, arm.stop))
    assert np.all(rows[:, other] == robot.HOME[other])  # the other arm keeps still
    speeds = np.abs(np.diff(rows, axis=0)) / dt
    assert speeds[:, arm_joints].max() < MAX_ARM_JOINT_SPEED
    accelerations = np.abs(np.diff(rows[:, arm_joints], n=2, axis=0)) / dt**2
    assert accelerations.max() < 10.0  # rad/s^2: no steps in velocity
    gripper = rows[:, robot.gripper_index(spec.arm)]
    assert gripper.min() == ExpertConfig().gripper_closed
    assert gripper.max() == pytest.approx(ExpertConfig().gripper_open)


@pytest.mark.parametrize("template", list(tasks.TEMPLATES))
def test_plans_exist_at_the_corners_of_the_target_regions(
    expert: ScriptedExpert, template: str
) -> None:
    """Every extreme of the template's target region and cube yaw is within the arm's reach,
    including the move goals."""
    y_values = tasks.TARGET_Y
    yaws = (-math.pi / 4, 0.0, math.pi / 4 - 1e-6)
    if template == "pick_with_arm":
        cases = [(arm, x) for arm in robot.ARMS for x in tasks.SHARED_X]
    else:
        side_x = tasks.PICK_SIDE_X if template == "pick" else tasks.MOVE_SIDE_X
        cases = [(arm, (-1 if arm == "left" else 1) * x) for arm in robot.ARMS for x in side_x]
    directions = tasks.DIRECTIONS if template == "move" else ("",)
    for (arm, x), y, yaw, direction in itertools.product(cases, y_values, yaws, directions):
        spec = dataclasses.replace(
            tasks.sample_episode(0, tasks.TEMPLATES[template].format(
                colour="red", arm=arm, direction=direction or "left")),
            arm=arm,
            direction=direction,
            objects={"red_cube": (x, y, yaw)},
        )  # fmt: skip
        plan = expert.plan(spec, robot.HOME, {"red_cube": _pose(x, y, yaw)}, 0.0)
        assert plan.end_time > 0.0


# ---------------------------------------------------------------------- rollouts
@pytest.mark.parametrize("template", list(tasks.TEMPLATES))
def test_rollouts_succeed_through_every_stage_in_order(
    cell: Workcell, expert: ScriptedExpert, template: str
) -> None:
    for spec in _specs(template, ROLLOUTS_PER_TEMPLATE):
        result = rollout(spec, expert, workcell=cell)
        assert result.success, spec
        assert result.stages == tasks.subtask_labels(spec), spec
        assert 0.0 < result.time_to_success < spec.time_limit_s


def test_success_lasts_to_the_time_limit_and_leaves_distractors_alone(
    cell: Workcell, expert: ScriptedExpert
) -> None:
    for template in tasks.TEMPLATES:
        spec = _specs(template, 2)[1]
        result = rollout(spec, expert, control_hz=70.0, workcell=cell, stop_on_success=False)
        assert result.success and result.stages[-1] == tasks.subtask_labels(spec)[-1]
        assert tasks.evaluate(cell, spec).success
        for name, (x, y, _) in spec.objects.items():
            if name != spec.target:
                position = cell.object_pose(name).position
                np.testing.assert_allclose(position, (x, y, 0.02), atol=2e-3)


def test_success_is_judged_for_the_named_arm_and_direction(
    cell: Workcell, expert: ScriptedExpert
) -> None:
    """The expert does the task; the same final state fails an instruction with another arm
    (pick) or the other direction (move)."""
    spec = tasks.sample_episode(5, "pick up the red cube with the left arm")
    assert rollout(spec, expert, workcell=cell).success
    other_arm = tasks.sample_episode(5, "pick up the red cube with the right arm")
    assert other_arm.objects == spec.objects
    result = tasks.evaluate(cell, other_arm)
    assert not result.success and result.stage == "reach the red cube"

    spec = tasks.sample_episode(6, "move the green cube to the right")
    assert rollout(spec, expert, workcell=cell).success
    other_way = dataclasses.replace(
        spec, direction="left", instruction="move the green cube to the left"
    )
    assert not tasks.evaluate(cell, other_way).success
