"""The action publisher and watchdog with a fake clock and a fake publish function (no node):
tick deadlines and skipping, the immediate publish of handed-off chunks, sequence numbers,
watchdog trip and recovery, diagnostics; and once with its real thread."""

from __future__ import annotations

import random
import threading
import time

import numpy as np
import pytest
from fake_clock import FakeClock

from oxygen_ros.engine.action_stream import StreamConfig
from oxygen_ros.msg import ActionChunk
from oxygen_ros.nodes.inference.action_publisher import (
    HOLD_CHUNK_ID,
    LATE_TOLERANCE_PERIODS,
    TRIGGER_NEW_CHUNK,
    TRIGGER_TICK,
    ActionPublisher,
    TickClock,
    Watchdog,
)

PERIOD = 0.125  # 8 Hz; binary fractions keep the deadline arithmetic exact
DT = 0.125  # seconds between chunk rows
EPOCH = 1000.0  # the node clock = EPOCH + the fake monotonic clock
ROWS = 16  # 2 s of rows


class Recorder:
    """The fake `publish`: (sequence, trigger, chunk_id, stamp, first row) per message."""

    def __init__(self) -> None:
        self.messages: list[tuple[int, int, int, float, tuple[float, ...]]] = []
        self.cond = threading.Condition()

    def __call__(self, piece, sequence: int, trigger: int) -> None:
        with self.cond:
            self.messages.append(
                (sequence, trigger, piece.chunk.chunk_id, piece.stamp, tuple(piece.rows[0]))
            )
            self.cond.notify_all()

    @property
    def triggers(self) -> list[int]:
        return [m[1] for m in self.messages]

    @property
    def sequences(self) -> list[int]:
        return [m[0] for m in self.messages]


def make(
    clock: FakeClock | None = None, *, policy: str = "stop", rate_hz: float = 1 / PERIOD, **kw
):
    clock = clock or FakeClock(epoch=EPOCH)
    rec = Recorder()
    events: list[tuple[str, ...]] = []
    params = {
        "action_rate_hz": rate_hz,
        "watchdog_timeout_s": 1.0,
        "watchdog_policy": policy,
        "stats_window_s": 10.0,
    }
    config = StreamConfig(
        dt=DT,
        num_joints=2,
        blend_mode="replace",
        max_chunk_age_s=5.0,
        position_lower=(-0.5, -0.5),
        position_upper=(0.5, 0.5),
    )
    pub = ActionPublisher(
        config,
        ROWS,
        params,
        rec,
        clock.node,
        monotonic=clock,
        on_reject=lambda reason, message: events.append(("reject", reason)),
        on_watchdog=lambda transition: events.append(("watchdog", transition)),
        **kw,
    )
    return pub, clock, rec, params, events


def chunk(value: float = 0.0) -> np.ndarray:
    """ROWS x 2 rows; row k = (value + k / 100, value)."""
    rows = np.zeros((ROWS, 2), np.float32)
    rows[:, 0] = value + np.arange(ROWS) / 100
    rows[:, 1] = value
    return rows


def hand_off(pub, clock: FakeClock, value: float = 0.0, latency: float = 0.25) -> None:
    """A chunk whose observation was `latency` s before now."""
    pub.hand_off(chunk(value), clock.node() - latency, latency)


# ------------------------------------------------------------------------------ tick clock
def test_tick_clock_due_late_and_skipped_exactly() -> None:
    ticks = TickClock(0.0, PERIOD)
    assert LATE_TOLERANCE_PERIODS * PERIOD == 0.0625
    poll = ticks.poll(0.0625, PERIOD)
    assert (poll.skipped, poll.deadline) == (0, None)  # not yet
    poll = ticks.poll(0.125, PERIOD)
    assert (poll.skipped, poll.deadline) == (0, 0.125)  # on time
    assert ticks.poll(0.125, PERIOD).deadline is None  # once
    poll = ticks.poll(0.25 + 0.0625, PERIOD)  # exactly the tolerance late: still sent
    assert (poll.skipped, poll.deadline) == (0, 0.25)
    poll = ticks.poll(0.375 + 0.09375, PERIOD)  # beyond it: skipped, the next is not due yet
    assert (poll.skipped, poll.deadline) == (1, None)
    assert ticks.next_deadline == 0.5
    poll = ticks.poll(0.5 + 3 * PERIOD + 0.03125, PERIOD)  # a stall over three deadlines
    assert (poll.skipped, poll.deadline) == (3, 0.875)  # 0.5..0.75 skipped, 0.875 in time
    assert ticks.next_deadline == 1.0


