"""The inference node's frame intake over DDS: frames reach the callback raw, with their DDS
timestamps, in the intake's own thread while the parent node is never spun; the helper node
keeps the parent's namespace and remapped topic but not the parent's `__node` remap; close
ends the thread and is idempotent."""

from __future__ import annotations

import threading
import time

import pytest
import rclpy
from harness import wait_for
from rclpy.serialization import deserialize_message

from oxygen_ros.msg import ObservationFrame
from oxygen_ros.nodes.common.runtime import OBSERVATION_QOS
from oxygen_ros.nodes.inference.frame_intake import FrameIntake

pytestmark = pytest.mark.integration


def test_frames_arrive_raw_in_the_intake_thread_on_the_remapped_topic(ros_node) -> None:
    context = rclpy.Context()
    # Global arguments as a launched node gets them: its name and a topic remapped.
    rclpy.init(
        args=["--ros-args", "-r", "__node:=renamed", "-r", "frames_in:=remapped/frames"],
        context=context,
    )
    parent = rclpy.create_node("parent", namespace="/robot1", context=context)
    received: list[tuple[bytes, dict, str]] = []

    def on_frame(data, info) -> None:
        received.append((data, info, threading.current_thread().name))

    intake = FrameIntake(parent, ObservationFrame, "frames_in", OBSERVATION_QOS, on_frame)
    try:
        assert parent.get_name() == "renamed"
        assert intake.topic == "/robot1/remapped/frames"
        assert intake.node.get_name() == "renamed_frames"
        assert intake.node.get_namespace() == "/robot1"
        publisher = ros_node.node.create_publisher(
            ObservationFrame, "/robot1/remapped/frames", OBSERVATION_QOS
        )
        ros_node.wait_for_subscribers(publisher)
        sent_at = time.time()

        def delivered() -> bool:  # best effort: publish until one arrives
            publisher.publish(ObservationFrame(sequence=7))
            return bool(received)

        wait_for(delivered, 10, "a frame through the intake")
        data, info, thread = received[0]
        assert isinstance(data, bytes)
        assert deserialize_message(data, ObservationFrame).sequence == 7
        assert thread == "frames"  # never the parent's executor (it is not even spun)
        assert sent_at - 1.0 < info["source_timestamp"] * 1e-9 <= time.time()
        assert info["source_timestamp"] <= info["received_timestamp"]
    finally:
        intake.close()
        intake.close()  # idempotent
        assert not intake.alive
        parent.destroy_node()
        context.try_shutdown()
