"""Pure conversions for the workcell simulator node: commands in, joint states / status out.

No function here needs a node, a clock or an executor; each is unit-tested without spinning.

Invariants:
- Command columns are mapped to robot joints by name, never by position: an `ActionChunk` or
  `JointTrajectory` may list any subset of the configured joints in any order. A name that is
  not a configured joint rejects the whole command (`RejectedCommandError`, reason
  `unknown_joint`); the command buffer's own checks (shape, NaN/inf, increasing times) apply to
  what is built here.
- A zero header stamp means "now" (the simulator's current time); otherwise the stamp is the
  absolute sim time of row 0 / of the trajectory start.
- Joint states list the joints in the configured order, whatever order the simulator uses.
"""

from __future__ import annotations

import array
import math
from collections.abc import Mapping, Sequence

import numpy as np
from geometry_msgs.msg import Pose
from rosgraph_msgs.msg import Clock
from sensor_msgs.msg import JointState
from trajectory_msgs.msg import JointTrajectory

from oxygen_ros.msg import ActionChunk, EpisodeStatus
from oxygen_ros.nodes.common.conversions import seconds_to_time, time_to_seconds
from oxygen_ros.nodes.workcell.workcell_episode import EpisodeTracker
from oxygen_ros.sim.command_buffer import (
    RejectedCommandError,
    TimedTargets,
    from_chunk,
    from_trajectory,
)

PHASES = {
    "idle": EpisodeStatus.PHASE_IDLE,
    "running": EpisodeStatus.PHASE_RUNNING,
    "succeeded": EpisodeStatus.PHASE_SUCCEEDED,
    "failed": EpisodeStatus.PHASE_FAILED,
}


# ---------------------------------------------------------------------------------- commands
def joint_indices(names: Sequence[str], index: Mapping[str, int]) -> tuple[int, ...]:
    """Command column names -> robot joint indices.

    Raises:
        RejectedCommandError: `unknown_joint` for a name `index` lacks, `bad_joint` for none.
    """
    unknown = [n for n in names if n not in index]
    if unknown:
        raise RejectedCommandError("unknown_joint", f"unknown joint names {unknown[:5]}")
    if not names:
        raise RejectedCommandError("bad_joint", "no joint names")
    return tuple(index[n] for n in names)


def start_time(stamp_s: float, now: float) -> float:
    """Header stamp -> absolute sim time of the command's start (zero stamp: `now`)."""
    return now if stamp_s == 0.0 else stamp_s


def chunk_targets(msg: ActionChunk, index: Mapping[str, int], now: float) -> TimedTargets:
    """`ActionChunk` -> `TimedTargets`: row k at `header.stamp + k * dt`, columns by name;
    nothing runs after its `valid_until` (the sender's expiry; zero: none).

    Args:
        msg: The chunk.
        index: Joint name -> robot joint index (the command buffer's column order).
        now: Current sim time (used for a zero stamp).

    Raises:
        RejectedCommandError: Unknown joint names, a size that does not match
            `horizon x len(joint_names)`, NaN/inf, non-increasing row times.
    """
    names = list(msg.joint_names)
    indices = joint_indices(names, index)
    values = np.asarray(msg.actions, dtype=np.float64)
    if msg.horizon < 1 or values.size != msg.horizon * len(names):
        raise RejectedCommandError(
            "bad_shape",
            f"{values.size} actions for horizon {msg.horizon} x {len(names)} joints",
        )
    if not math.isfinite(msg.dt):
        raise RejectedCommandError("non_finite", f"dt is {msg.dt}")
    rows = values.reshape(msg.horizon, len(names))
    start = start_time(time_to_seconds(msg.header.stamp), now)
    valid_until = time_to_seconds(msg.valid_until) or math.inf  # zero: no bound
    return from_chunk(start, float(msg.dt), rows, indices, valid_until, int(msg.sequence))


