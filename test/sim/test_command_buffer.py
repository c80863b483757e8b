"""Timed commands -> per-tick position targets: exact rows, interpolation, hold, expiry,
per-joint replacement, rejection reasons and starvation counting."""

import math
from collections import Counter

import numpy as np
import pytest

from oxygen_ros.sim.command_buffer import (
    CommandBuffer,
    CommandBufferConfig,
    RejectedCommandError,
    TimedTargets,
    from_chunk,
    from_trajectory,
)

DT = 0.25  # binary-exact row spacing, so interpolated values are exact


def make_buffer(
    num_joints: int = 2, max_age_s: float = 10.0, interpolate: bool = True, initial=None
) -> CommandBuffer:
    initial = np.zeros(num_joints) if initial is None else np.asarray(initial, dtype=float)
    return CommandBuffer(CommandBufferConfig(num_joints, max_age_s, interpolate), initial)


def assert_target(buf: CommandBuffer, now: float, values: list[float], status: str) -> None:
    q, got = buf.target(now)
    assert got == status
    np.testing.assert_array_equal(q, values)


def ramp(n_rows: int, n_joints: int = 2, offset: float = 0.0) -> np.ndarray:
    """Row k holds k + offset in column 0 and 10 * k + offset in column 1 (and on)."""
    k = np.arange(n_rows, dtype=float)[:, None]
    return k * np.array([1.0] + [10.0] * (n_joints - 1)) + offset


def test_rows_are_executed_exactly_at_their_stamps() -> None:
    buf = make_buffer()
    rows = np.random.default_rng(0).normal(size=(12, 2))
    chunk = buf.submit_chunk(3.7, 0.1, rows, (0, 1), math.inf, now=3.7)
    for k in range(12):
        q, status = buf.target(3.7 + k * 0.1)
        assert status == "active"
        np.testing.assert_array_equal(q, rows[k])
    assert chunk.source == "chunk" and chunk.command_id == 0
    assert buf.counters.commands_accepted == 1 and buf.counters.ticks_active == 12


def test_linear_interpolation_between_rows_and_zero_order_hold_without() -> None:
    buf = make_buffer()
    buf.submit_chunk(1.0, DT, ramp(4), (0, 1), math.inf, now=1.0)
    np.testing.assert_array_equal(buf.target(1.125)[0], [0.5, 5.0])
    np.testing.assert_array_equal(buf.target(1.375)[0], [1.5, 15.0])
    np.testing.assert_array_equal(buf.target(1.5)[0], [2.0, 20.0])
    step = make_buffer(interpolate=False)
    step.submit_chunk(1.0, DT, ramp(4), (0, 1), math.inf, now=1.0)
    np.testing.assert_array_equal(step.target(1.125)[0], [0.0, 0.0])
    np.testing.assert_array_equal(step.target(1.499)[0], [1.0, 10.0])
    np.testing.assert_array_equal(step.target(1.5)[0], [2.0, 20.0])


def test_first_row_in_the_past_starts_mid_chunk() -> None:
    buf = make_buffer()
    buf.submit_chunk(0.0, DT, ramp(8), (0, 1), math.inf, now=0.625)
    assert_target(buf, 0.625, [2.5, 25.0], "active")


def test_hold_last_row_after_the_end() -> None:
    buf = make_buffer()
    buf.submit_chunk(0.0, DT, ramp(4), (0, 1), math.inf, now=0.0)
    assert buf.target(0.75)[1] == "active"
    for now in (0.76, 5.0, 9.0):
        q, status = buf.target(now)
        assert status == "hold_exhausted"
        np.testing.assert_array_equal(q, [3.0, 30.0])
    c = buf.counters
    assert (c.ticks_active, c.ticks_hold_exhausted, c.starvation_events) == (1, 3, 1)


def test_expiry_by_max_age_holds_the_value_at_the_deadline() -> None:
    buf = make_buffer(max_age_s=0.625)  # rows run to 1.75 s, the deadline is 0.625 s
    buf.submit_chunk(0.0, DT, ramp(8), (0, 1), math.inf, now=0.0)
    assert_target(buf, 0.5, [2.0, 20.0], "active")
    for now in (0.7, 1.0, 3.0):
        q, status = buf.target(now)
        assert status == "hold_expired"
        np.testing.assert_array_equal(q, [2.5, 25.0])  # not row 0, not the initial zeros
    assert buf.counters.ticks_hold_expired == 3 and buf.counters.starvation_events == 1


