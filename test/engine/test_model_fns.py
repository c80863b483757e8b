"""Model functions on the tiny preset: cached decoding vs an uncached pass, masking, sampling."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from engine_factories import TINY, make_batch_inputs

from oxygen_ros.engine import compiles, prompts
from oxygen_ros.engine.config import PALIGEMMA_VOCAB_SIZE, CacheConfig, PromptConfig
from oxygen_ros.engine.kv_cache import write_tail_rows
from oxygen_ros.engine.model_fns import JitModel, PrefixInputs, sample_tokens
from oxygen_ros.engine.tokenizer import BUNDLED_TOKENIZER_PATH, Tokenizer

# The engine's default shapes, so these tests share the session's compilations.
NUM_SLOTS, MAX_SEQ_LEN = CacheConfig().num_slots, CacheConfig().max_seq_len
MAX_TAIL = PromptConfig().max_tail_len


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer(BUNDLED_TOKENIZER_PATH)


@pytest.fixture(scope="module")
def jit_model(tiny_model, tokenizer) -> JitModel:
    """Logits over the bundled tokenizer's ids, as the engine computes them."""
    return JitModel(tiny_model, vocab_size=tokenizer.vocab_size)


def _row(inputs: PrefixInputs, row: int) -> PrefixInputs:
    return jax.tree.map(lambda x: x[row : row + 1], inputs)


