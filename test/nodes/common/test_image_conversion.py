"""Image decoding and resizing against hand-made buffers of every supported encoding."""

import array

import numpy as np
import pytest

from oxygen_ros.nodes.common.image_conversion import (
    ENCODING_CHANNELS,
    ImageConversionError,
    check_image,
    decode_image,
    encode_image,
    resize_with_pad,
    to_model_image,
)

H, W = 3, 4


def expected_rgb() -> np.ndarray:
    """A 3x4 image whose every pixel differs: r = 10*y + x, g = 100 + r, b = 200 - r."""
    y, x = np.mgrid[0:H, 0:W]
    r = 10 * y + x
    return np.stack([r, 100 + r, 200 - r], axis=2).astype(np.uint8)


def hand_made(encoding: str, padding: int) -> tuple[int, bytes]:
    """Builds the buffer byte by byte, independently of `encode_image`."""
    rgb = expected_rgb()
    out = bytearray()
    for yy in range(H):
        for xx in range(W):
            r, g, b = (int(c) for c in rgb[yy, xx])
            out += {
                "rgb8": bytes([r, g, b]),
                "bgr8": bytes([b, g, r]),
                "rgba8": bytes([r, g, b, 77]),
                "bgra8": bytes([b, g, r, 77]),
                "mono8": bytes([r]),
            }[encoding]
        out += bytes([0xEE] * padding)
    return W * ENCODING_CHANNELS[encoding] + padding, bytes(out)


@pytest.mark.parametrize("padding", [0, 1, 5])
@pytest.mark.parametrize("encoding", ["rgb8", "bgr8", "rgba8", "bgra8"])
def test_color_encodings_decode_exactly(encoding: str, padding: int) -> None:
    step, data = hand_made(encoding, padding)
    out = decode_image(H, W, encoding, step, data)
    assert out.dtype == np.uint8 and out.shape == (H, W, 3) and out.flags.c_contiguous
    np.testing.assert_array_equal(out, expected_rgb())


@pytest.mark.parametrize("padding", [0, 3])
def test_mono8_replicates_gray(padding: int) -> None:
    step, data = hand_made("mono8", padding)
    out = decode_image(H, W, "mono8", step, data)
    red = expected_rgb()[:, :, 0]
    np.testing.assert_array_equal(out, np.stack([red, red, red], axis=2))


@pytest.mark.parametrize(
    "container",
    [bytes, bytearray, lambda b: array.array("B", b), lambda b: np.frombuffer(b, dtype=np.uint8)],
)
def test_accepts_rclpy_and_numpy_buffers_and_never_aliases(container) -> None:
    step, data = hand_made("rgb8", 0)
    buf = container(data)
    out = decode_image(H, W, "rgb8", step, buf)
    np.testing.assert_array_equal(out, expected_rgb())
    assert (out.flags.writeable and out.base is None) or not np.shares_memory(
        out, np.frombuffer(buf, dtype=np.uint8)
    )


@pytest.mark.parametrize("encoding", list(ENCODING_CHANNELS))
@pytest.mark.parametrize("padding", [0, 2])
def test_encode_image_round_trip(encoding: str, padding: int) -> None:
    rgb = expected_rgb()
    step, data = encode_image(rgb, encoding, row_padding=padding)
    assert step == W * ENCODING_CHANNELS[encoding] + padding and len(data) == step * H
    out = decode_image(H, W, encoding, step, data)
    if encoding == "mono8":
        assert np.all(out[:, :, 0] == out[:, :, 1])
    else:
        np.testing.assert_array_equal(out, rgb)


@pytest.mark.parametrize("encoding", ["16UC1", "yuv420", "bayer_rggb8", "RGB8", "", "32FC1"])
def test_unknown_encodings_rejected(encoding: str) -> None:
    with pytest.raises(ImageConversionError) as info:
        decode_image(H, W, encoding, W * 3, bytes(H * W * 3))
    assert info.value.reason == "encoding"


