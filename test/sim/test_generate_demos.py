"""ROS-free demonstrations: successful, labelled with the simulator's stages, and the same
bytes when regenerated from the same seed."""

from __future__ import annotations

import numpy as np
import pytest

from oxygen_ros.sim import generate_demos, tasks
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