def _tails(tokenizer: Tokenizer, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    pairs = [prompts.tokenize_tail(tokenizer, text, MAX_TAIL) for text in texts]
    return np.stack([p[0] for p in pairs]), np.stack([p[1] for p in pairs])


def _greedy_decode(jit_model, store, slot_prefix, tails, active, steps, vocab):
    """Extend + `steps` cached greedy decode steps; returns generated tokens and logits."""
    tail_tokens, tail_mask = tails
    tail_k, tail_v, logits = jit_model.extend(store, slot_prefix, tail_tokens, tail_mask)
    gen_k, gen_v = jit_model.empty_gen_cache(NUM_SLOTS, MAX_SEQ_LEN)
    gen_k, gen_v = write_tail_rows(gen_k, gen_v, tail_k, tail_v, np.arange(NUM_SLOTS))
    gen_len = tail_mask.sum(axis=1).astype(np.int32)
    tokens, all_logits = [], []
    for _ in range(steps):
        all_logits.append(np.asarray(logits[:, :vocab]))
        token = np.asarray(jnp.argmax(logits[:, :vocab], axis=-1), np.int32)
        tokens.append(token)
        logits, gen_k, gen_v = jit_model.decode_step(
            store, slot_prefix, gen_k, gen_v, gen_len, token, active
        )
        gen_len = gen_len + active.astype(np.int32)
    return np.stack(tokens, axis=1), np.stack(all_logits, axis=1)


def test_cached_greedy_decoding_equals_uncached_forward(jit_model, tokenizer) -> None:
    steps, vocab = 20, tokenizer.vocab_size
    inputs = make_batch_inputs(tokenizer, 0, 1)
    store = jit_model.prefill(inputs)  # P = 2 stored prefixes
    texts = ["\nNarration: ", "\nSubtask: ", "\nMemory: ", "\nSubtask: "] * (NUM_SLOTS // 4)
    tails = _tails(tokenizer, texts)
    slot_prefix = np.arange(NUM_SLOTS, dtype=np.int32) // 2 % 2  # rows read prefix 0 or 1
    active = np.arange(NUM_SLOTS) % 4 != 1
    generated, cached_logits = _greedy_decode(
        jit_model, store, slot_prefix, tails, active, steps, vocab
    )
    for row in np.flatnonzero(active):
        tail_len = int(tails[1][row].sum())
        text = np.concatenate([tails[0][row, :tail_len], generated[row]])[None]
        full = jit_model.full_forward_logits(
            _row(inputs, int(slot_prefix[row])), text, np.ones_like(text, bool)
        )
        # Logits that predict generated token i sit at text index tail_len - 1 + i.
        full = np.asarray(full[0, tail_len - 1 : tail_len - 1 + steps, :vocab])
        np.testing.assert_array_equal(np.argmax(full, axis=-1), generated[row])
        np.testing.assert_allclose(cached_logits[row], full, atol=2e-4, rtol=1e-4)


def test_decode_rows_are_independent_and_inactive_rows_untouched(jit_model, tokenizer) -> None:
    store = jit_model.prefill(make_batch_inputs(tokenizer, 2))
    tail_tokens, tail_mask = _tails(tokenizer, ["\nSubtask: "] * NUM_SLOTS)
    slot_prefix = np.zeros((NUM_SLOTS,), np.int32)
    tail_k, tail_v, _ = jit_model.extend(store, slot_prefix, tail_tokens, tail_mask)
    gen_len = tail_mask.sum(axis=1).astype(np.int32)

    def step(tokens, active):
        gen_k, gen_v = jit_model.empty_gen_cache(NUM_SLOTS, MAX_SEQ_LEN)
        gen_k, gen_v = write_tail_rows(gen_k, gen_v, tail_k, tail_v, np.arange(NUM_SLOTS))
        before = np.asarray(gen_k)
        logits, gen_k, _ = jit_model.decode_step(
            store, slot_prefix, gen_k, gen_v, gen_len, np.array(tokens, np.int32), active
        )
        return np.asarray(logits), before, np.asarray(gen_k)

    first_only = np.arange(NUM_SLOTS) == 0
    alone, before, after = step(np.where(first_only, 40, 0), first_only)
    everyone = np.ones((NUM_SLOTS,), bool)
    crowded, _, crowded_after = step(40 + np.arange(NUM_SLOTS), everyone)
    np.testing.assert_allclose(alone[0], crowded[0], atol=1e-6)
    # Inactive rows write nothing; the active row writes exactly one position.
    np.testing.assert_array_equal(after[:, 1:], before[:, 1:])
    changed = np.flatnonzero(np.any(after[:, 0] != before[:, 0], axis=(0, 2, 3)))
    np.testing.assert_array_equal(changed, [gen_len[0]])
    np.testing.assert_array_equal(crowded_after[:, 0], after[:, 0])


def test_extend_equals_feeding_the_tail_token_by_token(jit_model, tokenizer) -> None:
    store = jit_model.prefill(make_batch_inputs(tokenizer, 3))
    tail_tokens, tail_mask = _tails(tokenizer, ["\nNarration: "] * NUM_SLOTS)
    tail_len = int(tail_mask[0].sum())
    slot_prefix = np.zeros((NUM_SLOTS,), np.int32)
    tail_k, _, tail_logits = jit_model.extend(store, slot_prefix, tail_tokens, tail_mask)
    gen_k, gen_v = jit_model.empty_gen_cache(NUM_SLOTS, MAX_SEQ_LEN)
    active = np.array([True] + [False] * (NUM_SLOTS - 1))
    for i in range(tail_len):
        gen_len = np.full((NUM_SLOTS,), i, np.int32)
        logits, gen_k, gen_v = jit_model.decode_step(
            store, slot_prefix, gen_k, gen_v, gen_len, tail_tokens[:, i], active
        )
    stepped = np.asarray(gen_k)[:, 0, :tail_len]
    np.testing.assert_allclose(stepped, np.asarray(tail_k)[:, 0, :tail_len], atol=1e-5)
    np.testing.assert_allclose(np.asarray(logits)[0], np.asarray(tail_logits)[0], atol=1e-4)


def test_batched_prefill_and_denoise_equal_single_rows(jit_model, tokenizer) -> None:
    inputs = make_batch_inputs(tokenizer, 4, 5)
    noise = np.random.default_rng(0).standard_normal((2, TINY.action_horizon, TINY.action_dim))
    noise = noise.astype(np.float32)
    both = np.asarray(jit_model.denoise(jit_model.prefill(inputs), noise))
    for row in (0, 1):
        single = jit_model.denoise(jit_model.prefill(_row(inputs, row)), noise[row : row + 1])
        np.testing.assert_allclose(both[row], np.asarray(single)[0], atol=1e-5)
    assert np.abs(both[0] - both[1]).max() > 1e-3
    fewer_steps = np.asarray(jit_model.denoise(jit_model.prefill(inputs), noise, num_steps=3))
    assert np.abs(fewer_steps - both).max() > 1e-4


def test_small_vocab_logits_equal_the_full_tied_embedding_head(tiny_model, jit_model, tokenizer):
    store = jit_model.prefill(make_batch_inputs(tokenizer, 6))
    tails = _tails(tokenizer, ["\nMemory: "] * NUM_SLOTS)
    rows = np.zeros((NUM_SLOTS,), np.int32)
    _, _, small = jit_model.extend(store, rows, *tails)
    _, _, full = JitModel(tiny_model).extend(store, rows, *tails)
    assert small.shape == (NUM_SLOTS, tokenizer.vocab_size)
    assert full.shape == (NUM_SLOTS, PALIGEMMA_VOCAB_SIZE)
    np.testing.assert_allclose(small, np.asarray(full)[:, : tokenizer.vocab_size], atol=1e-6)


def test_sampling_is_greedy_or_seeded_per_request_token(jit_model) -> None:
    logits = np.asarray(jax.random.normal(jax.random.key(0), (4, 50)))
    zeros = np.zeros((4,), np.int32)
    greedy = np.asarray(jit_model.sample_tokens(logits, np.zeros(4, np.float32), zeros, zeros))
    np.testing.assert_array_equal(greedy, np.argmax(logits, axis=-1))

    hot = np.full((4,), 2.0, np.float32)
    seeds = np.array([7, 7, 8, 7], np.int32)
    indices = np.array([0, 0, 0, 1], np.int32)
    same_logits = np.repeat(logits[:1], 4, axis=0)
    first = np.asarray(jit_model.sample_tokens(same_logits, hot, seeds, indices))
    permuted = np.asarray(jit_model.sample_tokens(same_logits, hot, seeds[::-1], indices[::-1]))
    np.testing.assert_array_equal(first, permuted[::-1])  # row position does not matter
    assert first[0] == first[1]  # same (seed, index): same token
    draws = [
        int(jit_model.sample_tokens(same_logits, hot, seeds, np.full(4, i, np.int32))[0])
        for i in range(40)
    ]
    assert len(set(draws)) > 3  # temperature 2 over 50 ids: varies with the token index
    assert set(draws) != {int(greedy[0])}


@jax.jit
def _reference_sampler(logits, temperature, seeds, indices):
    """The sampler as it was before issue 13: an argmax and a categorical draw over every id
    for every row, then a per-row select."""
    logits = logits.astype(jnp.float32)
    greedy = jnp.argmax(logits, axis=-1)
    keys = jax.vmap(lambda s, i: jax.random.fold_in(jax.random.key(s), i))(seeds, indices)
    scaled = logits / jnp.maximum(temperature, 1e-6)[:, None]
    sampled = jax.vmap(jax.random.categorical)(keys, scaled)
    return jnp.where(temperature > 0, sampled, greedy).astype(jnp.int32)


def _sampling_batch(rows: int, vocab: int, seed: int) -> tuple[np.ndarray, ...]:
    """Logits of varied spread; greedy (0, < 0), tiny (< MIN_TEMPERATURE) and hot rows mixed."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(rows, vocab)) * rng.uniform(0.1, 8.0, (rows, 1))
    choices = np.array([0.0, -1.0, 1e-8, 0.3, 0.7, 1.0, 2.5], np.float32)
    temperature = choices[np.arange(rows) % len(choices)]
    seeds = rng.integers(0, 2**31 - 1, rows).astype(np.int32)
    indices = rng.integers(0, 500, rows).astype(np.int32)
    return logits.astype(np.float32), temperature, seeds, indices


def test_sampled_ids_equal_the_all_rows_categorical_formulation(jit_model) -> None:
    logits, temperature, seeds, indices = _sampling_batch(512, 640, seed=3)
    # Edge rows (temperature = row % 7 of 0, -1, 1e-8, 0.3, 0.7, 1, 2.5): NaNs (greedy, hot),
    # all -inf, a +inf in a hot row, a tie of the maximum in a greedy and in a hot row.
    logits[0, 10] = np.nan
    logits[4, 20] = np.nan
    logits[1, :] = -np.inf
    logits[2, 7] = np.inf
    logits[7, 100:110] = logits[7].max() + 1
    logits[5, 100:110] = logits[5].max() + 50  # no noise draw can lift another id this far
    ours = np.asarray(jit_model.sample_tokens(logits, temperature, seeds, indices))
    np.testing.assert_array_equal(ours, _reference_sampler(logits, temperature, seeds, indices))
    assert ours[[0, 4, 1, 2, 7]].tolist() == [10, 20, 0, 7, 100]
    assert 100 <= ours[5] < 110
    hot = temperature > 0
    # Not vacuous: many sampled rows are not their argmax.
    assert np.mean(ours[hot] != np.argmax(logits[hot], axis=-1)) > 0.3


def test_sampled_ids_equal_the_old_formulation_on_the_full_vocabulary_head() -> None:
    logits, temperature, seeds, indices = _sampling_batch(8, PALIGEMMA_VOCAB_SIZE, seed=4)
    for temps in (np.zeros_like(temperature), temperature, np.full_like(temperature, 0.8)):
        ours = np.asarray(jax.jit(sample_tokens)(logits, temps, seeds, indices))
        np.testing.assert_array_equal(ours, _reference_sampler(logits, temps, seeds, indices))


def test_switching_greedy_and_sampled_batches_does_not_recompile() -> None:
    logits, temperature, seeds, indices = _sampling_batch(8, 333, seed=5)
    mixes = [
        np.zeros_like(temperature),  # all greedy
        temperature,  # mixed
        np.full_like(temperature, 0.9),  # all sampled
        np.where(np.arange(8) == 3, 1.5, 0.0).astype(np.float32),  # one sampled row
    ]
    expected = [np.asarray(_reference_sampler(logits, t, seeds, indices)) for t in mixes]
    sample = jax.jit(lambda *args: sample_tokens(*args))  # a new function: nothing cached
    before = compiles.num_compiles()
    first = np.asarray(sample(logits, mixes[0], seeds, indices))
    compiled = compiles.num_compiles()
    assert compiled > before  # positive control: this count sees the first call compile
    got = [first] + [np.asarray(sample(logits, t, seeds, indices)) for t in mixes[1:]]
    got.append(np.asarray(sample(logits, mixes[0], seeds, indices)))
    assert compiles.num_compiles() == compiled
    for ours, reference in zip(got, expected + expected[:1], strict=True):
        np.testing.assert_array_equal(ours, reference)
    sample(logits[:7], temperature[:7], seeds[:7], indices[:7])  # 7 rows: a new shape
    assert compiles.num_compiles() > compiled  # ... and sees a recompilation