@pytest.mark.parametrize(
    ("height", "width", "step", "length", "reason"),
    [
        (H, W, W * 3 - 1, (W * 3 - 1) * H, "step"),  # step smaller than a row
        (H, W, W * 3, W * 3 * H - 1, "data_length"),  # one byte short
        (H, W, W * 3, W * 3 * H + 1, "data_length"),  # one byte too many
        (H, W, W * 3 + 2, W * 3 * H, "data_length"),  # padding claimed but not present
        (0, W, W * 3, 0, "size"),
        (H, 0, 0, 0, "size"),
        (9000, 1, 3, 27000, "size"),  # beyond max_dim
    ],
)
def test_malformed_headers_rejected(height, width, step, length, reason) -> None:
    with pytest.raises(ImageConversionError) as info:
        decode_image(height, width, "rgb8", step, bytes(length))
    assert info.value.reason == reason


def test_check_image_rejects_unresizable_aspect() -> None:
    with pytest.raises(ImageConversionError) as info:
        check_image(1, 5000, "mono8", 5000, 5000, out_height=224, out_width=224)
    assert info.value.reason == "size"


def test_resize_with_pad_landscape_pads_top_and_bottom() -> None:
    img = np.full((480, 640, 3), 200, dtype=np.uint8)
    out = resize_with_pad(img, 224, 224)
    assert out.shape == (224, 224, 3)
    # 640x480 -> 224x168, centred: 28 zero rows above and below.
    assert np.all(out[:28] == 0) and np.all(out[196:] == 0)
    assert np.all(out[28:196] == 200)


def test_resize_with_pad_portrait_pads_left_and_right() -> None:
    img = np.full((200, 100, 3), 50, dtype=np.uint8)
    out = resize_with_pad(img, 224, 224)
    # 100x200 -> 112x224, centred: 56 zero columns each side.
    assert np.all(out[:, :56] == 0) and np.all(out[:, 168:] == 0)
    assert np.all(out[:, 56:168] == 50)


def test_resize_keeps_content_orientation() -> None:
    img = np.zeros((100, 200, 3), dtype=np.uint8)
    img[:, :100, 0] = 255  # left half red
    img[:, 100:, 2] = 255  # right half blue
    out = resize_with_pad(img, 224, 224)
    # 200x100 -> 224x112, rows 56..167.
    assert out[112, 10, 0] == 255 and out[112, 10, 2] == 0
    assert out[112, 213, 2] == 255 and out[112, 213, 0] == 0


def test_same_size_is_returned_unchanged() -> None:
    img = np.random.default_rng(0).integers(0, 256, (224, 224, 3), dtype=np.uint8)
    np.testing.assert_array_equal(resize_with_pad(img, 224, 224), img)


def test_to_model_image_from_padded_bgr() -> None:
    rgb = np.zeros((48, 64, 3), dtype=np.uint8)
    rgb[..., 0] = 255
    step, data = encode_image(rgb, "bgr8", row_padding=7)
    out = to_model_image(48, 64, "bgr8", step, data, 224, 224)
    assert out.shape == (224, 224, 3)
    assert np.all(out[112, 112] == [255, 0, 0])  # still red after the channel swap
    assert np.all(out[0, 0] == 0)  # padding


# ---------------------------------------------------------------- YUV 4:2:2 (driver encodings)
def reference_bt601(y: int, u: int, v: int) -> tuple[int, int, int]:
    """One pixel, BT.601 limited range, with the textbook's rounded coefficients (as in the
    ITU-R BT.601 conversion tables), per pixel in plain Python: independent of the code's
    derivation from Kr, Kb and its vectorised path."""
    c, d, e = y - 16, u - 128, v - 128
    r = 1.164383 * c + 1.596027 * e
    g = 1.164383 * c - 0.391762 * d - 0.812968 * e
    b = 1.164383 * c + 2.017232 * d
    return tuple(min(255, max(0, round(x))) for x in (r, g, b))


