"""The engine thread's loop and its frame inbox with a fake engine (no node, no JAX): the chunk
is handed over and published during the frame's language work, bad frames never reach the
engine, an engine fault ends the in-flight requests once with an error and the loop serves on."""

from __future__ import annotations

import math
import threading
import time

import numpy as np
import pytest
from fake_clock import FakeClock
from rclpy.serialization import serialize_message

from oxygen_ros.engine.action_stream import StreamConfig
from oxygen_ros.engine.types import (
    ActionResult,
    EngineStats,
    FrameResult,
    FrameTimings,
    RequestKind,
    RequestOutput,
    RequestStatus,
)
from oxygen_ros.msg import ObservationFrame
from oxygen_ros.nodes.common.conversions import rgb_image_msg, seconds_to_time
from oxygen_ros.nodes.inference.action_publisher import TRIGGER_NEW_CHUNK, ActionPublisher
from oxygen_ros.nodes.inference.engine_bridge import LanguageQueue
from oxygen_ros.nodes.inference.engine_loop import EngineLoop, FrameFormat
from oxygen_ros.nodes.inference.frame_inbox import (
    PICKUP_MAX_WAIT_PERIODS,
    FrameInbox,
    Pickup,
    PickupPolicy,
    pickup_wait_s,
)
from oxygen_ros.nodes.inference.request_book import RequestBook

SLOTS = ("base_0_rgb", "left_wrist_0_rgb")
JOINTS = ("a", "b")
FORMAT = FrameFormat(SLOTS, JOINTS, len(JOINTS), (8, 8))
ROWS = 10
TIMINGS = FrameTimings(0.02, 0.03, 0.0, 0.0, 0.0, 0.2, action_s=0.06)


def frame_bytes(stamp: float, positions=(0.25, -0.5)) -> bytes:
    msg = ObservationFrame()
    msg.header.stamp = seconds_to_time(stamp)
    msg.image_names = list(SLOTS)
    msg.images = [
        rgb_image_msg(np.zeros((8, 8, 3), np.uint8), msg.header.stamp, "") for _ in SLOTS
    ]
    msg.image_valid = [True] * len(SLOTS)
    msg.image_stamps = [msg.header.stamp] * len(SLOTS)
    msg.joint_names = list(JOINTS)
    msg.joint_positions = [float(p) for p in positions]
    msg.joint_velocities = [0.0] * len(JOINTS)
    return serialize_message(msg)


class FakeEngine:
    """`step` hands the chunk over, then does its "language work" (`language`), then answers
    one finished output per request; `fail` raises inside the language work."""

    def __init__(self, language=None, latency_s: float = 0.125) -> None:
        self.language = language or (lambda: None)
        self.latency_s = latency_s
        self.fail = False
        self.steps: list[tuple[float, list[str]]] = []
        self.aborted: list[str] = []
        self.events: list[str] = []
        self.stepped = threading.Event()
        self.new_tasks = 0  # `new_task` calls

    def warmup(self) -> int:
        return 0

    def new_task(self) -> None:
        self.new_tasks += 1

    def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)

    def stats(self) -> EngineStats:
        return EngineStats(num_frames=len(self.steps))

    def step(self, observation, requests=(), *, on_actions=None) -> FrameResult:
        self.steps.append((observation.stamp, [r.request_id for r in requests]))
        actions = ActionResult(
            np.full((ROWS, len(JOINTS)), 0.125, np.float32), observation.stamp, self.latency_s
        )
        on_actions(actions)
        self.events.append("handed over")
        self.language()
        self.events.append("language done")
        self.stepped.set()
        if self.fail:
            raise RuntimeError("device lost")
        outputs = tuple(
            RequestOutput(r.request_id, r.kind, (7,), "ok", 0, RequestStatus.FINISHED_LENGTH, "ok")
            for r in requests
        )
        return FrameResult(len(self.steps) - 1, actions, outputs, TIMINGS, 1)


