"""Pure conversions between ROS messages and plain values that every node uses: times, rgb8
images, diagnostics (each node's own message conversions are in its package).

No function here needs a node, a clock or an executor: each takes plain values and returns a
message (or the reverse), so every one is unit-tested without spinning anything.

Invariants:
- Times are float seconds on the engine side and `builtin_interfaces/Time` on the ROS side;
  `seconds_to_time(time_to_seconds(t)) == t` for every valid stamp (nanoseconds are rounded,
  never truncated into the wrong second).
- An image that is not unpadded rgb8 raises `RejectedFrameError` saying why.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
from builtin_interfaces.msg import Duration, Time
from diagnostic_msgs.msg import DiagnosticStatus, KeyValue
from sensor_msgs.msg import Image

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
