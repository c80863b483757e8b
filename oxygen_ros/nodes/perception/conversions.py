"""The perception node's output message: a fused frame and its converted images ->
`ObservationFrame` (the inference node reads it back with `inference.conversions`).

Pure: no node, clock or executor (unit-tested without spinning anything).
"""

from __future__ import annotations

import array
from collections.abc import Sequence

import numpy as np

from oxygen_ros.msg import ObservationFrame
from oxygen_ros.nodes.common.conversions import rgb_image_msg, seconds_to_time
from oxygen_ros.nodes.perception.fusion import FusedFrame


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