class FakePublisher:
    def __init__(self, events: list[str] | None = None) -> None:
        self.handed: list[tuple[np.ndarray, float, float]] = []
        self.tasks: list[int] = []  # the task of each chunk handed over
        self.hold: np.ndarray | None = None
        self.events = events

    def hand_off(self, actions, observation_stamp, latency_s, task=0) -> None:
        self.handed.append((np.array(actions), observation_stamp, latency_s))
        self.tasks.append(task)
        if self.events is not None:
            self.events.append("hand_off")

    def set_hold_positions(self, positions) -> None:
        self.hold = np.asarray(positions)


class Logger:
    def __init__(self) -> None:
        self.lines: list[tuple[str, str]] = []

    def __getattr__(self, level: str):
        return lambda message, **_: self.lines.append((level, message))


class Rig:
    def __init__(self, engine: FakeEngine, publisher=None, factory=None, **params) -> None:
        self.now = 100.0
        self.mono = 10.0  # the loop's monotonic clock
        self.engine = engine
        self.params = {
            "warmup": True,
            "max_chunk_age_s": 2.0,
            "fault_injection": "",
            "stats_window_s": 10.0,
            "frame_pickup": "newest",
            "frame_pickup_fresh_s": 0.005,
            **params,
        }
        self.queue = LanguageQueue(8)
        self.finals: list[RequestOutput] = []
        self.book = RequestBook(self.queue, self._send, lambda: self.now)
        self.arrivals = FakeClock(10.0)  # the inbox's monotonic clock
        self.inbox = FrameInbox("pick the cup", clock=lambda: self.now, monotonic=self.arrivals)
        self.publisher = publisher if publisher is not None else FakePublisher()
        self.rejected: list[str] = []
        self.finished: list[str] = []
        self.logger = Logger()
        self.loop = EngineLoop(
            factory or (lambda: engine),
            FORMAT,
            self.inbox,
            self.book,
            self.publisher,
            self.params,
            clock=lambda: self.now,
            logger=self.logger,
            reject=lambda reason, message: self.rejected.append(reason),
            on_finished=lambda f: self.finished.append(f.output.request_id),
            monotonic=lambda: self.mono,
        )

    def _send(self, output, stamp, observation_stamp) -> None:
        if output.status.finished:
            self.finals.append(output)

    def submit(self, *kinds: RequestKind) -> list[str]:
        return [self.queue.submit(k).request_id for k in kinds]

    def run_frame(self, stamp: float, data: bytes | None = None) -> None:
        self.inbox.put_frame(frame_bytes(stamp) if data is None else data)
        work = self.inbox.take(self.queue.has_queued, threading.Event(), 0.0)
        assert work is not None
        self.loop.run_frame(self.engine, work, self.queue.take())


def test_chunk_handed_over_before_the_language_work_then_outputs() -> None:
    events: list[str] = []
    engine = FakeEngine(language=lambda: events.append("language"))
    rig = Rig(engine, FakePublisher(events))
    (rid,) = rig.submit(RequestKind.NARRATION)
    rig.run_frame(99.875)
    assert events == ["hand_off", "language"]
    ((actions, stamp, latency),) = rig.publisher.handed
    assert actions.shape == (ROWS, len(JOINTS))
    assert (stamp, latency) == (99.875, 0.125)  # the engine's own measure, passed through
    np.testing.assert_array_equal(rig.publisher.hold, [0.25, -0.5])  # the frame's joints
    assert [f.request_id for f in rig.finals] == [rid] and rig.finished == [rid]
    values = rig.loop.diagnostics()
    assert values["frame.action_path_p50_ms"] == pytest.approx(60.0)
    assert values["frame.prefill_denoise_p99_ms"] == pytest.approx(50.0)
    assert values["frame.obs_to_handoff_p99_ms"] == pytest.approx(125.0)
    assert values["frame.outside_model_p50_ms"] == pytest.approx(75.0)  # 125 - 50
    assert rig.loop.counters["frames_run"] == 1


