"""Pure conversions between the inference node's messages and the engine's / the pure modules'
types: ObservationFrame in, ActionChunk / JointTrajectory, SpeechToken and MemoryEntry out.

No function here needs a node, a clock or an executor: each takes plain values and returns a
message (or the reverse), so every one is unit-tested without spinning anything.

Invariants:
- An `ObservationFrame` is turned into an engine `Observation` only if it satisfies the
  message invariants (matching lengths, every slot rgb8 at the model resolution, finite joint
  values, the configured joints); otherwise `RejectedFrameError` says why.
- Speech statuses map one to one except REFUSED, which is reported as STATUS_ERROR with the
  engine's reason in `error` (the message has no REFUSED status).
"""

from __future__ import annotations

import array
import math
from collections.abc import Sequence

import numpy as np
from builtin_interfaces.msg import Time
from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

from oxygen_ros.engine.action_stream import Slice
from oxygen_ros.engine.types import Observation, RequestKind, RequestOutput, RequestStatus
from oxygen_ros.msg import ActionChunk, MemoryEntry, ObservationFrame, SpeechToken
from oxygen_ros.nodes.common.conversions import (
    RejectedFrameError,
    image_msg_to_rgb,
    seconds_to_duration,
    seconds_to_time,
    time_to_seconds,
)
from oxygen_ros.nodes.inference.memory_store import MemoryRecord
from oxygen_ros.nodes.inference.trajectory_groups import GroupTrajectory, TrajectoryPoint

KIND_TO_MSG: dict[RequestKind, int] = {
    RequestKind.SUBTASK: SpeechToken.KIND_SUBTASK,
    RequestKind.NARRATION: SpeechToken.KIND_NARRATION,
    RequestKind.MEMORY: SpeechToken.KIND_MEMORY,
}
MSG_TO_KIND: dict[int, RequestKind] = {v: k for k, v in KIND_TO_MSG.items()}
STATUS_TO_MSG: dict[RequestStatus, int] = {
    RequestStatus.WAITING: SpeechToken.STATUS_RUNNING,
    RequestStatus.RUNNING: SpeechToken.STATUS_RUNNING,
    RequestStatus.FINISHED_STOPPED: SpeechToken.STATUS_STOPPED,
    RequestStatus.FINISHED_LENGTH: SpeechToken.STATUS_LENGTH,
    RequestStatus.FINISHED_ABORTED: SpeechToken.STATUS_ABORTED,
    RequestStatus.FINISHED_ERROR: SpeechToken.STATUS_ERROR,
    RequestStatus.REFUSED: SpeechToken.STATUS_ERROR,
}


def observation_from_msg(
    msg: ObservationFrame,
    prompt: str,
    slots: Sequence[str],
    joint_names: Sequence[str],
    image_shape: tuple[int, int],
) -> Observation:
    """`ObservationFrame` -> engine `Observation` (images keyed by slot, state in joint order).

    Args:
        msg: The frame.
        prompt: The current task instruction.
        slots: The model's image slots; slots the frame lacks are masked out.
        joint_names: The configured joint order of the state vector.
        image_shape: (height, width) of the model's images.

    Raises:
        RejectedFrameError: The frame breaks a message invariant or does not match the model.
    """
    n_images = len(msg.image_names)
    if not (len(msg.images) == len(msg.image_valid) == len(msg.image_stamps) == n_images):
        raise RejectedFrameError(
            "bad_frame", "image_names/images/image_valid/image_stamps lengths differ"
        )
    if len(msg.joint_positions) != len(msg.joint_names):
        raise RejectedFrameError("bad_frame", "joint_names and joint_positions lengths differ")
    index = {name: i for i, name in enumerate(msg.joint_names)}
    missing = [n for n in joint_names if n not in index]
    if missing:
        raise RejectedFrameError("joint_mismatch", f"frame lacks configured joints {missing[:5]}")
    positions = np.asarray(msg.joint_positions, dtype=np.float64)
    state = positions[[index[n] for n in joint_names]].astype(np.float32)
    if not np.all(np.isfinite(state)):
        raise RejectedFrameError("non_finite", "joint positions contain NaN or inf")
    height, width = image_shape
    images: dict[str, np.ndarray] = {}
    masks: dict[str, bool] = {}
    by_name = {name: i for i, name in enumerate(msg.image_names)}
    for slot in slots:
        i = by_name.get(slot)
        if i is None:
            images[slot] = np.zeros((height, width, 3), dtype=np.uint8)
            masks[slot] = False
            continue
        img = msg.images[i]
        if (img.height, img.width) != (height, width):
            raise RejectedFrameError(
                "image_size",
                f"slot {slot} is {img.width}x{img.height}, model wants {width}x{height}",
            )
        images[slot] = image_msg_to_rgb(img)
        masks[slot] = bool(msg.image_valid[i])
    return Observation(
        images=images,
        image_masks=masks,
        state=state,
        prompt=prompt,
        stamp=time_to_seconds(msg.header.stamp),
    )


