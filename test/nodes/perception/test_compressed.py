"""CompressedImage payloads: format strings as image_transport writes them, JPEG within its
stated error on a rendered workcell image, PNG exact, and bad data rejected with its reason."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
import pytest
from PIL import Image as PILImage

from oxygen_ros.nodes.common.image_conversion import ImageConversionError
from oxygen_ros.nodes.perception.compressed import (
    CompressedFormat,
    decode_compressed,
    parse_format,
    probe,
)

# JPEG at quality 90 with libjpeg's default 4:2:0 chroma subsampling (Pillow's and OpenCV's
# default, so image_transport's) on the workcell's rendered top camera, measured here: mean
# absolute error 0.46 levels per channel, PSNR 40.2 dB, the largest error 76 levels (one
# channel of a pixel on a saturated cube's edge, where 4:2:0 halves the colour resolution) and
# 15 levels in BT.601 luma. The bounds leave room for another libjpeg build; a decode with the
# channels swapped or the image shifted by a pixel breaks every one of them.
JPEG_QUALITY = 90
JPEG_MEAN_ABS_MAX = 1.0
JPEG_PSNR_MIN_DB = 37.0
JPEG_LUMA_MAX = 24.0
JPEG_MAX_ABS = 110


def encode(rgb: np.ndarray, codec: str, **kwargs) -> bytes:
    out = io.BytesIO()
    PILImage.fromarray(rgb).save(out, codec, **kwargs)
    return out.getvalue()


@pytest.fixture(scope="module")
def rendered() -> np.ndarray:
    """The workcell's top camera (224 x 224) over a sampled episode: table, arms, cubes."""
    from oxygen_ros.sim import robot, tasks
    from oxygen_ros.sim.workcell import Workcell, WorkcellConfig

    cell = Workcell(WorkcellConfig(cameras=("top",)))
    try:
        cell.reset(robot.HOME, tasks.sample_episode(0).objects)
        return cell.render("top")
    finally:
        cell.close()


def jpeg_error(decoded: np.ndarray, original: np.ndarray) -> dict[str, float]:
    diff = decoded.astype(np.float64) - original.astype(np.float64)
    luma = diff @ np.array([0.299, 0.587, 0.114])
    return {
        "mean_abs": float(np.abs(diff).mean()),
        "max_abs": float(np.abs(diff).max()),
        "psnr_db": float(10 * np.log10(255.0**2 / np.mean(diff**2))),
        "luma_max": float(np.abs(luma).max()),
    }


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("rgb8; jpeg compressed bgr8", CompressedFormat("JPEG", "rgb8")),
        ("bgr8; png compressed bgr8", CompressedFormat("PNG", "bgr8")),
        ("mono8; jpeg compressed mono8", CompressedFormat("JPEG", "mono8")),
        ("rgb8; jpeg compressed ", CompressedFormat("JPEG", "rgb8")),  # older plugins
        ("jpeg", CompressedFormat("JPEG", "")),
        ("JPG", CompressedFormat("JPEG", "")),
        ("png", CompressedFormat("PNG", "")),
    ],
)
def test_image_transport_formats_parse(text: str, expected: CompressedFormat) -> None:
    assert parse_format(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "16UC1; compressedDepth png",  # the compressedDepth transport: depth, not a camera
        "theora",
        "rgb8; webp compressed bgr8",
        "rgb8; png",
        "a; b; jpeg compressed bgr8",
        "jpeg png",
    ],
)
def test_other_formats_are_refused(text: str) -> None:
    with pytest.raises(ImageConversionError) as info:
        parse_format(text)
    assert info.value.reason == "compressed_format"


def test_jpeg_round_trip_within_the_stated_error(rendered) -> None:
    data = encode(rendered, "JPEG", quality=JPEG_QUALITY)
    assert probe(data, "JPEG") == rendered.shape[:2]
    decoded = decode_compressed(data, "JPEG")
    assert decoded.dtype == np.uint8 and decoded.shape == rendered.shape
    assert decoded.flags.c_contiguous and decoded.flags.writeable
    error = jpeg_error(decoded, rendered)
    print(f"JPEG q{JPEG_QUALITY}, {len(data)} bytes: {error}")
    assert error["mean_abs"] <= JPEG_MEAN_ABS_MAX, error
    assert error["psnr_db"] >= JPEG_PSNR_MIN_DB, error
    assert error["luma_max"] <= JPEG_LUMA_MAX, error
    assert error["max_abs"] <= JPEG_MAX_ABS, error
    # Positive controls: the decode with red and blue swapped, or shifted by one pixel, is
    # outside the PSNR and luma bounds.
    for wrong in (decoded[:, :, ::-1], np.roll(decoded, 1, axis=1)):
        control = jpeg_error(wrong, rendered)
        assert control["psnr_db"] < JPEG_PSNR_MIN_DB - 5, control
        assert control["luma_max"] > JPEG_LUMA_MAX, control