def test_frame_time_is_wall_time_not_the_node_clock() -> None:
    """The node clock can be sim time (/clock: 10 ms ticks, scaled by the real-time factor);
    the frame time reported on /diagnostics is the engine frame's monotonic duration."""

    def language() -> None:  # the frame takes 0.25 s of wall time, 3 s of node clock
        rig.mono += 0.25
        rig.now += 3.0

    rig = Rig(FakeEngine(language=language))
    rig.run_frame(99.875)
    assert rig.loop.diagnostics()["frame_time_s"] == pytest.approx(0.25)


def test_new_chunk_published_while_the_engine_is_still_in_the_frame() -> None:
    """With the real publisher thread: the NEW_CHUNK message goes out during the language
    work (the fake engine's language phase waits for it), not after `step` returns."""
    published = threading.Event()
    messages: list[tuple[int, int, float]] = []

    def publish(piece, sequence, trigger) -> None:
        messages.append((sequence, trigger, piece.chunk.latency_s))
        published.set()

    seen_during_language: list[bool] = []
    engine = FakeEngine(language=lambda: seen_during_language.append(published.wait(5.0)))
    params = {
        "action_rate_hz": 1.0,  # the first tick is 1 s away
        "watchdog_timeout_s": 60.0,
        "watchdog_policy": "stop",
        "stats_window_s": 10.0,
    }
    publisher = ActionPublisher(
        StreamConfig(dt=0.1, num_joints=2, max_chunk_age_s=60.0), ROWS, params, publish, time.time
    )
    thread = threading.Thread(target=publisher.run, daemon=True)
    thread.start()
    try:
        rig = Rig(engine, publisher)
        rig.now = time.time()
        rig.run_frame(rig.now - 0.125)
    finally:
        publisher.stop()
        thread.join(timeout=5.0)
    assert seen_during_language == [True]
    assert engine.events == ["handed over", "language done"]
    assert messages[0] == (0, TRIGGER_NEW_CHUNK, 0.125)  # inference_latency: the engine's


def test_engine_fault_ends_in_flight_requests_once_and_the_loop_serves_on() -> None:
    engine = FakeEngine()
    rig = Rig(engine)
    a, b = rig.submit(RequestKind.NARRATION, RequestKind.MEMORY)
    engine.fail = True
    rig.run_frame(99.9)
    assert [(f.request_id, f.status) for f in rig.finals] == [
        (a, RequestStatus.FINISHED_ERROR),
        (b, RequestStatus.FINISHED_ERROR),
    ]
    assert "engine fault: RuntimeError: device lost" in rig.finals[0].error
    assert engine.aborted == [a, b]  # their slots freed where the engine still can
    assert rig.loop.counters["engine_faults"] == 1
    assert len(rig.publisher.handed) == 1  # the chunk had been handed over already
    engine.fail = False
    (c,) = rig.submit(RequestKind.NARRATION)
    rig.run_frame(99.95)
    assert [f.request_id for f in rig.finals] == [a, b, c]
    assert rig.finals[-1].status == RequestStatus.FINISHED_LENGTH
    assert rig.finished == [c]


def test_injected_engine_exception_is_logged_with_its_place() -> None:
    rig = Rig(FakeEngine(), fault_injection="engine_exception")
    (rid,) = rig.submit(RequestKind.NARRATION)
    rig.run_frame(99.9)
    assert [(f.request_id, f.status) for f in rig.finals] == [(rid, RequestStatus.FINISHED_ERROR)]
    errors = [m for level, m in rig.logger.lines if level == "error"]
    assert len(errors) == 1 and "frame failed: InjectedFaultError" in errors[0]
    assert "engine_loop.py:" in errors[0]


def test_nan_chunk_fault_poisons_the_handed_off_chunk() -> None:
    rig = Rig(FakeEngine(), fault_injection="nan_chunk")
    rig.run_frame(99.9)
    ((actions, _, _),) = rig.publisher.handed
    assert np.isnan(actions).sum() == 1


