"""Probe for the across-hosts test (run inside a network namespace by test_fault_injection).

Subscribes to the observation frames and the action chunks and prints one JSON line per second:
frames seen, action messages seen, and how many actions come from a frame this probe saw
(their `observation_stamp` equals a frame's stamp). Run next to the perception node, a matched
action proves the frame went to the inference node in the other namespace and its chunk came
back. Exits after `duration_s` (argv[1]) or on SIGINT/SIGTERM.
"""

from __future__ import annotations

import json
import signal
import sys
import time

import rclpy
from rclpy.signals import SignalHandlerOptions

from oxygen_ros.msg import ActionChunk, ObservationFrame
from oxygen_ros.nodes.common.runtime import OBSERVATION_QOS, RELIABLE_QOS


def main() -> int:
    duration_s = float(sys.argv[1]) if len(sys.argv) > 1 else 60.0
    rclpy.init(signal_handler_options=SignalHandlerOptions.NO)
    stop = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.append(True))
    node = rclpy.create_node("netns_probe")
    frames: set[tuple[int, int]] = set()
    actions: list[tuple[int, int]] = []

    def on_frame(msg: ObservationFrame) -> None:
        frames.add((msg.header.stamp.sec, msg.header.stamp.nanosec))

    def on_action(msg: ActionChunk) -> None:
        actions.append((msg.observation_stamp.sec, msg.observation_stamp.nanosec))

    node.create_subscription(ObservationFrame, "oxygen/observation", on_frame, OBSERVATION_QOS)
    node.create_subscription(ActionChunk, "oxygen/actions", on_action, RELIABLE_QOS)
    end = time.monotonic() + duration_s
    next_report = time.monotonic()
    while time.monotonic() < end and not stop:
        rclpy.spin_once(node, timeout_sec=0.05)
        if time.monotonic() >= next_report:
            next_report += 1.0
            matched = sum(1 for a in actions if a in frames)
            report = {"frames": len(frames), "actions": len(actions), "matched": matched}
            print(json.dumps(report), flush=True)
    node.destroy_node()
    rclpy.try_shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
