"""One configured camera's input: its transport (image_transport's `raw` or `compressed`), the
message type and topic it subscribes, the check on arrival, and the decodes to RGB.

Invariants:
- raw: `sensor_msgs/Image` on the camera's topic, any encoding of
  `image_conversion.BYTES_PER_PIXEL`; compressed: `sensor_msgs/CompressedImage` on
  `<topic>/compressed` (image_transport's naming), JPEG or PNG (`compressed.parse_format`).
- `check` runs on arrival and decodes no pixels: a raw image's header against its buffer, a
  compressed image's format string and its image header (codec, size, pixel mode). A configured
  `encoding` must match a raw image's encoding, and a compressed image's source encoding when
  its format names one (`encoding_mismatch`). A compressed image must have the configured
  `size` (`size_mismatch`; a 0 accepts any), since its message carries no size of its own.
- Both transports reach the same path: full-size RGB (`rgb`), then `resize_with_pad` to the
  model resolution (`model_image`). The newest message's full-size RGB and model image are kept
  (keyed by the message object, which the fuser keeps alive), so a message is decoded once
  unless a frame goes back to an older one; a message that fails to decode fails once
  (`Conversion.new`), so its rejection is counted once.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
from sensor_msgs.msg import CompressedImage, Image

from oxygen_ros.nodes.common.image_conversion import (
    ImageConversionError,
    check_image,
    check_resizable,
    decode_image,
    resize_with_pad,
)
from oxygen_ros.nodes.perception.compressed import decode_compressed, parse_format, probe
from oxygen_ros.nodes.perception.fusion import CameraSpec

TRANSPORTS = ("raw", "compressed")
COMPRESSED_SUFFIX = "/compressed"  # image_transport: <base topic>/<transport name>


@dataclasses.dataclass(frozen=True)
class Conversion:
    """The model image of one message."""

    image: np.ndarray | None  # uint8 [rows, cols, 3], None when it cannot be converted
    error: ImageConversionError | None  # why not (on the call that found it out)
    new: bool  # this call converted (or failed to): count it


class CameraInput:
    """One camera's messages -> RGB (see the module's invariants)."""

    def __init__(
        self,
        spec: CameraSpec,
        transport: str,
        size: tuple[int, int],
        out_size: tuple[int, int],
        max_dim: int,
    ) -> None:
        """
        Args:
            spec: The camera (name, slot, topic, expected encoding or "").
            transport: One of `TRANSPORTS`.
            size: (rows, cols) a compressed image must decode to; 0 accepts any.
            out_size: The model resolution (rows, cols).
            max_dim: Largest accepted height or width.
        """
        if transport not in TRANSPORTS:
            raise ValueError(f"camera {spec.name}: transport {transport!r} not in {TRANSPORTS}")
        self.spec = spec
        self.transport = transport
        self.size = size
        self.out_size = out_size
        self.max_dim = max_dim
        # (message, its full-size RGB or why it does not decode)
        self._full: tuple[Any, np.ndarray | ImageConversionError] | None = None
        self._model: tuple[Any, Conversion] | None = None  # (message, its conversion)

    @property
    def compressed(self) -> bool:
        return self.transport == "compressed"

    @property
    def msg_type(self) -> type:
        return CompressedImage if self.compressed else Image

    @property
    def topic(self) -> str:
        return self.spec.topic + COMPRESSED_SUFFIX if self.compressed else self.spec.topic

    def check(self, msg) -> None:
        """Validates a message on arrival without decoding its pixels.

        Raises:
            ImageConversionError: The first problem found, its category in `reason`.
        """
        expected = self.spec.encoding
        if not self.compressed:
            if expected and msg.encoding != expected:
                raise ImageConversionError(
                    "encoding_mismatch", f"encoding {msg.encoding!r}, configured {expected!r}"
                )
            check_image(
                msg.height,
                msg.width,
                msg.encoding,
                msg.step,
                len(msg.data),
                self.max_dim,
                *self.out_size,
            )
            return
        fmt = parse_format(msg.format)
        if expected and fmt.source_encoding and fmt.source_encoding != expected:
            raise ImageConversionError(
                "encoding_mismatch",
                f"format {msg.format!r} is from {fmt.source_encoding}, configured {expected!r}",
            )
        rows, cols = probe(_bytes(msg.data), fmt.codec, self.max_dim)
        self._check_size(rows, cols)

    def rgb(self, msg) -> np.ndarray:
        """The message's full-size uint8 [rows, cols, 3] RGB (the newest one's result kept).

        Raises:
            ImageConversionError: It cannot be decoded (again when asked again).
        """
        if self._full is None or self._full[0] is not msg:
            try:
                self._full = (msg, self._decode(msg))
            except ImageConversionError as exc:
                self._full = (msg, exc)
        if isinstance(self._full[1], ImageConversionError):
            raise self._full[1]
        return self._full[1]

    def _decode(self, msg) -> np.ndarray:
        if not self.compressed:
            return decode_image(
                msg.height, msg.width, msg.encoding, msg.step, msg.data, self.max_dim
            )
        image = decode_compressed(_bytes(msg.data), parse_format(msg.format).codec, self.max_dim)
        self._check_size(*image.shape[:2])  # the header said so; the pixels must agree
        return image

    def model_image(self, msg) -> Conversion:
        """The message at the model resolution (see `Conversion`)."""
        if self._model is not None and self._model[0] is msg:
            return dataclasses.replace(self._model[1], error=None, new=False)
        try:
            image = resize_with_pad(self.rgb(msg), *self.out_size)
            result = Conversion(image, None, True)
        except ImageConversionError as exc:
            result = Conversion(None, exc, True)
        self._model = (msg, result)
        return result

    def _check_size(self, rows: int, cols: int) -> None:
        if (self.size[0] and rows != self.size[0]) or (self.size[1] and cols != self.size[1]):
            raise ImageConversionError(
                "size_mismatch",
                f"decoded {cols}x{rows}, camera configured {self.size[1]}x{self.size[0]}",
            )
        check_resizable(rows, cols, *self.out_size)


def _bytes(data) -> bytes | memoryview:
    """`CompressedImage.data` (rclpy: `array('B')`; tests: bytes) as a buffer Pillow reads."""
    return data if isinstance(data, bytes | bytearray) else memoryview(data).cast("B")
