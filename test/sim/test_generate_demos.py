"""ROS-free demonstrations: successful, labelled with the simulator's stages, and the same
bytes when regenerated from the same seed."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

from oxygen_ros.sim import generate_demos, robot, tasks
from oxygen_ros.sim.expert import ScriptedExpert
from oxygen_ros.sim.recorder import episode_path, read_episode
from oxygen_ros.sim.workcell import Workcell, WorkcellConfig

pytestmark = pytest.mark.slow
SEED = 1003


@pytest.fixture(scope="module")
def workcell():
    cell = Workcell(WorkcellConfig())
    yield cell
    cell.close()


def test_regenerating_a_seed_gives_the_same_episode(workcell, tmp_path) -> None:
    """Two fresh workcells (sim time starts at 0 in each, as in every `generate` run)."""
    paths = [episode_path(tmp_path / name, 0) for name in ("a", "b")]
    for path in paths:
        cell = Workcell(WorkcellConfig())
        try:
            expert = ScriptedExpert(cell.model)
            assert generate_demos.generate_episode(cell, expert, SEED, path, 0)
        finally:
            cell.close()
    first, second = (read_episode(p) for p in paths)
    for name in ("qpos", "qvel", "action", "timestamps", "sim_state"):
        np.testing.assert_array_equal(getattr(first, name), getattr(second, name), name)
    for camera in first.camera_names:
        np.testing.assert_array_equal(first.images[camera], second.images[camera], camera)
    assert first.subtasks == second.subtasks

    spec = tasks.sample_episode(SEED)
    labels = tasks.subtask_labels(spec)
    assert first.success and first.seed == SEED and first.instruction == spec.instruction
    assert first.fps == generate_demos.FPS
    np.testing.assert_allclose(np.diff(first.timestamps), 1.0 / generate_demos.FPS, atol=1e-9)
    # Labels are the simulator's stages: from the task's phases, in order, ending at the last.
    order = [labels.index(s) for s in first.subtasks]
    assert order[0] == 0 and order[-1] == len(labels) - 1 and np.all(np.diff(order) >= 0)
    # The plan's own labels ride along and differ somewhere (what the stages add).
    assert len(first.extra["plan_subtasks"]) == len(first.subtasks)
    assert any(p != s for p, s in zip(first.extra["plan_subtasks"], first.subtasks, strict=True))


def test_the_recorded_state_replays_to_the_recorded_stage(workcell, tmp_path) -> None:
    expert = ScriptedExpert(workcell.model)
    path = episode_path(tmp_path, 0)
    generate_demos.generate_episode(workcell, expert, SEED + 1, path, 0)
    episode = read_episode(path)
    spec = tasks.sample_episode(SEED + 1)
    for step in range(0, len(episode.subtasks), 7):
        workcell.set_physics_state(episode.sim_state[step])
        assert tasks.evaluate(workcell, spec).stage == episode.subtasks[step]
        np.testing.assert_allclose(workcell.joint_positions(), episode.qpos[step], atol=1e-6)


def test_split_range_is_contiguous_and_balanced() -> None:
    assert generate_demos.split_range(7, 3) == [(0, 3), (3, 2), (5, 2)]
    assert generate_demos.split_range(2, 4) == [(0, 1), (1, 1)]
    with pytest.raises(ValueError, match="workers >= 1"):
        generate_demos.generate(pathlib.Path("unused"), 2, SEED, workers=0)


def test_two_workers_write_what_a_fresh_workcell_writes_per_seed(tmp_path) -> None:
    """Each worker starts its own workcell at sim time 0: the second worker's only episode
    (index 1, seed SEED + 1) is the one a fresh single-process run writes for that seed."""
    summary = generate_demos.generate(tmp_path / "pool", 2, SEED, workers=2)
    assert summary["succeeded"] == 2 and summary["workers"] == 2
    cell = Workcell(WorkcellConfig())
    try:
        alone = episode_path(tmp_path / "alone", 0)
        assert generate_demos.generate_episode(
            cell, ScriptedExpert(cell.model), SEED + 1, alone, 0
        )
    finally:
        cell.close()
    pooled, single = read_episode(episode_path(tmp_path / "pool", 1)), read_episode(alone)
    assert pooled.seed == single.seed == SEED + 1
    for name in ("qpos", "action", "sim_state"):
        np.testing.assert_array_equal(getattr(pooled, name), getattr(single, name), name)
    for camera in pooled.camera_names:
        np.testing.assert_array_equal(pooled.images[camera], single.images[camera], camera)
    assert read_episode(episode_path(tmp_path / "pool", 0)).seed == SEED


def test_command_noise_is_correlated_seeded_and_leaves_the_grippers_alone() -> None:
    dt = 1.0 / generate_demos.CONTROL_HZ
    draws = [generate_demos.CommandNoise(0.05, dt, seed=7) for _ in range(2)]
    first = np.array([draws[0].sample().copy() for _ in range(20000)])
    again = np.array([draws[1].sample().copy() for _ in range(20000)])
    np.testing.assert_array_equal(first, again)  # seeded
    grippers = [i for i, name in enumerate(robot.JOINT_NAMES) if name.endswith("_gripper")]
    assert not first[:, grippers].any()
    arm = np.delete(first, grippers, axis=1)
    assert 0.04 < arm[5000:].std() < 0.06  # the stationary standard deviation
    # Correlated over NOISE_TIME_CONSTANT_S: a tick moves it by sqrt(1 - a^2) sigma (std).
    decay = np.exp(-dt / generate_demos.NOISE_TIME_CONSTANT_S)
    step = np.diff(arm, axis=0).std()
    assert 0.9 < step / (0.05 * np.sqrt(1 - decay**2)) < 1.1
    zero = generate_demos.CommandNoise(0.0, dt, seed=7)
    assert not any(zero.sample().any() for _ in range(10))


def test_command_noise_moves_the_arm_but_records_the_clean_plan(tmp_path) -> None:
    """DART: the same seed with and without noise (fresh workcells, so the same plan): the
    recorded targets agree where both episodes run, the recorded joint states do not."""
    episodes = []
    for noise in (0.0, 0.03):
        cell = Workcell(WorkcellConfig())
        try:
            path = episode_path(tmp_path / str(noise), 0)
            generate_demos.generate_episode(
                cell, ScriptedExpert(cell.model), SEED, path, 0, command_noise_rad=noise
            )
        finally:
            cell.close()
        episodes.append(read_episode(path))
    clean, noisy = episodes
    n = min(len(clean.action), len(noisy.action))
    np.testing.assert_array_equal(noisy.action[:n], clean.action[:n])
    assert np.abs(noisy.qpos[:n] - clean.qpos[:n]).max() > 0.01  # the noise took effect
    assert noisy.extra["command_noise_rad"] == 0.03
