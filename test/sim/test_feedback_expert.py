"""The state-feedback expert: physics-only episodes succeed through every stage in order (also
under command noise), its command is a function of the measured state that steers a deviation
back (where the scripted plan's target ignores it), and generate_demos records it."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from oxygen_ros.sim import generate_demos, robot, tasks
from oxygen_ros.sim.expert import ScriptedExpert
from oxygen_ros.sim.feedback_expert import FeedbackConfig, FeedbackExpert
from oxygen_ros.sim.recorder import episode_path, read_episode
from oxygen_ros.sim.workcell import Workcell, WorkcellConfig

EPISODES_PER_TEMPLATE = 6
CONTROL_DT = 1.0 / generate_demos.CONTROL_HZ


@pytest.fixture(scope="module")
def cell():
    workcell = Workcell(WorkcellConfig(render=False))
    yield workcell
    workcell.close()


def _specs(template: str, count: int) -> list[tasks.EpisodeSpec]:
    specs = (tasks.sample_episode(s) for s in itertools.count())
    return list(itertools.islice((s for s in specs if s.template == template), count))


def _run(
    cell: Workcell, expert: FeedbackExpert, spec: tasks.EpisodeSpec, noise_rad: float = 0.0
) -> tuple[bool, list[str], list[str]]:
    """One episode at the control rate: (succeeded, evaluate's stages and the expert's labels,
    consecutive repeats merged)."""
    cell.reset(robot.HOME, spec.objects)
    start = cell.time
    expert.reset(cell, spec)
    noise = generate_demos.CommandNoise(noise_rad, CONTROL_DT, spec.seed)
    tracker = tasks.SuccessTracker()
    stages: list[str] = []
    labels: list[str] = []
    while cell.time - start < spec.time_limit_s and not tracker.succeeded:
        target = expert.command(cell)
        if not labels or labels[-1] != expert.subtask:
            labels.append(expert.subtask)
        cell.set_targets(target + noise.sample())
        cell.step(CONTROL_DT)
        evaluation = tasks.evaluate(cell, spec)
        if not stages or stages[-1] != evaluation.stage:
            stages.append(evaluation.stage)
        tracker.update(evaluation, cell.time)
    return tracker.succeeded, stages, labels


@pytest.mark.parametrize("template", list(tasks.TEMPLATES))
def test_episodes_succeed_through_every_stage_in_order(cell: Workcell, template: str) -> None:
    expert = FeedbackExpert(cell.model)
    for spec in _specs(template, EPISODES_PER_TEMPLATE):
        succeeded, stages, labels = _run(cell, expert, spec)
        assert succeeded, spec
        assert tuple(stages) == tasks.subtask_labels(spec), spec
        assert tuple(labels) == tasks.subtask_labels(spec), spec


def test_episodes_succeed_under_command_noise(cell: Workcell) -> None:
    """DART's noise (0.01 rad, correlated) on every command: the feedback steers back (at
    0.02 rad, 5 of seeds 0-19 never get within the grasp tolerance)."""
    expert = FeedbackExpert(cell.model)
    for template in tasks.TEMPLATES:
        for spec in _specs(template, 2):
            assert _run(cell, expert, spec, noise_rad=0.01)[0], spec


def test_command_steers_a_deviation_back_where_the_plan_does_not(cell: Workcell) -> None:
    """Same episode, same instant, the arm moved off by 0.1 rad on one joint: the feedback
    command moves with the measured joints and leads back towards the waypoint by at most
    `lead_rad`; the scripted plan's target is the same in both states (its positive control:
    it is a function of time only)."""
    spec = _specs("pick", 1)[0]
    config = FeedbackConfig()
    expert = FeedbackExpert(cell.model, config)
    arm = np.arange(robot.arm_slice(spec.arm).start, robot.arm_slice(spec.arm).start + 6)
    commands, plan_targets = [], []
    for offset in (0.0, 0.1):
        home = np.array(robot.HOME, np.float64)
        home[arm[1]] += offset  # the shoulder
        cell.reset(home, spec.objects)
        expert.reset(cell, spec)
        measured = cell.joint_positions()
        command = expert.command(cell)
        assert np.max(np.abs(command[arm] - measured[arm])) <= config.lead_rad + 1e-9
        commands.append((measured, command))
        plan = ScriptedExpert(cell.model).plan(
            spec, robot.HOME, {spec.target: cell.object_pose(spec.target)}, cell.time
        )
        plan_targets.append(plan.sample(cell.time + 0.5))
    (measured_a, command_a), (measured_b, command_b) = commands
    # The command follows the measured shoulder (state feedback) ...
    assert abs((command_b - command_a)[arm[1]]) > 0.05
    # ... and its lead points the deviated shoulder back (the deviation was +0.1).
    assert (command_b - measured_b)[arm[1]] < (command_a - measured_a)[arm[1]]
    np.testing.assert_array_equal(plan_targets[0], plan_targets[1])


def test_generate_demos_records_the_feedback_expert(tmp_path) -> None:
    cell = Workcell(WorkcellConfig())
    try:
        expert = generate_demos.make_expert("feedback", cell)
        path = episode_path(tmp_path, 0)
        assert generate_demos.generate_episode(cell, expert, 1003, path, 0)
        with pytest.raises(ValueError, match="expert must be one of"):
            generate_demos.make_expert("oracle", cell)
    finally:
        cell.close()
    episode = read_episode(path)
    spec = tasks.sample_episode(1003)
    labels = tasks.subtask_labels(spec)
    assert episode.success and episode.extra["expert"] == "feedback"
    assert episode.extra["plan_subtasks"][0] == labels[0]
    order = [labels.index(s) for s in episode.extra["plan_subtasks"]]
    assert order[-1] == len(labels) - 1 and np.all(np.diff(order) >= 0)


def test_a_waypoint_out_of_reach_is_steered_to_not_raised(cell: Workcell) -> None:
    """A cube pushed beyond the arm's reach (here placed there): the command stays finite and
    within the lead, and the unreachable ticks are counted (a reachable one counts none)."""
    spec = _specs("pick", 1)[0]
    expert = FeedbackExpert(cell.model)
    cell.reset(robot.HOME, spec.objects)
    expert.reset(cell, spec)
    expert.command(cell)
    assert expert.unreachable_ticks == 0
    far = dict(spec.objects)
    far[spec.target] = (0.0, 1.5, 0.0)  # a metre beyond the table
    cell.reset(robot.HOME, far)
    expert.reset(cell, spec)
    measured = cell.joint_positions()
    command = expert.command(cell)
    assert np.all(np.isfinite(command))
    assert np.max(np.abs(command - measured)[robot.arm_columns(spec.arm)]) <= 0.04 + 1e-9
    assert expert.unreachable_ticks == 1