@pytest.mark.parametrize("mode", ["RGB", "RGBA", "L", "P"])
def test_png_is_exact(rendered, mode: str) -> None:
    """PNG is lossless: RGB exactly, alpha dropped, grey replicated, a palette expanded."""
    source = PILImage.fromarray(rendered).convert(mode)
    data = encode(np.array(source), "PNG") if mode != "P" else _save(source, "PNG")
    decoded = decode_compressed(data, "PNG")
    np.testing.assert_array_equal(decoded, np.array(source.convert("RGB")))
    if mode in ("RGB", "RGBA"):
        np.testing.assert_array_equal(decoded, rendered)


def _save(image: PILImage.Image, codec: str) -> bytes:
    out = io.BytesIO()
    image.save(out, codec)
    return out.getvalue()


def test_grey_jpeg_is_replicated(rendered) -> None:
    grey = np.array(PILImage.fromarray(rendered).convert("L"))
    decoded = decode_compressed(encode(grey, "JPEG", quality=95), "JPEG")
    assert decoded.shape == (*grey.shape, 3)
    assert np.array_equal(decoded[..., 0], decoded[..., 2])
    assert np.abs(decoded[..., 0].astype(int) - grey).mean() < 1.0


@pytest.mark.parametrize(
    ("name", "codec", "reason"),
    [
        ("truncated jpeg", "JPEG", "compressed_data"),
        ("truncated png", "PNG", "compressed_data"),
        ("png named jpeg", "JPEG", "compressed_data"),
        ("jpeg named png", "PNG", "compressed_data"),
        ("random bytes", "JPEG", "compressed_data"),
        ("empty", "PNG", "compressed_data"),
        ("broken png crc", "PNG", "compressed_data"),
        ("16-bit png", "PNG", "compressed_format"),
    ],
)
def test_bad_data_is_rejected_with_its_reason(rendered, name, codec, reason) -> None:
    jpeg = encode(rendered, "JPEG", quality=JPEG_QUALITY)
    png = encode(rendered, "PNG")
    data = {
        "truncated jpeg": jpeg[: len(jpeg) // 2],
        "truncated png": png[: len(png) // 2],
        "png named jpeg": png,
        "jpeg named png": jpeg,
        "random bytes": np.random.default_rng(0).integers(0, 256, 4000, np.uint8).tobytes(),
        "empty": b"",
        "broken png crc": _flip_idat_byte(png),
        "16-bit png": _save(PILImage.fromarray(np.zeros((8, 8), np.uint16)), "PNG"),
    }[name]
    with pytest.raises(ImageConversionError) as info:
        decode_compressed(data, codec)
    assert info.value.reason == reason, info.value
    # Positive control: the intact payload of that codec decodes.
    decode_compressed(jpeg if codec == "JPEG" else png, codec)


def _flip_idat_byte(png: bytes) -> bytes:
    """One byte of the first IDAT chunk's data changed (its CRC no longer matches)."""
    at = png.index(b"IDAT") + 4 + 10
    return png[:at] + bytes([png[at] ^ 0xFF]) + png[at + 1 :]


def test_header_problems_show_without_decoding(rendered) -> None:
    """`probe` reads the header: a truncated JPEG passes it (its pixels fail later), an image
    larger than max_dim is refused before any pixel is decoded."""
    jpeg = encode(rendered, "JPEG", quality=JPEG_QUALITY)
    assert probe(jpeg[: len(jpeg) // 2], "JPEG") == (224, 224)
    with pytest.raises(ImageConversionError) as info:
        probe(jpeg, "JPEG", max_dim=200)
    assert info.value.reason == "size"
    with pytest.raises(ImageConversionError) as info:
        decode_compressed(jpeg, "JPEG", max_dim=200)
    assert info.value.reason == "size"


@pytest.mark.parametrize("side", [9000, 20000])  # over max_dim; over Pillow's bomb limit too
def test_a_huge_claimed_size_is_refused_before_decoding(side: int) -> None:
    """A PNG whose header claims side x side pixels (a decompression bomb's shape) is refused
    from its header (`size`), without allocating or decoding its pixels."""
    png = bytearray(encode(np.zeros((1, 1, 3), np.uint8), "PNG"))
    at = png.index(b"IHDR")
    png[at + 4 : at + 12] = struct.pack(">II", side, side)
    png[at + 17 : at + 21] = struct.pack(">I", zlib.crc32(bytes(png[at : at + 17])))
    for call in (probe, decode_compressed):
        with pytest.raises(ImageConversionError) as info:
            call(bytes(png), "PNG")
        assert info.value.reason == "size", info.value
    # Control: the same patch to a size within max_dim passes the header check.
    png[at + 4 : at + 12] = struct.pack(">II", 64, 48)
    png[at + 17 : at + 21] = struct.pack(">I", zlib.crc32(bytes(png[at : at + 17])))
    assert probe(bytes(png), "PNG") == (48, 64)
