"""Workcell simulator conversions (commands in, joint states and status out), without a node."""

import math

import numpy as np
import pytest
from builtin_interfaces.msg import Duration, Time
from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

from oxygen_ros.msg import ActionChunk, EpisodeStatus
from oxygen_ros.nodes.common.conversions import time_to_seconds
from oxygen_ros.nodes.workcell.workcell_conversions import (
    chunk_targets,
    clock_msg,
    episode_status_msg,
    joint_state_msg,
    pose_msg,
    trajectory_targets,
)
from oxygen_ros.nodes.workcell.workcell_episode import EpisodeTracker
from oxygen_ros.sim import robot, tasks
from oxygen_ros.sim.command_buffer import RejectedCommandError

INDEX = {name: i for i, name in enumerate(robot.JOINT_NAMES)}


STAMP = Time(sec=12, nanosec=500_000_000)
ZERO = Time()


def chunk(names, rows, stamp=STAMP, dt=0.02, sequence=3):
    rows = np.asarray(rows, dtype=np.float32)
    msg = ActionChunk(dt=dt, joint_names=list(names), horizon=len(rows), sequence=sequence)
    msg.header.stamp = stamp
    msg.actions = rows.ravel().tolist()
    return msg


def test_chunk_columns_map_to_joints_by_name_in_any_order() -> None:
    names = ["right_gripper", "left_waist", "right_elbow"]
    rows = [[0.5, 0.1, -0.2], [0.6, 0.2, -0.3]]
    targets = chunk_targets(chunk(names, rows), INDEX, now=99.0)
    assert targets.joint_indices == (13, 0, 9)
    np.testing.assert_allclose(targets.times, [12.5, 12.52])
    np.testing.assert_allclose(targets.rows, np.float32(rows))
    assert targets.source == "chunk" and targets.command_id == 3
    assert math.isinf(targets.valid_until)


def test_chunk_expiry_becomes_the_commands_valid_until() -> None:
    msg = chunk(["left_waist"], [[0.1], [0.2]])
    msg.valid_until = Time(sec=13, nanosec=500_000_000)
    assert chunk_targets(msg, INDEX, now=0.0).valid_until == 13.5


def test_chunk_with_zero_stamp_starts_now() -> None:
    targets = chunk_targets(chunk(["left_waist"], [[0.1]], stamp=ZERO), INDEX, now=4.25)
    assert targets.times[0] == 4.25


@pytest.mark.parametrize(
    ("names", "rows", "edit", "reason"),
    [
        (["left_waist", "nose"], [[0.0, 0.0]], None, "unknown_joint"),
        ([], [], None, "bad_joint"),
        (["left_waist", "left_waist"], [[0.0, 0.0]], None, "bad_joint"),
        (["left_waist"], [[0.0], [1.0]], {"horizon": 3}, "bad_shape"),
        (["left_waist"], [[0.0]], {"horizon": 0}, "bad_shape"),
        (["left_waist"], [[float("nan")]], None, "non_finite"),
        (["left_waist"], [[0.0], [1.0]], {"dt": float("inf")}, "non_finite"),
        (["left_waist"], [[0.0], [1.0]], {"dt": 0.0}, "times_not_increasing"),
    ],
)
def test_bad_chunks_are_rejected_with_a_reason(names, rows, edit, reason) -> None:
    msg = chunk(names, rows) if rows else ActionChunk(joint_names=names, horizon=0)
    for key, value in (edit or {}).items():
        setattr(msg, key, value)
    with pytest.raises(RejectedCommandError) as info:
        chunk_targets(msg, INDEX, now=0.0)
    assert info.value.reason == reason


def trajectory(names, points, stamp=ZERO):
    msg = JointTrajectory(joint_names=list(names))
    msg.header.stamp = stamp
    msg.points = [
        JointTrajectoryPoint(
            positions=list(map(float, p)), time_from_start=Duration(sec=int(t), nanosec=n)
        )
        for t, n, p in points
    ]
    return msg


