"""`sensor_msgs/Image` buffers to model-ready RGB arrays, with numpy (no cv_bridge).

ROS 2's cv_bridge is not installable on these machines (see ENVIRONMENT.md), and the PyPI port
breaks with numpy >= 2.3, so raw image buffers are decoded here with `np.frombuffer`.

Invariants:
- `decode_image` accepts exactly the encodings in `BYTES_PER_PIXEL`: the packed ones in
  `ENCODING_CHANNELS` (rgb8, bgr8, rgba8, bgra8, mono8, which `encode_image` also writes) and
  the camera drivers' YUV 4:2:2 ones in `YUV422_LAYOUTS` (decode only), and returns a
  C-contiguous uint8 [h, w, 3] RGB array that never aliases the message buffer; anything else
  raises `ImageConversionError` with the reason, never a numpy error from deep inside.
- YUV 4:2:2 (two pixels share one U and one V sample; the width must be even, reason
  `odd_width`) is converted with BT.601 in limited ("video") range, Y 16..235 and U, V
  16..240, as V4L2 cameras deliver it and as OpenCV's (cv_bridge's) YUV conversions read it;
  values outside the range are clipped to 0..255 after the conversion.
- Row padding is honoured: `step` may exceed `width * channels`; the padding bytes are dropped.
  The buffer must hold exactly `step * height` bytes (what `sensor_msgs/Image` specifies).
- `resize_with_pad` is openpi's own client-side preprocessing
  (`openpi_client.image_tools.resize_with_pad`: PIL bilinear, aspect-preserving, centred zero
  padding), so the node feeds the model what openpi's policies see.
"""

from __future__ import annotations

import array

import numpy as np
from openpi_client import image_tools

# Packed encoding -> bytes per pixel. All are 8 bit per channel, so `is_bigendian` does not
# matter.
ENCODING_CHANNELS: dict[str, int] = {"rgb8": 3, "bgr8": 3, "rgba8": 4, "bgra8": 4, "mono8": 1}
# YUV 4:2:2 encoding -> byte offsets of (Y0, U, Y1, V) in each 4-byte pair of pixels. ROS's
# sensor_msgs/image_encodings: "yuv422" is UYVY and "yuv422_yuy2" is YUYV (YUY2); "uyvy" and
# "yuyv" are their newer names.
YUV422_LAYOUTS: dict[str, tuple[int, int, int, int]] = {
    "uyvy": (1, 0, 3, 2),
    "yuv422": (1, 0, 3, 2),
    "yuyv": (0, 1, 2, 3),
    "yuv422_yuy2": (0, 1, 2, 3),
}
# Every decodable encoding -> bytes per pixel.
BYTES_PER_PIXEL: dict[str, int] = {**ENCODING_CHANNELS, **dict.fromkeys(YUV422_LAYOUTS, 2)}
# BT.601, limited range: RGB = Y_SCALE * (Y - 16) + CHROMA @ (U - 128, V - 128).
Y_SCALE = 255.0 / 219.0
CHROMA = (255.0 / 224.0) * np.array(
    [[0.0, 1.402], [-0.114 * 1.772 / 0.587, -0.299 * 1.402 / 0.587], [1.772, 0.0]]
)
DEFAULT_MAX_DIM = 8192  # pixels per side; larger images are refused as malformed
# What `Image.data` may be: rclpy returns array("B"); tests pass bytes or numpy arrays.
ImageBuffer = bytes | bytearray | memoryview | array.array | np.ndarray