def test_tick_clock_rate_change_keeps_the_next_deadline() -> None:
    ticks = TickClock(0.0, PERIOD)
    assert ticks.poll(0.125, PERIOD).deadline == 0.125
    assert ticks.poll(0.25, 0.5).deadline == 0.25  # the pending deadline stands
    assert ticks.next_deadline == 0.75  # then the new period


# ------------------------------------------------------------------------------ publisher
def test_late_tick_is_skipped_and_counted_never_sent_twice() -> None:
    pub, clock, rec, _, _ = make()
    hand_off(pub, clock, latency=0.0)  # rows up to now + 0.875 s
    pub.service()
    clock.t = 0.125
    pub.service()
    clock.t = 0.5 + 0.09375  # the ticks of 0.25, 0.375 and 0.5 are all late
    wait_s = pub.service()
    assert rec.triggers == [TRIGGER_NEW_CHUNK, TRIGGER_TICK]  # nothing sent for them
    assert wait_s == pytest.approx(0.03125)  # until the tick of 0.625
    assert pub.diagnostics()["action_ticks_skipped"] == 3
    clock.t = 0.625
    pub.service()
    clock.t = 0.75 + 0.0625  # late by exactly the tolerance: sent (positive control)
    pub.service()
    assert rec.triggers == [TRIGGER_NEW_CHUNK] + [TRIGGER_TICK] * 3
    assert rec.sequences == [0, 1, 2, 3]
    assert pub.service() == pytest.approx(0.0625)  # no second message for 0.75
    assert len(rec.messages) == 4
    assert pub.diagnostics()["action_ticks_skipped"] == 3


def test_handed_off_chunk_published_at_once_before_the_next_tick() -> None:
    pub, clock, rec, _, _ = make()
    hand_off(pub, clock, value=0.0)
    pub.service()
    clock.t = 0.125
    pub.service()  # a tick of chunk 0
    clock.t = 0.1875  # between ticks
    hand_off(pub, clock, value=0.25)
    wait_s = pub.service()
    assert rec.triggers == [TRIGGER_NEW_CHUNK, TRIGGER_TICK, TRIGGER_NEW_CHUNK]
    sequence, _, chunk_id, stamp, first = rec.messages[-1]
    assert (sequence, chunk_id) == (2, 1)
    # Re-based: the first row at or after now (observation 0.25 s ago: row 2).
    assert stamp == pytest.approx(clock.node())
    assert first == pytest.approx((0.27, 0.25))
    assert wait_s == pytest.approx(0.0625)  # the tick schedule did not move
    clock.t = 0.25
    pub.service()
    assert rec.messages[-1][1:3] == (TRIGGER_TICK, 1)  # the next tick carries the new chunk


def test_hand_off_and_due_tick_in_one_wake_up_new_chunk_first() -> None:
    pub, clock, rec, _, _ = make()
    hand_off(pub, clock, value=0.0)
    pub.service()
    clock.t = 0.125
    hand_off(pub, clock, value=0.25)
    pub.service()
    assert [m[1:3] for m in rec.messages] == [
        (TRIGGER_NEW_CHUNK, 0),
        (TRIGGER_NEW_CHUNK, 1),
        (TRIGGER_TICK, 1),
    ]
    assert rec.sequences == [0, 1, 2]


