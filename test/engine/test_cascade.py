"""Cascade-attention language path (`cascade.forward` under `model_fns.extend`/`decode_step`)
against the path through openpi's `gemma.Module` (`extend_openpi`/`decode_step_openpi`: each
row's prefix gathered and concatenated with its generated cache), and the vectorised sampler.

The uncached comparison with openpi's Gemma is `test_model_fns`'
`test_cached_greedy_decoding_equals_uncached_forward`, which now runs this path.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from engine_factories import TINY, make_observation
from test_model_fns import _reference_sampler, _sampling_batch

from oxygen_ros.engine import compiles, prompts
from oxygen_ros.engine.checkpoint import Normalizer
from oxygen_ros.engine.config import CacheConfig, NormConfig, PromptConfig
from oxygen_ros.engine.inputs import observation_to_inputs
from oxygen_ros.engine.kv_cache import write_tail_rows
from oxygen_ros.engine.model_fns import JitModel, PrefixInputs, first_argmax, sample_tokens
from oxygen_ros.engine.tokenizer import BUNDLED_TOKENIZER_PATH, Tokenizer

NUM_SLOTS, MAX_SEQ_LEN = CacheConfig().num_slots, CacheConfig().max_seq_len
MAX_TAIL = PromptConfig().max_tail_len
STEPS = 6
LOGIT_ATOL, KV_ATOL = 2e-5, 1e-5  # float32


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer(BUNDLED_TOKENIZER_PATH)


@pytest.fixture(scope="module", params=["tokenizer_head", "full_head"])
def jit_model(request, tiny_model, tokenizer) -> JitModel:
    """Both language heads: the bundled tokenizer's 640 rows and all 257,152."""
    vocab = tokenizer.vocab_size if request.param == "tokenizer_head" else None
    return JitModel(tiny_model, vocab_size=vocab)


def _inputs(tokenizer: Tokenizer, masked: dict[int, str]) -> PrefixInputs:
    """One stored prefix per seed 0..3; `masked` maps a row to the camera it lacks."""
    rows = []
    for seed in range(4):
        observation = make_observation(seed, prompt=f"task number {seed}")
        if seed in masked:
            masks = dict(observation.image_masks)
            masks[masked[seed]] = False
            observation = type(observation)(
                observation.images, masks, observation.state, observation.prompt, 0.0
            )
        rows.append(
            observation_to_inputs(
                observation,
                TINY.image_keys,
                TINY.image_resolution,
                tokenizer,
                Normalizer(None, NormConfig()),
                TINY.max_token_len,
            )
        )
    return jax.tree.map(lambda *x: np.concatenate(x, axis=0), *rows)


@pytest.fixture(scope="module")
def store(jit_model, tokenizer):
    """Four stored prefixes, two of them with a masked camera (different valid lengths)."""
    inputs = _inputs(tokenizer, {1: "left_wrist_0_rgb", 3: "base_0_rgb"})
    prefix = jit_model.prefill(inputs)
    valid = np.asarray(prefix.mask).sum(axis=1)
    image_tokens = 256
    assert valid[1] <= valid[0] - image_tokens + 8  # a masked camera: 256 fewer valid tokens
    assert valid[3] <= valid[2] - image_tokens + 8
    return prefix


def _tails(tokenizer: Tokenizer) -> tuple[np.ndarray, np.ndarray]:
    texts = ["\nNarration: ", "\nSubtask: ", "\nMemory: ", "\nSubtask: done? "]
    pairs = [prompts.tokenize_tail(tokenizer, texts[i % 4], MAX_TAIL) for i in range(NUM_SLOTS)]
    return np.stack([p[0] for p in pairs]), np.stack([p[1] for p in pairs])


def test_extend_equals_the_openpi_module_path(jit_model, store, tokenizer) -> None:
    tokens, mask = _tails(tokenizer)
    rows = np.arange(NUM_SLOTS, dtype=np.int32) % 4
    k, v, logits = jit_model.extend(store, rows, tokens, mask)
    ref_k, ref_v, ref_logits = jit_model.extend_openpi(store, rows, tokens, mask)
    np.testing.assert_allclose(logits, ref_logits, atol=LOGIT_ATOL, rtol=1e-5)
    for row in range(NUM_SLOTS):
        valid = int(mask[row].sum())
        np.testing.assert_allclose(k[:, row, :valid], ref_k[:, row, :valid], atol=KV_ATOL)
        np.testing.assert_allclose(v[:, row, :valid], ref_v[:, row, :valid], atol=KV_ATOL)