# --------------------------------------------------------------------------------- actions
def action_chunk_msg(
    piece: Slice,
    sequence: int,
    joint_names: Sequence[str],
    frame_id: str,
    trigger: int = ActionChunk.TRIGGER_TICK,
) -> ActionChunk:
    """A stream slice -> `ActionChunk` (row 0 at `piece.stamp`); `trigger` is one of
    `ActionChunk.TRIGGER_*` (the values of `action_publisher.TRIGGER_*`)."""
    msg = ActionChunk()
    msg.header.stamp = seconds_to_time(piece.stamp)
    msg.header.frame_id = frame_id
    msg.sequence = sequence
    msg.chunk_id = max(piece.chunk.chunk_id, 0)
    msg.dt = float(piece.chunk.dt)
    msg.joint_names = list(joint_names)
    msg.horizon = len(piece.rows)
    msg.actions = array.array("f", np.ascontiguousarray(piece.rows, dtype=np.float32).tobytes())
    msg.observation_stamp = seconds_to_time(piece.chunk.observation_stamp)
    msg.inference_latency = float(piece.chunk.latency_s)
    if math.isfinite(piece.valid_until):
        msg.valid_until = seconds_to_time(piece.valid_until)
    msg.trigger = trigger
    return msg


def action_chunk_rows(msg: ActionChunk) -> np.ndarray:
    """`ActionChunk.actions` as float32 [horizon, len(joint_names)]."""
    return np.asarray(msg.actions, dtype=np.float32).reshape(msg.horizon, len(msg.joint_names))


def joint_trajectory_msg(
    trajectory: GroupTrajectory, stamp: float, frame_id: str
) -> JointTrajectory:
    """One group's trajectory -> `trajectory_msgs/JointTrajectory` (positions only; the
    header stamp is the time its time_from_start values count from)."""
    msg = JointTrajectory()
    msg.header.stamp = seconds_to_time(stamp)
    msg.header.frame_id = frame_id
    msg.joint_names = list(trajectory.group.joint_names)
    rows = np.ascontiguousarray(trajectory.positions, dtype=np.float64)
    points = []
    for k in range(len(rows)):
        point = JointTrajectoryPoint()
        point.positions = array.array("d", rows[k].tobytes())
        point.time_from_start = seconds_to_duration(float(trajectory.time_from_start_s[k]))
        points.append(point)
    msg.points = points
    return msg


def trajectory_points(msg: JointTrajectory) -> tuple[list[str], list[TrajectoryPoint]]:
    """`trajectory_msgs/JointTrajectory` -> (joint names, points), for
    `trajectory_groups.trajectory_problems`."""
    points = [
        TrajectoryPoint(
            tuple(p.positions),
            p.time_from_start.sec + p.time_from_start.nanosec * 1e-9,
            tuple(p.velocities),
            tuple(p.accelerations),
        )
        for p in msg.points
    ]
    return list(msg.joint_names), points


# ---------------------------------------------------------------------------------- speech
def speech_token_msg(
    output: RequestOutput, stamp: Time, observation_stamp: float | None = None
) -> SpeechToken:
    """One engine `RequestOutput` -> `SpeechToken` (final when the request finished).

    `observation_stamp`: seconds of the frame the request started from (None: zero)."""
    msg = SpeechToken()
    msg.header.stamp = stamp
    if observation_stamp is not None:
        msg.observation_stamp = seconds_to_time(observation_stamp)
    msg.request_id = output.request_id
    msg.kind = KIND_TO_MSG[output.kind]
    msg.token_index = max(int(output.first_index), 0)
    msg.text_delta = output.text_delta
    msg.token_ids = [int(t) for t in output.new_token_ids]
    msg.final = bool(output.status.finished)
    msg.text = (output.text or "") if msg.final else ""
    msg.status = STATUS_TO_MSG[output.status]
    if output.status >= RequestStatus.FINISHED_ABORTED:
        msg.error = output.error or output.status.name.lower()
    return msg


# ---------------------------------------------------------------------------------- memory
def memory_entry_msg(record: MemoryRecord, frame_id: str) -> MemoryEntry:
    """A stored `MemoryRecord` -> `MemoryEntry`."""
    msg = MemoryEntry()
    msg.header.stamp = seconds_to_time(record.stamp)
    msg.header.frame_id = frame_id
    msg.entry_id = record.entry_id
    msg.text = record.text
    msg.observation_stamp = seconds_to_time(record.observation_stamp)
    msg.kind = record.kind
    msg.tags = list(record.tags)
    msg.request_id = record.request_id
    return msg