def test_newest_hand_off_wins_and_the_replaced_one_is_counted() -> None:
    pub, clock, rec, _, _ = make()
    hand_off(pub, clock, value=0.0)
    hand_off(pub, clock, value=0.25)
    pub.service()
    assert len(rec.messages) == 1 and rec.messages[0][4] == pytest.approx((0.27, 0.25))
    assert pub.diagnostics()["chunks_superseded"] == 1


def test_sequences_strictly_increase_over_random_hand_offs_and_stalls() -> None:
    pub, clock, rec, _, _ = make()
    rng = random.Random(3)
    for _ in range(400):
        if rng.random() < 0.2:
            hand_off(pub, clock, value=rng.choice((0.0, 0.25)), latency=rng.choice((0.0, 0.25)))
        pub.service()
        clock.t += rng.choice((0.01, 0.05, 0.125, 0.3))  # sometimes a stall over deadlines
    assert len(rec.messages) > 100
    assert rec.sequences == list(range(len(rec.messages)))
    chunk_ids = [m[2] for m in rec.messages]
    assert chunk_ids == sorted(chunk_ids)  # never back to an older chunk


def test_rejected_chunks_are_reported_never_published() -> None:
    pub, clock, rec, _, events = make()
    bad = chunk()
    bad[3, 0] = np.nan
    pub.hand_off(bad, clock.node(), 0.0)
    pub.hand_off(chunk(), clock.node() - 6.0, 0.1)  # observation older than max_chunk_age_s
    pub.service()  # the stale one replaced the NaN one in the mailbox
    pub.hand_off(bad, clock.node(), 0.0)
    pub.service()
    assert rec.messages == []
    assert events == [("reject", "chunk_stale"), ("reject", "chunk_non_finite")]
    hand_off(pub, clock)  # positive control: a good chunk is published
    pub.service()
    assert rec.triggers == [TRIGGER_NEW_CHUNK]


def test_starvation_counted_by_reason() -> None:
    pub, clock, rec, params, _ = make()
    params["watchdog_timeout_s"] = 60.0
    clock.t = 0.125
    pub.service()  # no chunk yet
    hand_off(pub, clock, latency=0.0)
    pub.service()
    clock.t = 0.125 + (ROWS - 1) * DT + 0.125  # every row has passed
    pub.service()
    values = pub.diagnostics()
    assert values["action_ticks_empty.no_chunk"] == 1
    assert values["action_ticks_empty.exhausted"] == 1
    assert rec.triggers == [TRIGGER_NEW_CHUNK]


def test_coverage_chunk_rate_and_tick_rate_in_diagnostics() -> None:
    pub, clock, _, params, _ = make()
    hand_off(pub, clock, latency=0.25)  # rows 2..15 ahead: the last at +1.625 s
    pub.service()
    clock.t = 0.125
    pub.service()  # the tick: the last row 1.5 s ahead
    values = pub.diagnostics()
    assert values["actions.coverage_min_s"] == pytest.approx(1.5)
    assert values["actions.coverage_p50_s"] == pytest.approx(1.5625)
    assert values["actions.chunk_rate_hz"] == pytest.approx(1 / params["stats_window_s"])
    assert values["action_messages"] == 2 and values["actions.chunks_accepted"] == 1
    params["stats_window_s"] = 0.0625  # the window follows the parameter: the tick only
    assert pub.diagnostics()["actions.coverage_p50_s"] == pytest.approx(1.5)
    clock.t = 0.25
    assert np.isnan(pub.diagnostics()["actions.coverage_min_s"])


# ------------------------------------------------------------------------------ watchdog
def test_watchdog_states() -> None:
    dog = Watchdog()
    assert dog.check(100.0, 1.0) == (False, "")  # not armed
    dog.feed(100.0)
    assert dog.check(101.0, 1.0) == (False, "")
    assert dog.state == "ok"
    assert dog.check(101.5, 1.0) == (True, "tripped")
    assert dog.check(102.0, 1.0) == (True, "")  # once per trip
    dog.feed(102.0)
    assert dog.check(102.0, 1.0) == (False, "recovered")
    assert dog.trips == 1


