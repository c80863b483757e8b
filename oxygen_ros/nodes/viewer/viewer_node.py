"""The live view: the graph's topics shown in a browser, through Rerun's web viewer.

Thin ROS shell: subscriptions hand messages to `view_data` (ROS-free conversions) and log the
result through `rerun_view.RerunView` (the Rerun recording, its gRPC server and web viewer) in
the panels of `layout`. It is a node of its own, so the view never slows perception or
inference: it only subscribes (one more DDS reader per topic).

Shown: the ObservationFrame's slot images as the model receives them (masked slots drawn as
MASKED), the instruction sent and the one in use, the language requests' text as it streams
(the newest of each kind; finished ones logged, subtasks when their text changes), the memory
entries, per joint group the commanded targets (each ActionChunk's first row) against the
measured positions (JointState), the received action and frame rates, perception's frame
rate, inference's frame time and chunk latency, and the workcell episode's phase and result.

Invariants:
- At start-up the node logs one line `view: <url>` (`http://localhost:<web_port>/?url=...`)
  and puts the same URL in its diagnostics (`url`); ports 0 pick free ones.
- Bounded work and memory whatever the topics' rates and however long it runs: images are
  logged at most `image_rate_hz`, each plot's samples at most `plot_rate_hz`, the text panels
  at most `text_rate_hz`; Rerun's server keeps at most `server_memory_limit`.
- Bad input never stops the node: a message (or slot image) that cannot be shown is counted
  (diagnostics `rejected.<reason>`) and warned about, throttled per reason; texts are cleaned
  (`text.cleaned`); an unexpected error in a callback drops that message
  (`rejected.internal_error`). Every message is checked, also those the rate limits do not
  show (images: only frames due for showing are decoded).
"""

from __future__ import annotations

import collections
import math
import sys
import time
from collections.abc import Sequence

from diagnostic_msgs.msg import DiagnosticArray
from rclpy.node import Node
from sensor_msgs.msg import JointState
from std_msgs.msg import String

from oxygen_ros.msg import ActionChunk, EpisodeStatus, MemoryEntry, ObservationFrame, SpeechToken
from oxygen_ros.nodes.common.conversions import diagnostic_values
from oxygen_ros.nodes.common.deduplicator import Deduplicator
from oxygen_ros.nodes.common.parameters import NodeParameters
from oxygen_ros.nodes.common.params import SHARED
from oxygen_ros.nodes.common.runtime import (
    LATCHED_QOS,
    OBSERVATION_QOS,
    RELIABLE_QOS,
    SENSOR_QOS,
    SPEECH_QOS,
    ReasonThrottle,
    latched_qos,
    publish_status,
    run_node,
    subscribe_latched_and_volatile,
)
from oxygen_ros.nodes.common.sliding_window import SlidingWindow
from oxygen_ros.nodes.viewer import layout
from oxygen_ros.nodes.viewer import view_data as vd
from oxygen_ros.nodes.viewer.params import VIEWER
from oxygen_ros.nodes.viewer.rerun_view import RerunView

THROTTLE_S = 5.0  # at most one warning per reason per this many seconds
RATE_WINDOW_S = 2.0
# pi0.5's image slots (openpi): their panels exist before the first frame; others are added.
DEFAULT_SLOTS = ("base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb")
SPEECH_LEVELS = {"error": "ERROR", "aborted": "WARN"}
SPEECH_REQUESTS = 64  # language requests kept (the panel shows the newest of each kind)
MEMORY_IDS = 4096  # memory entry ids remembered as shown


