"""DAgger's labels (oxygen_ros.training.dagger): the feedback (and the reactive) expert's chunk
from a state is exactly the chunk generate_demos records from it, labelling leaves the episode
unchanged, the labelling policy executes the learner (or the expert with beta = 1, which then
succeeds) and records a label per observation, written as an episode file that training loads
with those labels, and with `regrasp_m` the feedback expert starts over after a lost grasp
(without it, it does not); a reactive configuration reaches the reactive expert (and no other)."""

from __future__ import annotations

import numpy as np
import pytest

from oxygen_ros.engine.config import get_model_config
from oxygen_ros.sim import generate_demos, robot, tasks
from oxygen_ros.sim.feedback_expert import FeedbackConfig, FeedbackExpert
from oxygen_ros.sim.reactive_expert import ReactiveConfig
from oxygen_ros.sim.recorder import episode_path, read_episode
from oxygen_ros.sim.workcell import Workcell, WorkcellConfig
from oxygen_ros.training import dagger, data, rollout

PICK_SEED = 1  # pick_with_arm (the shortest template)
HORIZON = dagger.LabelConfig().horizon


@pytest.mark.parametrize("kind", dagger.LABELLERS)
def test_the_chunk_from_each_recorded_state_is_the_recorded_chunk(tmp_path, kind: str) -> None:
    # Both workcells are fresh: their clocks run alike, so the phase timers match bit for bit.
    recording = Workcell(WorkcellConfig())
    try:
        path = episode_path(tmp_path, 0)
        demo_expert = generate_demos.make_expert(kind, recording)
        assert generate_demos.generate_episode(recording, demo_expert, PICK_SEED, path, 0)
    finally:
        recording.close()
    episode = read_episode(path)
    recorded = episode.action[data.chunk_indices(len(episode.action), HORIZON)]

    cell = Workcell(WorkcellConfig(render=False))
    try:
        expert = dagger.make_labeller(kind, cell, regrasp_m=None)
        spec = tasks.sample_episode(PICK_SEED)
        cell.reset(robot.HOME, spec.objects)
        expert.reset(cell, spec)
        per_frame = round(generate_demos.CONTROL_HZ / generate_demos.FPS)
        chunks, labels = [], []
        for tick in range(per_frame * (len(recorded) - HORIZON)):
            if tick % per_frame == 0:
                np.testing.assert_allclose(
                    cell.joint_positions(), episode.qpos[len(chunks)], atol=1e-6
                )
                rows, subtask = dagger.expert_chunk(cell, expert)
                chunks.append(rows)
                labels.append(subtask)
                target = rows[0]
            else:
                target = expert.command(cell)
            cell.set_targets(target)
            cell.step(1.0 / generate_demos.CONTROL_HZ)
    finally:
        cell.close()
    chunks = np.stack(chunks).astype(recorded.dtype)  # as the recorder stores them
    # The labelled run stayed on the recorded trajectory (qpos asserted above) and every chunk
    # is the recorded one; the comparison tells a chunk one frame late apart.
    np.testing.assert_array_equal(chunks, recorded[: len(chunks)])
    assert not np.array_equal(chunks[1:], recorded[: len(chunks) - 1])
    assert labels == episode.extra["plan_subtasks"][: len(labels)]


class _Hold:
    """A learner that keeps the arms where they are (never reaches the cube)."""

    def __init__(self) -> None:
        self.calls = 0

    def reset(self, workcell, spec) -> None:
        pass

    def act(self, workcell, observation):
        self.calls += 1
        return np.tile(observation.state[: robot.NUM_JOINTS], (HORIZON, 1)), None


class _Refuse:
    def reset(self, workcell, spec) -> None:
        pass

    def act(self, workcell, observation):
        raise AssertionError("beta = 1 must not ask the learner")


@pytest.fixture(scope="module")
def cell():
    workcell = Workcell(WorkcellConfig())
    yield workcell
    workcell.close()


def test_the_learner_runs_and_every_observation_is_labelled_and_recorded(cell, tmp_path) -> None:
    config = rollout.RolloutConfig(execute_s=0.5, speak=False)
    learner = _Hold()
    labels = dagger.Labels()
    policy = dagger.RecordingLabeller(
        learner, FeedbackExpert(cell.model), labels, out=tmp_path, first_index=4
    )
    result = rollout.run_episode(policy, cell, PICK_SEED, config)
    path = policy.finish(result)
    assert not result.success and result.furthest_stage == 0
    arrays = labels.arrays()
    assert learner.calls == result.frames == len(arrays["state"]) == len(labels.subtask)
    assert arrays["actions"].shape == (result.frames, HORIZON, robot.NUM_JOINTS)
    assert set(arrays["seed"]) == {PICK_SEED}
    # The arm held still, so the expert is still reaching and each label leads the joints
    # towards the cube by the expert's lead.
    spec = tasks.sample_episode(PICK_SEED)
    assert set(labels.subtask) == {tasks.subtask_labels(spec)[0]}
    arm = np.arange(robot.arm_slice(spec.arm).start, robot.arm_slice(spec.arm).stop)
    arm = arm[arm != robot.gripper_index(spec.arm)]
    lead = np.abs(arrays["actions"][:, 0, arm] - arrays["state"][:, arm]).max(axis=1)
    assert lead.max() == pytest.approx(FeedbackConfig().lead_rad, abs=1e-3)

    # The file: one step per observation with the expert's chunk, and training loads a failed
    # relabelled episode with those chunks as its actions.
    assert path == episode_path(tmp_path, 4)
    episode = read_episode(path)
    assert not episode.success and episode.num_steps == result.frames
    np.testing.assert_array_equal(episode.action_chunk, arrays["actions"])
    np.testing.assert_array_equal(episode.action, arrays["actions"][:, 0])
    np.testing.assert_array_equal(episode.qpos, arrays["state"][:, : robot.NUM_JOINTS])
    assert episode.extra["expert_subtasks"] == labels.subtask
    loaded = data.load_episodes([path], get_model_config("workcell"))
    np.testing.assert_array_equal(loaded.actions, arrays["actions"])
    assert loaded.state.shape == (result.frames, robot.NUM_JOINTS)