def yuv_planes(height: int, width: int, seed: int = 0):
    """Random Y per pixel and U, V per pair of pixels (covering the whole 0..255 range, so
    clipping is exercised too)."""
    rng = np.random.default_rng(seed)
    luma = rng.integers(0, 256, (height, width))
    chroma = rng.integers(0, 256, (height, width // 2, 2))
    return luma, chroma


def pack_yuv(luma, chroma, order: str, padding: int = 0) -> tuple[int, bytes]:
    """The buffer byte by byte: order "YUYV" or "UYVY" per pair of pixels."""
    height, width = luma.shape
    out = bytearray()
    for yy in range(height):
        for pair in range(width // 2):
            sample = {
                "Y0": luma[yy, 2 * pair],
                "Y1": luma[yy, 2 * pair + 1],
                "U": chroma[yy, pair, 0],
                "V": chroma[yy, pair, 1],
            }
            names = ("Y0", "U", "Y1", "V") if order == "YUYV" else ("U", "Y0", "V", "Y1")
            out += bytes(int(sample[n]) for n in names)
        out += bytes([0xEE] * padding)
    return 2 * width + padding, bytes(out)


def reference_rgb(luma, chroma) -> np.ndarray:
    height, width = luma.shape
    out = np.zeros((height, width, 3), dtype=np.uint8)
    for yy in range(height):
        for xx in range(width):
            u, v = chroma[yy, xx // 2]
            out[yy, xx] = reference_bt601(int(luma[yy, xx]), int(u), int(v))
    return out


@pytest.mark.parametrize("padding", [0, 6])
@pytest.mark.parametrize(
    ("encoding", "order"),
    [("yuv422_yuy2", "YUYV"), ("yuyv", "YUYV"), ("uyvy", "UYVY"), ("yuv422", "UYVY")],
)
def test_yuv422_matches_an_independent_bt601_reference(encoding, order, padding) -> None:
    """yuv422 is UYVY and yuv422_yuy2 is YUYV (sensor_msgs/image_encodings); every pixel
    within one level of the per-pixel reference (float rounding at .5), nearly all equal."""
    luma, chroma = yuv_planes(6, 10)
    step, data = pack_yuv(luma, chroma, order, padding)
    out = decode_image(6, 10, encoding, step, data)
    assert out.dtype == np.uint8 and out.shape == (6, 10, 3) and out.flags.c_contiguous
    diff = np.abs(out.astype(int) - reference_rgb(luma, chroma).astype(int))
    assert diff.max() <= 1 and (diff == 0).mean() >= 0.98, diff.max()


def test_yuv422_anchor_colours() -> None:
    """Video-range black, white and the BT.601 primaries come out at full range."""
    # (Y, U, V) per pair of identical pixels -> RGB; primaries from BT.601's 8-bit table.
    anchors = {
        (16, 128, 128): (0, 0, 0),
        (235, 128, 128): (255, 255, 255),
        (126, 128, 128): (128, 128, 128),
        (81, 90, 240): (255, 0, 0),
        (145, 54, 34): (0, 255, 0),
        (41, 240, 110): (0, 0, 255),
    }
    luma = np.array([[y for (y, _u, _v) in anchors for _ in range(2)]])
    chroma = np.array([[[u, v] for (_y, u, v) in anchors]])
    step, data = pack_yuv(luma, chroma, "UYVY")
    out = decode_image(1, luma.shape[1], "uyvy", step, data)
    expected = np.repeat(np.array(list(anchors.values())), 2, axis=0)
    assert np.abs(out[0].astype(int) - expected).max() <= 2, out[0]


def test_yuyv_and_uyvy_differ_on_the_same_bytes() -> None:
    """Positive control for the byte order: the same buffer read as the other order is
    another image."""
    luma, chroma = yuv_planes(4, 8, seed=1)
    step, data = pack_yuv(luma, chroma, "YUYV")
    assert not np.array_equal(
        decode_image(4, 8, "yuv422_yuy2", step, data), decode_image(4, 8, "uyvy", step, data)
    )


@pytest.mark.parametrize("encoding", ["uyvy", "yuv422", "yuv422_yuy2"])
def test_yuv422_odd_width_rejected(encoding: str) -> None:
    with pytest.raises(ImageConversionError) as info:
        decode_image(2, 5, encoding, 10, bytes(20))
    assert info.value.reason == "odd_width"
    with pytest.raises(ImageConversionError) as info:  # and the usual header checks
        decode_image(2, 6, encoding, 11, bytes(22))
    assert info.value.reason == "step"
    decode_image(2, 6, encoding, 12, bytes(24))  # control: the even width decodes


def test_to_model_image_from_yuv() -> None:
    luma = np.full((48, 64), 235)
    chroma = np.full((48, 32, 2), 128)
    step, data = pack_yuv(luma, chroma, "YUYV", padding=4)
    out = to_model_image(48, 64, "yuv422_yuy2", step, data, 224, 224)
    assert np.all(out[112, 112] == 255) and np.all(out[0, 0] == 0)  # white, padded
