"""Per-controller trajectories (ROS-free): split a chunk's joints into controller groups and
check each group's trajectory against the rules a ros2_control JointTrajectoryController (JTC)
applies to its topic.

A robot driven by ros2_control usually runs several JTCs (arms, grippers, head), each
subscribed to `/<controller>/joint_trajectory` and owning a fixed list of joints. A JTC refuses
a message that names a joint it does not own, so one all-joints trajectory reaches none of
them: the action process sends one message per group instead.

Axis letters: N rows of a chunk, J model joints, G joints of one group.

Invariants:
- A group's joints are a non-empty subset of the model's `joint_names`, unique within it, and
  no joint belongs to two groups (`parse_groups` raises ValueError naming the problem).
- `split_chunk` copies columns and rows, never values: group g's position [k, i] is the chunk's
  [row, column of g's joint i] for the k-th row at or after the header stamp, and its
  time_from_start is that row's time.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

TIME_EPS_S = 1e-9  # a row this close before the header stamp counts as at the stamp


@dataclasses.dataclass(frozen=True)
class TrajectoryGroup:
    """One controller's share of the model's joints."""

    name: str  # the group (its parameters: trajectory_group.<name>.*)
    topic: str  # the controller's JointTrajectory topic
    joint_names: tuple[str, ...]  # the controller's joints, in the order it is sent
    columns: tuple[int, ...]  # index of each joint in the model's joint_names


@dataclasses.dataclass(frozen=True)
class TrajectoryPoint:
    """One point of a JointTrajectory, as the JTC reads it."""

    positions: tuple[float, ...]
    time_from_start_s: float  # relative to the header stamp
    velocities: tuple[float, ...] = ()
    accelerations: tuple[float, ...] = ()


@dataclasses.dataclass(frozen=True)
class GroupTrajectory:
    """What one group's message carries (the header stamp is the chunk's)."""

    group: TrajectoryGroup
    positions: np.ndarray  # float64 [n, G]
    time_from_start_s: np.ndarray  # float64 [n], relative to the header stamp

    def points(self) -> tuple[TrajectoryPoint, ...]:
        return tuple(
            TrajectoryPoint(tuple(row.tolist()), float(t))
            for row, t in zip(self.positions, self.time_from_start_s, strict=True)
        )


def parse_groups(
    joint_names: Sequence[str], groups: Mapping[str, tuple[str, Sequence[str]]]
) -> tuple[TrajectoryGroup, ...]:
    """Checks the group configuration against the model's joints.

    Args:
        joint_names: The model's joint order (the chunk's columns).
        groups: Group name -> (topic, joint names), in publishing order.

    Returns:
        One `TrajectoryGroup` per entry, in the same order.

    Raises:
        ValueError: A group without joints or topic, a joint that is not a model joint, a
            joint twice in one group or in two groups, or two groups on one topic.
    """
    column = {name: i for i, name in enumerate(joint_names)}
    owner: dict[str, str] = {}  # joint -> group that has it
    topics: dict[str, str] = {}  # topic -> group that uses it
    out = []
    for name, (topic, joints) in groups.items():
        if not joints:
            raise ValueError(f"trajectory group {name!r} has no joints")
        if not topic:
            raise ValueError(f"trajectory group {name!r} has no topic")
        if topic in topics:
            raise ValueError(
                f"trajectory groups {topics[topic]!r} and {name!r} share the topic {topic!r}"
            )
        topics[topic] = name
        unknown = [j for j in joints if j not in column]
        if unknown:
            raise ValueError(f"trajectory group {name!r}: {unknown} are not in joint_names")
        for joint in joints:
            if joint in owner:
                where = "twice" if owner[joint] == name else f"also in group {owner[joint]!r}"
                raise ValueError(f"trajectory group {name!r}: joint {joint!r} {where}")
            owner[joint] = name
        out.append(TrajectoryGroup(name, topic, tuple(joints), tuple(column[j] for j in joints)))
    return tuple(out)


def all_joints_group(joint_names: Sequence[str], topic: str) -> TrajectoryGroup:
    """The one group of every joint, in model order (no groups configured)."""
    return TrajectoryGroup("all", topic, tuple(joint_names), tuple(range(len(joint_names))))


def split_chunk(
    groups: Iterable[TrajectoryGroup], positions: np.ndarray, times_s: np.ndarray
) -> list[GroupTrajectory]:
    """Each group's trajectory of a chunk: its joints' columns at the rows not yet passed.

    Args:
        groups: From `parse_groups` (or `all_joints_group`).
        positions: float [N, J], the chunk in the model's joint order.
        times_s: float [N], each row's time relative to the header stamp.

    Returns:
        One `GroupTrajectory` per group, in order; none when every row has passed.
    """
    positions = np.asarray(positions, dtype=np.float64)
    times_s = np.asarray(times_s, dtype=np.float64)
    if positions.ndim != 2 or times_s.shape != (len(positions),):
        raise ValueError(f"positions {positions.shape} and times {times_s.shape} do not match")
    future = times_s >= -TIME_EPS_S
    if not future.any():
        return []
    rows, times = positions[future], np.maximum(times_s[future], 0.0)
    return [GroupTrajectory(g, rows[:, list(g.columns)], times) for g in groups]


def trajectory_problems(
    joint_names: Sequence[str],
    points: Sequence[TrajectoryPoint],
    controller_joints: Sequence[str],
) -> list[str]:
    """What a JointTrajectoryController would refuse in this topic message ([] = valid).

    The rules are those ros2_controllers documents for the JTC (control.ros.org,
    joint_trajectory_controller user documentation: the `~/joint_trajectory` topic interface
    and its details about trajectories) together with the trajectory_msgs definitions, put in
    our own words: the message names at least one joint and no joint twice, and only joints
    the controller owns (a subset when partial goals are allowed); every point gives one
    position per named joint, and velocities and accelerations are either left out or given
    for every joint; time_from_start (relative to the header stamp) is never negative and
    strictly increases from point to point. Two checks are ours, for what the JTC would take
    but never do what we mean: at least one point (an empty trajectory makes it stop and
    hold) and finite values (a NaN would reach the hardware interface).

    Args:
        joint_names: The message's joint_names.
        points: Its points.
        controller_joints: The joints the receiving controller owns.
    """
    problems = []
    if not joint_names:
        problems.append("joint_names is empty")
    if len(set(joint_names)) != len(joint_names):
        problems.append(f"joint_names repeat a joint: {list(joint_names)}")
    foreign = [j for j in joint_names if j not in set(controller_joints)]
    if foreign:
        problems.append(f"joints {foreign} are not the controller's")
    if not points:
        problems.append("no points")
    size = len(joint_names)
    previous = None
    for k, point in enumerate(points):
        if len(point.positions) != size:
            problems.append(f"point {k}: {len(point.positions)} positions for {size} joints")
        for field in ("velocities", "accelerations"):
            n = len(getattr(point, field))
            if n not in (0, size):
                problems.append(f"point {k}: {n} {field} for {size} joints")
        values = (*point.positions, *point.velocities, *point.accelerations)
        if not all(math.isfinite(v) for v in values):
            problems.append(f"point {k}: a value is not finite")
        t = point.time_from_start_s
        if not math.isfinite(t) or t < 0:
            problems.append(f"point {k}: time_from_start {t} is negative or not finite")
        elif previous is not None and t <= previous:
            problems.append(f"point {k}: time_from_start {t} does not increase (after {previous})")
        previous = t
    return problems