def test_watchdog_stop_trips_silences_and_recovers_on_a_fresh_chunk() -> None:
    pub, clock, rec, _, events = make(policy="stop")
    hand_off(pub, clock, latency=0.125)  # fed at the hand-off
    pub.service()
    clock.t = 0.875
    pub.service()  # fed 0.875 s ago: a tick (positive control)
    assert rec.triggers == [TRIGGER_NEW_CHUNK, TRIGGER_TICK]
    clock.t = 1.125
    pub.service()  # 1.125 s: tripped, nothing sent
    assert rec.triggers == [TRIGGER_NEW_CHUNK, TRIGGER_TICK]
    assert pub.watchdog_state == "tripped" and events == [("watchdog", "tripped")]
    assert pub.diagnostics()["action_ticks_empty.watchdog"] == 1
    pub.hand_off(chunk(), clock.node() - 1.5, 1.5)  # not a fresh observation: not published
    pub.service()
    assert len(rec.messages) == 2
    assert pub.diagnostics()["new_chunk_unpublished.watchdog"] == 1
    hand_off(pub, clock, value=0.25, latency=0.125)  # fresh: recovers, published at once
    pub.service()
    assert events == [("watchdog", "tripped"), ("watchdog", "recovered")]
    assert rec.messages[-1][1:3] == (TRIGGER_NEW_CHUNK, 2)
    assert pub.diagnostics()["watchdog_trips"] == 1


def test_watchdog_hold_publishes_last_joint_state_clamped() -> None:
    pub, clock, rec, _, _ = make(policy="hold")
    pub.set_hold_positions(np.array([0.9, -0.2]))
    hand_off(pub, clock, latency=0.0)
    pub.service()
    clock.t = 1.125
    pub.service()
    _, trigger, chunk_id, stamp, first = rec.messages[-1]
    assert (trigger, chunk_id) == (TRIGGER_TICK, HOLD_CHUNK_ID)
    assert first == pytest.approx((0.5, -0.2))  # joint 0 clamped to its upper limit
    assert stamp == pytest.approx(clock.node())


def test_watchdog_stop_sends_one_explicit_hold_at_the_trip_then_nothing() -> None:
    """`stop` with a measured pose: the trip's tick carries a hold of it (superseding the
    model rows a consumer may have buffered), later ticks nothing."""
    pub, clock, rec, _, _ = make(policy="stop")
    pub.set_hold_positions(np.array([0.9, -0.2]))
    hand_off(pub, clock, latency=0.0)
    pub.service()
    clock.t = 0.875
    pub.service()  # fed 0.875 s ago: a model tick (positive control)
    assert [m[2] for m in rec.messages] == [0, 0]
    for t in (1.125, 1.25, 1.375):
        clock.t = t
        pub.service()
    _, trigger, chunk_id, stamp, first = rec.messages[-1]
    assert len(rec.messages) == 3 and (trigger, chunk_id) == (TRIGGER_TICK, HOLD_CHUNK_ID)
    assert first == pytest.approx((0.5, -0.2)) and stamp == pytest.approx(EPOCH + 1.125)
    values = pub.diagnostics()
    assert values["watchdog_holds"] == 1 and values["action_ticks_empty.watchdog"] == 2


def test_watchdog_hold_renews_the_hold_when_it_expires() -> None:
    pub, clock, rec, _, _ = make(policy="hold")
    pub.set_hold_positions(np.array([0.1, -0.2]))
    hand_off(pub, clock, latency=0.0)
    pub.service()
    clock.t = 1.125
    while clock.t < 12.0:  # the hold's own age limit (max_chunk_age_s 5) passes twice
        pub.service()
        clock.t += PERIOD
    holds = [m for m in rec.messages if m[2] == HOLD_CHUNK_ID]
    assert len(holds) == len(rec.messages) - 1  # every tick after the trip sent the hold
    assert all(m[4] == pytest.approx((0.1, -0.2)) for m in holds)
    assert pub.diagnostics()["watchdog_holds"] >= 3  # the trip's, then renewed


