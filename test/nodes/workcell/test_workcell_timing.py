"""Pacing of the workcell simulation loop and the episode bookkeeping, with fake clocks."""

import pytest
from fake_clock import FakeClock

from oxygen_ros.nodes.workcell.workcell_episode import EpisodeTracker
from oxygen_ros.nodes.workcell.workcell_timing import Every, Pacer, RateMeter
from oxygen_ros.sim import tasks


def test_pacer_sleeps_to_absolute_deadlines_scaled_by_the_factor() -> None:
    clock = FakeClock(100.0)
    pacer = Pacer(0.5, clock=clock)
    assert pacer.wait_s(0.0) == (0.0, 0.0)  # anchors sim 0 at wall 100
    clock.t = 100.005
    sleep, late = pacer.wait_s(0.01)  # due at 100.02 (0.01 sim s at half speed)
    assert sleep == pytest.approx(0.015) and late == 0.0


def test_pacer_catches_up_after_a_slow_tick_without_drift() -> None:
    clock = FakeClock(100.0)
    pacer = Pacer(1.0, clock=clock)
    pacer.wait_s(0.0)
    clock.t = 100.05  # a 50 ms render in the tick that reached sim 0.01
    assert pacer.wait_s(0.01) == (0.0, pytest.approx(0.04))
    for k in range(2, 5):  # the next ticks run at once (no sleep) until caught up
        clock.t += 0.001
        assert pacer.wait_s(0.01 * k)[0] == 0.0
    clock.t = 100.053
    assert pacer.wait_s(0.06)[0] == pytest.approx(0.007)  # back on the original schedule
    assert pacer.resyncs == 0


def test_pacer_drops_a_backlog_beyond_max_lag() -> None:
    clock = FakeClock(100.0)
    pacer = Pacer(1.0, max_lag_s=0.25, clock=clock)
    pacer.wait_s(0.0)
    clock.t = 101.0  # a second behind
    assert pacer.wait_s(0.01)[0] == 0.0 and pacer.resyncs == 1
    assert pacer.wait_s(0.02)[0] == pytest.approx(0.01)  # re-anchored at now


def test_pacer_factor_change_reanchors() -> None:
    clock = FakeClock(100.0)
    pacer = Pacer(1.0, clock=clock)
    pacer.wait_s(0.0)
    clock.t = 100.5
    pacer.set_factor(0.25, sim_now=0.5)
    assert pacer.wait_s(0.51)[0] == pytest.approx(0.04)


def test_rate_meter_reports_sim_seconds_per_wall_second() -> None:
    clock = FakeClock(100.0)
    meter = RateMeter(window_s=1.0, clock=clock)
    assert meter.factor() == 0.0
    for k in range(300):
        clock.t = 100.0 + 0.01 * k
        meter.add(0.003 * k)
    assert meter.factor() == pytest.approx(0.3)
    clock.t += 5.0  # no samples for longer than the window: stale
    assert meter.factor() == 0.0


def test_every_fires_once_per_period_of_sim_time() -> None:
    every = Every(10.0)
    fired = [k for k in range(1, 51) if every.due(k * 0.01)]  # 100 Hz ticks, 0.5 s
    assert fired == [1, 11, 21, 31, 41]
    every.set_rate(50.0)
    assert [k for k in range(51, 61) if every.due(k * 0.01)] == [51, 53, 55, 57, 59]
    late = Every(100.0)
    assert late.due(0.0) and late.due(0.5) and not late.due(0.505)  # no burst after a gap


def evaluation(success: bool, stage: str = "reach the red cube") -> tasks.Evaluation:
    return tasks.Evaluation(
        success=success, stage=stage, held=success, lift_m=0.0, pinch_distance_m=0.1
    )


def test_episode_succeeds_after_the_dwell_and_only_once() -> None:
    tracker = EpisodeTracker()
    assert tracker.phase == "idle" and not tracker.update(1.0, evaluation(True))
    assert tracker.start(tasks.sample_episode(1), now=2.0, time_limit_s=5.0) == 1
    assert not tracker.update(2.5, evaluation(True, "hold"))  # dwell starts
    assert tracker.phase == "running" and tracker.stage == "hold"
    assert tracker.update(2.5 + tasks.SUCCESS_DWELL_S, evaluation(True))
    assert tracker.phase == "succeeded" and tracker.success
    assert tracker.time_to_success_s == pytest.approx(0.5)  # from the start of the dwell
    assert not tracker.update(9.0, evaluation(False))  # leaves running at most once
    assert tracker.phase == "succeeded" and tracker.success


def test_episode_fails_at_the_time_limit_and_counts_starvation_while_running() -> None:
    tracker = EpisodeTracker()
    tracker.add_starvation(3)  # idle: not counted
    tracker.start(tasks.sample_episode(2), now=10.0, time_limit_s=1.0)
    tracker.add_starvation(1)
    assert not tracker.update(10.99, evaluation(False))
    assert tracker.update(11.0, evaluation(False)) and tracker.phase == "failed"
    tracker.add_starvation(1)
    assert not tracker.update(11.5, evaluation(True))  # too late to count
    assert not tracker.success and tracker.time_to_success_s < 0
    assert tracker.starvation_events == 1
    assert tracker.elapsed(12.0) == pytest.approx(1.0)  # frozen at the end (11.0)
    assert tracker.start(tasks.sample_episode(3), now=12.0, time_limit_s=1.0) == 2
    assert tracker.phase == "running" and tracker.starvation_events == 0
