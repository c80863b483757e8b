"""The parent <-> action process protocol without a process or a node: `ActionLink` (the
inference node's end) and `serve` (the child's reader) over a socket pair in this process, the
child's `ActionPublisher` on a fake clock with a fake publish function, stepped by the test.

The real child process (spawned, over DDS, its exit when the parent dies) is in
test/integration/test_action_process.py."""

from __future__ import annotations

import dataclasses
import os
import socket
import threading
from multiprocessing.connection import Connection

import numpy as np
import pytest
from fake_clock import FakeClock

from oxygen_ros.engine.action_stream import Slice, StreamConfig, TimedChunk
from oxygen_ros.nodes.common.conversions import time_to_seconds
from oxygen_ros.nodes.inference.action_process import ActionLink, ActionMessages, serve
from oxygen_ros.nodes.inference.action_publisher import (
    HOLD_CHUNK_ID,
    TRIGGER_NEW_CHUNK,
    TRIGGER_TICK,
    ActionPublisher,
)
from oxygen_ros.nodes.inference.trajectory_groups import TrajectoryGroup, parse_groups

ROWS = 16
DT = 0.125
EPOCH = 1000.0  # the child's node clock = EPOCH + its fake monotonic clock
TIMEOUT_S = 10.0  # waits on conditions; never reached when the code works


class Recorder:
    """Fake `publish` (sequence, trigger, chunk id, first row), and events with a condition."""

    def __init__(self) -> None:
        self.messages: list[tuple[int, int, int, tuple[float, ...]]] = []
        self.events: list[tuple] = []
        self.cond = threading.Condition()

    def __call__(self, piece, sequence: int, trigger: int) -> None:
        self.messages.append((sequence, trigger, piece.chunk.chunk_id, tuple(piece.rows[0])))

    def event(self, *event) -> None:
        with self.cond:
            self.events.append(event)
            self.cond.notify_all()

    def wait_events(self, count: int) -> list[tuple]:
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.events) >= count, TIMEOUT_S)
            return list(self.events)


