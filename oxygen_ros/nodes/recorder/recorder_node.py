"""Recorder: the graph's topics -> a rosbag2 MCAP bag, as `ros2 bag record -a -s mcap` does.

Thin ROS shell around `recording.bag_writer.BagWriter` (the bag) and `recording.selection`
(which topics): a timer searches the graph every `discovery_period_s` and subscribes to each
new topic it should record, once it has a publisher; every message is written as received.

Invariants:
- Subscriptions are raw (serialized CDR bytes, never deserialized), with the publishers' QoS
  (`recording.qos.reader_qos`: reliable / transient local only when every publisher offers
  it, so latched topics such as the instruction and the memory arrive with their last value),
  keep-last `queue_depth`. The bag records the publishers' QoS as offered_qos_profiles.
- A message's bag timestamp is its reception time on the node clock (with use_sim_time the
  /clock time, as `ros2 bag record --use-sim-time`; by default wall time).
- A topic whose type cannot be resolved (no Python class, or unknown to the typestore) or
  that carries several types is not recorded: counted (`unknown_type`, `several_types`) and
  warned about (throttled per topic), never a crash. A failed write is counted
  (`write_errors`) and warned about; the node goes on.
- SIGINT / SIGTERM close the bag (`close()`): the MCAP summary and `metadata.yaml` complete.
- A publisher joining later with a QoS the subscription cannot match (a volatile publisher on
  a topic subscribed transient local) is warned about and counted (`unmatched_publishers.<topic>`),
  not resubscribed for (no duplicates, no gap), as rosbag2 does.
- Diagnostics: per topic `messages.<topic>` and `bytes.<topic>`, totals, the bag path.
"""

from __future__ import annotations

import collections
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from diagnostic_msgs.msg import DiagnosticArray
from rclpy.node import Node

from oxygen_ros.nodes.common.parameters import NodeParameters, ParameterError
from oxygen_ros.nodes.common.runtime import ReasonThrottle, publish_status, run_node
from oxygen_ros.nodes.recorder.conversions import bag_qos, message_class, qos_profile
from oxygen_ros.nodes.recorder.params import RECORDER
from oxygen_ros.recording.bag_writer import BagWriter
from oxygen_ros.recording.qos import EndpointQos, reader_matches, reader_qos
from oxygen_ros.recording.selection import compile_exclude, should_record
from oxygen_ros.recording.typestore import UnknownTypeError

THROTTLE_S = 10.0


def default_bag_name() -> str:
    return time.strftime("rosbag2_%Y_%m_%d-%H_%M_%S")


