"""The reactive expert: physics-only episodes succeed through every stage in order (also under
command noise, and after a dropped cube), its command is a
function of the current state only (where the feedback expert's phase machine is not), with
`keep_held` a grip off the centre is kept and lifted, and generate_demos records it."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from grips import CONTROL_DT, grip_above_centre, specs

from oxygen_ros.sim import generate_demos, robot, tasks
from oxygen_ros.sim.expert import ExpertConfig
from oxygen_ros.sim.feedback_expert import FeedbackExpert
from oxygen_ros.sim.reactive_expert import ReactiveConfig, ReactiveExpert
from oxygen_ros.sim.recorder import episode_path, read_episode
from oxygen_ros.sim.workcell import Workcell, WorkcellConfig

EPISODES_PER_TEMPLATE = 6


@pytest.fixture(scope="module")
def cell():
    workcell = Workcell(WorkcellConfig(render=False))
    yield workcell
    workcell.close()


def _run(
    cell: Workcell,
    expert: ReactiveExpert | FeedbackExpert,
    spec: tasks.EpisodeSpec,
    noise_rad: float = 0.0,
    drop_at_stage: int | None = None,
) -> tuple[bool, list[str], list[bool]]:
    """One episode at the control rate: (succeeded, evaluate's stages with consecutive repeats
    merged, held per tick). With `drop_at_stage`, the first time evaluate reaches that stage
    the gripper is commanded open for 0.4 s instead of the expert's value (the cube falls)."""
    cell.reset(robot.HOME, spec.objects)
    start = cell.time
    expert.reset(cell, spec)
    noise = generate_demos.CommandNoise(noise_rad, CONTROL_DT, spec.seed)
    tracker = tasks.SuccessTracker()
    labels = tasks.subtask_labels(spec)
    stages: list[str] = []
    held: list[bool] = []
    drop_ticks = 0
    while cell.time - start < spec.time_limit_s and not tracker.succeeded:
        target = expert.command(cell)
        if isinstance(expert, ReactiveExpert):  # (the feedback expert: its phase's label)
            assert expert.subtask == (stages[-1] if stages else labels[0])
        if drop_ticks > 0:
            target[robot.gripper_index(spec.arm)] = expert.config.waypoints.gripper_open
            drop_ticks -= 1
        cell.set_targets(target + noise.sample())
        cell.step(CONTROL_DT)
        evaluation = tasks.evaluate(cell, spec)
        if not stages or stages[-1] != evaluation.stage:
            stages.append(evaluation.stage)
        held.append(evaluation.held)
        if drop_at_stage is not None and evaluation.stage == labels[drop_at_stage]:
            drop_at_stage, drop_ticks = None, round(0.4 / CONTROL_DT)
        tracker.update(evaluation, cell.time)
    return tracker.succeeded, stages, held


# DAgger's wide funnel (`dagger --aligned-m 0.01 --gripper-open 1.0 --keep-held`): it descends
# and closes 10 mm off the centre, its fingers 6.9 cm apart around the 4 cm cube
WIDE = ReactiveConfig(
    waypoints=ExpertConfig(gripper_open=1.0), aligned_m=0.01, close_xy_m=0.01, keep_held=True
)


@pytest.mark.parametrize(
    "config",
    [ReactiveConfig(), WIDE, dataclasses.replace(WIDE, grip_high_m=0.012)],
    ids=["default", "wide", "wide_grip_high"],
)
@pytest.mark.parametrize("template", list(tasks.TEMPLATES))
def test_episodes_succeed_through_every_stage_in_order(
    cell: Workcell, template: str, config: ReactiveConfig
) -> None:
    expert = ReactiveExpert(cell.model, config)
    for spec in specs(template, EPISODES_PER_TEMPLATE):
        succeeded, stages, _ = _run(cell, expert, spec)
        assert succeeded, spec
        assert tuple(stages) == tasks.subtask_labels(spec), spec
        assert expert.unreachable_ticks == 0, spec


def test_episodes_succeed_under_command_noise(cell: Workcell) -> None:
    """DART's noise at 0.01 rad (correlated) on every arm command (seeds 0-19: 20/20; at
    0.02 rad 14/20, the six failures all moves, where the feedback expert has 15/20)."""
    expert = ReactiveExpert(cell.model)
    for template in tasks.TEMPLATES:
        for spec in specs(template, 2, start=100):
            assert _run(cell, expert, spec, noise_rad=0.01)[0], spec


