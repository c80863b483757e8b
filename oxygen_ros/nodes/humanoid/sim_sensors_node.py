"""Synthetic humanoid sensors for machines without a robot: moving camera images and smoothly
varying joint states.

Each configured camera publishes `sensor_msgs/Image` in its configured encoding and size at
`camera_rate_hz` (one timer per camera, so cameras are not phase-locked); joint states are
published at `joint_rate_hz` in reverse configured order (so consumers must reorder by name).

Invariants:
- Every message is stamped with the node clock at publish time.
- Images are pre-rendered once per camera (`FRAMES_PER_CYCLE` frames looping every
  `motion_period_s`), so publishing costs a buffer assignment, not rendering.
- Joint position i is `AMPLITUDE * sin(2 pi t / motion_period_s + i)` and its velocity is the
  exact derivative.
"""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Sequence

import numpy as np
from rclpy.node import Node
from sensor_msgs.msg import Image, JointState

from oxygen_ros.nodes.common.image_conversion import encode_image
from oxygen_ros.nodes.common.parameters import NodeParameters, camera_specs
from oxygen_ros.nodes.common.params import SHARED
from oxygen_ros.nodes.common.runtime import SENSOR_QOS, run_node
from oxygen_ros.nodes.humanoid.params import SIM_CAMERA, SIM_SENSORS

FRAMES_PER_CYCLE = 24
AMPLITUDE = 0.5  # rad


def render_frames(width: int, height: int, encoding: str, seed: int) -> tuple[int, list[bytes]]:
    """A loop of moving images: a scrolling colour gradient with a bouncing square.

    Returns:
        (step, per-frame encoded buffers).
    """
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base_color = rng.integers(60, 200, size=3)
    frames = []
    step = 0
    side = max(min(width, height) // 5, 1)
    for i in range(FRAMES_PER_CYCLE):
        phase = i / FRAMES_PER_CYCLE
        shift = (x + int(phase * width)) % width
        rgb = np.empty((height, width, 3), dtype=np.uint8)
        rgb[..., 0] = (base_color[0] + 255 * shift // max(width, 1)) % 256
        rgb[..., 1] = (base_color[1] + 255 * y // max(height, 1)) % 256
        rgb[..., 2] = base_color[2]
        cx = int((0.5 + 0.4 * math.sin(2 * math.pi * phase)) * (width - side))
        cy = int((0.5 + 0.4 * math.cos(2 * math.pi * phase)) * (height - side))
        rgb[cy : cy + side, cx : cx + side] = (255, 255, 255)
        step, data = encode_image(rgb, encoding)
        frames.append(data)
    return step, frames


def joint_values(t: float, n: int, period_s: float) -> tuple[np.ndarray, np.ndarray]:
    """Smooth positions and their exact velocities at time t."""
    w = 2 * math.pi / period_s
    phases = w * t + np.arange(n)
    return AMPLITUDE * np.sin(phases), AMPLITUDE * w * np.cos(phases)


class SimSensorsNode(Node):
    """Publishes synthetic camera images and joint states."""

    def __init__(self) -> None:
        super().__init__("sim_sensors")
        self.params = NodeParameters(
            self,
            SHARED + SIM_SENSORS,
            dependent=lambda v: [
                s for c in v["camera_names"] for s in camera_specs(c, SIM_CAMERA)
            ],
        )
        p = self.params
        self._joint_names = list(p["joint_names"])
        self._frame_id = p["frame_id"]
        self._cameras: list[tuple[str, object, int, list[bytes], Image]] = []
        self._camera_timers = []
        for index, name in enumerate(p["camera_names"]):
            prefix = f"cameras.{name}."
            width, height = p[prefix + "width"], p[prefix + "height"]
            encoding = p[prefix + "encoding"]
            step, frames = render_frames(width, height, encoding, seed=index)
            pub = self.create_publisher(Image, p[prefix + "topic"], SENSOR_QOS)
            template = Image(height=height, width=width, encoding=encoding, step=step)
            template.header.frame_id = f"{name}_optical_frame"
            self._cameras.append((name, pub, step, frames, template))
            self._camera_timers.append(
                self.create_timer(
                    1.0 / p["camera_rate_hz"], functools.partial(self._publish_camera, index)
                )
            )
        self._joint_pub = self.create_publisher(JointState, p["joint_state_topic"], SENSOR_QOS)
        self._joint_timer = self.create_timer(1.0 / p["joint_rate_hz"], self._publish_joints)
        self.params.add_listener(self._on_params)
        self.get_logger().info(
            f"publishing {len(self._cameras)} cameras at {p['camera_rate_hz']:g} Hz and "
            f"{len(self._joint_names)} joints at {p['joint_rate_hz']:g} Hz"
        )

    def _now(self) -> tuple[float, object]:
        stamp = self.get_clock().now()
        return stamp.nanoseconds * 1e-9, stamp.to_msg()

    def _publish_camera(self, index: int) -> None:
        _, pub, _, frames, template = self._cameras[index]
        t, stamp = self._now()
        period = self.params["motion_period_s"]
        frame = int((t % period) / period * FRAMES_PER_CYCLE) % FRAMES_PER_CYCLE
        msg = Image(
            height=template.height,
            width=template.width,
            encoding=template.encoding,
            step=template.step,
            is_bigendian=0,
        )
        msg.header.frame_id = template.header.frame_id
        msg.header.stamp = stamp
        msg.data = frames[frame]
        pub.publish(msg)

    def _publish_joints(self) -> None:
        t, stamp = self._now()
        positions, velocities = joint_values(
            t, len(self._joint_names), self.params["motion_period_s"]
        )
        msg = JointState()
        msg.header.stamp = stamp
        msg.header.frame_id = self._frame_id
        msg.name = self._joint_names[::-1]
        msg.position = positions[::-1].tolist()
        msg.velocity = velocities[::-1].tolist()
        self._joint_pub.publish(msg)

    def _on_params(self, changed: dict) -> None:
        if "camera_rate_hz" in changed:
            for timer in self._camera_timers:
                timer.timer_period_ns = int(1e9 / changed["camera_rate_hz"])
        if "joint_rate_hz" in changed:
            self._joint_timer.timer_period_ns = int(1e9 / changed["joint_rate_hz"])

    def close(self) -> None:
        for timer in [*self._camera_timers, self._joint_timer]:
            timer.cancel()


def main(args: Sequence[str] | None = None) -> int:
    return run_node(SimSensorsNode, "sim_sensors", args, num_threads=1)


if __name__ == "__main__":
    sys.exit(main())