class Pair:
    """A parent link and a child (publisher + reader thread) joined by a socket pair."""

    def __init__(self, parent_clock: FakeClock | None = None) -> None:
        parent_end, self.child_sock = socket.socketpair()
        self.child_conn = Connection(os.dup(self.child_sock.fileno()))
        self.clock = FakeClock(10.0, EPOCH)  # the child's monotonic clock
        self.parent_clock = parent_clock or self.clock
        self.rec = Recorder()
        self.params = {
            "action_rate_hz": 8.0,
            "watchdog_timeout_s": 1.0,
            "watchdog_policy": "stop",
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
        lock = threading.Lock()

        def send(message: tuple) -> None:  # as the child's: one sender at a time
            with lock:
                self.child_conn.send(message)

        self.pub = ActionPublisher(
            config,
            ROWS,
            self.params,
            self.rec,
            self.clock.node,
            monotonic=self.clock,
            on_reject=lambda reason, message: send(("reject", reason, message)),
            on_watchdog=lambda transition: send(("watchdog", transition)),
        )
        self.send = send
        self.server = threading.Thread(
            target=serve, args=(self.child_conn, self.pub, self.params, send), daemon=True
        )
        self.server.start()
        self.link = ActionLink(
            parent_end,
            on_reject=lambda reason, message: self.rec.event("reject", reason),
            on_watchdog=lambda transition: self.rec.event("watchdog", transition),
            on_ready=lambda refusal: self.rec.event("ready", refusal),
            monotonic=self.parent_clock,
        )

    def applied(self) -> dict:
        """A diagnostics round trip: everything sent before it has been applied."""
        values = self.link.diagnostics(timeout_s=TIMEOUT_S)
        assert values is not None
        return values

    def child_dies(self) -> None:
        """What the kernel does to the child's end when the child exits."""
        self.child_sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.link.close()
        self.server.join(TIMEOUT_S)
        self.child_conn.close()
        self.child_sock.close()


@pytest.fixture
def pair():
    p = Pair()
    yield p
    p.close()


def rows(value: float = 0.0) -> np.ndarray:
    out = np.zeros((ROWS, 2), np.float32)
    out[:, 0] = value + np.arange(ROWS) / 100
    out[:, 1] = value
    return out


def test_hand_off_reaches_the_child_with_the_parents_hand_off_time() -> None:
    parent_clock = FakeClock(9.5, EPOCH)  # the parent handed over 0.5 s before the child publishes
    p = Pair(parent_clock)
    try:
        p.link.hand_off(rows(0.25), p.clock.node() - 0.25, 0.25)
        p.applied()
        p.pub.service()
        assert p.rec.messages == [(0, TRIGGER_NEW_CHUNK, 0, pytest.approx((0.27, 0.25)))]
        # Measured from the parent's hand-off, not from when the child read it.
        assert p.applied()["actions.handoff_to_publish_p99_ms"] == pytest.approx(500.0)
    finally:
        p.close()


def test_hand_off_carries_its_task_to_the_childs_stream(pair) -> None:
    """A chunk's task crosses the socket: the child's stream starts a chunk of a new task
    afresh (`actions.chunks_new_task`); control: a second chunk of that task continues it."""
    now = pair.clock.node()
    for task, stamp in ((1, now), (2, now + 0.01), (2, now + 0.02)):
        pair.link.hand_off(rows(0.25), stamp, 0.0, task=task)
        pair.applied()
        pair.pub.service()
    values = pair.applied()
    assert values["actions.chunks_accepted"] == 3
    assert values["actions.chunks_new_task"] == 1


def test_messages_apply_in_order_params_stream_and_hold_go_live(pair) -> None:
    pair.link.hand_off(rows(), pair.clock.node(), 0.0)
    pair.link.set_params({"watchdog_policy": "hold", "action_rate_hz": 4.0})
    pair.link.set_hold_positions(np.array([0.9, -0.2]))
    pair.link.reconfigure(
        StreamConfig(dt=DT, num_joints=2, max_chunk_age_s=5.0, position_upper=(0.25, 0.5))
    )
    pair.link.set_params({})  # nothing to send
    pair.applied()
    assert pair.params["watchdog_policy"] == "hold" and pair.params["action_rate_hz"] == 4.0
    pair.pub.service()  # the new chunk
    pair.clock.t += 0.125  # the pending 8 Hz deadline
    assert pair.pub.service() == pytest.approx(0.25)  # a tick; the next at the new 4 Hz
    pair.clock.t += 1.25  # the watchdog trips: hold, clamped to the new upper limit
    pair.pub.service()
    _, trigger, chunk_id, first = pair.rec.messages[-1]
    assert (trigger, chunk_id) == (TRIGGER_TICK, HOLD_CHUNK_ID)
    assert first == pytest.approx((0.25, -0.2))


def test_gate_messages_engage_and_release_stop_reasons_in_the_child(pair) -> None:
    pair.link.set_stop("inactive", True)
    pair.link.set_stop("canceled", True)
    pair.link.set_stop("inactive", False)
    assert pair.applied()["stopped_by"] == "canceled" and pair.pub.stops == {"canceled"}
    pair.link.set_stop("canceled", False)
    assert pair.applied()["stopped_by"] == ""


def test_child_reports_reach_the_parents_callbacks(pair) -> None:
    bad = rows()
    bad[3, 0] = np.nan
    pair.link.hand_off(bad, pair.clock.node(), 0.0)
    pair.applied()
    pair.pub.service()
    assert pair.rec.wait_events(1) == [("reject", "chunk_non_finite")]
    pair.link.hand_off(rows(), pair.clock.node(), 0.0)  # positive control: published, fed
    pair.applied()
    pair.pub.service()
    pair.clock.t += 1.25
    pair.pub.service()
    assert pair.rec.wait_events(2)[1] == ("watchdog", "tripped")
    assert [m[1] for m in pair.rec.messages] == [TRIGGER_NEW_CHUNK]
    pair.send(("ready", "Operation not permitted"))
    assert pair.rec.wait_events(3)[2] == ("ready", "Operation not permitted")
    assert pair.link.ready.is_set()


@pytest.mark.parametrize("end", ["stop", "parent_closed"])
def test_stop_or_the_parents_end_stops_the_publisher(pair, end: str) -> None:
    pair.applied()
    if end == "stop":
        pair.link.stop()
    else:
        pair.link.close()  # what the kernel does when the parent dies, also by kill -9
    pair.server.join(TIMEOUT_S)
    assert not pair.server.is_alive()
    runner = threading.Thread(target=pair.pub.run, daemon=True)
    runner.start()  # a stopped publisher's loop returns at once
    runner.join(TIMEOUT_S)
    assert not runner.is_alive()


def test_parent_notices_the_child_is_gone_and_never_raises(pair) -> None:
    pair.child_dies()
    assert pair.link.closed.wait(TIMEOUT_S)
    assert pair.link.diagnostics(timeout_s=TIMEOUT_S) is None  # at once, not after the timeout
    pair.link.hand_off(rows(), 0.0, 0.0)  # the engine thread never sees an error
    pair.link.stop()


def test_unanswered_diagnostics_time_out() -> None:
    parent_end, child_end = socket.socketpair()
    link = ActionLink(
        parent_end,
        on_reject=lambda reason, message: None,
        on_watchdog=lambda transition: None,
    )
    try:
        assert link.diagnostics(timeout_s=0.05) is None  # nobody reads the child's end
        assert not link.closed.is_set()
    finally:
        link.close()
        child_end.close()


# ----------------------------------------------------------------- the child's messages
class FakePub:
    def __init__(self) -> None:
        self.messages: list = []

    def publish(self, msg) -> None:
        self.messages.append(msg)


def test_one_trajectory_per_group_per_chunk_and_a_refused_one_is_reported() -> None:
    joints = ("a", "b", "c")
    groups = parse_groups(joints, {"ca": ("ca/jt", ["c", "a"]), "b": ("b/jt", ["b"])})
    bad = TrajectoryGroup("bad", "bad/jt", ("a", "a"), (0, 0))  # bypasses parse_groups
    pubs = {name: FakePub() for name in ("actions", "ca", "b", "bad")}
    invalid: list[tuple[str, str]] = []
    messages = ActionMessages(
        pubs["actions"],
        joints,
        "base",
        [(g, pubs[g.name]) for g in (*groups, bad)],
        on_invalid=lambda reason, message: invalid.append((reason, message)),
    )
    values = np.arange(12, dtype=np.float32).reshape(4, 3)
    chunk = TimedChunk(0, 10.0, DT, values, 9.9, 0.1)
    messages(Slice(chunk, 1, 10.0 + DT, values[1:]), 0, TRIGGER_NEW_CHUNK)
    messages(Slice(chunk, 2, 10.0 + 2 * DT, values[2:]), 1, TRIGGER_TICK)  # same chunk
    assert len(pubs["actions"].messages) == 2
    (ca,) = pubs["ca"].messages
    (b,) = pubs["b"].messages
    assert ca.joint_names == ["c", "a"] and b.joint_names == ["b"]
    assert [list(p.positions) for p in ca.points] == [[5.0, 3.0], [8.0, 6.0], [11.0, 9.0]]
    assert [list(p.positions) for p in b.points] == [[4.0], [7.0], [10.0]]
    assert time_to_seconds(ca.header.stamp) == pytest.approx(10.0 + DT)
    assert pubs["bad"].messages == []
    assert [reason for reason, _ in invalid] == ["trajectory_invalid.bad"]
    assert "bad/jt" in invalid[0][1] and "repeat a joint" in invalid[0][1]
    messages(Slice(chunk, 1, 10.0 + DT, values[1:]), 2, TRIGGER_NEW_CHUNK)
    assert len(pubs["ca"].messages) == 1  # chunk 0 again: no second trajectory
    messages(Slice(dataclasses.replace(chunk, chunk_id=1), 0, 10.0, values), 3, TRIGGER_NEW_CHUNK)
    assert len(pubs["ca"].messages) == 2 and len(pubs["ca"].messages[1].points) == 4
