"""The inference node's engine thread: the loop around `Engine.step`.

Builds and warms up the engine, then per frame: the newest serialized ObservationFrame (plus
the queued language requests) -> deserialize and check it -> `Engine.step`, whose `on_actions`
hands the chunk to the action publisher (`ChunkSink`: the node's `ActionLink` to its action
process, or an `ActionPublisher` in tests) the moment it is denoised (before the frame's
language work) -> the frame's language outputs to the `RequestBook`, finished ones to the
node (`on_finished`: counters, memory entries).

Pick-up (`frame_pickup`, which frame the engine takes when it becomes free) is the frame
inbox's policy (`frame_inbox`); the loop counts its waits (`frames_waited_for`,
`frame_wait_timeouts`, `pickup_idle_s`).

Diagnostics decompose observation -> hand-off per frame (p50/p99 over `stats_window_s`):
age at arrival (arrival in the node - stamp, node clock; split, when the frame's DDS source and
reception timestamps are known, into the sender's part up to its DDS write, the DDS transport,
and this process's dispatch to the inbox), wait in the inbox (arrival -> taken,
and the part of it that overlaps the previous frame's language work), pre-step (taken ->
`Engine.step`: deserialisation, which is also reported alone, checks and bookkeeping), the
engine's action path, and the rest (`frame.unaccounted`).

Invariants:
- No engine call outside this thread.
- Only frames the engine uses are deserialized, here (a 3-camera frame holds the GIL ~3 ms;
  doing that for every received frame in a callback delayed ticks by ~20 ms).
- A frame the engine must not see (undecodable, breaking the message invariants, stamped
  more than `FRAME_FUTURE_TOLERANCE_S` ahead or older than `max_chunk_age_s`) is rejected
  (counted, warned about) and dropped; its requests go back to the front of the queue for the
  next good frame (the loop waits for that frame instead of spinning on the bad one).
- An exception in a frame (an engine fault, or the test-only `fault_injection`) ends every
  in-flight request with an error final message (and aborts it in the engine where it still
  can); the loop serves on.
- The hand-off costs the engine thread a lock and a notify, or one write to the action
  process's socket (no message is built there).
- Each instruction is a task (`FrameInbox.set_prompt` counts them, also one repeated word for
  word: a new episode). A chunk is handed off with the task of its frame's prompt, so the action
  stream does not continue the previous task's chunk, and before the first frame of a new task
  the engine forgets the chunk real-time chunking would continue (`Engine.new_task`).
- A frame observed before the current instruction arrived (stamped at or before the node's
  clock then, by at most `max_chunk_age_s`: further back means the clock itself went back) is
  not run under it: dropped and counted (`frames_before_instruction`), its requests back in
  the queue. A workcell episode reset publishes the new instruction, and the last frames of the
  old episode (the arms where it left them) still arrive after it: a chunk planned from them
  for the new task would start from the old pose.
- A reported world reset (`FrameInbox.note_reset`: the simulator's episode status) moves the
  task's start to the reset when it lies later: the node's clock may lag the simulator's when
  the instruction arrives, and the old episode's last frame carries the reset's own stamp. A
  frame observed at or before the newest reset is never run after the reset is known.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import math
import os
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import numpy as np
from rclpy.serialization import deserialize_message

from oxygen_ros.engine.types import ActionResult, FrameResult, LanguageRequest
from oxygen_ros.msg import ObservationFrame
from oxygen_ros.nodes.common.conversions import RejectedFrameError
from oxygen_ros.nodes.common.sliding_window import SlidingWindow
from oxygen_ros.nodes.inference.conversions import observation_from_msg
from oxygen_ros.nodes.inference.frame_inbox import FrameInbox, Pickup, PickupPolicy
from oxygen_ros.nodes.inference.request_book import Finished, RequestBook
from oxygen_ros.perception.task_window import STAMP_TOLERANCE_S

ENGINE_WAIT_S = 0.1  # the thread wakes at least this often to notice shutdown
FRAME_FUTURE_TOLERANCE_S = 0.5  # frames stamped further ahead of the node's clock are rejected
THROTTLE_S = 5.0
# Parameters read live (the node's NodeParameters, or a dict in tests).
PARAMETERS = (
    "warmup",
    "max_chunk_age_s",
    "fault_injection",
    "stats_window_s",
    "frame_pickup",
    "frame_pickup_fresh_s",
)


class ChunkSink(Protocol):
    """Where the engine thread hands chunks (`ActionPublisher`, `action_process.ActionLink`)."""

    def hand_off(
        self, actions: np.ndarray, observation_stamp: float, latency_s: float, task: int = 0
    ) -> None: ...

    def set_hold_positions(self, positions: np.ndarray) -> None: ...


class InjectedFaultError(RuntimeError):
    """Raised inside a frame by the test-only `fault_injection=engine_exception`."""


@dataclasses.dataclass(frozen=True)
class FrameFormat:
    """How an ObservationFrame becomes the engine's `Observation`."""

    image_keys: tuple[str, ...]  # the model's image slots
    state_names: tuple[str, ...]  # the joints, then perceived entries (the model's state)
    num_joints: int  # the first num_joints state entries are the joints
    resolution: tuple[int, int]  # the model's image height, width


