"""Pure helpers of oxygen_ros.nodes.common.runtime (no rclpy context needed)."""

from oxygen_ros.nodes.common.runtime import ReasonThrottle


def test_reason_throttle_is_per_reason_and_counts_suppressed() -> None:
    now = [0.0]
    throttle = ReasonThrottle(5.0, clock=lambda: now[0])
    assert throttle.message("empty", "empty instruction") == "empty instruction"
    assert throttle.message("empty", "empty instruction") is None
    # Another reason is not hidden by the first one's throttle.
    assert throttle.message("non_utf8", "not UTF-8") == "not UTF-8"
    now[0] = 4.9
    assert throttle.message("empty", "empty instruction") is None
    now[0] = 5.0
    assert throttle.message("empty", "empty") == "empty (+2 more since the last report)"
    now[0] = 10.1
    assert throttle.message("empty", "empty") == "empty"