@pytest.mark.parametrize(
    ("stamp", "data", "reason"),
    [
        (97.5, None, "frame_stale"),  # 2.5 s old, max_chunk_age_s 2
        (100.75, None, "frame_future_stamp"),  # 0.75 s ahead, tolerance 0.5
        (0.0, b"\x00\x01garbage", "frame_undecodable"),
    ],
)
def test_rejected_frames_never_reach_the_engine_and_requests_wait(stamp, data, reason) -> None:
    engine = FakeEngine()
    rig = Rig(engine)
    (rid,) = rig.submit(RequestKind.NARRATION)
    rig.run_frame(stamp, data)
    assert rig.rejected == [reason]
    assert engine.steps == [] and rig.publisher.handed == []
    assert rig.queue.num_queued == 1  # back in the queue for the next good frame
    # The bad frame is dropped: queued requests alone do not bring it back.
    assert rig.inbox.take(rig.queue.has_queued, threading.Event(), 0.0) is None
    rig.run_frame(99.9)  # positive control: a good frame runs them
    assert engine.steps == [(99.9, [rid])]


def test_inbox_keeps_only_the_newest_frame() -> None:
    inbox = FrameInbox("p")
    stop = threading.Event()
    assert inbox.take(lambda: True, stop, 0.0) is None  # no frame yet
    inbox.put_frame(b"1")
    inbox.put_frame(b"2")
    inbox.set_prompt("q")
    assert taken(inbox.take(lambda: False, stop, 0.0)) == (b"2", 2, "q")
    assert inbox.take(lambda: False, stop, 0.0) is None  # used, nothing queued
    assert taken(inbox.take(lambda: True, stop, 0.0)) == (b"2", 2, "q")  # requests reuse it


def test_each_instruction_is_a_task_the_chunks_carry_and_the_engine_hears_of() -> None:
    """`set_prompt` starts a task, also with the same words (a new episode of the same
    instruction); chunks are handed off with their frame's task, and the engine's `new_task`
    runs once before the first frame of each new task, not on the frames after it."""
    engine = FakeEngine()
    rig = Rig(engine)
    rig.run_frame(99.8)
    rig.run_frame(99.85)
    assert rig.publisher.tasks == [0, 0] and engine.new_tasks == 0  # no instruction yet
    rig.inbox.set_prompt("pick the cup")  # the same words as the start-up prompt, at 100.0
    rig.now = 100.2
    rig.run_frame(100.1)
    rig.run_frame(100.15)
    assert rig.publisher.tasks == [0, 0, 1, 1] and engine.new_tasks == 1
    rig.inbox.set_prompt("pick the cup")
    rig.inbox.set_prompt("put it down")  # two before a frame ran: one new task for the engine
    rig.run_frame(100.25)
    assert rig.publisher.tasks == [0, 0, 1, 1, 3] and engine.new_tasks == 2
    assert rig.loop.counters["tasks"] == 2


def test_a_frame_observed_before_the_instruction_is_not_run_under_it() -> None:
    """After an episode reset the old episode's last frames arrive after the new instruction:
    they are dropped (counted, no warning), their requests wait for the next frame, and the
    new task starts from a frame observed after the instruction (control: that one runs).
    A frame from before the task start by more than max_chunk_age_s means the clock went back
    (a restarted simulator): that one runs."""
    engine = FakeEngine()
    rig = Rig(engine)
    rig.inbox.set_prompt("pick the cup")  # arrives at 100.0
    (rid,) = rig.submit(RequestKind.SUBTASK)
    rig.now = 100.05
    rig.run_frame(99.95)  # observed before the instruction, arrived after it
    rig.run_frame(100.0)  # observed at its arrival: not after it
    assert engine.steps == [] and rig.publisher.handed == []
    assert rig.loop.counters["frames_before_instruction"] == 2 and rig.rejected == []
    assert rig.queue.num_queued == 1
    rig.now = 100.15
    rig.run_frame(100.1)  # positive control
    assert engine.steps == [(100.1, [rid])] and rig.publisher.tasks == [1]
    rig.now = 10.05  # the clock went back by far more than max_chunk_age_s (2.0)
    rig.run_frame(10.0)
    assert [s for s, _ in engine.steps] == [100.1, 10.0]
    assert rig.loop.counters["frames_before_instruction"] == 2