class ViewerNode(Node):
    """Subscribes to the graph's topics and serves them to a browser."""

    def __init__(self) -> None:
        super().__init__("viewer")
        self.params = NodeParameters(self, SHARED + VIEWER)
        p = self.params
        self.counters: collections.Counter[str] = collections.Counter()
        self._throttle = ReasonThrottle(THROTTLE_S)
        self._configured_groups = vd.group_joints(p["joint_names"])
        self._view = RerunView(
            p["grpc_port"],
            p["web_port"],
            p["server_memory_limit"],
            DEFAULT_SLOTS,
            self._configured_groups,
        )
        self.url = self._view.url
        self._stamp = 0.0  # the newest live stamp (what has none of its own is logged at it)
        self._image_gate = vd.RateGate(p["image_rate_hz"])
        self._commanded_gate = vd.RateGate(p["plot_rate_hz"])
        self._measured_gate = vd.RateGate(p["plot_rate_hz"])
        self._action_times = SlidingWindow(RATE_WINDOW_S)
        self._frame_times = SlidingWindow(RATE_WINDOW_S)
        self._speech = vd.SpeechBook(SPEECH_REQUESTS, p["max_text_chars"])
        self._last_subtask = ""  # the newest finished subtask's text (logged when it changes)
        self._memory = Deduplicator(MEMORY_IDS)  # latched entries come again on joining
        # Entries received before any live stamp (the latched ones at start), logged after.
        self._pending_memory: collections.deque[str] = collections.deque(maxlen=1000)
        self._instruction = ""
        self._current_instruction = ""
        self._episode: EpisodeStatus | None = None
        self._dirty = True  # the text panels changed since they were last logged
        self._reported_rejections = 0

        self._diag_pub = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
        self.create_subscription(
            ObservationFrame, p["observation_topic"], self._guard(self._on_frame), OBSERVATION_QOS
        )
        self.create_subscription(
            JointState, p["joint_state_topic"], self._guard(self._on_joints), SENSOR_QOS
        )
        self.create_subscription(
            ActionChunk, p["actions_topic"], self._guard(self._on_actions), RELIABLE_QOS
        )
        subscribe_latched_and_volatile(
            self, String, p["instruction_topic"], self._guard(self._on_instruction)
        )
        self.create_subscription(
            String,
            p["current_instruction_topic"],
            self._guard(self._on_current_instruction),
            LATCHED_QOS,
        )
        self.create_subscription(
            SpeechToken, p["speech_topic"], self._guard(self._on_speech), SPEECH_QOS
        )
        self.create_subscription(
            MemoryEntry,
            p["memory_topic"],
            self._guard(self._on_memory),
            latched_qos(p["memory_depth"]),
        )
        if p["episode_status_topic"]:
            self.create_subscription(
                EpisodeStatus,
                p["episode_status_topic"],
                self._guard(self._on_episode),
                LATCHED_QOS,
            )
        self.create_subscription(
            DiagnosticArray, "/diagnostics", self._guard(self._on_diagnostics), 10
        )
        self._text_timer = self.create_timer(1.0 / p["text_rate_hz"], self._on_text_tick)
        self._diag_timer = self.create_timer(self._diag_period(), self._publish_diagnostics)
        self.params.add_listener(self._on_params)
        self.get_logger().info(f"view: {self.url}")

    # ---------------------------------------------------------------- helpers
    def _diag_period(self) -> float:
        return self.params["diagnostics_period_s"] or 3600.0

    def _guard(self, callback):
        """`callback` such that an unexpected error drops that one message (counted as
        `rejected.internal_error`, logged with its cause) instead of ending the node."""

        def guarded(msg) -> None:
            try:
                callback(msg)
            except Exception as exc:
                self.counters["rejected.internal_error"] += 1
                self._throttle.warn(
                    self,
                    f"internal_error.{callback.__name__}",
                    f"message dropped, unexpected {type(exc).__name__} in "
                    f"{callback.__name__}: {exc}",
                )

        return guarded

    def _reject(self, reason: str, message: str) -> None:
        self.counters[f"rejected.{reason}"] += 1
        self._throttle.warn(self, reason, f"not shown ({reason}): {message}")

    def _at(self, stamp=None) -> bool:
        """Logs what follows at `stamp` (the newest stamp seen when it is zero or None);
        False before any message carried a stamp (nothing is logged then: the first stamp
        decides how the timeline counts, sim or wall-clock time)."""
        seconds = 0.0 if stamp is None else vd.stamp_seconds(stamp)
        if seconds > 0.0:
            self._stamp = seconds
        if self._stamp <= 0.0:
            return False
        self._view.at(seconds if seconds > 0.0 else self._stamp)
        return True

    def _text(self, text: str, what: str) -> str:
        cleaned, changed = vd.clean_text(text, self.params["max_text_chars"])
        if changed:
            self.counters["text.cleaned"] += 1
            self._throttle.warn(self, "text.cleaned", f"{what}: control characters or too long")
        return cleaned

    # ---------------------------------------------------------------- inputs
    def _on_frame(self, msg: ObservationFrame) -> None:
        now = time.monotonic()
        self.counters["received.frames"] += 1
        self._frame_times.add(1.0, now)
        if not self._image_gate.due(now):
            return
        try:
            slots, problems = vd.frame_images(msg)
        except vd.ViewInputError as exc:
            self._reject(exc.reason, f"ObservationFrame: {exc}")
            return
        for problem in problems:
            self._reject(problem.reason, f"ObservationFrame {problem}")
        if not slots:
            return
        self._view.ensure_layout([s.slot for s in slots], {})
        if not self._at(msg.header.stamp):
            return
        self._image_gate.mark(now)
        for slot in slots:
            self._view.image(slot.slot, slot.rgb)
            self.counters["shown.masked" if not slot.valid else "shown.images"] += 1

    def _groups_for(self, names: Sequence[str]):
        """The joint groups to plot: the configured ones, or those of the first message's
        joints when `joint_names` is empty."""
        if self._configured_groups:
            return self._configured_groups
        groups = vd.group_joints(names)
        self._view.ensure_layout([], groups)
        return self._view.groups

    def _on_joints(self, msg: JointState) -> None:
        self.counters["received.joint_states"] += 1
        try:
            values, nonfinite = vd.measured_positions(msg)
        except vd.ViewInputError as exc:
            self._reject(exc.reason, f"JointState: {exc}")
            return
        if nonfinite:
            self._reject("joint_nonfinite", f"JointState: {nonfinite} non-finite positions")
        if not self._measured_gate.allow(time.monotonic()):
            return
        self._plot(msg.header.stamp, values, layout.MEASURED, list(msg.name))

    def _on_actions(self, msg: ActionChunk) -> None:
        now = time.monotonic()
        self.counters["received.actions"] += 1
        try:
            values = vd.commanded_row(msg)
        except vd.ViewInputError as exc:
            self._reject(exc.reason, f"ActionChunk {msg.chunk_id}: {exc}")
            return
        self._action_times.add(1.0, now)
        if (
            msg.trigger == ActionChunk.TRIGGER_NEW_CHUNK
            and math.isfinite(msg.inference_latency)
            and self._at(msg.observation_stamp)
        ):
            latency_ms = 1e3 * msg.inference_latency
            self._view.scalars(layout.timing_path("chunk_latency_ms"), [latency_ms])
        if self._commanded_gate.allow(now):
            self._plot(msg.header.stamp, values, layout.COMMANDED, list(msg.joint_names))

    def _plot(self, stamp, values: dict[str, float], series: str, names: Sequence[str]) -> None:
        grouped = vd.group_values(values, self._groups_for(names))
        if not grouped:
            self._reject("unknown_joints", f"none of {list(values)[:4]}... is in joint_names")
            return
        if not self._at(stamp):
            return
        for group, row in grouped.items():
            self._view.scalars(layout.arm_path(group, series), row)

    def _on_instruction(self, msg: String) -> None:
        text = self._text(msg.data, "instruction")
        if text == self._instruction:  # a latched publisher's message arrives twice
            return
        self._instruction = text
        self._dirty = True
        if self._at():  # before any stamp: shown in the task panel only
            self._view.line(layout.event_path("instruction"), f"instruction: {text}")

    def _on_current_instruction(self, msg: String) -> None:
        self._current_instruction = self._text(msg.data, "current instruction")
        self._dirty = True

    def _on_speech(self, msg: SpeechToken) -> None:
        self.counters["received.speech"] += 1
        request, issues = self._speech.add(msg)
        for issue in issues:
            self.counters[issue] += 1
            if issue != "speech.text_cleaned":
                self._throttle.warn(self, issue, f"speech {request.request_id}: {issue}")
        self._dirty = True
        if not msg.final:
            return
        if request.kind == "subtask" and request.status == "stopped":
            # Subtasks come every subtask_period_s: the log shows when the text changes.
            if request.text == self._last_subtask:
                return
            self._last_subtask = request.text
        if self._at(msg.header.stamp):
            level = SPEECH_LEVELS.get(request.status, "INFO")
            self._view.line(layout.event_path(request.kind), vd.speech_line(request), level)

    def _on_memory(self, msg: MemoryEntry) -> None:
        """Entries are logged at the newest stamp of the live topics, not their own: inference
        republishes the newest entries of its database, made in earlier runs whose clock (sim
        time from 0) had other values; their own stamps would move the view's time cursor."""
        self.counters["received.memory"] += 1
        if not self._memory.accept(msg.entry_id):
            return
        line, cleaned = vd.memory_line(msg, self.params["max_text_chars"])
        if cleaned:
            self.counters["text.cleaned"] += 1
        self._pending_memory.append(line)
        self._log_memory()

    def _log_memory(self) -> None:
        """Logs the entries held until a live stamp was known (oldest first)."""
        if self._pending_memory and self._at():
            while self._pending_memory:
                self._view.line(layout.MEMORY, self._pending_memory.popleft())
                self.counters["shown.memory"] += 1

    def _on_episode(self, msg: EpisodeStatus) -> None:
        self.counters["received.episode_status"] += 1
        event = vd.episode_event(self._episode, msg)
        self._episode = msg
        self._dirty = True
        if event is not None and self._at(msg.header.stamp):
            level = {2: "INFO", 3: "WARN"}.get(msg.phase, "DEBUG")
            self._view.line(layout.event_path("episode"), event, level)

    def _on_diagnostics(self, msg: DiagnosticArray) -> None:
        for status in msg.status:
            node = status.name.removeprefix("oxygen_ros: ")
            if node == status.name or node == self.get_name():
                continue
            values = diagnostic_values(status)
            if node == "inference":
                frame_time = vd.diagnostic_number(values, "frame_time_s")
                if frame_time is not None and self._at():
                    self._view.scalars(layout.timing_path("frame_time_ms"), [1e3 * frame_time])
            elif node == "perception":
                rate = vd.diagnostic_number(values, "observation_rate_hz")
                if rate is not None and self._at():
                    self._view.scalars(layout.rate_path("perception_frames_hz"), [rate])

    # ---------------------------------------------------------------- timers
    def _on_text_tick(self) -> None:
        now = time.monotonic()
        if not self._at():
            return
        self._log_memory()
        self._view.scalars(layout.rate_path("actions_hz"), [self._action_times.rate(now)])
        self._view.scalars(layout.rate_path("frames_hz"), [self._frame_times.rate(now)])
        if not self._dirty:
            return
        self._dirty = False
        task, cleaned = vd.task_markdown(
            self._instruction,
            self._current_instruction,
            self._episode,
            self.params["max_text_chars"],
        )
        if cleaned:
            self.counters["text.cleaned"] += 1
        self._view.document(layout.TASK, task)
        shown = self._speech.newest_per_kind()
        self._view.document(layout.LANGUAGE, vd.speech_markdown(shown))

    def _on_params(self, changed: dict) -> None:
        if "image_rate_hz" in changed:
            self._image_gate.rate_hz = changed["image_rate_hz"]
        if "plot_rate_hz" in changed:
            self._commanded_gate.rate_hz = self._measured_gate.rate_hz = changed["plot_rate_hz"]
        if "text_rate_hz" in changed:
            self._text_timer.timer_period_ns = int(1e9 / changed["text_rate_hz"])
        if "diagnostics_period_s" in changed:
            self._diag_timer.timer_period_ns = int(1e9 * self._diag_period())

    def _publish_diagnostics(self) -> None:
        if not self.params["diagnostics_period_s"]:
            return
        rejected = sum(v for k, v in self.counters.items() if k.startswith("rejected."))
        if rejected > self._reported_rejections:
            level = "WARN"
            message = f"{rejected - self._reported_rejections} messages not shown; {self.url}"
        else:
            level, message = "OK", f"serving {self.url}"
        self._reported_rejections = rejected
        now = time.monotonic()
        values: dict[str, object] = {
            "url": self.url,
            "grpc_port": self._view.grpc_port,
            "web_port": self._view.web_port,
            "actions_hz": self._action_times.rate(now),
            "frames_hz": self._frame_times.rate(now),
        }
        values.update(sorted(self.counters.items()))
        publish_status(self, self._diag_pub, level, message, values)

    def close(self) -> None:
        self._text_timer.cancel()
        self._diag_timer.cancel()
        self._view.close()


def main(args: Sequence[str] | None = None) -> int:
    return run_node(ViewerNode, "viewer", args, num_threads=1)


if __name__ == "__main__":
    sys.exit(main())
