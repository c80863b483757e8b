"""What every node's `main()` shares: init, spin, clean shutdown, exit codes, QoS profiles.

Invariants:
- SIGINT and SIGTERM end the spin; the node's `close()` then runs while the context is still
  valid (timers stopped, requests ended, threads joined, files closed) and `main()` returns 0.
- Invalid start-up parameters end the process with exit code 2 and one fatal log line naming
  every bad value; any other start-up failure returns 1 with its cause logged.
- `ReasonThrottle` throttles log lines per reason (rclpy throttles per call site, so one noisy
  kind of bad input would hide every other kind logged from the same line).
"""

from __future__ import annotations

import collections
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence

import rclpy
from diagnostic_msgs.msg import DiagnosticArray
from rclpy.event_handler import SubscriptionEventCallbacks
from rclpy.executors import (
    ExternalShutdownException,
    MultiThreadedExecutor,
    SingleThreadedExecutor,
)
from rclpy.impl.implementation_singleton import rclpy_implementation as _rclpy
from rclpy.logging import get_logger
from rclpy.node import Node
from rclpy.qos import (
    QoSDurabilityPolicy,
    QoSHistoryPolicy,
    QoSProfile,
    QoSReliabilityPolicy,
    qos_profile_sensor_data,
)
from rclpy.signals import SignalHandlerOptions

from oxygen_ros.nodes.common.conversions import diagnostic_status
from oxygen_ros.nodes.common.parameters import ParameterError

EXIT_OK, EXIT_FAILURE, EXIT_BAD_PARAMETERS = 0, 1, 2
SPIN_POLL_S = 0.1  # a signal ends the spin loop within this time

# Cameras and joint states: best effort, newest few (ROS's sensor-data profile).
SENSOR_QOS = qos_profile_sensor_data
# Fused frames: best effort, only the newest matters to the inference node.
OBSERVATION_QOS = QoSProfile(
    history=QoSHistoryPolicy.KEEP_LAST,
    depth=1,
    reliability=QoSReliabilityPolicy.BEST_EFFORT,
    durability=QoSDurabilityPolicy.VOLATILE,
)
# Commands and streams every message of which matters (actions, speech): reliable.
RELIABLE_QOS = QoSProfile(
    history=QoSHistoryPolicy.KEEP_LAST,
    depth=10,
    reliability=QoSReliabilityPolicy.RELIABLE,
    durability=QoSDurabilityPolicy.VOLATILE,
)
# Fast streams a reader wants whole (speech tokens, the sim's applied commands at 100 Hz):
# reliable with 100 kept, so a reader that lags a second loses nothing (10 at 100 Hz lost 21
# commands in a row to a test probe under CI load).
STREAM_QOS = QoSProfile(
    history=QoSHistoryPolicy.KEEP_LAST,
    depth=100,
    reliability=QoSReliabilityPolicy.RELIABLE,
    durability=QoSDurabilityPolicy.VOLATILE,
)
SPEECH_QOS = STREAM_QOS
# Latched state (the instruction): reliable, transient local, the last value only.
LATCHED_QOS = QoSProfile(
    history=QoSHistoryPolicy.KEEP_LAST,
    depth=1,
    reliability=QoSReliabilityPolicy.RELIABLE,
    durability=QoSDurabilityPolicy.TRANSIENT_LOCAL,
)

# Services: reliable with room for bursts. ROS's default keeps the last 10 requests, so an 11th
# concurrent caller is dropped without an answer before the node can refuse it with a reason.
SERVICE_QOS = QoSProfile(
    history=QoSHistoryPolicy.KEEP_LAST,
    depth=256,
    reliability=QoSReliabilityPolicy.RELIABLE,
    durability=QoSDurabilityPolicy.VOLATILE,
)


def latched_qos(depth: int) -> QoSProfile:
    """Reliable + transient local keeping the last `depth` messages (memory entries)."""
    return QoSProfile(
        history=QoSHistoryPolicy.KEEP_LAST,
        depth=depth,
        reliability=QoSReliabilityPolicy.RELIABLE,
        durability=QoSDurabilityPolicy.TRANSIENT_LOCAL,
    )