def test_a_reported_reset_ends_the_frames_observed_before_it() -> None:
    """The node's clock may lag the simulator's when the instruction arrives: then the old
    episode's last frame, stamped with the reset's own time, would pass the instruction's check
    (the positive control). The reset from the episode status moves the task's start to it,
    whichever of the two arrives first, and also without an instruction."""
    reset = 100.0
    # The instruction first, handled while the clock lags two ticks; then the status.
    engine = FakeEngine()
    rig = Rig(engine)
    rig.now = reset - 0.02
    rig.inbox.set_prompt("pick the cup")
    rig.now = reset + 0.01
    rig.run_frame(reset)  # the control: without the reset it runs under the new task
    assert [s for s, _ in engine.steps] == [reset]
    rig.inbox.note_reset(reset)
    rig.run_frame(reset)
    rig.run_frame(reset - 0.1)
    assert [s for s, _ in engine.steps] == [reset]
    assert rig.loop.counters["frames_before_instruction"] == 2
    rig.run_frame(reset + 0.01)  # the first frame after the reset runs
    assert [s for s, _ in engine.steps] == [reset, reset + 0.01]
    # The status first, then the instruction with the clock lagging.
    engine = FakeEngine()
    rig = Rig(engine)
    rig.inbox.note_reset(reset)
    rig.now = reset - 0.02
    rig.inbox.set_prompt("pick the cup")
    rig.now = reset + 0.01
    rig.run_frame(reset)
    assert engine.steps == [] and rig.loop.counters["frames_before_instruction"] == 1
    # A reset without a new instruction (the same task goes on): frames before it end too.
    rig.run_frame(reset + 0.01)
    rig.inbox.note_reset(reset + 5.0)
    rig.now = reset + 5.01
    rig.run_frame(reset + 5.0)
    assert [s for s, _ in engine.steps] == [reset + 0.01]
    # A clock that went back (a new simulator from 0): its reset and frames are not blocked.
    rig.inbox.note_reset(1.0)
    rig.now = 1.05
    rig.run_frame(1.02)
    assert [s for s, _ in engine.steps] == [reset + 0.01, 1.02]


def taken(pickup: Pickup | None) -> tuple[bytes, int, str] | None:
    return None if pickup is None else (pickup.data, pickup.key, pickup.prompt)


def test_thread_runs_frames_from_the_inbox_and_stops() -> None:
    engine = FakeEngine()
    rig = Rig(engine)
    rig.loop.start()
    try:
        rig.inbox.put_frame(frame_bytes(99.9))
        assert engine.stepped.wait(5.0)
        assert rig.loop.state == "ready"
    finally:
        rig.loop.stop()
    assert rig.loop.join(5.0)
    assert [s for s, _ in engine.steps] == [99.9]


def test_engine_that_fails_to_build_marks_the_loop_failed() -> None:
    def broken():
        raise OSError("no checkpoint at /nowhere")

    rig = Rig(FakeEngine(), factory=broken)
    rig.loop.start()
    assert rig.loop.join(5.0)
    assert rig.loop.state == "failed"
    assert (
        "fatal",
        "engine failed to start: OSError: no checkpoint at /nowhere",
    ) in rig.logger.lines


# ------------------------------------------------------------------ pick-up policy
ON_ARRIVAL = PickupPolicy(wait_for_arrival=True, fresh_s=0.005)