@pytest.mark.parametrize("template", ["pick", "move"])
def test_a_dropped_cube_is_grasped_again(cell: Workcell, template: str) -> None:
    """The gripper is forced open for 0.4 s once the cube is lifted: the cube falls (held goes
    from true to false), the expert, remembering nothing, goes back for it and succeeds."""
    expert = ReactiveExpert(cell.model)
    spec = specs(template, 1, start=200)[0]
    succeeded, stages, held = _run(cell, expert, spec, drop_at_stage=2)
    labels = tasks.subtask_labels(spec)
    assert succeeded, (spec, stages)
    first_drop = next(i for i in range(1, len(held)) if held[i - 1] and not held[i])
    assert any(held[first_drop:]), "the cube was never held again"
    lift = stages.index(labels[2])
    assert labels[1] in stages[lift + 1 :] or labels[0] in stages[lift + 1 :], stages


def test_command_depends_on_the_state_alone(cell: Workcell) -> None:
    """Mid-episode (the cube held and rising), the physics state is saved with the command; a
    fresh expert and one that has just run another episode give the same command from that
    state restored. Positive control: a fresh feedback expert from the same state does not
    give its own episode's command (its phase machine starts over at the approach)."""
    spec = specs("move", 1, start=300)[0]
    labels = tasks.subtask_labels(spec)
    for make in (ReactiveExpert, FeedbackExpert):
        expert = make(cell.model)
        cell.reset(robot.HOME, spec.objects)
        expert.reset(cell, spec)
        while tasks.evaluate(cell, spec).stage != labels[2]:  # lift
            cell.set_targets(expert.command(cell))
            cell.step(CONTROL_DT)
        state = cell.physics_state()
        reference = expert.command(cell)
        other = specs("pick", 1, start=300)[0]
        _run(cell, expert, other)  # another episode's history
        cell.set_physics_state(state)
        expert.reset(cell, spec)
        again = expert.command(cell)
        fresh = make(cell.model)
        cell.set_physics_state(state)
        fresh.reset(cell, spec)
        from_fresh = fresh.command(cell)
        if make is ReactiveExpert:
            np.testing.assert_array_equal(again, reference)
            np.testing.assert_array_equal(from_fresh, reference)
        else:
            gripper = robot.gripper_index(spec.arm)
            assert reference[gripper] == expert.config.waypoints.gripper_closed
            assert from_fresh[gripper] == expert.config.waypoints.gripper_open  # starts over


def test_the_gripper_closes_only_at_the_cube_centre(cell: Workcell) -> None:
    """From the state at the approach point above the cube the command keeps the gripper open;
    with the pinch within the closing box it closes (the configured thresholds, both sides)."""
    spec = specs("pick", 1, start=400)[0]
    config = ReactiveConfig()
    expert = ReactiveExpert(cell.model, config)
    cell.reset(robot.HOME, spec.objects)
    expert.reset(cell, spec)
    gripper = robot.gripper_index(spec.arm)
    decisions = []
    start = cell.time
    while cell.time - start < spec.time_limit_s:
        target = expert.command(cell)
        cube = cell.object_pose(spec.target).position
        pinch = cell.site_position(f"{spec.arm}_pinch")
        inside = (
            np.linalg.norm((cube - pinch)[:2]) <= config.close_xy_m
            and abs(float((pinch - cube)[2])) <= config.close_z_m
        )
        measured = cell.joint_positions()[gripper]
        if measured > config.closing_below:  # open: the box alone decides
            decisions.append((inside, target[gripper] == config.waypoints.gripper_closed))
        if tasks.evaluate(cell, spec).stage == tasks.subtask_labels(spec)[2]:
            break
        cell.set_targets(target)
        cell.step(CONTROL_DT)
    assert decisions and all(inside == closes for inside, closes in decisions), decisions
    assert any(closes for _, closes in decisions) and not all(c for _, c in decisions)