def subscribe_latched_and_volatile(node: Node, msg_type, topic: str, callback, **kwargs) -> None:
    """Subscribes `callback` to `topic` twice, so that every kind of reliable publisher
    reaches it: transient local (a latched publisher's last message reaches a node that starts
    later) and volatile (DDS never matches a volatile publisher, such as `ros2 topic pub` or
    rqt, with a transient-local reader). A latched publisher's message arrives through both:
    `callback` must be idempotent or deduplicate (message info identifies a publication). The
    transient-local reader's expected mismatch with volatile publishers is not warned about.
    `kwargs` go to `create_subscription` (callback_group, ...)."""
    quiet = SubscriptionEventCallbacks(incompatible_qos=lambda _event: None)
    for qos, events in ((LATCHED_QOS, quiet), (RELIABLE_QOS, None)):
        node.create_subscription(msg_type, topic, callback, qos, event_callbacks=events, **kwargs)


def run_node(
    factory: Callable[[], Node],
    name: str,
    args: Sequence[str] | None = None,
    num_threads: int = 2,
) -> int:
    """Creates the node, spins it until SIGINT/SIGTERM or shutdown, closes it.

    rclpy's own signal handlers are not installed: they shut the context down at once, after
    which `close()` could no longer publish (final speech messages, for example). Instead a
    signal sets a flag, the spin loop ends within `SPIN_POLL_S`, `close()` runs with the
    context still valid, and only then is the context shut down.

    A node can end its own spin by setting a truthy `stop_requested` attribute (for example
    when its engine failed to start).

    Returns:
        The exit code: 0 after a signal or an external shutdown.
    """
    rclpy.init(
        args=list(args) if args is not None else sys.argv,
        signal_handler_options=SignalHandlerOptions.NO,
    )
    stop = threading.Event()
    previous = {
        sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)
    }
    node: Node | None = None
    try:
        try:
            node = factory()
        except ParameterError as exc:
            get_logger(name).fatal(f"invalid parameters: {exc}")
            return EXIT_BAD_PARAMETERS
        except (ValueError, OSError) as exc:
            get_logger(name).fatal(f"cannot start: {type(exc).__name__}: {exc}")
            return EXIT_FAILURE
        executor = (
            MultiThreadedExecutor(num_threads=num_threads)
            if num_threads > 1
            else SingleThreadedExecutor()
        )
        executor.add_node(node)
        try:
            while not stop.is_set() and rclpy.ok() and not getattr(node, "stop_requested", False):
                executor.spin_once(timeout_sec=SPIN_POLL_S)
        except ExternalShutdownException:
            pass
        except _rclpy.RCLError:
            if rclpy.ok():
                raise
        if stop.is_set():
            node.get_logger().info("signal received, shutting down")
        close = getattr(node, "close", None)
        if close is not None:
            close()
        executor.shutdown(timeout_sec=2.0)
    finally:
        if node is not None:
            node.destroy_node()
        rclpy.try_shutdown()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return EXIT_OK


class ReasonThrottle:
    """At most one log line per reason every `period_s`; the next line of a reason says how
    many were suppressed since the previous one. Thread-safe."""

    def __init__(self, period_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.period_s = period_s
        self._clock = clock
        self._last: dict[str, float] = {}
        self._suppressed: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()

    def message(self, reason: str, message: str) -> str | None:
        """The line to log now for `reason`, or None while it is throttled."""
        now = self._clock()
        with self._lock:
            last = self._last.get(reason)
            if last is not None and now - last < self.period_s:
                self._suppressed[reason] += 1
                return None
            self._last[reason] = now
            suppressed = self._suppressed.pop(reason, 0)
        if suppressed:
            return f"{message} (+{suppressed} more since the last report)"
        return message

    def warn(self, node: Node, reason: str, message: str) -> None:
        """Logs `message` as a warning of `node` unless `reason` is throttled now."""
        line = self.message(reason, message)
        if line is not None:
            node.get_logger().warning(line)


def publish_status(
    node: Node,
    publisher,
    level: str,
    message: str,
    values: dict[str, object],
) -> None:
    """Publishes `node`'s one-status `DiagnosticArray` (name `oxygen_ros: <node name>`)."""
    array = DiagnosticArray()
    array.header.stamp = node.get_clock().now().to_msg()
    array.status = [
        diagnostic_status(
            f"oxygen_ros: {node.get_name()}",
            node.get_fully_qualified_name(),
            level,
            message,
            values,
        )
    ]
    publisher.publish(array)


def now_s(node: Node) -> float:
    """The node clock in float seconds (ROS time; sim time when use_sim_time is set)."""
    return node.get_clock().now().nanoseconds * 1e-9
