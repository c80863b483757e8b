"""Episode files: exact round trip of every dataset and attribute, atomic publication,
validation, and listing a directory in episode index order."""

import math
from pathlib import Path

import h5py
import numpy as np
import pytest

from oxygen_ros.sim.recorder import (
    FORMAT_VERSION,
    EpisodeWriter,
    episode_path,
    list_episodes,
    read_episode,
)

JOINTS = tuple(f"j{i}" for i in range(14))
CAMERAS = ("top", "left_wrist", "right_wrist")
SHAPE = (32, 32)
STEPS = 5
SIM_STATE = 7


def make_writer(path: Path, episode_index: int = 3, **overrides) -> EpisodeWriter:
    kwargs = dict(
        joint_names=JOINTS,
        camera_names=CAMERAS,
        image_shape=SHAPE,
        instruction="put the red cube in the bowl",
        seed=1234,
        episode_index=episode_index,
        fps=10.0,
        task_template="put the {colour} cube in the {container}",
        sim_state_size=SIM_STATE,
    )
    kwargs.update(overrides)
    return EpisodeWriter(path, **kwargs)


def make_step(t: int, sim_state_size: int = SIM_STATE) -> dict:
    """Step t's values: distinct per step, field and camera."""
    rng = np.random.default_rng(t)
    return dict(
        timestamp=0.1 * t + 2.0,
        qpos=rng.normal(size=14),
        qvel=rng.normal(size=14).astype(np.float32),
        images={c: rng.integers(0, 256, (*SHAPE, 3), dtype=np.uint8) for c in CAMERAS},
        action=rng.normal(size=14),
        subtask=["reach", "grasp", "lift", "move ü", "place"][t % 5],
        sim_state=rng.normal(size=sim_state_size) if sim_state_size else None,
    )


def test_round_trip_of_every_field_and_attribute(tmp_path: Path) -> None:
    path = episode_path(tmp_path, 3)
    steps = [make_step(t) for t in range(STEPS)]
    with make_writer(path) as writer:
        for step in steps:
            writer.add_step(**step)
        assert writer.close(success=True, extra={"planner": "scripted", "retries": 2}) == path
    ep = read_episode(path)
    assert ep.path == path and ep.num_steps == STEPS
    assert ep.qpos.dtype == np.float32 and ep.qpos.shape == (STEPS, 14)
    np.testing.assert_array_equal(ep.qpos, np.stack([s["qpos"] for s in steps]).astype(np.float32))
    np.testing.assert_array_equal(ep.qvel, np.stack([s["qvel"] for s in steps]))
    assert ep.action.dtype == np.float32
    np.testing.assert_array_equal(ep.action, np.stack([s["action"] for s in steps]).astype("f4"))
    assert ep.sim_state.dtype == np.float64
    np.testing.assert_array_equal(ep.sim_state, np.stack([s["sim_state"] for s in steps]))
    np.testing.assert_array_equal(ep.timestamps, [0.1 * t + 2.0 for t in range(STEPS)])
    assert ep.timestamps.dtype == np.float64
    assert list(ep.images) == list(CAMERAS)
    for cam in CAMERAS:
        assert ep.images[cam].dtype == np.uint8 and ep.images[cam].shape == (STEPS, 32, 32, 3)
        np.testing.assert_array_equal(ep.images[cam], np.stack([s["images"][cam] for s in steps]))
    assert ep.subtasks == ("reach", "grasp", "lift", "move ü", "place")
    assert ep.instruction == "put the red cube in the bowl"
    assert ep.task_template == "put the {colour} cube in the {container}"
    assert (ep.seed, ep.success, ep.episode_index, ep.fps) == (1234, True, 3, 10.0)
    assert (ep.joint_names, ep.camera_names) == (JOINTS, CAMERAS)
    assert ep.format_version == FORMAT_VERSION == 1
    assert ep.extra == {"planner": "scripted", "retries": 2}
    with h5py.File(path, "r") as f:  # the raw layout, as other ALOHA readers see it
        assert bool(f.attrs["sim"]) is True
        assert f["observations/images/top"].chunks == (1, 32, 32, 3)
        assert f["observations/images/top"].compression == "gzip"
        assert set(f) == {"observations", "action", "timestamps", "language"}
        assert set(f["observations"]) == {"qpos", "qvel", "images", "sim_state"}


def test_without_sim_state_the_dataset_is_t_by_zero(tmp_path: Path) -> None:
    path = episode_path(tmp_path, 0)
    writer = make_writer(path, sim_state_size=0)
    for t in range(2):
        writer.add_step(**make_step(t, sim_state_size=0))
    writer.close(success=False)
    ep = read_episode(path)
    assert ep.sim_state.shape == (2, 0) and ep.sim_state.dtype == np.float64
    assert ep.success is False and ep.extra == {}


def test_action_chunks_round_trip_and_are_refused_when_missing_or_misshapen(tmp_path) -> None:
    path = episode_path(tmp_path, 0)
    chunks = np.random.default_rng(0).normal(size=(2, 4, 14))
    writer = make_writer(path, chunk_horizon=4)
    with pytest.raises(ValueError, match="action_chunk is needed"):
        writer.add_step(**make_step(0))
    with pytest.raises(ValueError, match=r"expected finite \[4, 14\]"):
        writer.add_step(**make_step(0), action_chunk=chunks[0, :3])
    for t in range(2):
        writer.add_step(**make_step(t), action_chunk=chunks[t])
    writer.close(success=False)
    ep = read_episode(path)
    assert ep.action_chunk.dtype == np.float32
    np.testing.assert_array_equal(ep.action_chunk, chunks.astype(np.float32))
    plain = episode_path(tmp_path, 1)
    with make_writer(plain) as writer:
        with pytest.raises(ValueError, match="action_chunk is needed"):
            writer.add_step(**make_step(0), action_chunk=chunks[0])
        writer.add_step(**make_step(0))
    assert read_episode(plain).action_chunk is None


