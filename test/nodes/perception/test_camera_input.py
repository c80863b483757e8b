"""A camera's input per transport: the topic and type it subscribes, the checks on arrival
(headers only), both transports reaching the same model image, and each message decoded and
counted once."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image as PILImage
from sensor_msgs.msg import CompressedImage, Image

from oxygen_ros.nodes.common.image_conversion import ImageConversionError, encode_image
from oxygen_ros.nodes.perception import compressed
from oxygen_ros.nodes.perception.camera_input import CameraInput
from oxygen_ros.nodes.perception.fusion import CameraSpec
from oxygen_ros.nodes.perception.params import PERCEPTION_CAMERA, RAW_ENCODINGS, TRANSPORTS

OUT = (96, 96)
H, W = 48, 64


def picture() -> np.ndarray:
    y, x = np.mgrid[0:H, 0:W]
    return np.stack([4 * x, 5 * y, 255 - 4 * x], axis=2).astype(np.uint8)


def camera(transport: str, encoding: str = "", size=(H, W)) -> CameraInput:
    spec = CameraSpec("head", "base_0_rgb", "head_camera/image_raw", encoding)
    return CameraInput(spec, transport, size, OUT, 8192)


def raw_msg(rgb: np.ndarray, encoding: str = "bgr8") -> Image:
    step, data = encode_image(rgb, encoding, row_padding=2)
    return Image(height=rgb.shape[0], width=rgb.shape[1], encoding=encoding, step=step, data=data)


def compressed_msg(rgb: np.ndarray, codec: str = "PNG", fmt: str | None = None) -> CompressedImage:
    out = io.BytesIO()
    PILImage.fromarray(rgb).save(out, codec)
    default = f"rgb8; {codec.lower()} compressed bgr8"
    return CompressedImage(format=fmt or default, data=out.getvalue())


def test_transports_subscribe_as_image_transport_does() -> None:
    raw, comp = camera("raw"), camera("compressed")
    assert (raw.msg_type, raw.topic) == (Image, "head_camera/image_raw")
    assert (comp.msg_type, comp.topic) == (CompressedImage, "head_camera/image_raw/compressed")
    with pytest.raises(ValueError, match="theora"):
        camera("theora")


def test_params_name_what_the_code_supports() -> None:
    from oxygen_ros.nodes.common.image_conversion import BYTES_PER_PIXEL
    from oxygen_ros.nodes.perception import camera_input

    assert set(RAW_ENCODINGS) == set(BYTES_PER_PIXEL)
    assert TRANSPORTS == camera_input.TRANSPORTS
    assert {"transport", "width", "height"} <= {s.name for s in PERCEPTION_CAMERA}


def test_raw_and_png_give_the_same_model_image() -> None:
    rgb = picture()
    raw, comp = camera("raw"), camera("compressed")
    raw_in, comp_in = raw_msg(rgb), compressed_msg(rgb)
    raw.check(raw_in)
    comp.check(comp_in)
    a, b = raw.model_image(raw_in), comp.model_image(comp_in)
    assert a.new and b.new and a.error is None and b.error is None
    assert a.image.shape == (*OUT, 3)
    np.testing.assert_array_equal(a.image, b.image)
    np.testing.assert_array_equal(comp.rgb(comp_in), rgb)


def test_each_message_is_decoded_once(monkeypatch) -> None:
    calls = []
    real = compressed.decode_compressed
    monkeypatch.setattr(
        "oxygen_ros.nodes.perception.camera_input.decode_compressed",
        lambda *a: calls.append(1) or real(*a),
    )
    comp = camera("compressed")
    first, second = compressed_msg(picture()), compressed_msg(picture()[::-1].copy())
    comp.check(first)  # headers only
    assert calls == []
    comp.rgb(first)  # the cube detector's full-size image, then the frame's model image
    assert comp.model_image(first).new and len(calls) == 1
    again = comp.model_image(first)
    assert not again.new and again.image is not None and len(calls) == 1
    assert comp.model_image(second).new and len(calls) == 2  # control: a new message decodes


def test_a_message_that_does_not_decode_fails_once() -> None:
    comp = camera("compressed", size=(0, 0))
    good = compressed_msg(picture(), "JPEG")
    truncated = CompressedImage(format=good.format, data=bytes(good.data[:-64]))
    comp.check(truncated)  # its header is intact: found out when decoded
    first = comp.model_image(truncated)
    assert first.image is None and first.error.reason == "compressed_data" and first.new
    again = comp.model_image(truncated)
    assert (again.image, again.error, again.new) == (None, None, False)  # counted once
    with pytest.raises(ImageConversionError):
        comp.rgb(truncated)
    assert comp.model_image(good).image is not None  # control


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("raw encoding", "encoding_mismatch"),
        ("compressed source encoding", "encoding_mismatch"),
        ("unknown format", "compressed_format"),
        ("garbage", "compressed_data"),
        ("compressed size", "size_mismatch"),
        ("odd yuv width", "odd_width"),
    ],
)
def test_bad_input_is_rejected_on_arrival(name: str, reason: str) -> None:
    rgb = picture()
    transport = "raw" if name in ("raw encoding", "odd yuv width") else "compressed"
    cam = camera(transport, encoding="" if name == "odd yuv width" else "rgb8")
    msg = {
        "raw encoding": lambda: raw_msg(rgb, "bgr8"),
        "compressed source encoding": lambda: compressed_msg(rgb, fmt="bgr8; png compressed bgr8"),
        "unknown format": lambda: compressed_msg(rgb, fmt="16UC1; compressedDepth png"),
        "garbage": lambda: CompressedImage(format="jpeg", data=b"\xff\xd8 not really"),
        "compressed size": lambda: compressed_msg(rgb[:, :-2].copy()),
        "odd yuv width": lambda: Image(
            height=2, width=5, encoding="uyvy", step=10, data=bytes(20)
        ),
    }[name]()
    with pytest.raises(ImageConversionError) as info:
        cam.check(msg)
    assert info.value.reason == reason, info.value


def test_checks_accept_what_is_configured() -> None:
    """Controls for the rejections above: the matching inputs pass."""
    rgb = picture()
    camera("raw", encoding="rgb8").check(raw_msg(rgb, "rgb8"))
    camera("compressed", encoding="rgb8").check(compressed_msg(rgb))
    camera("compressed", encoding="rgb8").check(compressed_msg(rgb, fmt="png"))  # says no source
    camera("compressed", size=(0, 0)).check(compressed_msg(rgb[:, :-2].copy()))  # any size
    camera("raw").check(Image(height=2, width=6, encoding="uyvy", step=12, data=bytes(24)))
