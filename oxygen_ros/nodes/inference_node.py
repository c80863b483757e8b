"""Inference: owns the engine (and so the unified KV cache); publishes actions, speech, memory.

Threads (the GIL is the scarce resource: a 70 Hz tick must never wait long for it):
- the engine thread builds and warms up the engine, then loops: newest ObservationFrame +
  queued language requests -> `Engine.step` -> offers the action chunk to the `ActionStream`,
  publishes the speech tokens, commits memory entries to SQLite and publishes them. Frames
  arrive serialized and only the ones it uses are deserialized, here (a 3-camera frame holds
  the GIL for ~3 ms; doing that 30 times a second in a callback delayed ticks by ~20 ms);
- the action publisher thread publishes `/oxygen/actions` at `action_rate_hz` on absolute
  deadlines (SCHED_FIFO when `action_thread_priority` > 0 and permitted): a slice of the
  current chunk re-based to the publish time, never engine work. A plain thread rather than a
  ROS timer: a timer dispatched through the Python executor needs several GIL hand-overs per
  tick and missed ticks next to the engine (measured 67 Hz instead of 70);
- a single-threaded executor runs the other callbacks (observation bytes, instruction,
  services, periodic requests, diagnostics).

Invariants:
- No engine call outside the engine thread; the publisher only slices the current chunk.
- Nothing stale is published: no slice past `max_chunk_age_s` or past the chunk's last row;
  when the watchdog trips (no fresh observation used for `watchdog_timeout_s`) the policy
  decides: `stop` publishes nothing, `hold` publishes the last joint state as a chunk.
- A memory entry is committed to SQLite before it is published; the last
  `memory_republish_count` entries are republished (transient local) at start.
- Every language request the node accepted ends with exactly one final SpeechToken (finished,
  aborted, refused or failed), also when the engine raises.
- Bad input (frames that break the message invariants, frames stamped more than
  `FRAME_FUTURE_TOLERANCE_S` ahead or older than `max_chunk_age_s`, empty / non-UTF-8
  instructions) is counted and warned about (throttled), never passed to the engine; a rejected
  frame is dropped (requests wait for the next good one instead of spinning on it).
- The watchdog's hold chunk is clamped to the position limits like every model chunk.
- Test only: `fault_injection` (off by default) makes every frame raise after `Engine.step` or
  poisons its chunk with NaN, to exercise the fault paths above over ROS.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import os
import sys
import threading
import time
import traceback
from collections.abc import Sequence

import numpy as np
from diagnostic_msgs.msg import DiagnosticArray
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.node import Node
from rclpy.serialization import deserialize_message
from std_msgs.msg import String
from trajectory_msgs.msg import JointTrajectory

from oxygen_ros.engine.types import RequestKind, RequestOutput, RequestStatus
from oxygen_ros.msg import ActionChunk, MemoryEntry, ObservationFrame, SpeechToken
from oxygen_ros.nodes import params as P
from oxygen_ros.nodes.action_stream import (
    ActionStream,
    RejectedChunkError,
    Slice,
    StreamConfig,
    hold_chunk,
)
from oxygen_ros.nodes.conversions import (
    MSG_TO_KIND,
    RejectedFrameError,
    action_chunk_msg,
    joint_trajectory_msg,
    memory_entry_msg,
    observation_from_msg,
    seconds_to_time,
    speech_token_msg,
    time_to_seconds,
)
from oxygen_ros.nodes.engine_bridge import LanguageQueue, RateMeter, build_engine_config
from oxygen_ros.nodes.memory_store import MemoryStore
from oxygen_ros.nodes.runtime import (
    LATCHED_QOS,
    OBSERVATION_QOS,
    RELIABLE_QOS,
    SERVICE_QOS,
    SPEECH_QOS,
    ReasonThrottle,
    latched_qos,
    now_s,
    publish_status,
    run_node,
)
from oxygen_ros.srv import QueryMemory, RequestLanguage

THROTTLE_S = 5.0
ENGINE_WAIT_S = 0.1  # engine thread wakes at least this often to notice shutdown
ENGINE_JOIN_S = 3.0  # at shutdown, how long to wait for a frame in progress
HOLD_CHUNK_ID = 2**63  # chunk_id of watchdog hold chunks (model chunks count from 0)
GIL_SWITCH_INTERVAL_S = 0.0005
MAX_CATCH_UP_TICKS = 3  # a tick this many periods late is still published, later ones skipped
FRAME_FUTURE_TOLERANCE_S = 0.5  # frames stamped further ahead of the node's clock are rejected
SUCCESS = (RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH)


class InjectedFaultError(RuntimeError):
    """Raised inside a frame by the test-only `fault_injection=engine_exception`."""


class InferenceNode(Node):
    """Runs the engine and publishes its actions, speech and memory."""

    def __init__(self) -> None:
        super().__init__("inference")
        self.params = P.NodeParameters(self, P.SHARED + P.INFERENCE)
        p = self.params
        self.exit_code = 0
        self.stop_requested = False
        self._joint_names = tuple(p["joint_names"])
        # The model's state: the joints, then perceived entries of the frame (not actions).
        self._state_names = self._joint_names + tuple(p["state_extra_names"])
        if len(set(self._state_names)) != len(self._state_names):
            raise P.ParameterError(f"state_extra_names repeat a joint: {p['state_extra_names']}")
        try:
            self._engine_config = build_engine_config(p.values(), len(self._joint_names))
            self._stream = ActionStream(self._stream_config())
        except ValueError as exc:
            raise P.ParameterError(str(exc)) from exc
        self._image_keys = self._engine_config.model.image_keys
        self._resolution = self._engine_config.model.image_resolution
        self._horizon = self._engine_config.model.action_horizon

        self._store = MemoryStore(p["memory_db_path"])
        if self._store.moved_aside is not None:
            self.get_logger().error(
                f"memory database {self._store.path} was unusable "
                f"({self._store.moved_aside_reason}); moved aside to {self._store.moved_aside}"
                " and started a new one"
            )
        self._queue = LanguageQueue(p["max_pending_requests"])
        self.counters: collections.Counter[str] = collections.Counter()
        self._throttle = ReasonThrottle(THROTTLE_S)  # per rejection reason
        self._action_rate = RateMeter()
        self._token_rate = RateMeter()

        # State shared with the engine thread (guarded by _cond / _stream_lock).
        self._cond = threading.Condition()
        # The newest ObservationFrame, still serialized: only frames the engine uses are
        # deserialized (in the engine thread; a 3-camera frame holds the GIL for ~3 ms).
        self._newest_frame: bytes | None = None
        self._newest_frame_key = 0  # frames received so far
        self._used_frame_key = 0
        self._prompt = self._clean_instruction(p["default_instruction"]) or ""
        self._stream_lock = threading.Lock()
        self._stop = threading.Event()
        self._engine_state = "loading"  # loading | ready | failed
        self._engine_stats: dict[str, object] = {}
        # Request id -> (observation stamp, prompt) of the frame it was handed to the engine in.
        self._admitted: dict[str, tuple[float, str]] = {}
        # Request id -> (tokens, text) streamed so far, for finals the node itself sends.
        self._streamed: dict[str, tuple[int, str]] = {}
        self._frame_time_s = float("nan")
        self._last_fed: float | None = None  # node time a fresh observation was last used
        self._last_positions: np.ndarray | None = None
        self._watchdog_state = "starting"  # starting | ok | tripped
        self._action_sequence = 0
        self._trajectory_chunk: int | None = None  # chunk_id of the last JointTrajectory

        # Publishers.
        self._io_group = MutuallyExclusiveCallbackGroup()
        self._action_pub = self.create_publisher(ActionChunk, p["actions_topic"], RELIABLE_QOS)
        self._trajectory_pub = (
            self.create_publisher(JointTrajectory, p["joint_trajectory_topic"], RELIABLE_QOS)
            if p["publish_joint_trajectory"]
            else None
        )
        self._speech_pub = self.create_publisher(SpeechToken, p["speech_topic"], SPEECH_QOS)
        self._memory_pub = self.create_publisher(
            MemoryEntry, p["memory_topic"], latched_qos(p["memory_republish_count"])
        )
        self._diag_pub = self.create_publisher(DiagnosticArray, "/diagnostics", 10)

        # Inputs, services, timers.
        self.create_subscription(
            ObservationFrame,
            p["observation_topic"],
            self._on_frame,
            OBSERVATION_QOS,
            callback_group=self._io_group,
            raw=True,
        )
        self.create_subscription(
            String,
            p["instruction_topic"],
            self._on_instruction,
            LATCHED_QOS,
            callback_group=self._io_group,
        )
        self.create_service(
            RequestLanguage,
            p["request_language_service"],
            self._on_request_language,
            qos_profile=SERVICE_QOS,
            callback_group=self._io_group,
        )
        self.create_service(
            QueryMemory,
            p["query_memory_service"],
            self._on_query_memory,
            qos_profile=SERVICE_QOS,
            callback_group=self._io_group,
        )
        self._action_period_s = 1.0 / p["action_rate_hz"]
        self._tick_lateness: collections.deque[float] = collections.deque(maxlen=512)
        self._action_thread = threading.Thread(
            target=self._action_loop, name="actions", daemon=True
        )
        self._subtask_timer = self.create_timer(
            self._period("subtask_period_s"),
            lambda: self._periodic(RequestKind.SUBTASK),
            callback_group=self._io_group,
        )
        self._narration_timer = self.create_timer(
            self._period("narration_period_s"),
            lambda: self._periodic(RequestKind.NARRATION),
            callback_group=self._io_group,
        )
        self._memory_timer = self.create_timer(
            self._period("memory_period_s"),
            lambda: self._periodic(RequestKind.MEMORY),
            callback_group=self._io_group,
        )
        self._diag_timer = self.create_timer(
            self._period("diagnostics_period_s"),
            self._publish_diagnostics,
            callback_group=self._io_group,
        )
        self.params.add_listener(self._on_params)

        self._republish_memory()
        self._engine_thread = threading.Thread(
            target=self._engine_main, name="engine", daemon=True
        )
        self._engine_thread.start()
        self._action_thread.start()
        self.get_logger().info(
            f"engine {self._engine_config.model.name} loading; actions at "
            f"{p['action_rate_hz']:g} Hz on {self._action_pub.topic_name}, memory in "
            f"{self._store.path} (last id {self._store.last_id()})"
        )

    # ================================================================ configuration
    def _stream_config(self) -> StreamConfig:
        p = self.params
        return StreamConfig(
            dt=p["action_dt_s"],
            num_joints=len(self._joint_names),
            blend_mode=p["blend_mode"],
            blend_steps=p["blend_steps"],
            max_chunk_age_s=p["max_chunk_age_s"],
            time_offset_s=p["action_time_offset_s"],
            position_lower=tuple(p["joint_position_lower"]),
            position_upper=tuple(p["joint_position_upper"]),
            max_velocity=tuple(p["joint_max_velocity"]),
        )

    def _period(self, name: str) -> float:
        """Timer period for a period parameter; 0 (disabled) polls rarely and does nothing."""
        return self.params[name] or 1.0

    def _on_params(self, changed: dict) -> None:
        if "action_rate_hz" in changed:
            self._action_period_s = 1.0 / changed["action_rate_hz"]
            self.get_logger().info(f"action_rate_hz -> {changed['action_rate_hz']:g}")
        for name, timer in (
            ("subtask_period_s", self._subtask_timer),
            ("narration_period_s", self._narration_timer),
            ("memory_period_s", self._memory_timer),
            ("diagnostics_period_s", self._diag_timer),
        ):
            if name in changed:
                timer.timer_period_ns = int(1e9 * self._period(name))
        if {"blend_mode", "blend_steps", "max_chunk_age_s"} & set(changed):
            with self._stream_lock:
                self._stream.reconfigure(self._stream_config())
        if "fault_injection" in changed:
            fault = changed["fault_injection"]
            self.get_logger().warning(
                f"fault_injection={fault!r}: every frame fails that way (test only)"
                if fault
                else "fault_injection off"
            )

    # ================================================================ inputs
    def _on_frame(self, data: bytes) -> None:
        with self._cond:
            self._newest_frame = data
            self._newest_frame_key += 1
            self._cond.notify_all()
        self.counters["frames_received"] += 1

    def _clean_instruction(self, text: str) -> str | None:
        if "\ufffd" in text:
            self._reject("instruction_non_utf8", "instruction is not valid UTF-8")
            return None
        text = text.strip()
        if not text:
            return None
        limit = self.params["instruction_max_chars"]
        if len(text) > limit:
            self.counters["instruction_truncated"] += 1
            self._throttle.warn(
                self,
                "instruction_truncated",
                f"instruction of {len(text)} characters truncated to {limit}",
            )
            text = text[:limit]
        return text

    def _on_instruction(self, msg: String) -> None:
        text = self._clean_instruction(msg.data)
        if text is None:
            if "\ufffd" not in msg.data:
                self._reject("instruction_empty", "empty instruction ignored")
            return
        with self._cond:
            self._prompt = text
        self.counters["instructions"] += 1
        for request in self._queue.abort_queued(RequestKind.SUBTASK):
            self._publish_final(
                request.request_id,
                RequestKind.SUBTASK,
                RequestStatus.FINISHED_ABORTED,
                "superseded by a new instruction",
            )
        self._queue.abort_in_flight(RequestKind.SUBTASK)  # the engine thread aborts them
        submitted = self._queue.submit(RequestKind.SUBTASK, origin="subtask")
        if not submitted.accepted:
            self._reject("request_refused", f"subtask request refused: {submitted.reason}")
        self.get_logger().info(f"instruction: {text!r} ({submitted.request_id or 'refused'})")
        self._wake_engine()

    def _periodic(self, kind: RequestKind) -> None:
        name = f"{kind.value}_period_s"
        if not self.params[name] or self._engine_state != "ready":
            return
        if self._queue.busy(kind):
            self.counters[f"periodic_skipped.{kind.value}"] += 1
            return
        submitted = self._queue.submit(kind, origin=kind.value)
        if not submitted.accepted:
            self._reject("request_refused", f"{kind.value} request refused: {submitted.reason}")
        self._wake_engine()

    def _on_request_language(self, request, response):
        kind = MSG_TO_KIND.get(request.kind)
        if kind is None:
            response.accepted, response.reason = False, f"unknown kind {request.kind}"
        elif self._engine_state != "ready":
            response.accepted, response.reason = False, f"engine not ready ({self._engine_state})"
        else:
            origin = "on_demand" if kind == RequestKind.MEMORY else kind.value
            submitted = self._queue.submit(kind, request.max_tokens or None, origin=origin)
            response.accepted = submitted.accepted
            response.request_id = submitted.request_id
            response.reason = submitted.reason
            self._wake_engine()
        if not response.accepted:
            self.counters["requests_refused"] += 1
        return response

    def _on_query_memory(self, request, response):
        limit = request.max_entries or self.params["memory_query_max_entries"]
        records = self._store.query(request.text, time_to_seconds(request.since), limit)
        response.entries = [memory_entry_msg(r, self.params["frame_id"]) for r in records]
        return response

    def _reject(self, reason: str, message: str) -> None:
        self.counters[f"rejected.{reason}"] += 1
        self._throttle.warn(self, reason, message)

    def _wake_engine(self) -> None:
        with self._cond:
            self._cond.notify_all()

    # ================================================================ engine thread
    def _engine_main(self) -> None:
        try:
            from oxygen_ros.engine.engine import Engine  # JAX import: seconds, keep it here

            engine = Engine(self._engine_config)
            if self.params["warmup"]:
                started = time.monotonic()
                compiled = engine.warmup()  # every code path, so no frame stalls on a compile
                self.get_logger().info(
                    f"engine warmed up: {compiled} compilations in "
                    f"{time.monotonic() - started:.1f} s"
                )
        except Exception as exc:  # a bad checkpoint or preset must not hang the node silently
            self._engine_state = "failed"
            self.exit_code = 1
            self.get_logger().fatal(f"engine failed to start: {type(exc).__name__}: {exc}")
            self.get_logger().debug(traceback.format_exc())
            self.stop_requested = True  # ends the spin; main() returns exit_code 1
            return
        self._engine_state = "ready"
        self.get_logger().info("engine ready")
        while not self._stop.is_set():
            work = self._next_work()
            if work is not None:
                self._run_frame(engine, *work)

    def _next_work(self) -> tuple[bytes, int, str, list] | None:
        """Waits for a new frame (or queued requests and any frame); takes them."""
        with self._cond:
            self._cond.wait_for(
                lambda: (
                    self._stop.is_set()
                    or (
                        self._newest_frame is not None
                        and (
                            self._newest_frame_key != self._used_frame_key
                            or self._queue.has_queued()
                        )
                    )
                ),
                timeout=ENGINE_WAIT_S,
            )
            if self._stop.is_set() or self._newest_frame is None:
                return None
            if self._newest_frame_key == self._used_frame_key and not self._queue.has_queued():
                return None
            self._used_frame_key = self._newest_frame_key
            frame, key, prompt = self._newest_frame, self._newest_frame_key, self._prompt
        return frame, key, prompt, self._queue.take()

    def _drop_frame(self, key: int, requests: list, reason: str, message: str) -> None:
        """A frame the engine must not see: counted, dropped (so the engine waits for the next
        one instead of retrying it), its requests back in the queue for the next good frame."""
        self._reject(reason, message)
        with self._cond:
            if self._newest_frame_key == key:
                self._newest_frame = None
        self._queue.requeue(requests)

    def _run_frame(self, engine, data: bytes, key: int, prompt: str, requests: list) -> None:
        try:
            frame = deserialize_message(data, ObservationFrame)
            observation = observation_from_msg(
                frame, prompt, self._image_keys, self._state_names, self._resolution
            )
        except RejectedFrameError as exc:
            self._drop_frame(key, requests, f"frame_{exc.reason}", f"frame rejected: {exc}")
            return
        except (ValueError, TypeError, RuntimeError) as exc:  # undecodable bytes
            self._drop_frame(key, requests, "frame_undecodable", f"frame undecodable: {exc}")
            return
        started = now_s(self)
        age = started - observation.stamp
        if age < -FRAME_FUTURE_TOLERANCE_S:
            self._drop_frame(
                key,
                requests,
                "frame_future_stamp",
                f"frame rejected: stamped {-age:.3f} s in the future (clocks out of sync?)",
            )
            return
        if age > self.params["max_chunk_age_s"]:
            self._drop_frame(
                key,
                requests,
                "frame_stale",
                f"frame rejected: {age:.3f} s old (max_chunk_age_s="
                f"{self.params['max_chunk_age_s']:g})",
            )
            return
        self._last_positions = np.asarray(
            observation.state[: len(self._joint_names)], dtype=np.float64
        )  # the joints (the state may go on with perceived entries)
        fault = self.params["fault_injection"]
        try:
            for request_id in self._queue.take_aborts():
                engine.abort(request_id)  # its final (aborted) output comes with this step
            for request in requests:
                self._admitted[request.request_id] = (observation.stamp, prompt)
            result = engine.step(observation, requests)
            if fault == "engine_exception":
                raise InjectedFaultError("fault_injection=engine_exception (test only)")
        except Exception as exc:  # engine fault: log the cause, end its requests, keep serving
            self._engine_fault(engine, exc)
            return
        if self._stop.is_set():
            return  # shutting down: close() ends these requests and closes the database
        now = now_s(self)
        self._frame_time_s = now - started
        self.counters["frames_run"] += 1
        self._engine_stats = flatten_stats(engine.stats())
        if now - observation.stamp <= self.params["watchdog_timeout_s"]:
            self._last_fed = now
        if result.actions is not None:
            actions = result.actions.actions
            if fault == "nan_chunk":  # test only: one NaN poisons the whole chunk
                actions = np.array(actions, dtype=np.float32, copy=True)
                actions[len(actions) // 2, 0] = np.nan
            self._offer_chunk(actions, observation.stamp, now)
        stamp = seconds_to_time(now)
        for output in result.outputs:
            self._publish_output(output, stamp, observation.stamp, prompt)

    def _engine_fault(self, engine, exc: Exception) -> None:
        """Logs the cause and ends every in-flight request with an error final message."""
        self.counters["engine_faults"] += 1
        reason = f"engine fault: {type(exc).__name__}: {exc}"
        frames = traceback.extract_tb(exc.__traceback__)
        at = (
            f" (at {os.path.basename(frames[-1].filename)}:{frames[-1].lineno} in "
            f"{frames[-1].name})"
            if frames
            else ""
        )
        self.get_logger().error(
            f"frame failed: {type(exc).__name__}: {exc}{at}; ending "
            f"{self._queue.num_in_flight} in-flight request(s) with an error, serving on",
            throttle_duration_sec=THROTTLE_S,
        )
        self.get_logger().debug(traceback.format_exc())
        for request in self._queue.fail_in_flight():
            with contextlib.suppress(Exception):  # free its slot if the engine still can
                engine.abort(request.request_id)
            self._publish_final(
                request.request_id, request.kind, RequestStatus.FINISHED_ERROR, reason
            )

    def _offer_chunk(self, actions: np.ndarray, observation_stamp: float, now: float) -> None:
        try:
            with self._stream_lock:
                self._stream.offer(actions, observation_stamp, now - observation_stamp, now)
        except RejectedChunkError as exc:
            self._reject(f"chunk_{exc.reason}", f"action chunk discarded: {exc}")

    def _publish_output(
        self, output: RequestOutput, stamp, observation_stamp: float, prompt: str
    ) -> None:
        if not self._queue.is_in_flight(output.request_id):
            self.counters["outputs_not_in_flight"] += 1  # already ended by the node
            return
        started = self._admitted.get(output.request_id, (observation_stamp, prompt))[0]
        self._speech_pub.publish(speech_token_msg(output, stamp, started))
        self._token_rate.add(len(output.new_token_ids))
        if not output.status.finished:
            count, text = self._streamed.get(output.request_id, (0, ""))
            self._streamed[output.request_id] = (
                count + len(output.new_token_ids),
                text + output.text_delta,
            )
            return
        self._streamed.pop(output.request_id, None)
        origin = self._queue.finish(output.request_id)
        observation_stamp, prompt = self._admitted.pop(
            output.request_id, (observation_stamp, prompt)
        )
        if output.status not in SUCCESS:
            self.counters[f"requests_{output.status.name.lower()}"] += 1
            self.get_logger().warning(
                f"{output.request_id} ended {output.status.name}: {output.error}",
                throttle_duration_sec=THROTTLE_S,
            )
            return
        self.counters[f"requests_done.{output.kind.value}"] += 1
        if output.kind == RequestKind.MEMORY:
            record = self._store.add(
                output.text or "",
                origin or "memory",
                now_s(self),
                observation_stamp,
                (prompt,) if prompt else (),
                output.request_id,
            )  # committed before it is published
            self._memory_pub.publish(memory_entry_msg(record, self.params["frame_id"]))
            self.counters["memory_entries"] += 1

    def _publish_final(
        self, request_id: str, kind: RequestKind, status: RequestStatus, error: str
    ) -> None:
        started = self._admitted.pop(request_id, (None, ""))[0]
        count, text = self._streamed.pop(request_id, (0, ""))  # what the stream already carried
        output = RequestOutput(request_id, kind, (), "", count, status, text, error)
        self._speech_pub.publish(
            speech_token_msg(output, self.get_clock().now().to_msg(), started)
        )

    def _abort_all(self, reason: str) -> None:
        for request in self._queue.drain():
            self._publish_final(
                request.request_id, request.kind, RequestStatus.FINISHED_ABORTED, reason
            )

    # ================================================================ action publisher
    def _action_loop(self) -> None:
        """Publishes at action_rate_hz on absolute deadlines: a late tick does not shift the
        schedule, and ticks up to `MAX_CATCH_UP_TICKS` periods late are still published (each
        re-based to its actual time); later than that the schedule restarts from now and the
        skipped ticks are counted."""
        self._raise_thread_priority(self.params["action_thread_priority"])
        deadline = time.monotonic()
        while not self._stop.is_set():
            period = self._action_period_s
            deadline += period
            delay = deadline - time.monotonic()
            if delay > 0:
                if self._stop.wait(delay):
                    break
            elif delay < -MAX_CATCH_UP_TICKS * period:
                missed = int(-delay // period)
                self.counters["action_ticks_missed"] += missed
                deadline += missed * period
            self._tick_lateness.append(time.monotonic() - deadline)
            self._on_action_tick()

    def _raise_thread_priority(self, priority: int) -> None:
        """SCHED_FIFO at `priority` for the calling thread (0: leave it alone). Needs
        CAP_SYS_NICE (root, or an rtprio limit); without it, warns and stays as it is."""
        if priority <= 0:
            return
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(priority))
        except (OSError, AttributeError) as exc:
            self.get_logger().warning(
                f"action publisher keeps normal scheduling (SCHED_FIFO {priority} refused: "
                f"{exc}); its timing then depends on the machine's load"
            )
            return
        self.get_logger().info(f"action publisher thread runs SCHED_FIFO priority {priority}")

    def _on_action_tick(self) -> None:
        now = now_s(self)
        with self._stream_lock:
            piece = self._stream.slice(now)
            empty = self._stream.empty_reason(now) if piece is None else ""
        if self._update_watchdog(now):
            piece = self._hold_slice(now) if self.params["watchdog_policy"] == "hold" else None
        if piece is None:
            self.counters[f"action_ticks_empty.{empty or 'watchdog'}"] += 1
            return
        self._action_pub.publish(
            action_chunk_msg(
                piece, self._action_sequence, self._joint_names, self.params["frame_id"]
            )
        )
        self._action_sequence += 1
        self._action_rate.add()
        if self._trajectory_pub is not None and piece.chunk.chunk_id != self._trajectory_chunk:
            # Once per chunk: JointTrajectoryController interpolates along time_from_start
            # itself, and a 50-point trajectory costs ~2 ms of GIL to build and send.
            self._trajectory_chunk = piece.chunk.chunk_id
            self._trajectory_pub.publish(
                joint_trajectory_msg(piece, self._joint_names, self.params["frame_id"])
            )

    def _update_watchdog(self, now: float) -> bool:
        """Returns True while tripped; logs transitions."""
        fed = self._last_fed
        if fed is None:  # armed by the first frame that used a fresh observation
            return False
        tripped = now - fed > self.params["watchdog_timeout_s"]
        state = "tripped" if tripped else "ok"
        if state != self._watchdog_state:
            if tripped:
                self.counters["watchdog_trips"] += 1
                self.get_logger().error(
                    f"watchdog: no fresh observation used for "
                    f"{self.params['watchdog_timeout_s']:g} s; policy "
                    f"{self.params['watchdog_policy']}"
                )
            elif self._watchdog_state == "tripped":
                self.get_logger().info("watchdog: fresh observations again, recovered")
            self._watchdog_state = state
        return tripped

    def _hold_slice(self, now: float) -> Slice | None:
        positions = self._last_positions
        if positions is None:
            return None
        chunk = hold_chunk(
            positions,
            now,
            self.params["action_dt_s"],
            self._horizon,
            HOLD_CHUNK_ID,
            tuple(self.params["joint_position_lower"]),
            tuple(self.params["joint_position_upper"]),
        )
        return Slice(chunk, 0, now, chunk.rows)

    # ================================================================ memory, diagnostics
    def _republish_memory(self) -> None:
        records = self._store.recent(self.params["memory_republish_count"])
        for record in records:
            self._memory_pub.publish(memory_entry_msg(record, self.params["frame_id"]))
        if records:
            self.get_logger().info(
                f"republished {len(records)} memory entries (ids {records[0].entry_id}.."
                f"{records[-1].entry_id})"
            )

    def _publish_diagnostics(self) -> None:
        if not self.params["diagnostics_period_s"]:
            return
        rate = self._action_rate.rate()
        target = self.params["action_rate_hz"]
        if self._engine_state == "failed":
            level, message = "ERROR", "engine failed to start"
        elif self._watchdog_state == "tripped":
            level, message = "ERROR", f"watchdog tripped ({self.params['watchdog_policy']})"
        elif self._engine_state == "loading":
            level, message = "WARN", "engine loading"
        elif self.params["fault_injection"]:
            level, message = "WARN", f"fault_injection={self.params['fault_injection']} (test)"
        elif rate < 0.9 * target:
            level, message = "WARN", f"action rate {rate:.1f} Hz below {target:g} Hz"
        else:
            level, message = "OK", f"actions {rate:.1f} Hz"
        slots = self._engine_config.cache.num_slots
        values: dict[str, object] = {
            "engine_state": self._engine_state,
            "model_preset": self._engine_config.model.name,
            "action_rate_hz": rate,
            "action_rate_target_hz": target,
            "frame_time_s": self._frame_time_s,
            "tokens_per_s": self._token_rate.rate(),
            "active_requests": self._queue.num_in_flight,
            "queued_requests": self._queue.num_queued,
            "cache_occupancy": self._cache_occupancy(slots),
            "action_tick_late_p99_ms": 1e3 * float(np.percentile(self._tick_lateness, 99))
            if self._tick_lateness
            else 0.0,
            "watchdog": self._watchdog_state,
            "memory_entries_total": self._store.last_id(),
            "prompt": self._prompt,
            "fault_injection": self.params["fault_injection"],
        }
        values.update((f"engine.{k}", v) for k, v in self._engine_stats.items())
        with self._stream_lock:
            stream_counters = dataclasses.asdict(self._stream.counters)
        values.update((f"actions.{k}", v) for k, v in stream_counters.items())
        values.update(sorted(self.counters.items()))
        publish_status(self, self._diag_pub, level, message, values)

    def _cache_occupancy(self, slots: int) -> float:
        stats = self._engine_stats
        if stats.get("cache_bytes_total"):
            return float(stats["cache_bytes_used"]) / float(stats["cache_bytes_total"])
        return self._queue.num_in_flight / slots

    # ================================================================ shutdown
    def close(self) -> None:
        """Stops timers and the engine thread, ends requests, closes the database."""
        timers = (self._subtask_timer, self._narration_timer, self._memory_timer, self._diag_timer)
        for timer in timers:
            timer.cancel()
        self._stop.set()
        self._wake_engine()
        self._action_thread.join(timeout=2.0)
        self._engine_thread.join(timeout=ENGINE_JOIN_S)
        if self._engine_thread.is_alive():
            doing = "inside a frame" if self._engine_state == "ready" else "loading"
            self.get_logger().warning(
                f"engine still {doing} after {ENGINE_JOIN_S:g} s; not waiting for it"
            )
        self._abort_all("node shutting down")
        self._store.close()

    def engine_busy(self) -> bool:
        """True while the engine thread has not finished (after `close`: stuck in XLA)."""
        return self._engine_thread.is_alive()


def flatten_stats(stats: object) -> dict[str, object]:
    """`EngineStats` (nested dataclasses included) as flat `name: value` pairs."""
    flat: dict[str, object] = {}
    for key, value in dataclasses.asdict(stats).items():
        if isinstance(value, dict):
            flat.update((f"{key}.{k}", v) for k, v in value.items())
        elif value is not None:
            flat[key] = value
    return flat


def main(args: Sequence[str] | None = None) -> int:
    # The engine thread runs Python between device calls; a short switch interval bounds how
    # long the action publisher waits for the GIL (default 5 ms is a third of a 70 Hz period).
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    holder: list[InferenceNode] = []

    def factory() -> InferenceNode:
        holder.append(InferenceNode())
        return holder[-1]

    code = run_node(factory, "inference", args, num_threads=1)
    code = code or (holder[0].exit_code if holder else 0)
    if holder:
        # Everything durable is closed (database checkpointed, ROS logging finalised). Skip the
        # interpreter's finalisation: tearing down XLA's runtime takes ~2.5 s on 2 cores, and
        # with a thread still inside XLA (loading or compiling, not interruptible) it aborts.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