@pytest.mark.parametrize(
    ("policy", "age_s", "used", "period_s", "expected"),
    [
        (PickupPolicy(), 0.030, False, 0.033, 0.0),  # newest: always at once
        (ON_ARRIVAL, 0.004, False, 0.033, 0.0),  # fresh enough
        (ON_ARRIVAL, 0.006, False, 0.033, PICKUP_MAX_WAIT_PERIODS * 0.033),  # waited too long
        (ON_ARRIVAL, 0.0, True, 0.033, PICKUP_MAX_WAIT_PERIODS * 0.033),  # already ran
        (ON_ARRIVAL, 0.030, False, float("nan"), 0.0),  # no frame period known yet
    ],
)
def test_pickup_wait(policy, age_s, used, period_s, expected) -> None:
    assert pickup_wait_s(policy, age_s, used, period_s) == pytest.approx(expected)


def test_inbox_frame_period_is_the_median_arrival_interval() -> None:
    mono = FakeClock()
    inbox = FrameInbox("p", clock=mono, monotonic=mono)
    assert np.isnan(inbox.frame_period_s())
    for t in (0.0, 0.033, 0.066, 0.2, 0.233):  # one late arrival does not move the median
        mono.t = t
        inbox.put_frame(b"x")
    assert inbox.frame_period_s() == pytest.approx(0.033)


def test_inbox_takes_a_fresh_frame_at_once() -> None:
    mono = FakeClock()
    inbox = FrameInbox("p", clock=lambda: 50.0, monotonic=mono)
    for t in (0.0, 1.0, 2.0):
        mono.t = t
        inbox.put_frame(f"{t}".encode())
    mono.t = 2.004  # 4 ms after the newest arrived
    pickup = inbox.take(lambda: False, threading.Event(), 0.0, ON_ARRIVAL)
    assert (pickup.data, pickup.wait_outcome, pickup.policy_wait_s) == (b"2.0", "", 0.0)
    assert (pickup.arrival_clock_s, pickup.arrival_s, pickup.taken_s) == (50.0, 2.0, 2.004)


def start_take(inbox: FrameInbox, policy: PickupPolicy, stop: threading.Event):
    result: list[Pickup | None] = []
    thread = threading.Thread(
        target=lambda: result.append(inbox.take(lambda: False, stop, 5.0, policy)), daemon=True
    )
    thread.start()
    return thread, result


def wait_until(predicate, timeout_s: float = 5.0) -> bool:
    done = threading.Event()
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        done.wait(0.001)
    return True


def test_inbox_waits_for_the_next_arrival_when_the_newest_is_old() -> None:
    mono = FakeClock()
    inbox = FrameInbox("p", monotonic=mono)
    for t in (0.0, 1.0, 2.0):  # a 1 s frame period: the wait is bounded by 1.5 s
        mono.t = t
        inbox.put_frame(f"{t}".encode())
    mono.t = 2.5  # the newest has waited 0.5 s
    thread, result = start_take(inbox, ON_ARRIVAL, threading.Event())
    assert wait_until(lambda: inbox.waiting_for_arrival)
    mono.t = 2.9
    inbox.put_frame(b"2.9")
    thread.join(5.0)
    (pickup,) = result
    assert (pickup.data, pickup.key, pickup.wait_outcome) == (b"2.9", 4, "arrived")
    assert pickup.policy_wait_s == pytest.approx(0.4)
    assert pickup.taken_s - pickup.arrival_s == 0.0  # started on arrival


def test_inbox_wait_is_bounded_then_takes_the_newest() -> None:
    """With no new arrival the engine takes the old frame after 1.5 frame periods (arrivals
    20 ms apart: a 30 ms bound, in real time)."""
    mono = FakeClock()
    inbox = FrameInbox("p", monotonic=mono)
    for t in (0.0, 0.02, 0.04):
        mono.t = t
        inbox.put_frame(f"{t}".encode())
    mono.t = 1.0  # the newest has waited long
    started = time.monotonic()
    thread, result = start_take(inbox, ON_ARRIVAL, threading.Event())
    thread.join(5.0)
    elapsed = time.monotonic() - started
    (pickup,) = result
    assert (pickup.data, pickup.key, pickup.wait_outcome) == (b"0.04", 3, "timed_out")
    assert PICKUP_MAX_WAIT_PERIODS * 0.02 <= elapsed < 2.0


