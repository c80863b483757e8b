"""Chunk re-basing to the publish time, blending, staleness and safety limits."""

import numpy as np
import pytest

from oxygen_ros.engine.action_stream import (
    HOLD_CHUNK_ID,
    ActionStream,
    RejectedChunkError,
    StreamConfig,
    TimedChunk,
)

DT = 0.1


def ramp(n_rows: int = 10, n_joints: int = 2, offset: float = 0.0) -> np.ndarray:
    """Row k holds k + offset in every column."""
    return np.repeat(np.arange(n_rows, dtype=np.float32)[:, None] + offset, n_joints, axis=1)


def stream(**overrides) -> ActionStream:
    cfg = dict(dt=DT, num_joints=2, blend_mode="replace", blend_steps=0, max_chunk_age_s=2.0)
    cfg.update(overrides)
    return ActionStream(StreamConfig(**cfg))


def test_rows_start_at_observation_and_past_rows_are_dropped() -> None:
    s = stream()
    chunk = s.offer(ramp(), observation_stamp=10.0, latency_s=0.25, now=10.25)
    assert chunk.start == 10.0 and chunk.latency_s == 0.25
    piece = s.slice(now=10.25)
    # Rows 0..2 (10.0, 10.1, 10.2) have passed; row 3 at 10.3 is the first from now on.
    assert piece.first_row == 3 and piece.stamp == pytest.approx(10.3)
    np.testing.assert_array_equal(piece.rows, ramp()[3:])


def test_row_exactly_at_now_is_kept() -> None:
    s = stream()
    s.offer(ramp(), 10.0, 0.0, now=10.0)
    piece = s.slice(now=10.2)
    assert piece.first_row == 2 and piece.stamp == pytest.approx(10.2)


def test_first_row_never_before_publish_time_over_many_publishes() -> None:
    s = stream()
    s.offer(ramp(), 10.0, 0.0, now=10.0)
    for now in np.arange(10.0, 10.9, 1 / 70):
        piece = s.slice(now)
        assert piece.stamp >= now - 1e-9
        assert piece.stamp - now < DT
        assert len(piece.rows) == 10 - piece.first_row


def test_time_offset_shifts_rows() -> None:
    s = stream(time_offset_s=0.05)
    chunk = s.offer(ramp(), 10.0, 0.0, now=10.0)
    assert chunk.start == pytest.approx(10.05)


def test_nothing_published_when_exhausted_or_stale() -> None:
    s = stream(max_chunk_age_s=0.5)
    assert s.slice(now=0.0) is None and s.empty_reason(0.0) == "no_chunk"
    s.offer(ramp(3), 10.0, 0.0, now=10.0)
    assert s.slice(now=10.2) is not None and s.empty_reason(10.2) == ""
    assert s.slice(now=10.21) is None  # every row passed
    assert s.empty_reason(10.21) == "exhausted"
    s.offer(ramp(10), 10.1, 0.0, now=10.3)
    assert s.slice(now=10.59) is not None
    assert s.slice(now=10.61) is None  # observation older than max_chunk_age_s
    assert s.empty_reason(10.61) == "stale"


def test_stale_chunk_refused_and_counted() -> None:
    s = stream(max_chunk_age_s=0.5)
    with pytest.raises(RejectedChunkError) as info:
        s.offer(ramp(), 10.0, 0.6, now=10.6)
    assert info.value.reason == "stale" and s.counters.chunks_stale == 1


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_chunk_discarded_previous_kept(bad: float) -> None:
    s = stream()
    good = s.offer(ramp(), 10.0, 0.0, now=10.0)
    rows = ramp(offset=5)
    rows[4, 1] = bad
    with pytest.raises(RejectedChunkError) as info:
        s.offer(rows, 10.1, 0.0, now=10.1)
    assert info.value.reason == "non_finite"
    assert s.current is good and s.counters.chunks_non_finite == 1


