"""The recorder's rclpy <-> bag conversions and its parameter checks (no node spun)."""

from __future__ import annotations

import pytest
from rclpy.duration import Duration
from rclpy.qos import QoSProfile
from rosbags.interfaces import QosDurability, QosHistory, QosReliability
from sensor_msgs.msg import Image

from oxygen_ros.msg import ObservationFrame
from oxygen_ros.nodes.common.parameters import validate
from oxygen_ros.nodes.common.runtime import LATCHED_QOS, SENSOR_QOS
from oxygen_ros.nodes.recorder.conversions import bag_qos, message_class, qos_profile
from oxygen_ros.nodes.recorder.params import RECORDER
from oxygen_ros.recording.qos import EndpointQos, reader_matches, reader_qos
from oxygen_ros.recording.typestore import UnknownTypeError
from oxygen_ros.srv import ResetEpisode

SPECS = {spec.name: spec for spec in RECORDER}


def test_publisher_qos_as_the_bag_records_it() -> None:
    latched = bag_qos(LATCHED_QOS)
    assert latched.reliability == QosReliability.RELIABLE
    assert latched.durability == QosDurability.TRANSIENT_LOCAL
    assert (latched.history, latched.depth) == (QosHistory.KEEP_LAST, 1)
    sensor = bag_qos(SENSOR_QOS)
    assert sensor.reliability == QosReliability.BEST_EFFORT
    assert sensor.durability == QosDurability.VOLATILE
    timed = bag_qos(QoSProfile(depth=3, deadline=Duration(seconds=1, nanoseconds=5)))
    assert (timed.deadline.sec, timed.deadline.nsec) == (1, 5)


def test_reader_profile_matches_the_publishers() -> None:
    profile = qos_profile(reader_qos([bag_qos(LATCHED_QOS)], depth=100))
    assert profile.durability == LATCHED_QOS.durability
    assert profile.reliability == LATCHED_QOS.reliability
    assert profile.depth == 100
    sensor = qos_profile(reader_qos([bag_qos(SENSOR_QOS), bag_qos(LATCHED_QOS)], depth=5))
    assert sensor.reliability == SENSOR_QOS.reliability
    assert sensor.durability == SENSOR_QOS.durability
    latched_reader = EndpointQos(reliable=True, transient_local=True, depth=1)
    assert reader_matches(latched_reader, bag_qos(LATCHED_QOS))
    assert not reader_matches(latched_reader, bag_qos(SENSOR_QOS))
    assert reader_matches(EndpointQos(False, False, 1), bag_qos(LATCHED_QOS))


def test_message_classes() -> None:
    assert message_class("sensor_msgs/msg/Image") is Image
    assert message_class("oxygen_ros/msg/ObservationFrame") is ObservationFrame
    assert message_class("oxygen_ros/srv/ResetEpisode_Request") is ResetEpisode.Request
    for bad in ("no_such_pkg/msg/Thing", "sensor_msgs/msg/NoSuch", "Image", "a//b"):
        with pytest.raises(UnknownTypeError):
            message_class(bad)


@pytest.mark.parametrize(
    ("name", "value", "accepted"),
    [
        ("exclude_regex", "^/diag|/rosout", True),
        ("exclude_regex", "(", False),
        ("output_dir", "", True),
        ("output_dir", "~/bags/run_1", True),
        ("queue_depth", 0, False),
        ("discovery_period_s", 0.01, False),
        ("topics", ["/clock", "joint_states"], True),
        ("compression", "zstd", True),
        ("compression", "lz4", False),
    ],
)
def test_parameter_checks(name, value, accepted) -> None:
    _value, reason = validate(SPECS[name], value)
    assert (reason is None) == accepted, reason
