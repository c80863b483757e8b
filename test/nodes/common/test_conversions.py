"""Shared message conversions (times, rgb8 images, diagnostics), without spinning a node."""

import math

import numpy as np
import pytest
from builtin_interfaces.msg import Time

from oxygen_ros.nodes.common.conversions import (
    diagnostic_status,
    diagnostic_values,
    rgb_image_msg,
    seconds_to_time,
    time_to_seconds,
)


@pytest.mark.parametrize("seconds", [0.0, 1e-9, 0.5, 1.999999999, 12.345678901, 1.7e9 + 0.25])
def test_time_round_trip(seconds: float) -> None:
    t = seconds_to_time(seconds)
    assert 0 <= t.nanosec < 1_000_000_000
    assert time_to_seconds(t) == pytest.approx(seconds, abs=1e-9 * max(1.0, seconds) * 1e-6 + 1e-9)
    assert seconds_to_time(time_to_seconds(t)) == t


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf])
def test_bad_seconds_give_zero(bad: float) -> None:
    assert seconds_to_time(bad) == Time()


def test_diagnostic_status() -> None:
    status = diagnostic_status("oxygen_ros: x", "/x", "WARN", "slow", {"rate": 69.51234, "n": 3})
    assert diagnostic_values(status) == {"rate": "69.5123", "n": "3"}
    assert status.level == b"\x01"


def test_rgb_image_msg_is_unpadded_rgb8() -> None:
    img = np.zeros((2, 3, 3), dtype=np.uint8)
    msg = rgb_image_msg(img, Time(sec=1), "cam")
    assert (msg.height, msg.width, msg.step, msg.encoding, len(msg.data)) == (2, 3, 9, "rgb8", 18)
