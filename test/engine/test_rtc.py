"""Real-time chunking (rtc.py) on the tiny preset: the paper's soft mask and guidance weight,
zero guidance equals plain denoise, strong guidance pins the frozen rows to the previous chunk
and leaves the free rows alone, and changing the row counts or beta never recompiles."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from engine_factories import TINY, make_batch_inputs

from oxygen_ros.engine import compiles
from oxygen_ros.engine.model_fns import JitModel, Prefix
from oxygen_ros.engine.rtc import guidance_weight, prefix_weights
from oxygen_ros.engine.tokenizer import BUNDLED_TOKENIZER_PATH, Tokenizer

HORIZON, ACTION_DIM = TINY.action_horizon, TINY.action_dim
FROZEN, GUIDED = 10, 25  # d and H - s of the paper on the 50-row chunk
STRONG_BETA = 5.0  # the paper's guidance weight clip


def _paper_weight(row: int, frozen: int, guided: int) -> float:
    """The paper's soft mask, one row at a time (an independent reference)."""
    if row < frozen:
        return 1.0
    if row >= guided:
        return 0.0
    c = (guided - row) / (guided - frozen + 1)
    return c * (math.exp(c) - 1.0) / (math.e - 1.0)


@pytest.fixture(scope="module")
def jit_model(tiny_model) -> JitModel:
    return JitModel(tiny_model)


@pytest.fixture(scope="module")
def prefix(jit_model) -> Prefix:
    """Two observations' prefixes (two batch rows)."""
    inputs = make_batch_inputs(Tokenizer(BUNDLED_TOKENIZER_PATH), 6, 7)
    return jit_model.prefill(inputs)


@pytest.fixture(scope="module")
def noises() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    shape = (2, HORIZON, ACTION_DIM)
    return tuple(rng.standard_normal(shape).astype(np.float32) for _ in range(2))


@pytest.fixture(scope="module")
def chunks(jit_model, prefix, noises) -> tuple[np.ndarray, np.ndarray]:
    """Plain denoise of the same prefixes from two noises: the new chunk without guidance,
    and another sample of the same policy, used as the previous chunk to continue."""
    return tuple(np.asarray(jit_model.denoise(prefix, noise)) for noise in noises)


def test_prefix_weights_are_the_papers_soft_mask() -> None:
    decay = [c * (math.exp(c) - 1) / (math.e - 1) for c in (5 / 6, 4 / 6, 3 / 6, 2 / 6, 1 / 6)]
    np.testing.assert_allclose(
        np.asarray(prefix_weights(10, 3, 8)), [1, 1, 1, *decay, 0, 0], rtol=1e-6
    )
    np.testing.assert_allclose(prefix_weights(10, 3, 8)[3], 0.630948, rtol=1e-5)  # c = 5/6
    cases = [(10, 0, 10), (50, 10, 25), (50, 0, 50), (6, 4, 2), (5, 5, 5), (8, 0, 0), (8, 3, 4)]
    for horizon, frozen, guided in cases:
        expected = [_paper_weight(i, frozen, guided) for i in range(horizon)]
        got = np.asarray(prefix_weights(horizon, frozen, guided))
        assert got.dtype == np.float32 and got.shape == (horizon,)
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)
        assert np.all(np.diff(got) <= 0) and got.min() >= 0 and got.max() <= 1
    # frozen = 0, guided = horizon: every row guided, none pinned, the first at c = 10/11
    np.testing.assert_allclose(prefix_weights(10, 0, 10)[0], 0.784116, rtol=1e-5)
    # per-row counts [B] give each row its own mask
    per_row = np.asarray(prefix_weights(12, jnp.array([0, 3, 12]), jnp.array([12, 7, 12])))
    for row, (frozen, guided) in enumerate([(0, 12), (3, 7), (12, 12)]):
        np.testing.assert_array_equal(per_row[row], prefix_weights(12, frozen, guided))