def test_stop_ends_a_pickup_wait() -> None:
    mono = FakeClock()
    inbox = FrameInbox("p", monotonic=mono)
    for t in (0.0, 10.0, 20.0):  # a 15 s bound
        mono.t = t
        inbox.put_frame(b"x")
    mono.t = 25.0
    stop = threading.Event()
    thread, result = start_take(inbox, ON_ARRIVAL, stop)
    assert wait_until(lambda: inbox.waiting_for_arrival)
    stop.set()
    inbox.wake()
    thread.join(5.0)
    assert result == [None]


@pytest.mark.parametrize(
    ("pickup", "expected_stamps"), [("newest", [2.0, 2.5]), ("on_arrival", [2.0, 2.9])]
)
def test_saturated_engine_starts_the_frame_that_arrives_next(pickup, expected_stamps) -> None:
    """The engine is busy (language work) while frame 2.5 arrives; when it becomes free that
    frame has waited 0.5 s. `newest` runs it (the positive control), `on_arrival` waits for
    frame 2.9 and runs that one instead."""
    release = threading.Event()
    engine = FakeEngine(language=lambda: release.wait(5.0))
    rig = Rig(engine, frame_pickup=pickup)
    mono = rig.arrivals
    for t in (0.0, 1.0, 2.0):  # frame period 1 s
        mono.t = t
        rig.inbox.put_frame(frame_bytes(99.0 + t / 100))
    rig.loop.start()
    try:
        assert wait_until(lambda: len(engine.steps) == 1)
        mono.t = 2.5
        rig.inbox.put_frame(frame_bytes(99.0 + 2.5 / 100))
        mono.t = 3.0
        release.set()
        if pickup == "on_arrival":
            assert wait_until(lambda: rig.inbox.waiting_for_arrival)
            rig.inbox.put_frame(frame_bytes(99.0 + 2.9 / 100))
        assert wait_until(lambda: len(engine.steps) >= 2)
    finally:
        rig.loop.stop()
    assert rig.loop.join(5.0)
    assert [round((s - 99.0) * 100, 3) for s, _ in engine.steps[:2]] == expected_stamps
    waited = 1 if pickup == "on_arrival" else 0
    assert rig.loop.counters["frames_waited_for"] == waited


def test_diagnostics_decompose_observation_to_handoff() -> None:
    """Frame 2 arrives during frame 1's language work: its wait in the inbox, the part of it
    in that language work, and the other parts come out exactly (fake clocks)."""
    rig = Rig(FakeEngine(latency_s=0.3))

    def language() -> None:
        rig.mono += 0.2  # frame 1's language work: 10.0 -> 10.2

    rig.engine.language = language
    rig.now = 100.0

    def pickup(stamp: float, arrival_clock: float, arrival: float, taken: float) -> Pickup:
        return Pickup(frame_bytes(stamp), 1, "p", arrival_clock, arrival, taken)

    rig.mono = 10.0
    rig.loop.run_frame(rig.engine, pickup(99.99, 100.0, 10.0, 10.0), [])
    assert rig.mono == pytest.approx(10.2)
    rig.loop.run_frame(rig.engine, pickup(100.11, 100.15, 10.15, 10.2), [])
    values = rig.loop.diagnostics()

    def both(name: str) -> tuple[float, float]:
        return values[f"frame.{name}_p50_ms"], values[f"frame.{name}_p99_ms"]

    assert values["frame.count_in_window"] == 2
    assert both("age_at_arrival") == pytest.approx((25.0, 39.7))  # 10 and 40 ms
    assert both("inbox_wait") == pytest.approx((25.0, 49.5))  # 0 and 50 ms
    assert both("wait_in_language") == pytest.approx((25.0, 49.5))  # all of frame 2's wait
    assert values["frame.engine_idle_p50_ms"] == pytest.approx(0.0)  # taken at frame 1's end
    assert both("pickup_wait") == (0.0, 0.0)
    # latency 300 ms = age + wait + pre-step (0: fake clock) + action path 60 ms + the rest.
    assert values["frame.unaccounted_p50_ms"] == pytest.approx(300 - 60 - (10 + 40 + 50) / 2)
    assert both("language") == pytest.approx((140.0, 140.0))  # TIMINGS: total 200 - action 60


