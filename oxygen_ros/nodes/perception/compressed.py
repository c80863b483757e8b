"""`sensor_msgs/CompressedImage` payloads (image_transport's `compressed` transport: JPEG or PNG)
-> RGB arrays, decoded with Pillow.

Pure: bytes and a format string in, numpy out (no ROS).

Invariants:
- `parse_format` accepts what image_transport's compressed plugin writes,
  "<encoding>; jpeg compressed <encoding>" or "<encoding>; png compressed <encoding>" (the
  first encoding is the camera's own, the second the one the plugin compressed), and a bare
  "jpeg", "jpg" or "png", in any case. Anything else (compressedDepth, theora, "") raises
  `ImageConversionError` with reason `compressed_format`.
- Pillow is told to parse only the codec the format names, so other bytes are corrupt data,
  never decoded by another of Pillow's parsers. `probe` reads only the image's header (size,
  pixel mode), so a size check costs no pixel decoding and an image larger than `max_dim`
  per side (or over Pillow's own decompression-bomb limit) is never decoded (reason `size`).
- Only 8-bit pixel modes are accepted (grey, palette, RGB, with or without alpha, CMYK,
  YCbCr; reason `compressed_format` otherwise: 16-bit PNG is depth, not a colour camera);
  alpha is dropped and grey replicated, as for raw images.
- Data that Pillow cannot decode (corrupt, truncated, not the named codec) raises
  `ImageConversionError` with reason `compressed_data`, never a Pillow error. JPEG's
  entropy-coded data has no checksum: flipped bits inside it decode to wrong pixels without an
  error, as in every JPEG decoder; truncation and broken markers are detected.
"""

from __future__ import annotations

import dataclasses
import io

import numpy as np
from PIL import Image as PILImage

from oxygen_ros.nodes.common.image_conversion import DEFAULT_MAX_DIM, ImageConversionError

CODECS = {"jpeg": "JPEG", "jpg": "JPEG", "png": "PNG"}  # format word -> Pillow's format name
RGB_MODES = frozenset({"1", "L", "LA", "P", "PA", "RGB", "RGBA", "RGBX", "CMYK", "YCbCr"})


@dataclasses.dataclass(frozen=True)
class CompressedFormat:
    """A parsed `CompressedImage.format`."""

    codec: str  # Pillow's format name: JPEG or PNG
    source_encoding: str  # the camera's own encoding, "" when the format does not say


def parse_format(text: str) -> CompressedFormat:
    """Parses a `CompressedImage.format` string (see the module's invariants).

    Raises:
        ImageConversionError: reason `compressed_format`.
    """
    source, _, rest = text.rpartition(";") if ";" in text else ("", "", text)
    words = rest.strip().lower().split()
    codec = CODECS.get(words[0]) if words else None
    plain = len(words) == 1 and not source
    transported = len(words) in (2, 3) and words[1] == "compressed" and source.strip()
    if codec is None or not (plain or transported) or ";" in source:
        raise ImageConversionError(
            "compressed_format",
            f"unsupported compressed format {text[:80]!r} (image_transport's "
            "'<encoding>; jpeg|png compressed <encoding>', or 'jpeg' or 'png')",
        )
    return CompressedFormat(codec, source.strip())


def _open(data: bytes | bytearray | memoryview, codec: str) -> PILImage.Image:
    """The image's header, parsed (pixels not decoded yet)."""
    try:
        return PILImage.open(io.BytesIO(data), formats=[codec])
    except PILImage.DecompressionBombError as exc:  # Pillow's own limit, far over max_dim
        raise ImageConversionError("size", str(exc)) from None
    except Exception as exc:  # untrusted bytes: every parser error is the data's fault
        raise ImageConversionError(
            "compressed_data", f"not a readable {codec} image ({type(exc).__name__}: {exc})"
        ) from None


def probe(data: bytes | bytearray | memoryview, codec: str, max_dim: int = DEFAULT_MAX_DIM):
    """(rows, cols) of a compressed image, from its header only.

    Raises:
        ImageConversionError: `compressed_data` (unreadable header), `compressed_format` (not
            8-bit pixels) or `size` (zero or over `max_dim` per side).
    """
    with _open(data, codec) as image:
        _check_header(image, codec, max_dim)
        return image.height, image.width


def _check_header(image: PILImage.Image, codec: str, max_dim: int) -> None:
    if image.mode not in RGB_MODES:
        raise ImageConversionError(
            "compressed_format", f"{codec} with {image.mode} pixels: not an 8-bit colour image"
        )
    width, height = image.size
    if not (0 < width <= max_dim and 0 < height <= max_dim):
        raise ImageConversionError(
            "size", f"image size {width}x{height} outside 1..{max_dim} pixels per side"
        )


def decode_compressed(
    data: bytes | bytearray | memoryview, codec: str, max_dim: int = DEFAULT_MAX_DIM
) -> np.ndarray:
    """Decodes a JPEG or PNG payload into RGB.

    Args:
        data: The compressed bytes (`CompressedImage.data`).
        codec: `CompressedFormat.codec`.
        max_dim: Largest accepted height or width, checked before decoding.

    Returns:
        uint8 [rows, cols, 3] RGB, C-contiguous, owning its memory.

    Raises:
        ImageConversionError: `compressed_data`, `compressed_format` or `size` (see `probe`).
    """
    with _open(data, codec) as image:
        _check_header(image, codec, max_dim)
        try:
            rgb = image.convert("RGB")  # decodes every pixel
        except Exception as exc:  # truncated or corrupt: the data's fault
            raise ImageConversionError(
                "compressed_data", f"{codec} data does not decode ({type(exc).__name__}: {exc})"
            ) from None
    return np.array(rgb, dtype=np.uint8)  # a copy: owns its memory
