"""Per-controller trajectories without ROS: the group configuration's errors, the split of a
chunk into groups (exact columns and rows), and the JointTrajectoryController rules checker
(one broken message per rule, next to the valid one it was made from)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import numpy as np
import pytest

from oxygen_ros.nodes.inference.trajectory_groups import (
    TrajectoryPoint,
    all_joints_group,
    parse_groups,
    split_chunk,
    trajectory_problems,
)

JOINTS = ("waist", "l_arm", "l_grip", "r_arm", "r_grip", "head")
GROUPS = {
    "left": ("left_controller/joint_trajectory", ["l_arm", "l_grip"]),
    "right": ("right_controller/joint_trajectory", ["r_grip", "r_arm"]),  # not model order
    "head": ("head_controller/joint_trajectory", ["head"]),
}


def chunk(rows: int = 5) -> np.ndarray:
    """Row k, column j = 10 k + j: every value names its place."""
    return (10.0 * np.arange(rows)[:, None] + np.arange(len(JOINTS))[None, :]).astype(np.float32)


# ------------------------------------------------------------------------- configuration
def test_groups_keep_their_order_topics_and_model_columns() -> None:
    groups = parse_groups(JOINTS, GROUPS)
    assert [g.name for g in groups] == ["left", "right", "head"]
    assert [g.topic for g in groups] == [topic for topic, _ in GROUPS.values()]
    assert groups[1].joint_names == ("r_grip", "r_arm") and groups[1].columns == (4, 3)
    assert groups[2].columns == (5,)


@pytest.mark.parametrize(
    ("groups", "match"),
    [
        ({"left": ("l/jt", ["l_arm", "elbow"])}, r"'left'.*\['elbow'\] are not in joint_names"),
        ({"left": ("l/jt", [])}, "'left' has no joints"),
        ({"left": ("", ["l_arm"])}, "'left' has no topic"),
        ({"left": ("l/jt", ["l_arm", "l_arm"])}, "joint 'l_arm' twice"),
        (
            {"left": ("l/jt", ["l_arm"]), "both": ("b/jt", ["r_arm", "l_arm"])},
            "'both': joint 'l_arm' also in group 'left'",
        ),
        (
            {"left": ("same/jt", ["l_arm"]), "right": ("same/jt", ["r_arm"])},
            "'left' and 'right' share the topic 'same/jt'",
        ),
    ],
)
def test_bad_groups_raise_naming_the_problem(groups, match) -> None:
    with pytest.raises(ValueError, match=match):
        parse_groups(JOINTS, groups)


def test_groups_need_not_cover_every_joint() -> None:
    groups = parse_groups(JOINTS, GROUPS)  # waist is in no group: it is not sent
    assert "waist" not in {j for g in groups for j in g.joint_names}


# --------------------------------------------------------------------------------- split
def test_each_group_gets_its_columns_of_the_future_rows_at_their_times() -> None:
    groups = parse_groups(JOINTS, GROUPS)
    rows = chunk(5)
    times = np.array([-0.2, -0.1, 0.0, 0.1, 0.2])  # rows 0 and 1 have passed
    out = split_chunk(groups, rows, times)
    assert [t.group for t in out] == list(groups)
    left, right, head = out
    np.testing.assert_array_equal(left.positions, [[21, 22], [31, 32], [41, 42]])
    np.testing.assert_array_equal(right.positions, [[24, 23], [34, 33], [44, 43]])
    np.testing.assert_array_equal(head.positions, [[25], [35], [45]])
    for trajectory in out:
        np.testing.assert_array_equal(trajectory.time_from_start_s, [0.0, 0.1, 0.2])
        assert trajectory.positions.dtype == np.float64


def test_no_groups_configured_is_one_trajectory_of_every_joint() -> None:
    (only,) = split_chunk([all_joints_group(JOINTS, "jt")], chunk(3), np.arange(3) * 0.04)
    assert only.group.joint_names == JOINTS
    np.testing.assert_array_equal(only.positions, chunk(3))


def test_a_chunk_whose_rows_all_passed_gives_nothing() -> None:
    assert split_chunk(parse_groups(JOINTS, GROUPS), chunk(2), np.array([-0.2, -0.1])) == []


def test_a_row_a_rounding_error_before_the_stamp_is_kept_at_zero() -> None:
    (head,) = split_chunk(parse_groups(JOINTS, {"head": GROUPS["head"]}), chunk(2), [-1e-12, 1])
    np.testing.assert_array_equal(head.time_from_start_s, [0.0, 1.0])


def test_points_carry_the_rows_and_times() -> None:
    (head,) = split_chunk(parse_groups(JOINTS, {"head": GROUPS["head"]}), chunk(2), [0.0, 0.5])
    assert head.points() == (TrajectoryPoint((5.0,), 0.0), TrajectoryPoint((15.0,), 0.5))


# ----------------------------------------------------------------------------- validator
CONTROLLER = ("a", "b", "c")


def valid_points() -> list[TrajectoryPoint]:
    return [
        TrajectoryPoint((0.0, 1.0), 0.0, (0.1, 0.2), (0.0, 0.0)),
        TrajectoryPoint((0.5, 1.5), 0.1),
        TrajectoryPoint((1.0, 2.0), 0.2),
    ]


def replace_point(k: int, **changes) -> list[TrajectoryPoint]:
    points = valid_points()
    points[k] = dataclasses.replace(points[k], **changes)
    return points


def test_the_valid_message_passes() -> None:
    assert trajectory_problems(["a", "b"], valid_points(), CONTROLLER) == []


@pytest.mark.parametrize(
    ("names", "points", "problem"),
    [
        ([], [], "joint_names is empty"),
        (["a", "a"], None, "joint_names repeat a joint"),
        (["a", "x"], None, "joints ['x'] are not the controller's"),
        (["a", "b"], [], "no points"),
        (["a", "b"], replace_point(1, positions=(0.5,)), "point 1: 1 positions for 2 joints"),
        (["a", "b"], replace_point(2, velocities=(1.0,)), "point 2: 1 velocities for 2 joints"),
        (
            ["a", "b"],
            replace_point(0, accelerations=(0.0, 0.0, 0.0)),
            "point 0: 3 accelerations for 2 joints",
        ),
        (["a", "b"], replace_point(1, time_from_start_s=0.2), "point 2: time_from_start 0.2 does"),
        (["a", "b"], replace_point(2, time_from_start_s=0.05), "point 2: time_from_start 0.05"),
        (["a", "b"], replace_point(0, time_from_start_s=-0.01), "point 0: time_from_start -0.01"),
        (["a", "b"], replace_point(1, positions=(0.5, np.nan)), "point 1: a value is not finite"),
        (["a", "b"], replace_point(0, velocities=(np.inf, 0)), "point 0: a value is not finite"),
    ],
)
def test_each_broken_rule_is_flagged(names, points, problem) -> None:
    points = valid_points() if points is None else points
    problems = trajectory_problems(names, points, CONTROLLER)
    assert any(problem in p for p in problems), problems


def test_every_split_of_random_chunks_is_valid() -> None:
    rng = np.random.default_rng(0)
    for _ in range(200):
        num_joints = int(rng.integers(2, 8))
        names = tuple(f"j{i}" for i in range(num_joints))
        order = rng.permutation(num_joints)
        cuts = sorted(rng.choice(np.arange(1, num_joints), rng.integers(0, num_joints - 1), False))
        parts = np.split(order, cuts)
        config = {f"g{i}": (f"g{i}/jt", [names[c] for c in p]) for i, p in enumerate(parts)}
        groups = parse_groups(names, config)
        rows = int(rng.integers(1, 60))
        dt = float(rng.uniform(0.005, 0.2))
        times = np.arange(rows) * dt - float(rng.uniform(0, rows * dt))
        positions = rng.normal(size=(rows, num_joints)).astype(np.float32)
        out = split_chunk(groups, positions, times)
        assert len(out) == (len(groups) if (times >= 0).any() else 0)
        future = positions[times >= 0]
        for trajectory in out:
            g = trajectory.group
            assert trajectory_problems(g.joint_names, trajectory.points(), g.joint_names) == []
            np.testing.assert_array_equal(trajectory.positions, future[:, g.columns])


def test_the_module_imports_no_ros() -> None:
    code = (
        "import sys, oxygen_ros.nodes.inference.trajectory_groups; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('rclpy', 'trajectory_msgs', 'builtin_interfaces') or '.msg' in m))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