def test_wrong_width_refused() -> None:
    s = stream()
    with pytest.raises(RejectedChunkError) as info:
        s.offer(np.zeros((10, 3)), 10.0, 0.0, now=10.0)
    assert info.value.reason == "bad_shape"


def test_replace_switches_at_once() -> None:
    s = stream()
    s.offer(ramp(), 10.0, 0.0, now=10.0)
    s.offer(ramp(offset=100), 10.2, 0.0, now=10.2)
    piece = s.slice(now=10.2)
    np.testing.assert_array_equal(piece.rows[:, 0], np.arange(10) + 100.0)


def test_blend_hands_over_linearly_from_now_on() -> None:
    s = stream(blend_mode="blend", blend_steps=3)
    s.offer(np.zeros((10, 2), np.float32), 10.0, 0.0, now=10.0)
    # New chunk of ones from an observation at 10.2, ready at 10.45: rows 0..2 passed.
    chunk = s.offer(np.ones((10, 2), np.float32), 10.2, 0.25, now=10.45)
    col = chunk.rows[:, 0]
    np.testing.assert_allclose(col[3:6], [0.25, 0.5, 0.75])
    np.testing.assert_allclose(col[6:], 1.0)
    np.testing.assert_allclose(col[:3], 1.0)  # passed rows untouched (never published)


def test_blend_samples_previous_chunk_at_new_row_times() -> None:
    s = stream(blend_mode="blend", blend_steps=1)
    s.offer(ramp(), 10.0, 0.0, now=10.0)  # value at time t is (t - 10) / 0.1
    chunk = s.offer(np.zeros((10, 2), np.float32), 10.05, 0.0, now=10.05)
    # Row 0 at 10.05: old value 0.5 interpolated, weight of the new chunk 1/2.
    assert chunk.rows[0, 0] == pytest.approx(0.25)
    assert chunk.rows[1, 0] == pytest.approx(0.0)


def test_blend_ignores_rows_beyond_previous_chunk_end() -> None:
    s = stream(blend_mode="blend", blend_steps=5)
    s.offer(np.zeros((2, 2), np.float32), 10.0, 0.0, now=10.0)  # ends at 10.1
    chunk = s.offer(np.ones((10, 2), np.float32), 10.05, 0.0, now=10.05)
    assert chunk.rows[0, 0] == pytest.approx(1 / 6)  # 10.05 inside the old chunk
    np.testing.assert_allclose(chunk.rows[1:, 0], 1.0)  # 10.15... after its end


def test_position_limits_clamp_and_count() -> None:
    s = stream(position_lower=(-1.0, 0.0), position_upper=(1.0, 5.0))
    chunk = s.offer(ramp(offset=-2), 10.0, 0.0, now=10.0)
    assert chunk.rows[:, 0].min() == -1.0 and chunk.rows[:, 0].max() == 1.0
    assert chunk.rows[:, 1].min() == 0.0 and chunk.rows[:, 1].max() == 5.0
    assert s.counters.chunks_position_clamped == 1


def test_velocity_limits_between_rows_and_from_previous_chunk() -> None:
    s = stream(max_velocity=(1.0, 100.0))  # joint 0: at most 0.1 per row
    s.offer(np.zeros((10, 2), np.float32), 10.0, 0.0, now=10.0)
    chunk = s.offer(np.full((10, 2), 5.0, np.float32), 10.0, 0.0, now=10.0)
    np.testing.assert_allclose(chunk.rows[:, 0], 0.1 * np.arange(1, 11), rtol=1e-6)
    np.testing.assert_allclose(chunk.rows[:, 1], 5.0)
    assert s.counters.chunks_velocity_clamped == 1


def test_chunk_ids_increase_and_rows_read_only() -> None:
    s = stream()
    a = s.offer(ramp(), 10.0, 0.0, now=10.0)
    b = s.offer(ramp(), 10.1, 0.0, now=10.1)
    assert (a.chunk_id, b.chunk_id) == (0, 1)
    with pytest.raises(ValueError):
        b.rows[0, 0] = 3.0