def test_expiry_by_valid_until_and_exhaustion_when_rows_end_first() -> None:
    buf = make_buffer(max_age_s=10.0)
    buf.submit_chunk(0.0, DT, ramp(8), (0, 1), valid_until=1.125, now=0.0)
    assert_target(buf, 1.2, [4.5, 45.0], "hold_expired")
    ends_first = make_buffer(max_age_s=10.0)
    ends_first.submit_chunk(0.0, DT, ramp(4), (0, 1), valid_until=2.0, now=0.0)
    assert_target(ends_first, 3.0, [3.0, 30.0], "hold_exhausted")


def test_future_chunk_keeps_the_previous_command_until_its_first_row() -> None:
    buf = make_buffer()
    buf.submit_chunk(0.0, DT, ramp(8), (0, 1), math.inf, now=0.0)
    buf.submit_chunk(1.0, DT, ramp(4, offset=100.0), (0, 1), math.inf, now=0.5)
    assert_target(buf, 0.75, [3.0, 30.0], "active")
    assert_target(buf, 0.875, [3.5, 35.0], "active")
    assert_target(buf, 1.0, [100.0, 100.0], "active")
    assert_target(buf, 1.25, [101.0, 110.0], "active")


def test_future_chunk_without_previous_command_holds_initial_positions() -> None:
    buf = make_buffer(initial=[7.0, -7.0])
    buf.submit_chunk(2.0, DT, ramp(4), (0, 1), math.inf, now=1.0)
    assert_target(buf, 1.5, [7.0, -7.0], "hold_none")
    assert_target(buf, 2.0, [0.0, 0.0], "active")


def test_newer_command_drops_an_older_one_that_had_not_started_yet() -> None:
    buf = make_buffer()
    buf.submit_chunk(2.0, DT, ramp(4, offset=50.0), (0, 1), math.inf, now=0.0)
    buf.submit_chunk(1.0, DT, ramp(20, offset=100.0), (0, 1), math.inf, now=0.5)
    assert_target(buf, 2.0, [104.0, 140.0], "active")


def test_trajectory_on_a_subset_leaves_other_joints_on_their_commands() -> None:
    buf = make_buffer(num_joints=3)
    buf.submit_chunk(0.0, DT, ramp(8, n_joints=3), (0, 1, 2), math.inf, now=0.0)
    traj = buf.submit_trajectory(0.5, [0.0, 0.5], [[-1.0], [-3.0]], (1,), math.inf, now=0.5)
    assert traj.source == "trajectory" and traj.joint_indices == (1,)
    assert_target(buf, 0.25, [1.0, 10.0, 10.0], "active")
    assert_target(buf, 0.75, [3.0, -2.0, 30.0], "active")
    # The trajectory ran out on joint 1, the chunk is still live on joints 0 and 2.
    assert_target(buf, 1.5, [6.0, -3.0, 60.0], "active")
    assert_target(buf, 2.0, [7.0, -3.0, 70.0], "hold_exhausted")


def test_trajectory_times_are_relative_to_start() -> None:
    t = from_trajectory(10.0, [0.5, 1.0], [[1.0], [2.0]], (0,), valid_until=12.0, command_id=4)
    np.testing.assert_array_equal(t.times, [10.5, 11.0])
    assert (t.valid_until, t.command_id) == (12.0, 4)
    assert not t.rows.flags.writeable and not t.times.flags.writeable


def test_reset_forgets_commands_and_holds_the_given_positions() -> None:
    buf = make_buffer()
    buf.submit_chunk(0.0, DT, ramp(8), (0, 1), math.inf, now=0.0)
    buf.submit_chunk(1.0, DT, ramp(8, offset=5.0), (0, 1), math.inf, now=0.0)
    buf.target(0.5)
    buf.reset([9.0, 8.0])
    for now in (0.5, 1.5):
        assert_target(buf, now, [9.0, 8.0], "hold_none")
    np.testing.assert_array_equal(buf.last_target, [9.0, 8.0])
    assert buf.counters.starvation_events == 0
    with pytest.raises(ValueError):
        buf.reset([1.0, math.nan])