def test_trajectory_points_at_stamp_plus_time_from_start() -> None:
    msg = trajectory(
        ["left_gripper", "right_waist"],
        [(0, 500_000_000, (1.0, 0.2)), (1, 0, (0.0, 0.3))],
        stamp=Time(sec=3),
    )
    targets = trajectory_targets(msg, INDEX, now=1.0, command_id=7)
    np.testing.assert_allclose(targets.times, [3.5, 4.0])
    assert targets.joint_indices == (6, 7) and targets.command_id == 7
    np.testing.assert_allclose(targets.rows, [[1.0, 0.2], [0.0, 0.3]])
    now_based = trajectory_targets(trajectory(["left_waist"], [(0, 0, (0.1,))]), INDEX, 2.0)
    np.testing.assert_allclose(now_based.times, [2.0])


@pytest.mark.parametrize(
    ("names", "points", "reason"),
    [
        (["left_waist"], [], "bad_shape"),
        (["left_waist", "right_waist"], [(0, 0, (0.1,))], "bad_shape"),
        (["elbow"], [(0, 0, (0.1,))], "unknown_joint"),
        (["left_waist"], [(1, 0, (0.1,)), (1, 0, (0.2,))], "times_not_increasing"),
    ],
)
def test_bad_trajectories_are_rejected_with_a_reason(names, points, reason) -> None:
    with pytest.raises(RejectedCommandError) as info:
        trajectory_targets(trajectory(names, points), INDEX, now=0.0)
    assert info.value.reason == reason


def test_joint_state_lists_joints_in_the_configured_order() -> None:
    names = list(reversed(robot.JOINT_NAMES))
    order = [robot.JOINT_NAMES.index(n) for n in names]
    positions = np.arange(14, dtype=np.float64)
    msg = joint_state_msg(2.5, "world", names, order, positions, -positions)
    assert list(msg.name) == names and msg.header.frame_id == "world"
    np.testing.assert_array_equal(msg.position, positions[::-1])
    np.testing.assert_array_equal(msg.velocity, -positions[::-1])
    assert time_to_seconds(msg.header.stamp) == 2.5
    assert len(joint_state_msg(0.0, "w", names, order, positions).velocity) == 0


def test_clock_and_pose() -> None:
    assert clock_msg(1.25).clock == Time(sec=1, nanosec=250_000_000)
    pose = pose_msg(np.array([1.0, 2.0, 3.0]), np.array([0.5, 0.1, 0.2, 0.3]))
    assert (pose.position.x, pose.position.y, pose.position.z) == (1.0, 2.0, 3.0)
    o = pose.orientation
    assert (o.w, o.x, o.y, o.z) == (0.5, 0.1, 0.2, 0.3)  # MuJoCo's w-first order, by name


def test_episode_status_carries_the_episode() -> None:
    idle = episode_status_msg(EpisodeTracker(), 1.0, 0.5, [], "world")
    assert idle.phase == EpisodeStatus.PHASE_IDLE and idle.episode_id == 0
    tracker = EpisodeTracker()
    spec = tasks.sample_episode(5)
    tracker.start(spec, now=10.0, time_limit_s=8.0)
    tracker.add_starvation(2)
    objects = [("red_cube", np.array([0.1, 0.5, 0.02]), np.array([1.0, 0.0, 0.0, 0.0]))]
    msg = episode_status_msg(tracker, 13.5, 0.98, objects, "world")
    assert (msg.episode_id, msg.seed, msg.instruction) == (1, 5, spec.instruction)
    assert msg.task_template == spec.template and msg.phase == EpisodeStatus.PHASE_RUNNING
    assert msg.elapsed_s == pytest.approx(3.5) and msg.time_limit_s == 8.0
    assert msg.time_to_success_s < 0 and not msg.success
    assert msg.starvation_events == 2 and msg.real_time_factor == pytest.approx(0.98)
    assert list(msg.object_names) == ["red_cube"] and msg.object_poses[0].position.y == 0.5
    assert time_to_seconds(msg.header.stamp) == pytest.approx(13.5)