def test_sample_interpolates_and_holds_ends() -> None:
    c = TimedChunk(0, 1.0, 0.5, ramp(3), 1.0, 0.0)
    assert c.sample(0.0)[0] == 0.0
    assert c.sample(1.25)[0] == pytest.approx(0.5)
    assert c.sample(9.0)[0] == 2.0
    assert c.end == 2.0


def test_first_chunk_velocity_limited_from_the_measured_joint_state() -> None:
    """No live previous chunk (the first, or the first after a gap): the first published row
    moves at most max_velocity * dt from the measured pose. Control: without the measured pose
    the same chunk starts wherever the model put it."""
    s = stream(max_velocity=(1.0, 1.0))
    measured = np.array([0.0, 5.0])
    chunk = s.offer(ramp(offset=3.0), 10.0, 0.0, now=10.0, measured=measured)
    steps = np.diff(np.vstack([measured, chunk.rows]), axis=0)
    assert np.all(np.abs(steps) <= 1.0 * DT + 1e-6)
    np.testing.assert_allclose(chunk.rows[0], [0.1, 4.9], atol=1e-6)
    assert s.counters.chunks_velocity_clamped == 1
    later = s.offer(ramp(offset=3.0), 20.0, 0.0, now=20.0)  # the first expired: a gap
    np.testing.assert_array_equal(later.rows[0], [3.0, 3.0])  # control: no measured pose


def test_measured_pose_ignored_while_a_previous_chunk_is_live() -> None:
    s = stream(max_velocity=(1.0, 1.0))
    s.offer(np.zeros((10, 2), np.float32), 10.0, 0.0, now=10.0)
    chunk = s.offer(np.ones((10, 2), np.float32), 10.2, 0.0, now=10.2, measured=np.full(2, 9.0))
    # Limited from the live chunk's row before (0.0), not from the measured 9.0.
    np.testing.assert_allclose(chunk.rows[0], [0.1, 0.1], atol=1e-6)


def test_a_new_tasks_chunk_starts_from_the_measured_pose_not_the_live_chunk() -> None:
    """After a new instruction (or an episode reset: the robot back at its rest pose) the live
    chunk is the previous task's plan: the new task's first chunk neither blends with it nor
    starts its velocity limits from it. Control: the same offer within the task is pulled
    towards the live chunk (blend and limits), which is what drove the arms back towards the
    last episode's pose after a reset."""

    def offer_after_live(task: int) -> tuple[np.ndarray, ActionStream]:
        s = stream(blend_mode="blend", blend_steps=3, max_velocity=(1.0, 1.0))
        s.offer(np.full((10, 2), 2.0, np.float32), 10.0, 0.0, now=10.0, task=1)  # last pose
        rest = np.zeros(2)  # measured: the robot was put back at rest
        chunk = s.offer(np.zeros((10, 2), np.float32), 10.2, 0.0, now=10.2, measured=rest,
                        task=task)  # fmt: skip
        return chunk.rows, s

    same, s_same = offer_after_live(task=1)
    assert same[0, 0] > 1.5  # blended with and limited from the live chunk (at 2.0)
    assert s_same.counters.chunks_new_task == 0
    new, s_new = offer_after_live(task=2)
    np.testing.assert_array_equal(new, 0.0)  # its own rows, from the measured rest pose
    assert s_new.counters.chunks_new_task == 1 and s_new.current.task == 2
    # A hold continues the task it holds: the next chunk of that task starts from the hold.
    s_new.offer_hold(np.array([0.5, 0.5]), now=10.3, horizon=4)
    assert s_new.current.task == 2
    nxt = s_new.offer(np.zeros((10, 2), np.float32), 10.4, 0.0, now=10.4, task=2)
    np.testing.assert_allclose(nxt.rows[0], [0.4, 0.4], atol=1e-6)


