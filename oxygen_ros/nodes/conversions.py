"""Pure conversions between ROS messages and the engine's / the pure modules' types.

No function here needs a node, a clock or an executor: each takes plain values and returns a
message (or the reverse), so every one is unit-tested without spinning anything.

Invariants:
- Times are float seconds on the engine side and `builtin_interfaces/Time` on the ROS side;
  `seconds_to_time(time_to_seconds(t)) == t` for every valid stamp (nanoseconds are rounded,
  never truncated into the wrong second).
- An `ObservationFrame` is turned into an engine `Observation` only if it satisfies the
  message invariants (matching lengths, every slot rgb8 at the model resolution, finite joint
  values, the configured joints); otherwise `RejectedFrameError` says why.
- Speech statuses map one to one except REFUSED, which is reported as STATUS_ERROR with the
  engine's reason in `error` (the message has no REFUSED status).
"""

from __future__ import annotations

import array
import math
from collections.abc import Mapping, Sequence

import numpy as np
from builtin_interfaces.msg import Duration, Time
from diagnostic_msgs.msg import DiagnosticStatus, KeyValue
from sensor_msgs.msg import Image
from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

from oxygen_ros.engine.action_stream import Slice
from oxygen_ros.engine.types import Observation, RequestKind, RequestOutput, RequestStatus
from oxygen_ros.msg import ActionChunk, MemoryEntry, ObservationFrame, SpeechToken
from oxygen_ros.nodes.fusion import FusedFrame
from oxygen_ros.nodes.memory_store import MemoryRecord
from oxygen_ros.nodes.trajectory_groups import GroupTrajectory, TrajectoryPoint

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
DIAGNOSTIC_LEVELS = {
    "OK": DiagnosticStatus.OK,
    "WARN": DiagnosticStatus.WARN,
    "ERROR": DiagnosticStatus.ERROR,
    "STALE": DiagnosticStatus.STALE,
}


class RejectedFrameError(ValueError):
    """An ObservationFrame that must not reach the model; `reason` is a counter name."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


# ------------------------------------------------------------------------------------ time
def time_to_seconds(stamp: Time) -> float:
    """`builtin_interfaces/Time` -> float seconds."""
    return stamp.sec + stamp.nanosec * 1e-9


def seconds_to_time(seconds: float) -> Time:
    """Float seconds (>= 0) -> `builtin_interfaces/Time`; negative or non-finite gives zero."""
    if not math.isfinite(seconds) or seconds <= 0:
        return Time()
    total_ns = round(seconds * 1e9)
    return Time(sec=total_ns // 1_000_000_000, nanosec=total_ns % 1_000_000_000)


def seconds_to_duration(seconds: float) -> Duration:
    """Float seconds (>= 0) -> `builtin_interfaces/Duration`."""
    total_ns = max(round(seconds * 1e9), 0)
    return Duration(sec=total_ns // 1_000_000_000, nanosec=total_ns % 1_000_000_000)


# ---------------------------------------------------------------------------------- images
def rgb_image_msg(rgb: np.ndarray, stamp: Time, frame_id: str) -> Image:
    """uint8 [h, w, 3] RGB -> rgb8 `sensor_msgs/Image` without row padding."""
    msg = Image()
    msg.header.stamp = stamp
    msg.header.frame_id = frame_id
    msg.height, msg.width = int(rgb.shape[0]), int(rgb.shape[1])
    msg.encoding = "rgb8"
    msg.is_bigendian = 0
    msg.step = msg.width * 3
    msg.data = np.ascontiguousarray(rgb, dtype=np.uint8).tobytes()
    return msg


def image_msg_to_rgb(msg: Image) -> np.ndarray:
    """An rgb8 `sensor_msgs/Image` without padding -> uint8 [h, w, 3] view of its buffer."""
    if msg.encoding != "rgb8" or msg.step != msg.width * 3:
        raise RejectedFrameError("bad_image", f"expected unpadded rgb8, got {msg.encoding}")
    data = np.frombuffer(msg.data, dtype=np.uint8)
    if data.size != msg.height * msg.width * 3:
        raise RejectedFrameError("bad_image", f"rgb8 image data has {data.size} bytes")
    return data.reshape(msg.height, msg.width, 3)


# ----------------------------------------------------------------------------- observation
def observation_frame_msg(
    frame: FusedFrame,
    images: Sequence[np.ndarray | None],
    sequence: int,
    frame_id: str,
    image_height: int,
    image_width: int,
) -> ObservationFrame:
    """A fused frame plus its converted slot images -> `ObservationFrame`.

    Args:
        frame: From `Fuser.fuse`.
        images: Per slot, uint8 [image_height, image_width, 3], or None for an invalid slot
            (sent as an all-zero image of the same size).
        sequence: The node's frame counter.
        frame_id: Robot base frame.
        image_height: Model resolution rows.
        image_width: Model resolution columns.
    """
    msg = ObservationFrame()
    stamp = seconds_to_time(frame.stamp)
    msg.header.stamp = stamp
    msg.header.frame_id = frame_id
    msg.sequence = sequence
    msg.image_names = list(frame.slots)
    blank = None
    out_images = []
    for image, slot_stamp in zip(images, frame.image_stamps, strict=True):
        if image is None:
            if blank is None:
                blank = np.zeros((image_height, image_width, 3), dtype=np.uint8)
            image = blank
        out_images.append(rgb_image_msg(image, seconds_to_time(slot_stamp), frame_id))
    msg.images = out_images
    msg.image_valid = [
        bool(v) and img is not None for v, img in zip(frame.valid, images, strict=True)
    ]
    msg.image_stamps = [seconds_to_time(s) for s in frame.image_stamps]
    msg.joint_names = list(frame.joint_names)
    msg.joint_positions = array.array("d", np.asarray(frame.positions, dtype=np.float64).tobytes())
    msg.joint_velocities = array.array(
        "d", np.asarray(frame.velocities, dtype=np.float64).tobytes()
    )
    msg.max_skew = float(frame.max_skew)
    return msg


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


# ----------------------------------------------------------------------------- diagnostics
def diagnostic_status(
    name: str, hardware_id: str, level: str, message: str, values: Mapping[str, object]
) -> DiagnosticStatus:
    """A `DiagnosticStatus` with `level` one of OK/WARN/ERROR/STALE and stringified values."""
    status = DiagnosticStatus()
    status.level = DIAGNOSTIC_LEVELS[level]
    status.name = name
    status.hardware_id = hardware_id
    status.message = message
    status.values = [KeyValue(key=str(k), value=_format_value(v)) for k, v in values.items()]
    return status


def _format_value(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def diagnostic_values(status: DiagnosticStatus) -> dict[str, str]:
    """`DiagnosticStatus.values` as a dict (for consumers such as the console view)."""
    return {kv.key: kv.value for kv in status.values}
