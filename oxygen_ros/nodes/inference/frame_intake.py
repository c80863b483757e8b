"""The inference node's ObservationFrame subscription, on a node and thread of its own.

Why: with `frame_pickup: on_arrival` the engine waits for the next frame, so everything between
the frame's DDS reception and the engine's inbox is observation -> action latency. On the
node's own executor a frame waited behind whatever callback was running (the diagnostics:
window percentiles and a round trip to the action process; services, timers, the Instruct
action), and after its callback the executor rebuilt its wait set of some twenty entities in
Python, holding the GIL the woken engine thread needed to start the frame. Here the frame
callback is the only entity of a small executor spun by a thread of its own: reception -> inbox
is one short callback, and that thread is back in its wait (GIL released) right after it.

Invariants:
- The helper node is `<parent name>_frames` in the parent's namespace and context. It takes no
  command-line arguments (the parent's `-r __node:=...` would otherwise rename it to the
  parent's name), has no parameter services and no rosout; it subscribes to the parent's fully
  resolved topic name (namespace and remappings applied), raw: the engine thread deserializes
  only the frames it uses.
- `callback(data, info)` runs in the intake's thread only, never in the parent's executor.
- `close` ends the thread before it destroys the helper node (a node destroyed under a waiting
  executor aborts the process); it is idempotent.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any

import rclpy
from rclpy.executors import ExternalShutdownException, SingleThreadedExecutor
from rclpy.node import Node
from rclpy.qos import QoSProfile

JOIN_S = 2.0  # at close, how long the thread may take to leave its wait


class FrameIntake:
    """Receives `msg_type` on `topic` (resolved as the parent would) in a thread of its own."""

    def __init__(
        self,
        parent: Node,
        msg_type: Any,
        topic: str,
        qos: QoSProfile,
        callback: Callable[[bytes, Any], None],
    ) -> None:
        self.topic = parent.resolve_topic_name(topic)
        self.node = rclpy.create_node(
            f"{parent.get_name()}_frames",
            namespace=parent.get_namespace(),
            context=parent.context,
            use_global_arguments=False,
            enable_rosout=False,
            start_parameter_services=False,
        )
        self.node.create_subscription(msg_type, self.topic, callback, qos, raw=True)
        self._executor = SingleThreadedExecutor(context=parent.context)
        self._executor.add_node(self.node)
        self._closed = False
        self._thread = threading.Thread(target=self._spin, name="frames", daemon=True)
        self._thread.start()

    def _spin(self) -> None:
        with contextlib.suppress(ExternalShutdownException):
            self._executor.spin()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def close(self) -> None:
        """Stops the thread, then destroys the helper node (left alone if the thread does not
        end within `JOIN_S`: the process is ending anyway)."""
        if self._closed:
            return
        self._closed = True
        self._executor.shutdown(timeout_sec=JOIN_S)
        self._thread.join(timeout=JOIN_S)
        if not self._thread.is_alive():
            self.node.destroy_node()