def test_hold_is_a_clamped_chunk_of_the_measured_pose_and_the_next_chunk_starts_from_it() -> None:
    s = stream(position_lower=(-1.0, -1.0), position_upper=(1.0, 1.0), max_velocity=(1.0, 1.0))
    hold = s.offer_hold(np.array([2.0, 0.25]), now=3.0, horizon=4)
    assert hold.chunk_id == HOLD_CHUNK_ID and s.current is hold
    assert hold.rows.shape == (4, 2) and np.all(hold.rows == np.array([1.0, 0.25], np.float32))
    assert hold.start == 3.0 and hold.observation_stamp == 3.0
    assert s.counters.chunks_position_clamped == 1 and s.counters.chunks_accepted == 0
    piece = s.slice(3.05)
    assert piece.valid_until == pytest.approx(3.0 + 2.0)  # its stamp + max_chunk_age_s
    nxt = s.offer(np.full((10, 2), -1.0, np.float32), 3.1, 0.0, now=3.1)
    np.testing.assert_allclose(nxt.rows[0], [0.9, 0.15], atol=1e-6)  # from the hold
    assert nxt.chunk_id == 0  # model chunks keep their own numbering


def test_slice_valid_until_is_the_chunk_age_limit() -> None:
    s = stream(max_chunk_age_s=0.5)
    s.offer(ramp(), 10.0, 0.1, now=10.1)
    assert s.slice(10.2).valid_until == pytest.approx(10.5)
    assert s.slice(10.51) is None  # the stream's own rule at the same time


@pytest.mark.parametrize(
    "overrides",
    [
        dict(dt=0.0),
        dict(blend_mode="cubic"),
        dict(blend_steps=-1),
        dict(max_chunk_age_s=0.0),
        dict(position_lower=(1.0,)),
        dict(max_velocity=(0.0, 1.0)),
        dict(position_lower=(1.0, 1.0), position_upper=(0.0, 2.0)),
    ],
)
def test_invalid_config_rejected(overrides) -> None:
    with pytest.raises(ValueError):
        stream(**overrides)


def reference_velocity_clamp(rows, first, before, step) -> tuple[np.ndarray, bool]:
    """The row-by-row velocity limit as specified: each row from `first` on limited against
    the previous limited row (`before` for the first; none when it is None)."""
    rows = rows.copy()
    changed, prev = False, before
    for k in range(first, len(rows)):
        if prev is not None:
            limited = np.clip(rows[k], prev - step, prev + step)
            if np.any(limited != rows[k]):
                changed, rows[k] = True, limited
        prev = rows[k]
    return rows, changed


@pytest.mark.parametrize("seed", range(40))
def test_velocity_limits_equal_the_row_by_row_pass(seed: int) -> None:
    """The vectorised search for the first violating step changes nothing: the clamped rows
    and the counter equal the plain row-by-row pass exactly, with violations anywhere (or
    none, or only at the first row against the previous chunk / measured pose)."""
    rng = np.random.default_rng(seed)
    n_rows, n_joints = int(rng.integers(1, 12)), int(rng.integers(1, 4))
    max_velocity = tuple(rng.uniform(0.5, 2.0, n_joints))
    step = np.asarray(max_velocity) * DT
    # Steps mostly inside the limit; a few rows jump (sometimes none does).
    deltas = rng.uniform(-0.9, 0.9, (n_rows, n_joints)) * step
    jumps = rng.random(n_rows) < rng.choice([0.0, 0.1, 0.5])
    deltas[jumps] *= rng.uniform(1.5, 4.0, (int(jumps.sum()), 1))
    rows = np.cumsum(deltas, axis=0)
    first = int(rng.integers(0, n_rows))
    before = None if rng.random() < 0.3 else rows[max(first - 1, 0)] + rng.choice([0, 3]) * step
    s = stream(num_joints=n_joints, max_velocity=max_velocity)
    got = rows.copy()
    changed = s._clamp_velocities(got, first, None if before is None else before.copy())
    expected, expected_changed = reference_velocity_clamp(rows, first, before, step)
    np.testing.assert_array_equal(got, expected)
    assert changed == expected_changed