def test_new_chunk_after_a_gap_starts_from_the_measured_pose() -> None:
    """No live chunk: velocity limits start from the frame's measured joint state."""
    config = StreamConfig(dt=DT, num_joints=2, blend_mode="replace", max_velocity=(0.8, 0.8))
    pub, clock, rec, _, _ = make()
    pub.reconfigure(config)
    pub.set_hold_positions(np.array([-0.3, 0.2]))
    hand_off(pub, clock, value=0.4, latency=0.0)
    pub.service()
    first = np.array(rec.messages[0][4])
    np.testing.assert_allclose(first, [-0.3 + 0.1, 0.2 + 0.1], atol=1e-6)  # 0.8 * 0.125


def test_estop_holds_at_once_drops_chunks_and_releases_from_the_hold() -> None:
    config = StreamConfig(
        dt=DT,
        num_joints=2,
        blend_mode="replace",
        max_velocity=(0.8, 0.8),
        position_lower=(-0.5, -0.5),
        position_upper=(0.5, 0.5),
    )
    pub, clock, rec, _, _ = make()
    pub.reconfigure(config)
    pub.set_hold_positions(np.array([0.9, -0.2]))
    hand_off(pub, clock, value=0.1, latency=0.0)
    pub.service()
    clock.t = PERIOD
    pub.service()  # a model tick: the positive control for "nothing" below
    assert [m[2] for m in rec.messages] == [0, 0]
    pub.set_estop(True)
    pub.service()  # at once, not at the next tick
    _, trigger, chunk_id, stamp, first = rec.messages[-1]
    assert (trigger, chunk_id) == (TRIGGER_TICK, HOLD_CHUNK_ID)
    assert first == pytest.approx((0.5, -0.2)) and stamp == pytest.approx(clock.node())
    count = len(rec.messages)
    hand_off(pub, clock, value=0.3, latency=0.0)  # fresh, but engaged: dropped
    for _ in range(4):
        clock.t += PERIOD
        pub.service()
    assert len(rec.messages) == count
    values = pub.diagnostics()
    assert values["estop"] == "engaged" and values["stop_engagements.estop"] == 1
    assert values["action_ticks_empty.estop"] == 4
    assert values["new_chunk_unpublished.estop"] == 1
    pub.set_estop(True)  # engaged again: nothing new
    pub.set_estop(False)
    hand_off(pub, clock, value=-0.4, latency=0.0)
    pub.service()
    _, trigger, chunk_id, _, first = rec.messages[-1]
    assert trigger == TRIGGER_NEW_CHUNK and chunk_id == 1  # the dropped chunk never counted
    np.testing.assert_allclose(first, [0.5 - 0.1, -0.3], atol=1e-6)  # from the hold, 0.8 * dt
    assert pub.diagnostics()["estop"] == "released"