def test_file_appears_under_its_final_name_only_on_close(tmp_path: Path) -> None:
    path = episode_path(tmp_path / "new_dir", 1)
    writer = make_writer(path)
    writer.add_step(**make_step(0))
    assert not path.exists() and writer.temp_path.exists()
    assert list_episodes(path.parent) == []
    writer.close(success=True)
    assert path.exists() and not writer.temp_path.exists()
    assert [p.name for p in path.parent.iterdir()] == ["episode_000001.hdf5"]
    with pytest.raises(ValueError, match="closed"):
        writer.add_step(**make_step(1))
    with pytest.raises(FileExistsError):
        make_writer(path)


def test_abort_and_exception_leave_nothing(tmp_path: Path) -> None:
    writer = make_writer(episode_path(tmp_path, 1))
    writer.add_step(**make_step(0))
    writer.abort()
    with pytest.raises(RuntimeError), make_writer(episode_path(tmp_path, 2)) as writer:
        writer.add_step(**make_step(0))
        raise RuntimeError("the expert crashed")
    with make_writer(episode_path(tmp_path, 3)):
        pass  # no steps: discarded
    assert list(tmp_path.iterdir()) == []


def test_leaving_the_block_without_close_records_a_failure(tmp_path: Path) -> None:
    with make_writer(episode_path(tmp_path, 4)) as writer:
        writer.add_step(**make_step(0))
    assert read_episode(episode_path(tmp_path, 4)).success is False


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (dict(qpos=np.zeros(13)), "qpos"),
        (dict(qvel=np.zeros((14, 1))), "qvel"),
        (dict(action=np.full(14, math.nan)), "finite"),
        (dict(action=np.array(["a"] * 14)), "action"),
        (dict(sim_state=None), "sim_state"),
        (dict(sim_state=np.zeros(SIM_STATE + 1)), "sim_state"),
        (dict(images={"top": np.zeros((32, 32, 3), np.uint8)}), "images for"),
        (dict(images={c: np.zeros((32, 32, 3), np.float32) for c in CAMERAS}), "uint8"),
        (dict(images={c: np.zeros((32, 32), np.uint8) for c in CAMERAS}), "uint8"),
        (dict(subtask=3), "subtask"),
        (dict(timestamp=2.0), "after"),  # not after the previous step's 2.0
        (dict(timestamp=math.inf), "finite"),
    ],
)
def test_invalid_steps_are_refused_and_change_nothing(tmp_path: Path, change, match) -> None:
    path = episode_path(tmp_path, 5)
    writer = make_writer(path)
    writer.add_step(**make_step(0))
    with pytest.raises(ValueError, match=match):
        writer.add_step(**{**make_step(1), **change})
    writer.add_step(**make_step(1))
    writer.close(success=True)
    ep = read_episode(path)
    assert ep.num_steps == 2 and ep.qpos.shape == (2, 14) and ep.images["top"].shape[0] == 2
    assert ep.subtasks == ("reach", "grasp")


@pytest.mark.parametrize(
    "change",
    [
        dict(joint_names=("a", "a")),
        dict(joint_names=()),
        dict(camera_names=("top", "top")),
        dict(camera_names=("a/b",)),
        dict(image_shape=(32, 32, 4)),
        dict(image_shape=(0, 32)),
        dict(fps=0.0),
        dict(sim_state_size=-1),
    ],
)
def test_invalid_writer_settings(tmp_path: Path, change) -> None:
    with pytest.raises(ValueError):
        make_writer(episode_path(tmp_path, 0), **change)
    assert list(tmp_path.iterdir()) == []


def test_close_refuses_empty_episodes_and_unserialisable_extra(tmp_path: Path) -> None:
    writer = make_writer(episode_path(tmp_path, 0))
    with pytest.raises(ValueError, match="at least one step"):
        writer.close(success=True)
    writer.add_step(**make_step(0))
    with pytest.raises(ValueError, match="JSON"):
        writer.close(success=True, extra={"x": object()})
    assert writer.close(success=True, extra={"x": 1}).exists()


def test_list_episodes_in_index_order_skipping_unfinished_and_foreign_files(
    tmp_path: Path,
) -> None:
    for index in (12, 2, 1_000_000, 7):
        with make_writer(episode_path(tmp_path, index), episode_index=index) as writer:
            writer.add_step(**make_step(0))
            writer.close(success=index % 2 == 0)
    unfinished = make_writer(episode_path(tmp_path, 3))
    unfinished.add_step(**make_step(0))
    (tmp_path / "notes.txt").write_text("not an episode")
    (tmp_path / "episode_42.hdf5").write_text("wrong width")
    paths = list_episodes(tmp_path)
    assert [p.name for p in paths] == [
        "episode_000002.hdf5",
        "episode_000007.hdf5",
        "episode_000012.hdf5",
        "episode_1000000.hdf5",
    ]
    assert [read_episode(p).episode_index for p in paths] == [2, 7, 12, 1_000_000]
    assert [read_episode(p).success for p in paths] == [True, False, True, True]
    unfinished.abort()


def test_read_refuses_other_files(tmp_path: Path) -> None:
    path = tmp_path / "other.hdf5"
    with h5py.File(path, "w") as f:
        f.attrs["format_version"] = 2
    with pytest.raises(ValueError, match="format 1"):
        read_episode(path)
