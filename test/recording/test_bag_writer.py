"""`recording.typestore` and `recording.bag_writer`: a bag written from rclpy-serialized
messages is read back by the independent MCAP reader (`mcap` + `mcap_ros2`), which decodes
this package's messages from the definitions the bag carries; metadata.yaml matches."""

from __future__ import annotations

import json

import pytest
import yaml
from mcap.reader import make_reader
from mcap_ros2.decoder import DecoderFactory
from rclpy.serialization import serialize_message
from rosbags.interfaces import QosDurability, QosReliability
from sensor_msgs.msg import Image
from std_msgs.msg import String

from oxygen_ros.msg import ActionChunk, ObservationFrame, SpeechToken
from oxygen_ros.recording.bag_reader import BagReader
from oxygen_ros.recording.bag_writer import BagClosedError, BagWriter
from oxygen_ros.recording.qos import offered_qos
from oxygen_ros.recording.typestore import (
    UnknownTypeError,
    graph_typestore,
    message_definition,
    msg_directory,
    own_type_names,
)

RELIABLE, BEST_EFFORT, TRANSIENT_LOCAL, VOLATILE, KEEP_LAST = 1, 2, 1, 2, 1
INFINITE_NS = 2**63 - 1


def frame(sequence: int) -> ObservationFrame:
    msg = ObservationFrame(sequence=sequence, image_names=["base_0_rgb", "left_wrist_0_rgb"])
    msg.header.stamp.sec, msg.header.stamp.nanosec = 10 + sequence, 500
    for k in range(2):
        image = Image(height=2, width=3, encoding="rgb8", step=9)
        image.data = bytes(range(k + sequence, k + sequence + 18))
        msg.images.append(image)
    msg.image_valid = [True, False]
    msg.joint_names = ["a", "b"]
    msg.joint_positions = [0.25, -1.5 * sequence]
    msg.max_skew = 0.01
    return msg


def chunk() -> ActionChunk:
    msg = ActionChunk(sequence=7, chunk_id=3, dt=0.02, horizon=2, joint_names=["a", "b"])
    msg.actions = [1.0, 2.0, 3.0, 4.5]
    msg.trigger = ActionChunk.TRIGGER_NEW_CHUNK
    return msg


def speech() -> SpeechToken:
    return SpeechToken(
        request_id="r1",
        kind=SpeechToken.KIND_SUBTASK,
        token_index=4,
        text_delta=" cube",
        token_ids=[11, 12],
        final=True,
        text="lift the red cube",
        status=SpeechToken.STATUS_STOPPED,
    )


def decoded(bag_dir):
    """{topic: [(log_time, decoded message)]} read by the independent reader."""
    out: dict = {}
    (mcap_path,) = bag_dir.glob("*.mcap")
    with mcap_path.open("rb") as stream:
        reader = make_reader(stream, decoder_factories=[DecoderFactory()])
        for _schema, channel, message, msg in reader.iter_decoded_messages():
            out.setdefault(channel.topic, []).append((message.log_time, msg))
    return out


def test_typestore_has_every_own_message_with_rosidl_hash() -> None:
    store = graph_typestore()
    names = own_type_names()
    assert "oxygen_ros/msg/ObservationFrame" in names and len(names) == 5
    for name in names:
        text, rihs01 = message_definition(store, name)
        # rosidl's own hash of the installed type (the .json beside the .msg)
        description = json.loads((msg_directory() / f"{name.rsplit('/', 1)[1]}.json").read_text())
        assert rihs01 == description["type_hashes"][0]["hash_string"], name
        assert "MSG: std_msgs/Header" in text
    for standard in ("sensor_msgs/msg/Image", "rosgraph_msgs/msg/Clock"):
        assert standard in store.fielddefs
    with pytest.raises(UnknownTypeError):
        message_definition(store, "no_such_pkg/msg/Thing")


def test_unknown_compression_is_refused(tmp_path) -> None:
    with pytest.raises(ValueError, match="lz4"):
        BagWriter(tmp_path / "bag", "lz4")
    assert not (tmp_path / "bag").exists()