def trajectory_targets(
    msg: JointTrajectory, index: Mapping[str, int], now: float, command_id: int = 0
) -> TimedTargets:
    """`JointTrajectory` -> `TimedTargets`: point k at `header.stamp + time_from_start[k]`.

    Only positions are used (the simulator's actuators are position servos).

    Raises:
        RejectedCommandError: Unknown joint names, no points, a point whose positions do not
            match `joint_names`, NaN/inf, non-increasing `time_from_start`.
    """
    names = list(msg.joint_names)
    indices = joint_indices(names, index)
    if not msg.points:
        raise RejectedCommandError("bad_shape", "trajectory has no points")
    if any(len(p.positions) != len(names) for p in msg.points):
        raise RejectedCommandError(
            "bad_shape", f"every point needs {len(names)} positions (one per joint name)"
        )
    rows = np.array([np.asarray(p.positions, dtype=np.float64) for p in msg.points])
    offsets = np.array([time_to_seconds(p.time_from_start) for p in msg.points])
    start = start_time(time_to_seconds(msg.header.stamp), now)
    return from_trajectory(start, offsets, rows, indices, math.inf, command_id)


# ---------------------------------------------------------------------------------- outputs
def clock_msg(seconds: float) -> Clock:
    return Clock(clock=seconds_to_time(seconds))


def joint_state_msg(
    stamp_s: float,
    frame_id: str,
    names: Sequence[str],
    order: Sequence[int],
    positions: np.ndarray,
    velocities: np.ndarray | None = None,
) -> JointState:
    """Simulator joint vectors -> `JointState` listing `names` (entry i is joint `order[i]`)."""
    msg = JointState()
    msg.header.stamp = seconds_to_time(stamp_s)
    msg.header.frame_id = frame_id
    msg.name = list(names)
    msg.position = array.array("d", np.asarray(positions, np.float64)[list(order)].tobytes())
    if velocities is not None:
        msg.velocity = array.array("d", np.asarray(velocities, np.float64)[list(order)].tobytes())
    return msg


def pose_msg(position: np.ndarray, quaternion_wxyz: np.ndarray) -> Pose:
    """A position [3] and a MuJoCo quaternion (w, x, y, z) -> `geometry_msgs/Pose`."""
    pose = Pose()
    pose.position.x, pose.position.y, pose.position.z = (float(v) for v in position)
    w, x, y, z = (float(v) for v in quaternion_wxyz)
    pose.orientation.w, pose.orientation.x = w, x
    pose.orientation.y, pose.orientation.z = y, z
    return pose


def episode_status_msg(
    episode: EpisodeTracker,
    now: float,
    real_time_factor: float,
    objects: Sequence[tuple[str, np.ndarray, np.ndarray]],
    frame_id: str,
) -> EpisodeStatus:
    """The current episode -> `EpisodeStatus` stamped `now` (sim time).

    Args:
        episode: The tracker (its `spec` provides seed, instruction and template).
        now: Current sim time.
        real_time_factor: Achieved sim seconds per wall second.
        objects: (name, position [3], quaternion w, x, y, z) per object, in the world frame.
        frame_id: Frame of the object poses.
    """
    msg = EpisodeStatus()
    msg.header.stamp = seconds_to_time(now)
    msg.header.frame_id = frame_id
    msg.episode_id = episode.episode_id
    spec = episode.spec
    if spec is not None:
        msg.seed = int(spec.seed)
        msg.instruction = spec.instruction
        msg.task_template = spec.template
    msg.phase = PHASES[episode.phase]
    msg.success = episode.success
    msg.elapsed_s = episode.elapsed(now)
    msg.time_to_success_s = episode.time_to_success_s
    msg.time_limit_s = episode.time_limit_s
    msg.stage = episode.stage
    msg.real_time_factor = float(real_time_factor)
    msg.starvation_events = episode.starvation_events
    msg.object_names = [name for name, _, _ in objects]
    msg.object_poses = [pose_msg(position, quat) for _, position, quat in objects]
    return msg
