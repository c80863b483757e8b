"""`recording.schedule.ReplaySchedule`: original timing relative to the first message, divided
by the rate; never early, late sends measured."""

from __future__ import annotations

import pytest

from oxygen_ros.recording.schedule import ReplaySchedule

S = 1_000_000_000


def test_due_times_keep_the_recorded_spacing_divided_by_the_rate() -> None:
    schedule = ReplaySchedule(first_ns=5 * S, start_s=100.0, rate=2.0)
    assert schedule.due_s(5 * S) == 100.0
    assert schedule.due_s(6 * S) == pytest.approx(100.5)
    assert schedule.due_s(9 * S + S // 2) == pytest.approx(102.25)
    assert ReplaySchedule(first_ns=0, start_s=1.0, rate=0.5).due_s(S) == pytest.approx(3.0)


def test_wait_is_zero_once_due_and_lateness_is_recorded() -> None:
    schedule = ReplaySchedule(first_ns=0, start_s=10.0)
    assert schedule.wait_s(2 * S, now_s=10.5) == pytest.approx(1.5)
    assert schedule.wait_s(2 * S, now_s=12.0) == 0.0
    assert schedule.wait_s(2 * S, now_s=13.0) == 0.0  # late: at once, never skipped
    schedule.record_send(0, 10.0)
    schedule.record_send(2 * S, 12.3)
    assert schedule.num_sent == 2
    assert schedule.max_late_s == pytest.approx(0.3)
    assert schedule.mean_late_s == pytest.approx(0.15)


def test_bag_time_advances_at_the_rate() -> None:
    schedule = ReplaySchedule(first_ns=7 * S, start_s=50.0, rate=0.5)
    assert schedule.bag_time_ns(49.0) == 7 * S  # never before the first message
    assert schedule.bag_time_ns(52.0) == 8 * S


@pytest.mark.parametrize("rate", [0.0, -1.0, float("nan"), float("inf")])
def test_bad_rate_is_refused(rate) -> None:
    with pytest.raises(ValueError):
        ReplaySchedule(first_ns=0, start_s=0.0, rate=rate)
