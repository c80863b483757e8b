"""`recording.selection` (which topics are recorded / replayed) and `recording.qos` (which
QoS a recorder subscribes with and a replay publishes with)."""

from __future__ import annotations

import pytest

from oxygen_ros.recording.qos import offered_qos, reader_qos, writer_qos
from oxygen_ros.recording.selection import (
    compile_exclude,
    parse_remaps,
    replay_topics,
    should_record,
)

RELIABLE, BEST_EFFORT, TRANSIENT_LOCAL, VOLATILE, KEEP_LAST = 1, 2, 1, 2, 1
LATCHED = offered_qos(KEEP_LAST, 1, RELIABLE, TRANSIENT_LOCAL)
RELIABLE_VOLATILE = offered_qos(KEEP_LAST, 10, RELIABLE, VOLATILE)
SENSOR = offered_qos(KEEP_LAST, 5, BEST_EFFORT, VOLATILE)

BAG = {
    "/clock": "rosgraph_msgs/msg/Clock",
    "/top_camera/image_raw": "sensor_msgs/msg/Image",
    "/cam/compressed": "sensor_msgs/msg/CompressedImage",
    "/joint_states": "sensor_msgs/msg/JointState",
    "/joint_commands": "sensor_msgs/msg/JointState",
    "/oxygen/observation": "oxygen_ros/msg/ObservationFrame",
    "/diagnostics": "diagnostic_msgs/msg/DiagnosticArray",
}


def test_record_every_topic_but_hidden_and_excluded() -> None:
    exclude = compile_exclude(r"^/diag")
    assert should_record("/oxygen/observation")
    assert not should_record("/oxygen/instruct/_action/feedback")
    assert should_record("/oxygen/instruct/_action/feedback", include_hidden=True)
    assert not should_record("/diagnostics", exclude=exclude)
    assert should_record("/oxygen/actions", exclude=exclude)


def test_record_only_listed_topics() -> None:
    include = ["joint_states", "/clock"]
    assert should_record("/joint_states", include) and should_record("/clock", include)
    assert not should_record("/oxygen/observation", include)
    assert not should_record("/clock", include, exclude=compile_exclude("clock"))


def test_replay_sensors_are_cameras_joint_states_and_clock() -> None:
    assert replay_topics(BAG, sensors=True) == [
        "/cam/compressed",
        "/clock",
        "/joint_states",
        "/top_camera/image_raw",
    ]
    assert replay_topics(BAG, topics=["oxygen/observation"]) == ["/oxygen/observation"]
    assert replay_topics(BAG) == sorted(BAG)
    assert "/oxygen/observation" in replay_topics(BAG, ["/oxygen/observation"], sensors=True)
    with pytest.raises(KeyError, match="/nope"):
        replay_topics(BAG, topics=["/nope"])


def test_remaps() -> None:
    assert parse_remaps(["a:=/b/c", "/x:=y"]) == {"/a": "/b/c", "/x": "/y"}
    for bad in ("a", ":=b", "a:="):
        with pytest.raises(ValueError):
            parse_remaps([bad])


def test_reader_qos_matches_every_publisher() -> None:
    latched = reader_qos([LATCHED], depth=100)
    assert (latched.reliable, latched.transient_local, latched.depth) == (True, True, 100)
    mixed = reader_qos([LATCHED, RELIABLE_VOLATILE], depth=100)
    assert (mixed.reliable, mixed.transient_local) == (True, False)
    sensor = reader_qos([SENSOR, RELIABLE_VOLATILE], depth=100)
    assert (sensor.reliable, sensor.transient_local) == (False, False)
    none = reader_qos([], depth=7)
    assert (none.reliable, none.transient_local) == (False, False)


def test_writer_qos_follows_the_recorded_publishers() -> None:
    latched = writer_qos([LATCHED])
    assert (latched.reliable, latched.transient_local, latched.depth) == (True, True, 10)
    sensor = writer_qos([SENSOR, RELIABLE_VOLATILE])
    assert (sensor.reliable, sensor.transient_local) == (False, False)
    deep = writer_qos([offered_qos(KEEP_LAST, 100, RELIABLE, VOLATILE)])
    assert deep.depth == 100
    unknown = writer_qos([])
    assert (unknown.reliable, unknown.transient_local) == (True, False)


def test_offered_qos_converts_rmw_values_and_durations() -> None:
    qos = offered_qos(KEEP_LAST, 3, RELIABLE, VOLATILE, deadline_ns=1_500_000_000, liveliness=9)
    assert (qos.deadline.sec, qos.deadline.nsec) == (1, 500_000_000)
    assert qos.liveliness.name == "UNKNOWN"