def _decode(step, jit_model, store, tokenizer, rows, active):
    """Extend (openpi path, shared by both) then STEPS greedy steps with `step`; returns the
    ids, the logits of every step and the final generated cache."""
    tokens, mask = _tails(tokenizer)
    tail_k, tail_v, logits = jit_model.extend_openpi(store, rows, tokens, mask)
    gen_k, gen_v = jit_model.empty_gen_cache(NUM_SLOTS, MAX_SEQ_LEN)
    gen_k, gen_v = write_tail_rows(gen_k, gen_v, tail_k, tail_v, np.arange(NUM_SLOTS))
    gen_len = mask.sum(axis=1).astype(np.int32)
    ids, all_logits = [], []
    token = np.asarray(jnp.argmax(logits, axis=-1), np.int32)
    for _ in range(STEPS):
        logits, gen_k, gen_v = step(store, rows, gen_k, gen_v, gen_len, token, active)
        all_logits.append(np.asarray(logits))
        token = np.asarray(jnp.argmax(logits, axis=-1), np.int32)
        ids.append(token)
        gen_len = gen_len + active.astype(np.int32)
    return np.stack(ids, 1), np.stack(all_logits, 1), np.asarray(gen_k), np.asarray(gen_v)


@pytest.mark.parametrize("num_active", [1, 3, NUM_SLOTS])
def test_decode_equals_the_openpi_module_path(
    jit_model, store, tokenizer, num_active: int
) -> None:
    # Rows spread over four stored prefixes (two with a masked camera), two rows per prefix,
    # the active ones scattered over the slots.
    rows = np.array([0, 1, 2, 3, 3, 2, 1, 0], np.int32)[:NUM_SLOTS]
    active = np.isin(
        np.arange(NUM_SLOTS), np.random.default_rng(num_active).permutation(NUM_SLOTS)[:num_active]
    )
    ours = _decode(jit_model.decode_step, jit_model, store, tokenizer, rows, active)
    reference = _decode(jit_model.decode_step_openpi, jit_model, store, tokenizer, rows, active)
    live = np.flatnonzero(active)
    np.testing.assert_array_equal(ours[0][live], reference[0][live])
    np.testing.assert_allclose(ours[1][live], reference[1][live], atol=LOGIT_ATOL, rtol=1e-5)
    for cache, ref in zip(ours[2:], reference[2:], strict=True):  # k, v written where openpi's
        np.testing.assert_allclose(cache, ref, atol=KV_ATOL)
    # Not vacuous: the rows' logits differ (different prefixes and tails).
    assert (
        np.abs(ours[1][live[0]] - ours[1][(live[0] + 1) % NUM_SLOTS]).max() > 1e-3
        or len(live) == 1
    )


def test_seeded_sampling_through_decode_equals_the_categorical_reference(
    jit_model, store, tokenizer
) -> None:
    """The fused decode + sample (sampling variant) draws what `jax.random.categorical` draws
    from the openpi path's logits, row by row, whatever the mix of greedy and sampled rows."""
    tokens, mask = _tails(tokenizer)
    rows = np.arange(NUM_SLOTS, dtype=np.int32) % 4
    tail_k, tail_v, _ = jit_model.extend_openpi(store, rows, tokens, mask)
    gen_len = mask.sum(axis=1).astype(np.int32)
    feed = np.arange(NUM_SLOTS, dtype=np.int32) + 30
    active = np.ones((NUM_SLOTS,), bool)
    temperature = np.where(np.arange(NUM_SLOTS) % 3 == 0, 0.0, 1.5).astype(np.float32)
    seeds = np.arange(NUM_SLOTS, dtype=np.int32) * 7 + 1
    indices = np.full((NUM_SLOTS,), 4, np.int32)

    def cache():
        k, v = jit_model.empty_gen_cache(NUM_SLOTS, MAX_SEQ_LEN)
        return write_tail_rows(k, v, tail_k, tail_v, np.arange(NUM_SLOTS))

    sampled, _, _ = jit_model.decode_sample(
        store, rows, *cache(), gen_len, feed, active, temperature, seeds, indices
    )
    logits, _, _ = jit_model.decode_step_openpi(store, rows, *cache(), gen_len, feed, active)
    expected = _reference_sampler(logits, temperature, seeds, indices)
    np.testing.assert_array_equal(np.asarray(sampled), np.asarray(expected))
    hot = temperature > 0
    assert np.any(np.asarray(sampled)[hot] != np.asarray(jnp.argmax(logits, -1))[hot])