def test_stop_reasons_overlap_one_hold_and_motion_only_when_all_are_released() -> None:
    """Two reasons (lifecycle "inactive", then the e-stop): one hold at the first, none at the
    second; releasing one of them keeps the stream silent, releasing both lets chunks through."""
    pub, clock, rec, _, _ = make()
    pub.set_hold_positions(np.array([0.2, -0.1]))
    hand_off(pub, clock, value=0.1, latency=0.0)
    pub.service()
    assert [m[1] for m in rec.messages] == [TRIGGER_NEW_CHUNK]  # positive control
    pub.set_stop("inactive", True)
    pub.service()
    _, trigger, chunk_id, _, first = rec.messages[-1]
    assert (trigger, chunk_id) == (TRIGGER_TICK, HOLD_CHUNK_ID)
    assert first == pytest.approx((0.2, -0.1))
    count = len(rec.messages)
    pub.set_estop(True)  # a second reason: no second hold
    pub.service()
    assert len(rec.messages) == count and pub.stops == {"inactive", "estop"}
    pub.set_stop("inactive", False)  # the e-stop still holds everything back
    hand_off(pub, clock, value=0.3, latency=0.0)
    clock.t += PERIOD
    pub.service()
    assert len(rec.messages) == count
    values = pub.diagnostics()
    assert values["stopped_by"] == "estop" and values["new_chunk_unpublished.estop"] == 1
    assert values["action_ticks_empty.estop"] == 1
    assert values["stop_engagements.inactive"] == values["stop_engagements.estop"] == 1
    pub.set_estop(False)
    hand_off(pub, clock, value=0.2, latency=0.0)
    pub.service()
    assert rec.messages[-1][1] == TRIGGER_NEW_CHUNK and pub.diagnostics()["stopped_by"] == ""


def test_trigger_constants_match_the_message() -> None:
    assert (ActionChunk.TRIGGER_TICK, ActionChunk.TRIGGER_NEW_CHUNK) == (
        TRIGGER_TICK,
        TRIGGER_NEW_CHUNK,
    )


# ------------------------------------------------------------------------------ real thread
def wait_until(cond: threading.Condition, predicate, timeout_s: float) -> bool:
    with cond:
        return cond.wait_for(predicate, timeout=timeout_s)


def test_thread_publishes_a_hand_off_at_once_then_ticks_on_schedule() -> None:
    pub, rec = make_real(rate_hz=1.0)
    thread = threading.Thread(target=pub.run, daemon=True)
    thread.start()
    try:
        handed = time.monotonic()
        pub.hand_off(chunk(), time.time() - 0.1, 0.1)
        assert wait_until(rec.cond, lambda: len(rec.messages) >= 1, 5.0)
        published = time.monotonic()
        # The first tick is due 1 s after start: the hand-off did not wait for it.
        assert rec.triggers == [TRIGGER_NEW_CHUNK]
        assert published - handed < 0.5
        assert wait_until(rec.cond, lambda: len(rec.messages) >= 2, 5.0)  # positive control
        assert rec.triggers == [TRIGGER_NEW_CHUNK, TRIGGER_TICK]
    finally:
        pub.stop()
        thread.join(timeout=5.0)
    assert not thread.is_alive()


def test_thread_sequences_stay_contiguous_with_concurrent_hand_offs() -> None:
    pub, rec = make_real(rate_hz=200.0)
    thread = threading.Thread(target=pub.run, daemon=True)
    thread.start()
    try:
        for i in range(30):  # this thread plays the engine: hand-offs while ticks go on
            pub.hand_off(chunk(0.25 * (i % 2)), time.time() - 0.05, 0.05)
            assert wait_until(rec.cond, lambda i=i: rec.triggers.count(TRIGGER_NEW_CHUNK) > i, 5.0)
        assert wait_until(rec.cond, lambda: len(rec.messages) >= 80, 10.0)
    finally:
        pub.stop()
        thread.join(timeout=5.0)
    assert rec.sequences == list(range(len(rec.messages)))
    new_chunks = [m[2] for m in rec.messages if m[1] == TRIGGER_NEW_CHUNK]
    assert new_chunks == list(range(30))  # each hand-off published once, in order
    assert TRIGGER_TICK in rec.triggers


def make_real(rate_hz: float) -> tuple[ActionPublisher, Recorder]:
    """A publisher on the real clocks (node clock: time.time)."""
    rec = Recorder()
    params = {
        "action_rate_hz": rate_hz,
        "watchdog_timeout_s": 60.0,  # never trips here, however late a tick is
        "watchdog_policy": "stop",
        "stats_window_s": 10.0,
    }
    config = StreamConfig(dt=DT, num_joints=2, max_chunk_age_s=60.0)
    return ActionPublisher(config, ROWS, params, rec, time.time), rec
