"""Test relay: republishes every oxygen_ros message it receives on /relay/in/<Type> to
/relay/out/<Type>, unchanged. Runs as its own process so round trips cross DDS twice."""

import rclpy
from rclpy.executors import ExternalShutdownException
from rclpy.node import Node
from rclpy.qos import QoSDurabilityPolicy, QoSProfile, QoSReliabilityPolicy

from oxygen_ros.msg import ActionChunk, MemoryEntry, ObservationFrame, SpeechToken

TYPES = (ObservationFrame, ActionChunk, SpeechToken, MemoryEntry)


class Relay(Node):
    def __init__(self) -> None:
        super().__init__("relay")
        qos = QoSProfile(
            depth=10,
            reliability=QoSReliabilityPolicy.RELIABLE,
            durability=QoSDurabilityPolicy.VOLATILE,
        )
        self._pubs = {}
        for msg_type in TYPES:
            name = msg_type.__name__
            pub = self.create_publisher(msg_type, f"/relay/out/{name}", qos)
            self.create_subscription(msg_type, f"/relay/in/{name}", pub.publish, qos)
            self._pubs[name] = pub


def main() -> None:
    rclpy.init()
    node = Relay()
    try:
        rclpy.spin(node)
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:
        node.destroy_node()
        rclpy.try_shutdown()


if __name__ == "__main__":
    main()
