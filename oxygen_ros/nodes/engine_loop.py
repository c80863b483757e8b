"""The inference node's engine thread: the loop around `Engine.step`.

Builds and warms up the engine, then per frame: the newest serialized ObservationFrame (plus
the queued language requests) -> deserialize and check it -> `Engine.step`, whose `on_actions`
hands the chunk to the action publisher (`ChunkSink`: the node's `ActionLink` to its action
process, or an `ActionPublisher` in tests) the moment it is denoised (before the frame's
language work) -> the frame's language outputs to the `RequestBook`, finished ones to the
node (`on_finished`: counters, memory entries).

Pick-up (`frame_pickup`): `newest` starts the newest frame the moment the engine is free.
`on_arrival` is for a saturated engine (a frame takes longer than the observation period, so
the newest frame has usually waited 0..1 period when the engine becomes free): if the newest
frame has waited longer than `frame_pickup_fresh_s` (or was already used), the engine waits
for the next frame to arrive and starts it at once; the wait is bounded by
`PICKUP_MAX_WAIT_PERIODS` frame periods (the median interval of recent arrivals), after which
the newest frame is taken, so nothing stalls. Counted: `frames_waited_for` (a new frame came),
`frame_wait_timeouts` (the bound was hit), `pickup_idle_s` (engine time spent waiting).

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
import statistics
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import numpy as np
from rclpy.serialization import deserialize_message

from oxygen_ros.engine.types import ActionResult, FrameResult, LanguageRequest
from oxygen_ros.msg import ObservationFrame
from oxygen_ros.nodes.conversions import RejectedFrameError, observation_from_msg
from oxygen_ros.nodes.request_book import Finished, RequestBook
from oxygen_ros.nodes.sliding_window import SlidingWindow
from oxygen_ros.perception.task_window import STAMP_TOLERANCE_S, TaskWindow

ENGINE_WAIT_S = 0.1  # the thread wakes at least this often to notice shutdown
PICKUP_MAX_WAIT_PERIODS = 1.5  # on_arrival: longest wait for a new frame, in frame periods
ARRIVAL_HISTORY = 16  # arrival intervals the frame period is the median of
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


@dataclasses.dataclass(frozen=True)
class PickupPolicy:
    """How the engine picks its next frame (`frame_pickup`, `frame_pickup_fresh_s`)."""

    wait_for_arrival: bool = False  # on_arrival: wait for a new frame when the newest is old
    fresh_s: float = 0.001  # a frame that has waited at most this long is started at once


def pickup_wait_s(policy: PickupPolicy, age_s: float, used: bool, period_s: float) -> float:
    """How long the engine, free now, waits for a newer frame (0: take the newest now).

    Args:
        policy: The pick-up policy.
        age_s: How long the newest frame has waited since it arrived.
        used: The newest frame already ran (it is offered again for queued requests).
        period_s: Median interval between frame arrivals (NaN while unknown).
    """
    if not policy.wait_for_arrival or not math.isfinite(period_s):
        return 0.0
    if not used and age_s <= policy.fresh_s:
        return 0.0
    return PICKUP_MAX_WAIT_PERIODS * period_s


@dataclasses.dataclass(frozen=True)
class Pickup:
    """A frame the engine took, with when (monotonic seconds unless noted)."""

    data: bytes  # serialized ObservationFrame
    key: int  # its number among the frames received
    prompt: str  # the task prompt when it was taken
    arrival_clock_s: float  # node clock when it arrived (compared with its stamp)
    arrival_s: float  # when it arrived
    taken_s: float  # when the engine took it
    policy_wait_s: float = 0.0  # time the pick-up policy waited for a newer frame
    # The policy's wait: "" (none), "arrived" (this frame came meanwhile) or "timed_out"
    # (none came within the bound; this is the newest older frame).
    wait_outcome: str = ""
    # Wall-clock (system time) seconds of its trip, NaN where unknown: the sender's DDS write
    # (source timestamp), the DDS reception in this process, its hand-over to the inbox.
    sent_wall_s: float = math.nan
    received_wall_s: float = math.nan
    arrival_wall_s: float = math.nan
    task: int = 0  # the prompt's task number (`FrameInbox.set_prompt` counts them)
    task_since: float = -math.inf  # the node's clock when that prompt was set


class FrameInbox:
    """The newest serialized ObservationFrame and the task prompt, from the node's callbacks to
    the engine thread (only the newest frame matters; older ones are overwritten)."""

    def __init__(
        self,
        prompt: str,
        *,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._cond = threading.Condition()
        self._clock = clock  # the node's clock (stamps)
        self._monotonic = monotonic
        self._wall = wall  # system time (DDS source / reception timestamps)
        self._frame: bytes | None = None
        self._key = 0  # frames received so far
        self._used_key = 0  # key of the last frame taken
        self._arrival_clock = math.nan  # of the newest frame
        self._arrival = math.nan
        self._trip = (math.nan, math.nan, math.nan)  # its sent, received, arrival (wall)
        self._intervals: collections.deque[float] = collections.deque(maxlen=ARRIVAL_HISTORY)
        self._prompt = prompt
        self._task = 0  # prompts set so far (each instruction is a task)
        # When the task began (node clock): its instruction, or a later world reset; the rule
        # and its clock-went-back bound are perception's (`TaskWindow`).
        self._window = TaskWindow()
        self.waiting_for_arrival = False  # `take` is in the pick-up policy's wait

    @property
    def prompt(self) -> str:
        with self._cond:
            return self._prompt

    def put_frame(
        self, data: bytes, sent_wall_s: float = math.nan, received_wall_s: float = math.nan
    ) -> None:
        """A new frame; `sent_wall_s` / `received_wall_s`: its DDS source and reception
        timestamps (system time, seconds) when known."""
        arrival_clock, arrival, arrival_wall = self._clock(), self._monotonic(), self._wall()
        with self._cond:
            if self._key:
                self._intervals.append(arrival - self._arrival)
            self._frame = data
            self._key += 1
            self._arrival_clock, self._arrival = arrival_clock, arrival
            self._trip = (sent_wall_s, received_wall_s, arrival_wall)
            self._cond.notify_all()

    def set_prompt(self, prompt: str) -> None:
        """A new instruction: the prompt of the frames taken from now on, and a new task (also
        when the words are the same as before: a new episode of the same instruction)."""
        since = self._clock()
        with self._cond:
            self._prompt = prompt
            self._task += 1
            self._window.on_instruction(since)

    def note_reset(self, reset_s: float) -> None:
        """The world was reset at `reset_s` (node clock; a workcell episode): no frame observed
        at or before it runs from now on, under this task or a later one."""
        with self._cond:
            self._window.on_reset(reset_s)  # later than the start, or the clock went back

    def wake(self) -> None:
        """Makes a waiting `take` look again (new requests, shutdown)."""
        with self._cond:
            self._cond.notify_all()

    def frame_period_s(self) -> float:
        """Median interval between the last `ARRIVAL_HISTORY` + 1 arrivals (NaN before two)."""
        with self._cond:
            return statistics.median(self._intervals) if self._intervals else math.nan

    def take(
        self,
        has_requests: Callable[[], bool],
        stop: threading.Event,
        timeout_s: float,
        policy: PickupPolicy = PickupPolicy(),
    ) -> Pickup | None:
        """Waits up to `timeout_s` for a new frame, or for requests and any frame, then applies
        the pick-up `policy` (`pickup_wait_s`); returns the frame taken, or None (nothing to do,
        or `stop` is set)."""

        def ready() -> bool:
            return self._frame is not None and (self._key != self._used_key or has_requests())

        with self._cond:
            self._cond.wait_for(lambda: stop.is_set() or ready(), timeout=timeout_s)
            if stop.is_set() or not ready():
                return None
            now = self._monotonic()
            used = self._key == self._used_key
            intervals = self._intervals
            period = statistics.median(intervals) if intervals else math.nan
            wait = pickup_wait_s(policy, now - self._arrival, used, period)
            policy_wait, outcome = 0.0, ""
            if wait > 0:
                key = self._key
                self.waiting_for_arrival = True
                try:
                    self._cond.wait_for(lambda: stop.is_set() or self._key != key, timeout=wait)
                finally:
                    self.waiting_for_arrival = False
                if stop.is_set():
                    return None
                outcome = "arrived" if self._key != key else "timed_out"
                policy_wait = self._monotonic() - now
            self._used_key = self._key
            return Pickup(
                self._frame,
                self._key,
                self._prompt,
                self._arrival_clock,
                self._arrival,
                self._monotonic(),
                policy_wait,
                outcome,
                *self._trip,
                task=self._task,
                task_since=self._window.start_s,
            )

    def drop(self, key: int) -> None:
        """Forgets frame `key` if it is still the newest (it is not used again)."""
        with self._cond:
            if self._key == key:
                self._frame = None


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