class EngineLoop:
    """The engine thread (`start` / `stop` / `join`); see the module docstring.

    `params` is read live (keys in `PARAMETERS`). `reject(reason, message)` counts and warns
    about a rejected frame; `on_finished` gets each request the engine reported finished;
    `logger` is the node's (rclpy logger calls). `engine_factory` builds the engine (in this
    thread: importing JAX and building the model take seconds). `monotonic` must be the
    inbox's monotonic clock too (the diagnostics compare arrival and engine times).
    """

    def __init__(
        self,
        engine_factory: Callable[[], Any],
        frame_format: FrameFormat,
        inbox: FrameInbox,
        book: RequestBook,
        publisher: ChunkSink,
        params: Mapping[str, Any],
        *,
        clock: Callable[[], float],
        logger: Any,
        reject: Callable[[str, str], None],
        on_finished: Callable[[Finished], None],
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._engine_factory = engine_factory
        self._format = frame_format
        self._inbox = inbox
        self._book = book
        self._queue = book.queue
        self._publisher = publisher
        self._params = params
        self._clock = clock
        self._logger = logger
        self._reject = reject
        self._on_finished = on_finished
        self._monotonic = monotonic
        self.state = "loading"  # loading | ready | failed
        self.started = threading.Event()  # set when `state` leaves "loading"
        self.counters: collections.Counter[str] = collections.Counter()
        self._task = 0  # the task (FrameInbox.set_prompt's count) of the last frame run
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self.run, name="engine", daemon=True)
        self._engine_stats: dict[str, object] = {}
        self._frame_time_s = float("nan")
        self.pickup_idle_s = 0.0  # engine time the pick-up policy spent waiting for frames
        window = params["stats_window_s"]
        self._action_path = SlidingWindow(window)  # FrameTimings.action_s
        self._prefill_denoise = SlidingWindow(window)  # prefill_s + denoise_s
        self._handoff_latency = SlidingWindow(window)  # ActionResult.latency_s
        # Per frame: latency_s - (prefill_s + denoise_s), what the frame spent outside the
        # model (sensors, DDS, queues, input preparation): issue 11's bar, frame by frame.
        self._overhead = SlidingWindow(window)
        # Observation -> hand-off, decomposed (see the module docstring).
        self._age_at_arrival = SlidingWindow(window)
        # Of the age at arrival: stamp -> the sender's DDS write (the age minus the two
        # below), DDS write -> reception here, reception -> the inbox (the node's frame
        # intake); only for frames whose DDS timestamps are known.
        self._sender_age = SlidingWindow(window)
        self._transport = SlidingWindow(window)
        self._dispatch = SlidingWindow(window)
        self._inbox_wait = SlidingWindow(window)  # arrival -> taken
        self._wait_in_language = SlidingWindow(window)  # of that, during the previous language
        self._pickup_wait = SlidingWindow(window)  # the policy's wait before it arrived (idle)
        self._pre_step = SlidingWindow(window)  # taken -> Engine.step
        self._decode_time = SlidingWindow(window)  # deserialise + convert
        self._unaccounted = SlidingWindow(window)  # latency - the parts above - action path
        self._language = SlidingWindow(window)  # FrameTimings.total_s - action_s
        self._idle = SlidingWindow(window)  # previous frame's end -> taken (any cause)
        self._windows = (
            ("frame.action_path", self._action_path),
            ("frame.prefill_denoise", self._prefill_denoise),
            ("frame.obs_to_handoff", self._handoff_latency),
            ("frame.outside_model", self._overhead),
            ("frame.age_at_arrival", self._age_at_arrival),
            ("frame.sender_age", self._sender_age),
            ("frame.transport", self._transport),
            ("frame.dispatch", self._dispatch),
            ("frame.inbox_wait", self._inbox_wait),
            ("frame.wait_in_language", self._wait_in_language),
            ("frame.pickup_wait", self._pickup_wait),
            ("frame.pre_step", self._pre_step),
            ("frame.decode", self._decode_time),
            ("frame.unaccounted", self._unaccounted),
            ("frame.language", self._language),
            ("frame.engine_idle", self._idle),
        )
        # Monotonic times of the previous frame run: chunk handed over, frame ended (outputs
        # sent); its language work is the span between them.
        self._previous: tuple[float, float] | None = None
        self._handoff_s = math.nan  # when this frame's chunk was handed over

    # ------------------------------------------------------------------ other threads
    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Asks the loop to end (a frame in progress finishes first)."""
        self._stop.set()
        self._inbox.wake()

    def join(self, timeout_s: float) -> bool:
        """Waits for the thread; True when it has ended."""
        self._thread.join(timeout=timeout_s)
        return not self._thread.is_alive()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def diagnostics(self) -> dict[str, object]:
        """Key/values for /diagnostics (windows over the last `stats_window_s`)."""
        t = self._monotonic()
        values: dict[str, object] = {
            "engine_state": self.state,
            "frame_time_s": self._frame_time_s,
        }
        for name, window in self._windows:
            window.window_s = self._params["stats_window_s"]
            p50, p99 = window.percentiles((50, 99), t)
            values[f"{name}_p50_ms"] = 1e3 * p50
            values[f"{name}_p99_ms"] = 1e3 * p99
        values["frame.count_in_window"] = self._action_path.count(t)
        values["frame_pickup"] = self._params["frame_pickup"]
        values["frame_period_ms"] = 1e3 * self._inbox.frame_period_s()
        values["pickup_idle_s"] = self.pickup_idle_s
        values.update((f"engine.{k}", v) for k, v in self._engine_stats.items())
        return values

    @property
    def engine_stats(self) -> dict[str, object]:
        """The engine's `stats()` after the last frame, flattened."""
        return self._engine_stats

    # ------------------------------------------------------------------ engine thread
    def run(self) -> None:
        """Builds the engine, then runs frames until `stop`."""
        try:
            engine = self._engine_factory()
            if self._params["warmup"]:
                started = time.monotonic()
                compiled = engine.warmup()  # every code path, so no frame stalls on a compile
                self._logger.info(
                    f"engine warmed up: {compiled} compilations in "
                    f"{time.monotonic() - started:.1f} s"
                )
        except Exception as exc:  # a bad checkpoint or preset must not hang the node silently
            self.state = "failed"
            self._logger.fatal(f"engine failed to start: {type(exc).__name__}: {exc}")
            self._logger.debug(traceback.format_exc())
            self.started.set()
            return
        self.state = "ready"
        self.started.set()
        mask = tuple(getattr(engine, "delta_action_mask", ()) or ())
        delta = [n for n, on in zip(self._format.state_names, mask, strict=False) if on]
        space = f"deltas on {delta} (added to the joint state)" if delta else "absolute"
        self._logger.info(f"engine ready; model actions: {space}; published: joint targets")
        while not self._stop.is_set():
            pickup = self._inbox.take(
                self._queue.has_queued, self._stop, ENGINE_WAIT_S, self.pickup_policy()
            )
            if pickup is not None:
                self.run_frame(engine, pickup, self._queue.take())

    def pickup_policy(self) -> PickupPolicy:
        """The pick-up policy from the live parameters."""
        return PickupPolicy(
            self._params["frame_pickup"] == "on_arrival", self._params["frame_pickup_fresh_s"]
        )

    def run_frame(self, engine: Any, pickup: Pickup, requests: list[LanguageRequest]) -> None:
        """One frame: checks it, steps the engine, hands its chunk over, sends its outputs."""
        self._count_pickup(pickup)
        observation = self._decode(pickup.data, pickup.key, requests, pickup.prompt)
        if observation is None:
            return
        before_task = pickup.task_since - observation.stamp  # at or before: not the task's
        if -STAMP_TOLERANCE_S <= before_task <= self._params["max_chunk_age_s"]:
            self.counters["frames_before_instruction"] += 1  # not a fault: no warning
            self._set_aside(pickup.key, requests)
            return
        prompt = pickup.prompt
        decoded = self._monotonic()
        self._publisher.set_hold_positions(observation.state[: self._format.num_joints])
        fault = self._params["fault_injection"]
        # The frame's duration is wall time: the node clock may be /clock's sim time, which
        # moves in control ticks (10 ms at 100 Hz) and at the real-time factor's pace.
        started = self._monotonic()
        self._handoff_s = math.nan
        try:
            if pickup.task != self._task:
                engine.new_task()  # the previous instruction's chunk is not continued
                self._task = pickup.task
                self.counters["tasks"] += 1
            for request_id in self._queue.take_aborts():
                engine.abort(request_id)  # its final (aborted) output comes with this step
            self._book.admit(requests, observation.stamp, prompt)
            step_start = self._monotonic()
            result = engine.step(
                observation, requests, on_actions=lambda r: self._hand_off(r, fault, pickup.task)
            )
            if fault == "engine_exception":
                raise InjectedFaultError("fault_injection=engine_exception (test only)")
        except Exception as exc:  # engine fault: log the cause, end its requests, keep serving
            self._engine_fault(engine, exc)
            return
        if self._stop.is_set():
            return  # shutting down: the node ends these requests and closes the database
        self._record(engine, result, started)
        self._record_path(pickup, observation.stamp, result, decoded, step_start)
        stamp = self._clock()  # one header stamp for every output of the frame
        for output in result.outputs:
            finished = self._book.on_output(output, stamp, observation.stamp, prompt)
            if finished is not None:
                self._on_finished(finished)
        self._previous = (self._handoff_s, self._monotonic())

    def _hand_off(self, result: ActionResult, fault: str, task: int) -> None:
        """`on_actions`: in the engine thread, before the frame's language work."""
        self._handoff_s = self._monotonic()
        actions = result.actions
        if fault == "nan_chunk":  # test only: one NaN poisons the whole chunk
            actions = np.array(actions, dtype=np.float32, copy=True)
            actions[len(actions) // 2, 0] = np.nan
        self._publisher.hand_off(actions, result.observation_stamp, result.latency_s, task)

    def _decode(self, data: bytes, key: int, requests: list[LanguageRequest], prompt: str):
        """The frame as an `Observation`, or None (rejected and dropped)."""
        fmt = self._format
        try:
            frame = deserialize_message(data, ObservationFrame)
            observation = observation_from_msg(
                frame, prompt, fmt.image_keys, fmt.state_names, fmt.resolution
            )
        except RejectedFrameError as exc:
            return self._drop(key, requests, f"frame_{exc.reason}", f"frame rejected: {exc}")
        except (ValueError, TypeError, RuntimeError) as exc:  # undecodable bytes
            return self._drop(key, requests, "frame_undecodable", f"frame undecodable: {exc}")
        age = self._clock() - observation.stamp
        if age < -FRAME_FUTURE_TOLERANCE_S:
            return self._drop(
                key,
                requests,
                "frame_future_stamp",
                f"frame rejected: stamped {-age:.3f} s in the future (clocks out of sync?)",
            )
        max_age = self._params["max_chunk_age_s"]
        if age > max_age:
            return self._drop(
                key,
                requests,
                "frame_stale",
                f"frame rejected: {age:.3f} s old (max_chunk_age_s={max_age:g})",
            )
        return observation

    def _drop(self, key: int, requests: list[LanguageRequest], reason: str, message: str) -> None:
        """A frame the engine must not see: counted, dropped (the loop waits for the next one
        instead of retrying it), its requests back in the queue for the next good frame."""
        self._reject(reason, message)
        self._set_aside(key, requests)

    def _set_aside(self, key: int, requests: list[LanguageRequest]) -> None:
        """The frame dropped (not retried), its requests back in the queue for the next one."""
        self._inbox.drop(key)
        self._queue.requeue(requests)

    def _record(self, engine: Any, result: FrameResult, started: float) -> None:
        timings = result.timings
        t = self._monotonic()
        self._action_path.add(timings.action_s, t)
        model_s = timings.prefill_s + timings.denoise_s
        self._prefill_denoise.add(model_s, t)
        if result.actions is not None:
            self._handoff_latency.add(result.actions.latency_s, t)
            self._overhead.add(result.actions.latency_s - model_s, t)
        self._frame_time_s = self._monotonic() - started
        self.counters["frames_run"] += 1
        self._engine_stats = flatten_stats(engine.stats())

    def _count_pickup(self, pickup: Pickup) -> None:
        if pickup.wait_outcome:
            arrived = pickup.wait_outcome == "arrived"
            self.counters["frames_waited_for" if arrived else "frame_wait_timeouts"] += 1
            self.pickup_idle_s += pickup.policy_wait_s

    def _record_path(
        self,
        pickup: Pickup,
        stamp: float,
        result: FrameResult,
        decoded: float,
        step_start: float,
    ) -> None:
        """Windows of the observation -> hand-off decomposition (module docstring)."""
        t = self._monotonic()
        timings = result.timings
        age = pickup.arrival_clock_s - stamp
        wait = pickup.taken_s - pickup.arrival_s
        pre_step = step_start - pickup.taken_s
        in_language = 0.0
        if self._previous is not None:
            handoff, end = self._previous
            if math.isfinite(handoff):
                lo, hi = max(pickup.arrival_s, handoff), min(pickup.taken_s, end)
                in_language = max(hi - lo, 0.0)
            self._idle.add(pickup.taken_s - end, t)
        self._age_at_arrival.add(age, t)
        trip = (pickup.sent_wall_s, pickup.received_wall_s, pickup.arrival_wall_s)
        if all(math.isfinite(x) for x in trip):
            sent, received, arrived = trip
            self._sender_age.add(age - (arrived - sent), t)
            self._transport.add(received - sent, t)
            self._dispatch.add(arrived - received, t)
        self._inbox_wait.add(wait, t)
        self._wait_in_language.add(in_language, t)
        self._pickup_wait.add(pickup.policy_wait_s, t)
        self._pre_step.add(pre_step, t)
        self._decode_time.add(decoded - pickup.taken_s, t)
        self._language.add(timings.total_s - timings.action_s, t)
        if result.actions is not None:
            parts = age + wait + pre_step + timings.action_s
            self._unaccounted.add(result.actions.latency_s - parts, t)

    def _engine_fault(self, engine: Any, exc: Exception) -> None:
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
        self._logger.error(
            f"frame failed: {type(exc).__name__}: {exc}{at}; ending "
            f"{self._queue.num_in_flight} in-flight request(s) with an error, serving on",
            throttle_duration_sec=THROTTLE_S,
        )
        self._logger.debug(traceback.format_exc())
        for request in self._book.fail_in_flight(reason):
            with contextlib.suppress(Exception):  # free its slot if the engine still can
                engine.abort(request.request_id)


def flatten_stats(stats: object) -> dict[str, object]:
    """`EngineStats` (nested dataclasses included) as flat `name: value` pairs."""
    flat: dict[str, object] = {}
    for key, value in dataclasses.asdict(stats).items():
        if isinstance(value, dict):
            flat.update((f"{key}.{k}", v) for k, v in value.items())
        elif value is not None:
            flat[key] = value
    return flat