@pytest.mark.parametrize(
    ("kind", "args", "reason"),
    [
        ("chunk", (0.0, DT, [[0.0, math.nan]], (0, 1), math.inf), "non_finite"),
        ("chunk", (0.0, DT, [[0.0, 1.0]], (0, 1), math.nan), "non_finite"),
        ("chunk", (0.0, DT, [[0.0, 1.0, 2.0]], (0, 1), math.inf), "bad_shape"),
        ("chunk", (0.0, DT, np.zeros((0, 2)), (0, 1), math.inf), "bad_shape"),
        ("chunk", (0.0, DT, [[0.0], [1.0, 2.0]], (0, 1), math.inf), "bad_shape"),
        ("chunk", (0.0, 0.0, ramp(3), (0, 1), math.inf), "times_not_increasing"),
        ("trajectory", (0.0, [0.0, 0.5, 0.5], ramp(3), (0, 1), math.inf), "times_not_increasing"),
        ("trajectory", (0.0, [0.0, 0.5], ramp(3), (0, 1), math.inf), "bad_shape"),
        ("trajectory", (0.0, [0.0], [[1.0]], (5,), math.inf), "bad_joint"),
        ("trajectory", (0.0, [0.0], [[1.0]], (-1,), math.inf), "bad_joint"),
        ("trajectory", (0.0, [0.0], [[1.0, 2.0]], (1, 1), math.inf), "bad_joint"),
        ("chunk", (-20.0, DT, ramp(3), (0, 1), math.inf), "stale"),  # deadline -10 < now 0
        ("chunk", (0.0, DT, ramp(3), (0, 1), -1.0), "stale"),  # valid_until before row 0
    ],
)
def test_rejections_are_counted_by_reason_and_change_nothing(kind, args, reason) -> None:
    buf = make_buffer()
    buf.submit_chunk(0.0, DT, ramp(8, offset=1.0), (0, 1), math.inf, now=0.0)
    submit = buf.submit_chunk if kind == "chunk" else buf.submit_trajectory
    with pytest.raises(RejectedCommandError) as err:
        submit(*args, now=0.0)
    assert err.value.reason == reason
    assert buf.counters.commands_rejected == Counter({reason: 1})
    assert buf.counters.commands_accepted == 1
    assert_target(buf, 0.5, [3.0, 21.0], "active")
    # The next accepted command gets the next id: rejected ones do not use one up.
    assert buf.submit_chunk(0.5, DT, ramp(2), (0, 1), math.inf, now=0.5).command_id == 1


def test_builders_reject_without_a_buffer() -> None:
    with pytest.raises(RejectedCommandError, match="NaN") as err:
        from_chunk(0.0, DT, [[math.inf]], (0,))
    assert err.value.reason == "non_finite" and isinstance(err.value, ValueError)
    with pytest.raises(RejectedCommandError) as err:
        TimedTargets(np.array([0.0]), np.array([[1.0]]), ("a",), math.inf, "chunk", 0)
    assert err.value.reason == "bad_joint"


def test_overlapping_chunks_never_starve() -> None:
    buf = make_buffer()
    ticks = np.arange(0, 400) * 0.02  # 50 Hz for 8 s
    for i, now in enumerate(ticks):
        if i % 25 == 0:  # a 2 s chunk every 0.5 s, first row 0.1 s in the past
            buf.submit_chunk(now - 0.1, DT, ramp(9, offset=i), (0, 1), math.inf, now=now)
        assert buf.target(now)[1] == "active"
    assert buf.counters.starvation_events == 0
    assert buf.counters.ticks_active == 400


def test_each_gap_between_chunks_is_one_starvation_event() -> None:
    buf = make_buffer(max_age_s=1.0)
    statuses = []
    for i, now in enumerate(np.arange(0, 300) * 0.02):  # 6 s
        if i % 100 == 0:  # a 0.5 s chunk every 2 s: 3 gaps
            buf.submit_chunk(now, DT, ramp(3), (0, 1), math.inf, now=now)
        statuses.append(buf.target(now)[1])
    c = buf.counters
    assert c.starvation_events == 3
    assert statuses.count("active") == c.ticks_active == 3 * 26  # rows at 0, 0.02 .. 0.5
    assert c.ticks_hold_exhausted == 300 - 3 * 26 and c.ticks_hold_none == 0


def test_no_command_is_hold_none() -> None:
    buf = make_buffer(initial=[1.0, 2.0])
    assert_target(buf, 0.0, [1.0, 2.0], "hold_none")
    assert buf.counters.ticks_hold_none == 1 and buf.counters.starvation_events == 0
