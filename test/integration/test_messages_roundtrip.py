"""Every oxygen_ros message survives a round trip through another process over DDS, with
every field (including nested ones) set to a non-default value and compared."""

from pathlib import Path

import numpy as np
import pytest
from builtin_interfaces.msg import Time
from harness import wait_for
from rclpy.qos import QoSProfile, QoSReliabilityPolicy
from sensor_msgs.msg import Image

from oxygen_ros.msg import ActionChunk, MemoryEntry, ObservationFrame, SpeechToken

pytestmark = pytest.mark.integration
RELAY = str(Path(__file__).with_name("relay_node.py"))


def _image(seed: int) -> Image:
    rng = np.random.default_rng(seed)
    img = Image()
    img.header.stamp = Time(sec=100 + seed, nanosec=7)
    img.header.frame_id = f"cam{seed}"
    img.height, img.width, img.encoding, img.is_bigendian = 4, 5, "rgb8", 0
    img.step = 5 * 3
    img.data = rng.integers(0, 256, size=4 * 5 * 3, dtype=np.uint8).tobytes()
    return img


def make_messages() -> dict:
    obs = ObservationFrame()
    obs.header.stamp, obs.header.frame_id = Time(sec=12, nanosec=345), "base_link"
    obs.sequence = 99
    obs.image_names = ["base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb"]
    obs.images = [_image(i) for i in range(3)]
    obs.image_valid = [True, False, True]
    obs.image_stamps = [Time(sec=11, nanosec=i) for i in range(3)]
    obs.joint_names = ["a", "b"]
    obs.joint_positions = [0.25, -1.5]
    obs.joint_velocities = [0.125, 2.0]
    obs.max_skew = 0.0125

    chunk = ActionChunk()
    chunk.header.stamp, chunk.header.frame_id = Time(sec=13, nanosec=1), "base_link"
    chunk.sequence, chunk.chunk_id, chunk.dt = 7, 3, 1.0 / 70
    chunk.joint_names = ["a", "b", "c"]
    chunk.horizon = 4
    chunk.actions = np.arange(12, dtype=np.float32).tolist()
    chunk.observation_stamp = Time(sec=12, nanosec=345)
    chunk.inference_latency = 0.0875
    chunk.valid_until = Time(sec=14, nanosec=345)
    chunk.trigger = ActionChunk.TRIGGER_NEW_CHUNK

    tok = SpeechToken()
    tok.header.stamp = Time(sec=14, nanosec=2)
    tok.observation_stamp = Time(sec=13, nanosec=77)
    tok.request_id, tok.kind, tok.token_index = "req-1", SpeechToken.KIND_NARRATION, 5
    tok.text_delta, tok.token_ids = " gräbt ✓", [17, 2041, 3]
    tok.final, tok.text, tok.status = True, "Ich gräbt ✓", SpeechToken.STATUS_STOPPED
    tok.error = "none"

    mem = MemoryEntry()
    mem.header.stamp = Time(sec=15, nanosec=3)
    mem.entry_id, mem.text, mem.kind = 42, "the red cup is on the left", "memory"
    mem.observation_stamp = Time(sec=12, nanosec=345)
    mem.tags, mem.request_id = ["kitchen", "cup"], "req-2"
    return {type(m).__name__: m for m in (obs, chunk, tok, mem)}


def _assert_all_fields_set(msg) -> None:
    default = type(msg)()
    for field in msg.get_fields_and_field_types():
        a, b = getattr(msg, field), getattr(default, field)
        assert not _equal(a, b), f"{type(msg).__name__}.{field} left at its default"


def _equal(a, b) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.array_equal(np.asarray(a), np.asarray(b))
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    if hasattr(a, "get_fields_and_field_types"):
        return all(_equal(getattr(a, f), getattr(b, f)) for f in a.get_fields_and_field_types())
    try:
        return (
            list(a) == list(b)
            if not isinstance(a, str | bytes) and hasattr(a, "__len__")
            else a == b
        )
    except TypeError:
        return a == b


@pytest.mark.parametrize(
    "type_name", ["ObservationFrame", "ActionChunk", "SpeechToken", "MemoryEntry"]
)
def test_round_trip_between_processes(type_name, launcher, ros_node) -> None:
    sent = make_messages()[type_name]
    _assert_all_fields_set(sent)
    relay = launcher.start(RELAY, name="relay")
    qos = QoSProfile(depth=10, reliability=QoSReliabilityPolicy.RELIABLE)
    pub = ros_node.node.create_publisher(type(sent), f"/relay/in/{type_name}", qos)
    received = ros_node.collect(type(sent), f"/relay/out/{type_name}", qos)
    ros_node.wait_for_subscribers(pub)
    ros_node.wait_for_publishers(f"/relay/out/{type_name}")
    # The relay's output publisher must also have matched our subscription.
    wait_for(
        lambda: ros_node.node.count_subscribers(f"/relay/out/{type_name}") >= 1,
        15,
        "our subscription to be discovered",
    )

    def sent_and_received() -> bool:
        if not received:
            pub.publish(sent)
        return bool(received)

    wait_for(sent_and_received, 15, f"{type_name} to come back from the relay", poll_s=0.2)
    got = received[0]
    for field in sent.get_fields_and_field_types():
        assert _equal(getattr(got, field), getattr(sent, field)), f"{type_name}.{field} differs"
    assert got == sent
    assert relay.alive(), relay.log()
