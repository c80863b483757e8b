"""ChunkGuide: the previous chunk aligned to a new observation, in model space."""

from __future__ import annotations

import numpy as np
from openpi.shared import normalize

from oxygen_ros.engine.checkpoint import Normalizer
from oxygen_ros.engine.chunk_guide import ChunkGuide
from oxygen_ros.engine.config import NormConfig, RtcConfig

HORIZON, JOINTS, MODEL_DIM, DT = 6, 3, 5, 0.1


def _guide(delta_mask=(), stats=None, **config) -> ChunkGuide:
    rtc = RtcConfig(enabled=True, row_dt_s=DT, **config)
    return ChunkGuide(rtc, Normalizer(stats, NormConfig()), delta_mask, HORIZON, MODEL_DIM)


def _chunk() -> np.ndarray:
    """Row i, joint j = 10 i + j: every row tells where it came from."""
    return (10.0 * np.arange(HORIZON)[:, None] + np.arange(JOINTS)[None]).astype(np.float32)


def test_without_a_previous_chunk_nothing_is_guided() -> None:
    plan = _guide().plan(5.0, np.zeros(JOINTS))
    assert (plan.frozen_rows, plan.guided_rows, plan.max_guidance) == (0, 0, 0.0)
    assert plan.previous.shape == (1, HORIZON, MODEL_DIM) and not plan.previous.any()


def test_previous_rows_are_aligned_by_the_stamps_and_frozen_by_the_measured_delay() -> None:
    guide = _guide(max_guidance=3.0)
    guide.record(_chunk(), stamp=5.0, latency_s=0.12)
    plan = guide.plan(5.2, np.zeros(JOINTS))  # two rows later
    assert plan.offset_rows == 2
    assert plan.guided_rows == HORIZON - 2
    assert plan.frozen_rows == 2  # 0.12 s of 0.1 s rows: rows 0 and 1 pass before hand-off
    assert plan.max_guidance == 3.0
    # No stats: identity normalisation; row i of the target is the previous row i + 2.
    np.testing.assert_array_equal(plan.previous[0, :4, :JOINTS], _chunk()[2:])
    assert not plan.previous[0, :, JOINTS:].any()  # padded model dims stay zero


def test_the_delay_is_the_largest_recent_latency_and_capped_by_the_overlap() -> None:
    guide = _guide(delay_window=2)
    guide.record(_chunk(), 1.0, 0.35)
    guide.record(_chunk(), 1.1, 0.05)
    assert guide.delay_s == 0.35
    assert guide.plan(1.1, np.zeros(JOINTS)).frozen_rows == 4  # ceil(3.5)
    guide.record(_chunk(), 1.2, 0.1)  # the 0.35 s frame leaves the window of 2
    assert guide.delay_s == 0.1
    assert guide.plan(1.2, np.zeros(JOINTS)).frozen_rows == 1  # exactly one row, not two
    guide.record(_chunk(), 1.3, 0.55)
    plan = guide.plan(1.8, np.zeros(JOINTS))  # 5 rows on: one row of overlap left
    assert (plan.guided_rows, plan.frozen_rows) == (1, 1)


def test_time_going_back_or_no_overlap_means_no_guidance() -> None:
    guide = _guide()
    guide.record(_chunk(), 5.0, 0.1)
    assert guide.plan(4.9, np.zeros(JOINTS)).max_guidance == 0.0  # a reset sim clock
    assert guide.plan(5.0 + HORIZON * DT, np.zeros(JOINTS)).max_guidance == 0.0
    # Positive control: the same guide guides a frame inside the overlap.
    assert guide.plan(5.0, np.zeros(JOINTS)).max_guidance > 0.0
    guide.reset()
    assert guide.plan(5.1, np.zeros(JOINTS)).max_guidance == 0.0


def test_a_new_task_forgets_the_chunk_but_keeps_the_measured_delay() -> None:
    guide = _guide(max_guidance=3.0)
    guide.record(_chunk(), 5.0, 0.25)
    assert guide.plan(5.1, np.zeros(JOINTS)).max_guidance == 3.0  # control: it continues it
    guide.forget_chunk()
    assert guide.plan(5.1, np.zeros(JOINTS)).max_guidance == 0.0
    assert guide.delay_s == 0.25  # the machine's, not the task's


def test_delta_checkpoints_get_the_target_relative_to_the_new_state_then_normalised() -> None:
    stats = {
        "state": normalize.NormStats(
            mean=np.zeros(JOINTS), std=np.ones(JOINTS), q01=-np.ones(JOINTS), q99=np.ones(JOINTS)
        ),
        "actions": normalize.NormStats(
            mean=np.zeros(JOINTS),
            std=np.ones(JOINTS),
            q01=np.full(JOINTS, -100.0),
            q99=np.full(JOINTS, 100.0),
        ),
    }
    guide = _guide(delta_mask=(True, True, False), stats=stats)
    guide.record(_chunk(), 2.0, 0.0)
    state = np.array([1.0, 2.0, 3.0, 99.0], np.float32)  # extra state entries are ignored
    plan = guide.plan(2.1, state)
    relative = _chunk()[1:] - np.array([1.0, 2.0, 0.0])
    np.testing.assert_allclose(plan.previous[0, :5, :JOINTS], relative / 100.0, atol=1e-6)
    # The inverse transform gives the previous chunk's absolute rows back.
    back = Normalizer.absolute_actions(relative, state, (True, True, False))
    np.testing.assert_allclose(back, _chunk()[1:])