class RecorderNode(Node):
    """Subscribes to the graph's topics and writes what arrives into one bag."""

    def __init__(self) -> None:
        super().__init__("recorder")
        self.params = NodeParameters(self, RECORDER)
        p = self.params
        self._include = list(p["topics"])
        self._exclude = compile_exclude(p["exclude_regex"])
        path = Path(p["output_dir"] or default_bag_name()).expanduser()
        try:
            self._bag = BagWriter(path, p["compression"])
        except Exception as exc:  # rosbags' WriterError (exists), OSError, missing msg/ ...
            raise ParameterError(f"cannot create the bag {path}: {exc}") from exc
        self._refused: dict[str, str] = {}  # topic -> reason (not recorded)
        self._readers: dict[str, EndpointQos] = {}  # recorded topic -> its subscription QoS
        self.counters: collections.Counter[str] = collections.Counter()
        self._throttle = ReasonThrottle(THROTTLE_S)
        self._diag_pub = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
        self.create_timer(p["discovery_period_s"], self._discover)
        period = p["diagnostics_period_s"] or 3600.0
        self.create_timer(period, self._publish_diagnostics)
        what = ", ".join(self._include) if self._include else "every topic"
        self.get_logger().info(f"recording {what} into {path}")
        self._discover()

    # ---------------------------------------------------------------- discovery
    def _discover(self) -> None:
        for topic, types in self.get_topic_names_and_types():
            if topic in self._readers:
                self._check_publishers(topic)
                continue
            if topic in self._refused:
                continue
            if not should_record(
                topic, self._include, self._exclude, self.params["include_hidden_topics"]
            ):
                continue
            if len(types) != 1:
                self._refuse(topic, "several_types", f"{topic} carries several types {types}")
                continue
            try:
                self._subscribe(topic, types[0])
            except UnknownTypeError as exc:
                self._refuse(topic, "unknown_type", f"{topic} is not recorded: {exc}")

    def _subscribe(self, topic: str, msgtype: str) -> None:
        publishers = self.get_publishers_info_by_topic(topic)
        if not publishers:
            return  # only subscribers so far: try again at the next discovery
        cls = message_class(msgtype)
        offered = [bag_qos(info.qos_profile) for info in publishers]
        self._bag.add_topic(topic, msgtype, offered)
        endpoint = reader_qos(offered, self.params["queue_depth"])
        self._readers[topic] = endpoint
        self.create_subscription(
            cls,
            topic,
            lambda data, t=topic: self._on_message(t, data),
            qos_profile(endpoint),
            raw=True,
        )
        kind = ("reliable" if endpoint.reliable else "best effort") + (
            ", transient local" if endpoint.transient_local else ""
        )
        self.get_logger().info(f"recording {topic} ({msgtype}, {kind})")

    def _check_publishers(self, topic: str) -> None:
        """Warns about publishers that joined with a QoS the subscription does not match."""
        reader = self._readers[topic]
        missed = [
            info.node_name
            for info in self.get_publishers_info_by_topic(topic)
            if not reader_matches(reader, bag_qos(info.qos_profile))
        ]
        if missed:
            self.counters[f"unmatched_publishers.{topic}"] = len(missed)
            self._throttle.warn(
                self,
                f"unmatched:{topic}",
                f"{topic}: publishers {missed} offer a weaker QoS than the recording subscribed "
                "with when the topic appeared (best effort or volatile): their messages are not "
                "recorded",
            )

    def _refuse(self, topic: str, reason: str, message: str) -> None:
        self._refused[topic] = reason
        self.counters[reason] += 1
        self._throttle.warn(self, f"{reason}:{topic}", message)

    # ---------------------------------------------------------------- messages
    def _on_message(self, topic: str, data: bytes) -> None:
        stamp = self.get_clock().now().nanoseconds
        try:
            self._bag.write(topic, stamp, data)
        except Exception as exc:  # a full disk, a closed bag: counted, the node goes on
            self.counters["write_errors"] += 1
            self._throttle.warn(
                self, "write_error", f"cannot write a {topic} message: {type(exc).__name__}: {exc}"
            )

    # ---------------------------------------------------------------- diagnostics
    def _publish_diagnostics(self) -> None:
        stats = self._bag.stats()
        values: dict[str, object] = {
            "bag": str(self._bag.path),
            "topics": len(stats),
            "messages": sum(s.messages for s in stats.values()),
            "bytes": sum(s.bytes for s in stats.values()),
            "write_errors": self.counters["write_errors"],
            "unknown_type": self.counters["unknown_type"],
            "several_types": self.counters["several_types"],
        }
        for topic, s in sorted(stats.items()):
            values[f"messages.{topic}"] = s.messages
            values[f"bytes.{topic}"] = s.bytes
        for key, count in sorted(self.counters.items()):
            if key.startswith("unmatched_publishers."):
                values[key] = count
        for topic, reason in sorted(self._refused.items()):
            values[f"not_recorded.{topic}"] = reason
        level = "WARN" if self.counters["write_errors"] else "OK"
        message = f"{values['messages']} messages on {len(stats)} topics"
        publish_status(self, self._diag_pub, level, message, values)

    def close(self) -> None:
        """Closes the bag (MCAP summary, metadata.yaml); idempotent."""
        if self._bag.closed:
            return
        self._bag.close()
        stats = self._bag.stats()
        total = sum(s.messages for s in stats.values())
        self.get_logger().info(
            f"bag closed: {self._bag.path} ({total} messages on {len(stats)} topics)"
        )


def main(args: Sequence[str] | None = None) -> int:
    return run_node(RecorderNode, "recorder", args, num_threads=1)


if __name__ == "__main__":
    sys.exit(main())