class ImageConversionError(ValueError):
    """An image that cannot be converted; `reason` is a short machine-friendly category."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason  # encoding, size, odd_width, step, data_length (and see callers)


def check_image(
    height: int,
    width: int,
    encoding: str,
    step: int,
    data_length: int,
    max_dim: int = DEFAULT_MAX_DIM,
    out_height: int | None = None,
    out_width: int | None = None,
) -> None:
    """Validates an image header against its buffer length without touching the pixels.

    Args:
        height: Rows.
        width: Columns.
        encoding: `sensor_msgs/Image` encoding string.
        step: Bytes per row, padding included.
        data_length: Bytes in the buffer.
        max_dim: Largest accepted height or width.
        out_height: Model rows; with `out_width`, also checks the padded resize is possible.
        out_width: Model columns.

    Raises:
        ImageConversionError: The first problem found, with its category in `reason`.
    """
    channels = BYTES_PER_PIXEL.get(encoding)
    if channels is None:
        raise ImageConversionError(
            "encoding",
            f"unsupported encoding {encoding!r} (supported: {', '.join(BYTES_PER_PIXEL)})",
        )
    if height <= 0 or width <= 0 or height > max_dim or width > max_dim:
        raise ImageConversionError(
            "size", f"image size {width}x{height} outside 1..{max_dim} pixels per side"
        )
    if encoding in YUV422_LAYOUTS and width % 2:
        raise ImageConversionError(
            "odd_width", f"{encoding} pairs pixels, but the width {width} is odd"
        )
    if step < width * channels:
        raise ImageConversionError(
            "step", f"step {step} < width * channels = {width * channels} for {encoding}"
        )
    if data_length != step * height:
        raise ImageConversionError(
            "data_length",
            f"data has {data_length} bytes, expected step * height = {step * height}",
        )
    if out_height is not None and out_width is not None:
        check_resizable(height, width, out_height, out_width)


def check_resizable(height: int, width: int, out_height: int, out_width: int) -> None:
    """Raises `ImageConversionError` ("size") when the aspect-preserving resize of a
    `width` x `height` image to `out_width` x `out_height` would shrink a side to zero."""
    ratio = max(width / out_width, height / out_height)
    if int(height / ratio) < 1 or int(width / ratio) < 1:
        raise ImageConversionError(
            "size", f"image {width}x{height} cannot be resized to {out_width}x{out_height}"
        )


def decode_image(
    height: int,
    width: int,
    encoding: str,
    step: int,
    data: ImageBuffer,
    max_dim: int = DEFAULT_MAX_DIM,
) -> np.ndarray:
    """Decodes a raw image buffer into an RGB array.

    Args:
        height: Rows.
        width: Columns.
        encoding: `sensor_msgs/Image` encoding string.
        step: Bytes per row, padding included.
        data: The buffer (bytes, `array('B')` as rclpy returns it, or a uint8 array).
        max_dim: Largest accepted height or width.

    Returns:
        uint8 [height, width, 3] RGB, C-contiguous, owning its memory.

    Raises:
        ImageConversionError: Unknown encoding, zero or too large size, an odd width for YUV
            4:2:2, step too small, or a buffer whose length is not `step * height`.
    """
    buffer = np.frombuffer(data, dtype=np.uint8) if not isinstance(data, np.ndarray) else data
    buffer = buffer.reshape(-1)
    if buffer.dtype != np.uint8:
        raise ImageConversionError(
            "data_length", f"image data has dtype {buffer.dtype}, not uint8"
        )
    check_image(height, width, encoding, step, buffer.size, max_dim=max_dim)
    channels = BYTES_PER_PIXEL[encoding]
    row_bytes = width * channels
    rows = buffer.reshape(height, step)[:, :row_bytes].reshape(height, width, channels)
    if encoding in YUV422_LAYOUTS:
        return yuv422_to_rgb(rows.reshape(height, width // 2, 4), YUV422_LAYOUTS[encoding])
    if encoding == "rgb8":
        return rows.copy()  # never alias the message buffer
    if encoding == "bgr8":
        return np.ascontiguousarray(rows[:, :, ::-1])
    if encoding == "rgba8":
        return np.ascontiguousarray(rows[:, :, :3])
    if encoding == "bgra8":
        return np.ascontiguousarray(rows[:, :, 2::-1])
    return np.ascontiguousarray(np.repeat(rows, 3, axis=2))  # mono8


def yuv422_to_rgb(pairs: np.ndarray, layout: tuple[int, int, int, int]) -> np.ndarray:
    """BT.601 limited-range YUV 4:2:2 -> RGB.

    Args:
        pairs: uint8 [h, w / 2, 4], each row of 4 bytes two pixels sharing U and V.
        layout: Byte offsets of (Y0, U, Y1, V) (`YUV422_LAYOUTS`).

    Returns:
        uint8 [h, w, 3] RGB, rounded to nearest and clipped.
    """
    y0, u, y1, v = layout
    h, half = pairs.shape[:2]
    luma = Y_SCALE * (pairs[..., [y0, y1]].astype(np.float32) - 16.0)  # [h, w / 2, 2]
    chroma = pairs[..., [u, v]].astype(np.float32) - 128.0  # [h, w / 2, 2]: U, V
    rgb = np.empty((h, half, 2, 3), dtype=np.float32)  # [h, pair, pixel of the pair, channel]
    for channel, (from_u, from_v) in enumerate(CHROMA.astype(np.float32)):
        offset = from_u * chroma[..., 0] + from_v * chroma[..., 1]  # shared by the pair
        np.add(luma, offset[..., None], out=rgb[..., channel])
    np.rint(rgb, out=rgb)
    np.clip(rgb, 0, 255, out=rgb)
    return rgb.astype(np.uint8).reshape(h, 2 * half, 3)


def resize_with_pad(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """Aspect-preserving bilinear resize to [height, width, 3] with centred zero padding.

    Args:
        image: uint8 [h, w, 3].
        height: Output rows.
        width: Output columns.

    Returns:
        uint8 [height, width, 3]; `image` itself when it already has that size.

    Raises:
        ImageConversionError: The image is so elongated that one side would shrink to zero.
    """
    check_resizable(*image.shape[:2], height, width)
    return image_tools.resize_with_pad(image, height, width)


def to_model_image(
    height: int,
    width: int,
    encoding: str,
    step: int,
    data: ImageBuffer,
    out_height: int,
    out_width: int,
    max_dim: int = DEFAULT_MAX_DIM,
) -> np.ndarray:
    """`decode_image` then `resize_with_pad`: uint8 [out_height, out_width, 3] RGB."""
    rgb = decode_image(height, width, encoding, step, data, max_dim=max_dim)
    return resize_with_pad(rgb, out_height, out_width)


def encode_image(rgb: np.ndarray, encoding: str, row_padding: int = 0) -> tuple[int, bytes]:
    """Encodes uint8 RGB [h, w, 3] into a raw buffer (test images and the sim sensors).

    Args:
        rgb: uint8 [h, w, 3].
        encoding: One of `ENCODING_CHANNELS`.
        row_padding: Extra bytes at the end of each row (filled with 0xAB).

    Returns:
        (step, data).
    """
    if encoding not in ENCODING_CHANNELS:
        raise ImageConversionError("encoding", f"unsupported encoding {encoding!r}")
    if encoding == "rgb8":
        pixels = rgb
    elif encoding == "bgr8":
        pixels = rgb[:, :, ::-1]
    elif encoding in ("rgba8", "bgra8"):
        alpha = np.full((*rgb.shape[:2], 1), 255, dtype=np.uint8)
        color = rgb if encoding == "rgba8" else rgb[:, :, ::-1]
        pixels = np.concatenate([color, alpha], axis=2)
    else:  # mono8: ITU-R 601 luma
        luma = rgb.astype(np.float32) @ np.array([0.299, 0.587, 0.114], dtype=np.float32)
        pixels = np.clip(np.rint(luma), 0, 255).astype(np.uint8)[:, :, None]
    h, w, c = pixels.shape
    rows = np.full((h, w * c + row_padding), 0xAB, dtype=np.uint8)
    rows[:, : w * c] = pixels.reshape(h, w * c)
    return w * c + row_padding, rows.tobytes()
