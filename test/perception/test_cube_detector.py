"""The cube detector finds each coloured cube in the rendered top camera and places it on the
table where the simulator put it; cubes it cannot see are None, never a guess."""

from __future__ import annotations

import numpy as np
import pytest

from oxygen_ros.perception import workcell_cubes
from oxygen_ros.perception.cube_detector import CubeDetector, CubeTracker, PinholeCamera
from oxygen_ros.sim import robot, tasks
from oxygen_ros.sim.scene import COLOURS
from oxygen_ros.sim.workcell import Workcell, WorkcellConfig

HALF_SIZE = 0.02  # the cubes' half size: their centres are this high above the table
TOLERANCE_M = 0.005  # measured worst case 1.7 mm over these 36 cubes (printed with -s)
YAW_TOLERANCE_DEG = 6.0  # measured worst case 2.4 degrees over the same 36 (15 over 120)


@pytest.fixture(scope="module")
def cell():
    workcell = Workcell(WorkcellConfig())
    yield workcell
    workcell.close()


@pytest.fixture(scope="module")
def detector(cell) -> CubeDetector:
    config = cell.config
    camera = PinholeCamera.from_mujoco(
        cell.model, cell.data, "top", config.image_width, config.image_height
    )
    return CubeDetector(camera, {f"{c}_cube": rgba for c, rgba in COLOURS.items()}, HALF_SIZE)


def test_a_point_on_the_plane_projects_and_comes_back(detector) -> None:
    camera = detector.camera
    rng = np.random.default_rng(0)
    (x0, x1), (y0, y1) = tasks.TABLE_REGION  # where cube centres lie
    for x, y in rng.uniform([x0, y0], [x1, y1], size=(20, 2)):
        u, v = camera.project(np.array([x, y, HALF_SIZE]))
        assert 0 <= u < camera.width and 0 <= v < camera.height
        np.testing.assert_allclose(camera.on_plane(u, v, HALF_SIZE), (x, y), atol=1e-9)
    with pytest.raises(ValueError, match="behind the camera"):
        camera.project(camera.position + camera.rotation[:, 2])  # +z: backwards


def test_cubes_are_placed_where_the_simulator_put_them(cell, detector) -> None:
    errors = []
    for seed in range(12):
        spec = tasks.sample_episode(seed)
        cell.reset(robot.HOME, spec.objects)
        found = detector.detect(cell.render("top"))
        for name, (x, y, _yaw) in spec.objects.items():
            assert found[name] is not None, (seed, name)
            errors.append(float(np.hypot(*(found[name] - (x, y)))))
    print(f"table position error over {len(errors)} cubes: max {max(errors) * 1000:.1f} mm")
    assert max(errors) < TOLERANCE_M


def test_cube_yaws_modulo_90_degrees_are_the_simulators(cell, detector) -> None:
    found, true = [], []
    for seed in range(12):
        spec = tasks.sample_episode(seed)
        cell.reset(robot.HOME, spec.objects)
        yaws = detector.yaws(cell.render("top"))
        for name, (_x, _y, yaw) in spec.objects.items():
            assert yaws[name] is not None and -np.pi / 4 <= yaws[name] < np.pi / 4, (seed, name)
            found.append(yaws[name])
            true.append(yaw)

    def errors_deg(shift_deg: float) -> np.ndarray:
        wrapped = (np.subtract(found, true) - np.radians(shift_deg) + np.pi / 4) % (np.pi / 2)
        return np.degrees(np.abs(wrapped - np.pi / 4))

    print(f"yaw error over {len(found)} cubes: max {errors_deg(0).max():.1f} deg")
    assert errors_deg(0).max() < YAW_TOLERANCE_DEG
    assert errors_deg(10).min() > YAW_TOLERANCE_DEG  # the check tells a 10 degree turn apart
    grey = np.full((cell.config.image_height, cell.config.image_width, 3), 128, np.uint8)
    assert set(detector.yaws(grey).values()) == {None}


def test_a_cube_out_of_view_is_none_and_in_view_is_found(cell, detector) -> None:
    spec = tasks.sample_episode(3)
    named = next(iter(spec.objects))
    others = {k: v for k, v in spec.objects.items() if k != named}
    cell.reset(robot.HOME, others)  # `named` is parked outside the top camera's view
    found = detector.detect(cell.render("top"))
    assert found[named] is None
    assert all(found[k] is not None for k in others)
    cell.reset(robot.HOME, spec.objects)  # positive control: the same check sees it
    assert detector.detect(cell.render("top"))[named] is not None


def test_grey_images_give_nothing_and_a_wrong_shape_is_refused(detector) -> None:
    camera = detector.camera
    grey = np.full((camera.height, camera.width, 3), 128, np.uint8)
    assert all(v is None for v in detector.detect(grey).values())
    with pytest.raises(ValueError, match="does not match the camera"):
        detector.detect(grey[:100])
    with pytest.raises(ValueError, match="distinct dominant channels"):
        CubeDetector(camera, {"a": (1.0, 0.0, 0.0), "b": (0.9, 0.2, 0.1)}, HALF_SIZE)


def test_the_tracker_keeps_the_last_seen_position_and_starts_at_the_default() -> None:
    track = CubeTracker(("a", "b"), (0.0, 0.5))
    np.testing.assert_array_equal(track.update({"a": None, "b": None}), [0.0, 0.5, 0.0, 0.5])
    assert track.seen == {"a": False, "b": False}
    np.testing.assert_array_equal(
        track.update({"a": np.array([0.1, 0.4]), "b": None}), [0.1, 0.4, 0.0, 0.5]
    )
    np.testing.assert_array_equal(
        track.update({"a": None, "b": np.array([-0.2, 0.6])}), [0.1, 0.4, -0.2, 0.6]
    )
    assert track.seen == {"a": True, "b": True}
    track.reset()
    np.testing.assert_array_equal(track.update({}), [0.0, 0.5, 0.0, 0.5])


def test_workcell_detector_tracks_a_cube_through_frames_where_it_is_hidden(cell, detector) -> None:
    built = workcell_cubes.detector(cell.config.image_width, cell.config.image_height)
    np.testing.assert_allclose(built.camera.position, detector.camera.position)
    np.testing.assert_allclose(built.camera.rotation, detector.camera.rotation)
    assert built.plane_z == HALF_SIZE and built.camera.fovy_deg == detector.camera.fovy_deg
    spec = tasks.sample_episode(5)
    frames = []
    cell.reset(robot.HOME, spec.objects)
    frames.append(cell.render("top"))
    hidden = workcell_cubes.CUBE_NAMES[0]
    cell.reset(robot.HOME, {k: v for k, v in spec.objects.items() if k != hidden})
    frames.append(cell.render("top"))  # the first cube is gone from view in this frame
    states = workcell_cubes.episode_cube_states(np.stack(frames))
    assert states.shape == (2, 2 * len(workcell_cubes.CUBE_NAMES)) and states.dtype == np.float32
    truth = np.concatenate([spec.objects[name][:2] for name in workcell_cubes.CUBE_NAMES])
    np.testing.assert_allclose(states[0], truth, atol=TOLERANCE_M)
    np.testing.assert_array_equal(states[1], states[0])  # held where it was last seen
    # A fresh episode that never saw the cube starts it at the table's centre.
    alone = workcell_cubes.episode_cube_states(np.stack(frames[1:]))
    np.testing.assert_allclose(alone[0, :2], workcell_cubes.TABLE_CENTRE_XY)
    np.testing.assert_allclose(alone[0, 2:], truth[2:], atol=TOLERANCE_M)