def test_guidance_weight_is_the_clipped_pseudoinverse_weight() -> None:
    times = np.linspace(1.0, 0.1, 10).astype(np.float32)
    got = np.asarray([guidance_weight(jnp.float32(t), 100.0) for t in times])
    tau = 1.0 - times.astype(np.float64)
    r2 = (1 - tau) ** 2 / (tau**2 + (1 - tau) ** 2)
    with np.errstate(divide="ignore"):
        expected = np.minimum(100.0, (1 - tau) / (tau * r2))  # the paper's form, in tau
    np.testing.assert_allclose(got, expected, rtol=1e-5)
    assert got[0] == 100.0  # t = 1 (pure noise): infinite, clipped
    assert float(guidance_weight(jnp.float32(0.5), STRONG_BETA)) == pytest.approx(2.0)
    assert float(guidance_weight(jnp.float32(0.9), STRONG_BETA)) == STRONG_BETA
    assert float(guidance_weight(jnp.float32(0.3), 0.0)) == 0.0


def test_zero_guidance_equals_plain_denoise(jit_model, prefix, noises, chunks) -> None:
    noise, (plain, previous) = noises[0], chunks
    no_beta = jit_model.denoise_rtc(prefix, noise, previous, FROZEN, GUIDED, 0.0)
    no_weights = jit_model.denoise_rtc(prefix, noise, previous, 0, 0, STRONG_BETA)
    # The guidance term is exactly 0; the forward inside the VJP may fuse differently from
    # plain denoise's (measured max difference 7e-7 on actions of std 1.3).
    np.testing.assert_allclose(np.asarray(no_beta), plain, atol=1e-5)
    np.testing.assert_allclose(np.asarray(no_weights), plain, atol=1e-5)


def test_strong_guidance_pins_frozen_rows_and_leaves_free_rows(
    jit_model, prefix, noises, chunks
) -> None:
    noise, (plain, previous) = noises[0], chunks
    guided = np.asarray(
        jit_model.denoise_rtc(prefix, noise, previous, FROZEN, GUIDED, STRONG_BETA)
    )
    frozen, free = slice(0, FROZEN), slice(GUIDED, HORIZON)
    # Positive control: the two samples differ (measured max 6.2 on the frozen rows).
    plain_gap = np.abs(plain[:, frozen] - previous[:, frozen]).max()
    assert plain_gap > 4.0
    # Guided: measured max 0.24 over both batch rows (the clipped weight leaves a residue
    # after 10 steps: 0.59 with beta = 2, 0.09 with beta = 10). 0.5 is twice the measured
    # gap and 12x below plain's.
    assert np.abs(guided[:, frozen] - previous[:, frozen]).max() < 0.5
    # The decaying rows are pulled too, less than the frozen ones (mean per-row gaps,
    # measured 0.06 < 0.67 < 1.48).
    row_gap = np.abs(guided - previous).mean(axis=(0, 2))
    assert row_gap[frozen].mean() < row_gap[FROZEN:GUIDED].mean() < row_gap[free].mean()
    # Free rows are not pulled: they stay within 0.2 of plain denoise (measured 0.07; the
    # chunk's rows attend to each other, so they move a little) while plain's distance to
    # the previous chunk there is large (measured 6.9): their gap to it stays plain's.
    free_gap = np.abs(plain[:, free] - previous[:, free]).max()
    assert free_gap > 4.0
    assert np.abs(guided[:, free] - plain[:, free]).max() < 0.2


def test_changing_rows_and_beta_does_not_recompile(jit_model, prefix, noises, chunks) -> None:
    noise, (plain, previous) = noises[0], chunks
    scalar = jit_model.denoise_rtc(prefix, noise, previous, FROZEN, GUIDED, STRONG_BETA)
    before = compiles.num_compiles()
    for frozen, guided, beta in [(0, 0, 0.0), (3, 7, 1.0), (0, HORIZON, 10.0), (49, 50, 2.5)]:
        jax.block_until_ready(jit_model.denoise_rtc(prefix, noise, previous, frozen, guided, beta))
    numpy_scalars = (np.int64(5), np.int32(20), np.float64(5.0))
    jax.block_until_ready(jit_model.denoise_rtc(prefix, noise, previous, *numpy_scalars))
    assert compiles.num_compiles() == before
    # Positive control: per-row counts [B] are a new argument shape, so the counter sees a
    # compilation. Row 0 is guided as above, row 1 not at all (it equals plain denoise).
    per_row = jit_model.denoise_rtc(
        prefix, noise, previous, np.array([FROZEN, 0]), np.array([GUIDED, 0]), STRONG_BETA
    )
    assert compiles.num_compiles() > before
    np.testing.assert_allclose(np.asarray(per_row)[0], np.asarray(scalar)[0], atol=1e-5)
    np.testing.assert_allclose(np.asarray(per_row)[1], plain[1], atol=1e-5)