def test_beta_one_executes_the_experts_chunks_which_succeed(cell) -> None:
    config = rollout.RolloutConfig(execute_s=0.1, speak=False)
    labels = dagger.Labels()
    policy = dagger.LabellingPolicy(_Refuse(), FeedbackExpert(cell.model), labels, beta=1.0)
    result = rollout.run_episode(policy, cell, PICK_SEED, config)
    assert result.success, result
    assert labels.subtask[0] != labels.subtask[-1]  # the labels followed the phases


def test_beta_outside_unit_interval_is_refused(cell) -> None:
    with pytest.raises(ValueError, match="beta"):
        dagger.LabellingPolicy(_Hold(), FeedbackExpert(cell.model), dagger.Labels(), beta=1.5)


def test_a_reactive_config_reaches_only_the_reactive_labeller(cell) -> None:
    config = ReactiveConfig(keep_held=True, aligned_m=0.01)
    assert dagger.make_labeller("reactive", cell, reactive=config).config == config
    assert dagger.make_labeller("reactive", cell).config == ReactiveConfig()
    with pytest.raises(ValueError, match="reactive expert only"):
        dagger.make_labeller("feedback", cell, reactive=config)
    # the command line's: one width to descend and close within, the open gripper's value
    assert dagger.reactive_config() == ReactiveConfig()
    wide = dagger.reactive_config(True, 0.01, 1.0)
    assert wide.keep_held and wide.aligned_m == wide.close_xy_m == 0.01
    assert wide.waypoints.gripper_open == 1.0
    assert wide.close_z_m == ReactiveConfig().close_z_m and wide.grip_high_m == 0.0
    assert dagger.reactive_config(grip_high_m=0.012).grip_high_m == 0.012


class _CollectedError(Exception):
    """Raised by a stand-in for dagger.collect: main got as far as collecting."""


@pytest.mark.parametrize(
    "flag",
    [
        ["--keep-held"],
        ["--aligned-m", "0.01"],
        ["--gripper-open", "1"],
        ["--grip-high-m", "0.012"],
    ],
)
def test_main_refuses_reactive_flags_for_another_expert(monkeypatch, flag) -> None:
    def collect(*args):
        raise _CollectedError(args)

    monkeypatch.setattr(dagger, "collect", collect)
    base = ["--checkpoint", "expert", "--seeds", "0:1", "--out", "unused"]
    with pytest.raises(SystemExit):  # a reactive flag with the feedback labeller
        dagger.main([*base, "--expert", "feedback", *flag])
    with pytest.raises(_CollectedError) as plain:  # positive control: no flag goes on to collect
        dagger.main([*base, "--expert", "feedback"])
    assert plain.value.args[0][-1] is None
    with pytest.raises(_CollectedError) as reactive:  # the reactive labeller takes the flag
        dagger.main([*base, "--expert", "reactive", *flag])
    assert reactive.value.args[0][-1] != ReactiveConfig()


def test_main_passes_blend_steps_to_the_rollout_config(monkeypatch) -> None:
    def collect(*args):
        raise _CollectedError(args)

    monkeypatch.setattr(dagger, "collect", collect)
    base = ["--checkpoint", "expert", "--seeds", "0:1", "--out", "unused"]
    with pytest.raises(_CollectedError) as plain:
        dagger.main(base)
    assert plain.value.args[0][3].blend_steps == 0  # off unless asked (the control)
    with pytest.raises(_CollectedError) as blended:
        dagger.main([*base, "--blend-steps", "3"])
    assert blended.value.args[0][3].blend_steps == 3


@pytest.mark.parametrize("regrasp_m", [None, 0.03])
def test_a_lost_grasp_starts_over_only_with_regrasp(regrasp_m) -> None:
    cell = Workcell(WorkcellConfig(render=False))
    try:
        expert = FeedbackExpert(cell.model, FeedbackConfig(regrasp_m=regrasp_m))
        spec = tasks.sample_episode(PICK_SEED)
        labels = tasks.subtask_labels(spec)
        cell.reset(robot.HOME, spec.objects)
        expert.reset(cell, spec)
        dt = 1.0 / generate_demos.CONTROL_HZ
        for _ in range(round(spec.time_limit_s / dt)):
            target = expert.command(cell)
            if expert.subtask == labels[3]:  # lifted: holding the cube up
                break
            cell.set_targets(target)
            cell.step(dt)
        assert expert.subtask == labels[3]
        # The learner opens the gripper: the cube drops.
        target[robot.gripper_index(spec.arm)] = expert.config.waypoints.gripper_open
        for _ in range(round(1.0 / dt)):
            cell.set_targets(target)
            cell.step(dt)
        expert.command(cell)
        assert expert.subtask == (labels[3] if regrasp_m is None else labels[0])
    finally:
        cell.close()
