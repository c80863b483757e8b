"""Workcell physics and cameras: joint layout and limits from the MJCF, episode resets, target
tracking per joint, state round trips, and camera identity (test pattern)."""

from __future__ import annotations

import numpy as np
import pytest

from oxygen_ros.sim import robot
from oxygen_ros.sim.scene import TEST_PATTERN_COLOURS, SceneConfig, aloha_assets_dir
from oxygen_ros.sim.workcell import Workcell, WorkcellConfig

OBJECTS = {
    "red_cube": (-0.1, 0.5, 0.3),
    "green_cube": (0.0, 0.55, 0.0),
    "blue_cube": (0.1, 0.45, 0),
}


@pytest.fixture(scope="module")
def cell():
    workcell = Workcell(WorkcellConfig(render=False))
    yield workcell
    workcell.close()


def test_assets_come_from_the_installed_gym_aloha_package() -> None:
    assets = aloha_assets_dir()
    assert "site-packages" in str(assets) or "dist-packages" in str(assets)
    assert (assets / "vx300s_left.xml").is_file()


def test_joint_layout_and_limits_from_the_mjcf(cell: Workcell) -> None:
    assert len(robot.JOINT_NAMES) == 14
    assert robot.JOINT_NAMES[:7] == (
        "left_waist", "left_shoulder", "left_elbow", "left_forearm_roll",
        "left_wrist_angle", "left_wrist_rotate", "left_gripper",
    )  # fmt: skip
    m = cell.model
    for col, name in enumerate(robot.JOINT_NAMES):
        arm, joint = name.split("_", 1)
        if joint == "gripper":
            assert (cell.lower[col], cell.upper[col]) == (0.0, 1.0)
            continue
        jnt = m.joint(robot.mjcf_prefix(arm) + joint)
        assert (cell.lower[col], cell.upper[col]) == tuple(jnt.range)
    assert cell.lower[robot.JOINT_NAMES.index("left_shoulder")] == pytest.approx(-1.85005)


def test_reset_places_objects_at_rest_and_time_never_goes_back(cell: Workcell) -> None:
    cell.step(0.1)
    before = cell.time
    cell.reset(robot.HOME, OBJECTS)
    assert cell.time == before
    np.testing.assert_allclose(cell.joint_positions(), robot.HOME, atol=1e-12)
    cell.step(1.0)
    assert cell.time == pytest.approx(before + 1.0)
    for name, (x, y, yaw) in OBJECTS.items():
        pose = cell.object_pose(name)
        np.testing.assert_allclose(pose.position, (x, y, 0.02), atol=1e-3)
        assert 2 * np.arctan2(pose.quaternion[3], pose.quaternion[0]) == pytest.approx(
            yaw, abs=1e-2
        )
    np.testing.assert_allclose(cell.joint_positions(), robot.HOME, atol=2e-3)


@pytest.mark.parametrize("joint", ["left_elbow", "right_wrist_angle", "left_gripper"])
def test_one_commanded_joint_moves_alone(cell: Workcell, joint: str) -> None:
    cell.reset(robot.HOME, OBJECTS)
    target = robot.HOME.copy()
    col = robot.JOINT_NAMES.index(joint)
    target[col] += 0.6 if joint.endswith("gripper") else 0.3
    cell.set_targets(target)
    cell.step(1.5)
    q = cell.joint_positions()
    assert q[col] == pytest.approx(target[col], abs=0.02)
    others = np.delete(np.arange(14), col)
    np.testing.assert_allclose(q[others], robot.HOME[others], atol=0.02)


def test_targets_are_clipped_to_the_limits(cell: Workcell) -> None:
    applied = cell.set_targets(np.full(14, 10.0))
    np.testing.assert_array_equal(applied, cell.upper)
    assert np.all(cell.data.ctrl <= cell.model.actuator_ctrlrange[:, 1] + 1e-12)


def test_physics_state_round_trip_replays_exactly(cell: Workcell) -> None:
    cell.reset(robot.HOME, OBJECTS)
    target = robot.HOME + 0.2
    cell.set_targets(target)
    cell.step(0.2)
    state = cell.physics_state()
    cell.step(0.3)
    first = cell.data.qpos.copy()
    cell.set_physics_state(state)
    cell.step(0.3)
    np.testing.assert_array_equal(cell.data.qpos, first)


def test_each_camera_sees_its_own_test_pattern_colour() -> None:
    config = WorkcellConfig(scene=SceneConfig(test_pattern=True), image_width=64, image_height=48)
    cell = Workcell(config)
    try:
        for camera, rgba in TEST_PATTERN_COLOURS.items():
            image = cell.render(camera)
            assert image.shape == (48, 64, 3) and image.dtype == np.uint8
            centre = image[16:32, 24:40].reshape(-1, 3).mean(axis=0)
            assert int(np.argmax(centre)) == int(np.argmax(rgba[:3])), (camera, centre)
            assert centre.max() > 150 and np.sort(centre)[1] < 100, (camera, centre)
    finally:
        cell.close()


def _red_pixels(image: np.ndarray) -> np.ndarray:
    rgb = image.astype(int)
    return (
        (rgb[..., 0] > 150) & (rgb[..., 0] - rgb[..., 1] > 100) & (rgb[..., 0] - rgb[..., 2] > 100)
    )


def test_rendering_is_deterministic_and_shows_the_cubes() -> None:
    cell = Workcell(WorkcellConfig(image_width=96, image_height=96))
    try:
        cell.reset(robot.HOME, OBJECTS)
        first = cell.render("top")
        np.testing.assert_array_equal(cell.render("top"), first)
        red = _red_pixels(first)
        assert red.sum() >= 4  # the red cube is in the top camera's view
        cell.reset(robot.HOME, {})
        parked = cell.render("top")
        red = _red_pixels(parked)
        assert red.sum() == 0  # positive control: no cube on the table, no red pixels
    finally:
        cell.close()


def test_unknown_camera_is_refused() -> None:
    with pytest.raises(ValueError, match="not in the scene"):
        Workcell(WorkcellConfig(cameras=("nope",), render=False))


def test_a_diverging_simulation_keeps_time_monotonic(cell: Workcell) -> None:
    cell.reset(robot.HOME, OBJECTS)
    cell.step(0.1)
    before = cell.time
    cell.data.qvel[:] = 1e12  # provoke MuJoCo's divergence check (it resets the state)
    cell.step(0.01)
    assert cell.instabilities == 1
    assert cell.time == pytest.approx(before + 0.01)
    cell.reset(robot.HOME, OBJECTS)
    cell.step(0.1)
    assert cell.instabilities == 1  # positive control above; a normal step counts nothing


def test_markers_are_invisible_to_the_cameras(cell: Workcell) -> None:
    m = cell.model
    for site in range(m.nsite):
        assert m.site_rgba[site][3] == 0.0, m.site(site).name  # a policy must not see markers