def test_inbox_passes_on_the_frame_trip() -> None:
    """The DDS source and reception timestamps given with a frame, and the wall time it
    reached the inbox, come out with the frame that is taken (NaN when not given)."""
    wall = FakeClock(1000.0)
    inbox = FrameInbox("p", wall=wall)
    stop = threading.Event()
    inbox.put_frame(b"1")
    untimed = inbox.take(lambda: False, stop, 0.0)
    assert untimed is not None
    assert np.isnan([untimed.sent_wall_s, untimed.received_wall_s]).all()
    assert untimed.arrival_wall_s == 1000.0
    wall.t = 1000.5
    inbox.put_frame(b"2", 1000.49, 1000.495)
    timed = inbox.take(lambda: False, stop, 0.0)
    assert timed is not None
    assert (timed.sent_wall_s, timed.received_wall_s, timed.arrival_wall_s) == (
        1000.49,
        1000.495,
        1000.5,
    )


def test_diagnostics_split_the_age_at_arrival() -> None:
    """With DDS timestamps, the age at arrival splits into the sender's part (up to its DDS
    write), the transport and the dispatch here, exactly; frames without them add nothing to
    those three windows."""
    rig = Rig(FakeEngine(latency_s=0.3))

    def pickup(stamp: float, arrival_clock: float, trip: tuple[float, float, float]) -> Pickup:
        return Pickup(frame_bytes(stamp), 1, "p", arrival_clock, 10.0, 10.0, 0.0, "", *trip)

    rig.loop.run_frame(rig.engine, pickup(99.99, 100.0, (math.nan,) * 3), [])
    values = rig.loop.diagnostics()
    assert values["frame.age_at_arrival_p50_ms"] == pytest.approx(10.0)
    assert math.isnan(values["frame.transport_p50_ms"])
    # Age 10 ms: written 7 ms after the stamp, received 1 ms later, in the inbox 2 ms later.
    rig.loop.run_frame(rig.engine, pickup(99.99, 100.0, (5000.007, 5000.008, 5000.010)), [])
    values = rig.loop.diagnostics()
    assert values["frame.age_at_arrival_p50_ms"] == pytest.approx(10.0)
    assert values["frame.sender_age_p50_ms"] == pytest.approx(7.0)
    assert values["frame.transport_p50_ms"] == pytest.approx(1.0)
    assert values["frame.dispatch_p50_ms"] == pytest.approx(2.0)


def test_pickup_waits_are_counted() -> None:
    rig = Rig(FakeEngine())
    base = dict(arrival_clock_s=99.95, arrival_s=10.0, taken_s=10.0)
    for outcome, wait in (("arrived", 0.02), ("arrived", 0.01), ("timed_out", 0.05), ("", 0.0)):
        rig.loop.run_frame(
            rig.engine,
            Pickup(frame_bytes(99.9), 1, "p", **base, policy_wait_s=wait, wait_outcome=outcome),
            [],
        )
    assert rig.loop.counters["frames_waited_for"] == 2
    assert rig.loop.counters["frame_wait_timeouts"] == 1
    assert rig.loop.pickup_idle_s == pytest.approx(0.08)
    assert rig.loop.diagnostics()["pickup_idle_s"] == pytest.approx(0.08)