def test_first_argmax_equals_jnp_argmax_with_nan_inf_and_ties() -> None:
    rng = np.random.default_rng(0)
    for vocab in (640, 257_152, 641):  # 641 is prime: one chunk
        x = rng.normal(size=(7, vocab)).astype(np.float32)
        x[0, 10] = np.nan
        x[1, :] = -np.inf
        x[2, 7] = np.inf
        x[3, 5], x[3, vocab - 3] = np.inf, np.nan  # the NaN wins over an earlier +inf
        x[4, [30, vocab - 30]] = x[4].max() + 1  # a tie: the first one wins
        x[5, vocab - 1] = x[5].max() + 1  # the last id
        np.testing.assert_array_equal(jax.jit(first_argmax)(x), np.argmax(x, axis=-1))


def test_greedy_and_sampling_variants_compile_once_each(jit_model) -> None:
    logits, temperature, seeds, indices = _sampling_batch(NUM_SLOTS, 333, seed=5)
    greedy = np.zeros_like(temperature)
    jax.block_until_ready(jit_model.sample_tokens(logits, greedy, seeds, indices))
    jax.block_until_ready(jit_model.sample_tokens(logits, temperature, seeds, indices))
    before = compiles.num_compiles()
    mixes = [greedy, temperature, np.full_like(temperature, 0.9), greedy]
    got = [np.asarray(jit_model.sample_tokens(logits, t, seeds, indices)) for t in mixes]
    assert compiles.num_compiles() == before
    for ours, t in zip(got, mixes, strict=True):
        np.testing.assert_array_equal(ours, _reference_sampler(logits, t, seeds, indices))
    fresh = 5 if jit_model.vocab_size is None else 6  # a shape no other case has used
    jit_model.sample_tokens(logits[:fresh], temperature[:fresh], seeds[:fresh], indices[:fresh])
    assert compiles.num_compiles() > before  # positive control: a new shape compiles
    # The greedy variant draws no noise: it equals the argmax even where rows are hot.
    plain = jax.jit(sample_tokens, static_argnums=4)(logits, temperature, seeds, indices, False)
    np.testing.assert_array_equal(plain, np.argmax(logits, axis=-1))


def test_prefill_equals_the_openpi_module_path(jit_model, tokenizer) -> None:
    """Every slot encoded (masked ones too, openpi's way): the valid positions' k/v equal
    those of openpi's module for prefixes with and without a masked camera."""
    inputs = _inputs(tokenizer, {1: "left_wrist_0_rgb", 3: "base_0_rgb"})
    ours = jit_model.prefill(inputs)
    reference = jit_model.prefill_openpi(inputs)
    np.testing.assert_array_equal(ours.mask, reference.mask)
    valid = np.asarray(reference.mask)
    for mine, theirs in ((ours.k, reference.k), (ours.v, reference.v)):
        mine, theirs = np.asarray(mine), np.asarray(theirs)
        assert np.isfinite(mine).all()  # masked positions hold junk, never NaN
        for row in range(valid.shape[0]):
            np.testing.assert_allclose(
                mine[:, row, valid[row]], theirs[:, row, valid[row]], atol=KV_ATOL
            )


def test_action_velocity_equals_the_openpi_module_path(jit_model, store, tiny_model) -> None:
    """The action expert through `cascade.forward` (adaRMS, gated residuals, reading the
    prefix where it lies) against openpi's module, per row and per-row times."""
    from oxygen_ros.engine import model_fns, openpi_reference

    horizon = TINY.action_horizon
    x_t = np.random.default_rng(3).standard_normal((4, horizon, TINY.action_dim))
    time = np.array([1.0, 0.7, 0.3, 0.05], np.float32)

    @jax.jit
    def both(x_t, time):
        ours = model_fns.action_velocity(tiny_model, store, horizon)(x_t, time)
        reference = openpi_reference.action_velocity_openpi(tiny_model, store, horizon)(x_t, time)
        return ours, reference

    ours, reference = both(x_t.astype(np.float32), time)
    np.testing.assert_allclose(ours, reference, atol=2e-5, rtol=1e-5)
    assert np.abs(np.asarray(ours[0]) - np.asarray(ours[1])).max() > 1e-3  # rows differ