@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_independent_reader_decodes_own_messages(tmp_path, compression) -> None:
    bag_dir = tmp_path / "bag"
    latched = offered_qos(KEEP_LAST, 1, RELIABLE, TRANSIENT_LOCAL, INFINITE_NS, INFINITE_NS)
    sensor = offered_qos(KEEP_LAST, 5, BEST_EFFORT, VOLATILE)
    writer = BagWriter(bag_dir, compression)
    writer.add_topic("/oxygen/observation", "oxygen_ros/msg/ObservationFrame", [sensor])
    writer.add_topic("/oxygen/actions", "oxygen_ros/msg/ActionChunk", [latched])
    writer.add_topic("/oxygen/speech", "oxygen_ros/msg/SpeechToken")
    writer.add_topic("/oxygen/instruction", "std_msgs/msg/String", [latched])
    with pytest.raises(UnknownTypeError):
        writer.add_topic("/x", "no_such_pkg/msg/Thing")
    with pytest.raises(ValueError):
        writer.add_topic("/oxygen/speech", "oxygen_ros/msg/SpeechToken")
    frames = [frame(k) for k in range(3)]
    written = [serialize_message(msg) for msg in frames]  # CDR padding bytes vary per call
    for k, data in enumerate(written):
        writer.write("/oxygen/observation", 1_000 + k, data)
    writer.write("/oxygen/actions", 2_000, serialize_message(chunk()))
    writer.write("/oxygen/speech", 3_000, serialize_message(speech()))
    writer.write("/oxygen/instruction", 4_000, serialize_message(String(data="stack")))
    writer.close()
    writer.close()  # idempotent
    with pytest.raises(BagClosedError):
        writer.write("/oxygen/speech", 5_000, serialize_message(speech()))

    topics = decoded(bag_dir)
    assert [t for t, _ in topics["/oxygen/observation"]] == [1_000, 1_001, 1_002]
    for (_, got), sent in zip(topics["/oxygen/observation"], frames, strict=True):
        assert got.sequence == sent.sequence
        assert (got.header.stamp.sec, got.header.stamp.nanosec) == (10 + sent.sequence, 500)
        assert list(got.image_names) == ["base_0_rgb", "left_wrist_0_rgb"]
        assert [bytes(i.data) for i in got.images] == [bytes(i.data) for i in sent.images]
        assert list(got.image_valid) == [True, False]
        assert list(got.joint_positions) == list(sent.joint_positions)
    ((_, action),) = topics["/oxygen/actions"]
    assert (action.sequence, action.chunk_id, action.horizon) == (7, 3, 2)
    assert list(action.actions) == [1.0, 2.0, 3.0, 4.5]
    assert action.trigger == ActionChunk.TRIGGER_NEW_CHUNK
    ((_, token),) = topics["/oxygen/speech"]
    assert (token.request_id, token.text_delta, token.text) == ("r1", " cube", "lift the red cube")
    assert list(token.token_ids) == [11, 12] and token.final
    assert topics["/oxygen/instruction"][0][1].data == "stack"

    (mcap_path,) = bag_dir.glob("*.mcap")
    with mcap_path.open("rb") as stream:
        chunks = make_reader(stream).get_summary().chunk_indexes
    assert {c.compression for c in chunks} == {"" if compression == "none" else "zstd"}
    info = yaml.safe_load((bag_dir / "metadata.yaml").read_text())["rosbag2_bagfile_information"]
    assert info["storage_identifier"] == "mcap" and info["message_count"] == 6
    assert info["compression_mode"] == ""  # inside the MCAP file, as rosbag2's presets write
    counts = {
        t["topic_metadata"]["name"]: t["message_count"] for t in info["topics_with_message_count"]
    }
    assert counts == {
        "/oxygen/observation": 3,
        "/oxygen/actions": 1,
        "/oxygen/speech": 1,
        "/oxygen/instruction": 1,
    }
    stats = writer.stats()
    assert stats["/oxygen/observation"].messages == 3
    assert stats["/oxygen/speech"].bytes == len(serialize_message(speech()))

    with BagReader(bag_dir) as bag:  # the QoS comes back for replay
        read = bag.topics()
        (qos,) = read["/oxygen/instruction"].offered_qos
        assert qos.durability == QosDurability.TRANSIENT_LOCAL
        assert qos.reliability == QosReliability.RELIABLE
        assert (qos.deadline.sec, qos.deadline.nsec) == (9223372036, 854775807)
        assert read["/oxygen/speech"].offered_qos == ()
        got = list(bag.messages(["/oxygen/observation", "/oxygen/speech"]))
        assert [(t, s) for t, s, _ in got] == [
            ("/oxygen/observation", 1_000),
            ("/oxygen/observation", 1_001),
            ("/oxygen/observation", 1_002),
            ("/oxygen/speech", 3_000),
        ]
        assert [data for _, _, data in got[:3]] == written  # bytes as written