def test_generate_demos_records_the_reactive_expert(tmp_path) -> None:
    cell = Workcell(WorkcellConfig())
    try:
        expert = generate_demos.make_expert("reactive", cell)
        assert isinstance(expert, ReactiveExpert)
        path = episode_path(tmp_path, 0)
        assert generate_demos.generate_episode(cell, expert, 1003, path, 0)
    finally:
        cell.close()
    episode = read_episode(path)
    labels = tasks.subtask_labels(tasks.sample_episode(1003))
    assert episode.success and episode.extra["expert"] == "reactive"
    order = [labels.index(s) for s in episode.extra["plan_subtasks"]]
    assert order[0] == 0 and order[-1] == len(labels) - 1 and np.all(np.diff(order) >= 0)


def test_keep_held_lifts_a_cube_held_off_the_centre(cell: Workcell) -> None:
    """The cube held and lifted with the pinch point just beyond `near_m` above its centre: by
    default the expert lets go (the grip reads as open: it goes down to the centre, gripper
    open); with `keep_held` it keeps the gripper closed, steers straight up (the grip's offset
    kept) and the pick succeeds."""
    spec = specs("pick", 1, start=500)[0]
    config = ReactiveConfig()
    grip_above_centre(cell, spec, config.near_m + 0.002)
    evaluation = tasks.evaluate(cell, spec)
    assert evaluation.held and evaluation.lift_m >= config.kept_lift_m, evaluation
    assert evaluation.pinch_distance_m > config.near_m, evaluation
    pinch = cell.site_position(f"{spec.arm}_pinch")
    default = ReactiveExpert(cell.model, config)
    default.reset(cell, spec)
    target, open_gripper = default.pinch_and_gripper(cell)
    assert open_gripper and target[2] < pinch[2]  # positive control: lets go
    keeper = ReactiveExpert(cell.model, dataclasses.replace(config, keep_held=True))
    keeper.reset(cell, spec)
    target, open_gripper = keeper.pinch_and_gripper(cell)
    assert not open_gripper
    np.testing.assert_allclose(target[:2], pinch[:2], atol=1e-3)  # straight up, offset kept
    assert target[2] > pinch[2] + 0.02
    tracker = tasks.SuccessTracker()
    start = cell.time
    while cell.time - start < 5.0 and not tracker.succeeded:
        cell.set_targets(keeper.command(cell))
        cell.step(CONTROL_DT)
        evaluation = tasks.evaluate(cell, spec)
        assert evaluation.held, "the kept grip let the cube go"
        tracker.update(evaluation, cell.time)
    assert tracker.succeeded


def test_grip_high_lets_go_of_a_top_edge_grip_and_grasps_at_the_centre(cell: Workcell) -> None:
    """Fingers closed on the cube's top part (pinch 20 mm above its centre), the cube still on
    the table: by default the expert holds and lifts (the positive control); with
    `grip_high_m` it opens and descends, grasps again at the centre and the pick succeeds."""
    spec = specs("pick", 1, start=500)[0]
    config = ReactiveConfig()
    grip_above_centre(cell, spec, 0.02, lift_m=0.0)
    evaluation = tasks.evaluate(cell, spec)
    assert evaluation.held and evaluation.lift_m <= config.resting_m, evaluation
    pinch = cell.site_position(f"{spec.arm}_pinch")
    default = ReactiveExpert(cell.model, config)
    default.reset(cell, spec)
    target, open_gripper = default.pinch_and_gripper(cell)
    assert not open_gripper and target[2] > pinch[2]  # positive control: lifts the top grip
    low = ReactiveExpert(cell.model, dataclasses.replace(config, grip_high_m=0.012))
    low.reset(cell, spec)
    target, open_gripper = low.pinch_and_gripper(cell)
    assert open_gripper and target[2] < pinch[2] - 0.015
    tracker = tasks.SuccessTracker()
    grasped_at = None
    start = cell.time
    while cell.time - start < 8.0 and not tracker.succeeded:
        cell.set_targets(low.command(cell))
        cell.step(CONTROL_DT)
        evaluation = tasks.evaluate(cell, spec)
        if evaluation.lift_m >= config.kept_lift_m and grasped_at is None:
            grasped_at = evaluation.pinch_distance_m
        tracker.update(evaluation, cell.time)
    assert tracker.succeeded
    assert grasped_at is not None and grasped_at <= 0.01, grasped_at  # lifted from the centre
