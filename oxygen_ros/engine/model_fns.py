"""Pure model functions (prefill, denoise, extend, decode_step, sampling) and their jitted form.

One control frame: `prefill` runs the prefix (images + pi0.5 prompt) once, bidirectionally,
and returns its KV cache. `denoise` runs openpi's flow-matching loop with the action expert
reading that cache (`rtc.denoise_rtc`: the same loop, guided towards the previous chunk).
Language tasks `extend` the same cache with their tail (causally), then `decode_step`
generates one token per active slot from a fixed-capacity cache.

Axes: L layers, B batch/slot rows, P stored prefixes, S prefix length, T tail/generated length,
K kv heads, H head dim, D model width, V vocabulary, A action horizon, J action dim.

KV layout follows openpi: k and v are [L, B, S, K, H], keys already rotated (RoPE).

Invariants:
- The action expert attends only to the prefix (never to tails or generated text); `denoise`
  computes exactly openpi's `Pi0.sample_actions` loop for the same prefix and noise.
- Positions: prefix tokens use cumsum(mask) - 1 (openpi); a tail and its generated tokens
  continue at the prefix's valid length, so row b's gen-cache entry j sits at position
  valid_len(prefix[b]) + j.
- `decode_step` has fixed shapes: inactive rows are masked (they attend only to themselves,
  and their cache is not written), so one compilation serves 1..B active rows; a row's
  result does not depend on the other rows.
- Callers keep gen_len < T for active rows (the cache module answers "does not fit").
- Sampling is stateless: token i of a request uses fold_in(key(seed), i), so it does not
  depend on batching or on which frame decodes it. Temperature <= 0 is greedy, and a greedy
  row costs an argmax only (no random draw over the vocabulary).
- Compiled functions are cached per `ModelConfig`; parameters are arguments, so every
  model of one config shares one compilation.
"""

# jaxtyping shape strings ("b s d") are not Python expressions; pyflakes' F722 misreads them.

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

import flax.nnx as nnx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int
from openpi.models.pi0 import make_attn_mask

from oxygen_ros.engine import cascade
from oxygen_ros.engine.config import ModelConfig
from oxygen_ros.engine.model import Pi05Model, abstract_model, gemma_config

MIN_TEMPERATURE = 1e-6  # sampled rows (temperature > 0) divide their logits by at least this


class PrefixInputs(NamedTuple):
    """Model-ready prefix inputs for B observations."""

    images: dict[str, Float[Array, "b h w 3"]]  # per slot, float32 in [-1, 1]
    image_masks: dict[str, Bool[Array, " b"]]  # per slot, valid
    tokens: Int[Array, "b l"]  # pi0.5 prompt tokens, right-padded to max_token_len
    token_mask: Bool[Array, "b l"]


class Prefix(NamedTuple):
    """KV cache of B prefixes (or, as a prefix store, of P stored prefixes)."""

    k: Float[Array, "l b s k h"]
    v: Float[Array, "l b s k h"]
    mask: Bool[Array, "b s"]  # valid prefix positions


def prefill(
    model: Pi05Model, inputs: PrefixInputs, valid_slots: tuple[str, ...] | None = None
) -> Prefix:
    """Runs the prefix LLM over images + prompt (bidirectional) and returns its KV cache.

    `valid_slots` (static; None: every slot): the image slots that hold a valid image in every
    row. Only those are encoded and run through the LLM (a masked camera costs nothing); the
    cache is then padded with masked positions to the full prefix length S, so every consumer
    sees one shape. Valid tokens keep openpi's positions (cumsum(mask) - 1 skips masked ones)
    and, since no valid token attends a masked one, their k/v equal openpi's compute-then-mask
    prefix; only where they sit in the S positions differs. The LLM runs `cascade.forward`
    (openpi's layer math, one 2D matmul per attention product for a batch-1 prefix);
    `prefill_openpi` is the same through openpi's module. Masked positions hold junk that no
    consumer reads (they are masked wherever a prefix is read).
    """
    embedded, mask, ar_mask = model.embed_prefix(
        inputs.images, inputs.image_masks, inputs.tokens, inputs.token_mask, valid_slots
    )
    positions = jnp.cumsum(mask, axis=1) - 1
    params = cascade.llm_params(model.llm)
    itself = jnp.eye(mask.shape[1], dtype=bool)[None]  # masked tokens: no empty softmax
    visible = make_attn_mask(mask, ar_mask) | itself
    _, k, v = cascade.forward(
        params, embedded.astype(model.config.dtype), positions, None, None, None, None, visible
    )
    missing = model.config.prefix_len - mask.shape[1]
    if missing:
        pad = [(0, 0), (0, 0), (0, missing), (0, 0), (0, 0)]
        k, v = jnp.pad(k, pad), jnp.pad(v, pad)
        mask = jnp.pad(mask, [(0, 0), (0, missing)])
    return Prefix(k, v, mask)


def valid_slots_of(image_keys: Sequence[str], image_masks: dict[str, object]) -> tuple[str, ...]:
    """The slots whose mask is True in every row (host-side arrays), in `image_keys` order."""
    return tuple(key for key in image_keys if bool(np.all(np.asarray(image_masks[key]))))


def suffix_layout(prefix: Prefix, horizon: int) -> tuple[Bool[Array, "b a a"], Int[Array, "b a"]]:
    """Action tokens see every valid prefix token and each other (openpi's suffix ar mask);
    their positions follow the prefix's valid length."""
    batch = prefix.mask.shape[0]
    suffix_mask = jnp.ones((batch, horizon), dtype=bool)
    suffix_ar = jnp.zeros((horizon,), dtype=bool).at[0].set(True)
    positions = jnp.sum(prefix.mask, axis=-1)[:, None] + jnp.cumsum(suffix_mask, axis=-1) - 1
    return make_attn_mask(suffix_mask, suffix_ar), positions


def action_velocity(
    model: Pi05Model, prefix: Prefix, horizon: int
) -> Callable[[Float[Array, "b a j"], Float[Array, ""]], Float[Array, "b a j"]]:
    """The action expert's flow v(x_t, t) for B chunks of `horizon` rows reading `prefix`
    (openpi's convention: v ~ noise - actions; t is one scalar for every row, or one per row
    as training draws it). The expert runs `cascade.forward` with its adaRMS condition: row
    b's action tokens read prefix b where it lies (no concatenation with their own k/v), one
    2D matmul per attention product for a batch-1 prefix; `action_velocity_openpi` is the
    same through openpi's module."""
    batch = prefix.mask.shape[0]
    params = cascade.llm_params(model.llm, expert=1)
    among, positions = suffix_layout(prefix, horizon)
    dtype = model.config.dtype

    def velocity(x_t: Array, time: Array) -> Array:
        tokens, cond = model.embed_suffix(x_t, jnp.broadcast_to(time, batch))
        out, _, _ = cascade.forward(
            params,
            tokens.astype(dtype),
            positions,
            prefix.k,
            prefix.v,
            None,
            prefix.mask,
            among,
            cond=cond,
        )
        return model.action_out_proj(out)

    return velocity


def denoise(
    model: Pi05Model, prefix: Prefix, noise: Float[Array, "b a j"], num_steps: int
) -> Float[Array, "b a j"]:
    """Flow matching from t=1 (noise) to t=0 (actions) with Euler steps, reading the prefix."""
    velocity = action_velocity(model, prefix, noise.shape[1])
    dt = -1.0 / num_steps

    def step(_: int, carry: tuple[Array, Array]) -> tuple[Array, Array]:
        x_t, time = carry
        return x_t + dt * velocity(x_t, time), time + dt

    actions, _ = jax.lax.fori_loop(0, num_steps, step, (noise, jnp.float32(1.0)))
    return actions


def _valid_len(store: Prefix, index: Int[Array, " b"]) -> Int[Array, " b"]:
    return jnp.sum(store.mask, axis=-1)[index]


def extend(
    model: Pi05Model,
    store: Prefix,
    prefix_index: Int[Array, " b"],
    tail_tokens: Int[Array, "b t"],
    tail_mask: Bool[Array, "b t"],
    vocab_size: int | None = None,
) -> tuple[Float[Array, "l b t k h"], Float[Array, "l b t k h"], Float[Array, "b v"]]:
    """Prefills language tails after stored prefixes, causally (cascade attention: the
    prefix is read in the store, never gathered with the tail into one cache).

    Row b reads `store[prefix_index[b]]`; its tail is left-aligned (tail_mask a run of True
    then False) and starts at the prefix's valid length. Returns the tails' k/v
    [L, B, T, K, H] (padded positions hold junk, beyond the row's tail length) and the logits
    of each row's last valid tail token (first `vocab_size` ids; None: all).
    """
    params = cascade.llm_params(model.llm)
    num_tail = tail_tokens.shape[1]
    positions = _valid_len(store, prefix_index)[:, None] + jnp.cumsum(tail_mask, axis=-1) - 1
    causal = make_attn_mask(tail_mask, jnp.ones((num_tail,), dtype=bool))
    itself = jnp.eye(num_tail, dtype=bool)[None]  # padding sees itself: no empty softmax
    hidden, k, v = cascade.forward(
        params,
        model.embed_tokens(tail_tokens),
        positions,
        store.k,
        store.v,
        prefix_index,
        store.mask[prefix_index],
        causal | itself,
    )
    last = jnp.maximum(jnp.sum(tail_mask, axis=-1) - 1, 0)
    hidden = jnp.take_along_axis(hidden, last[:, None, None], axis=1)[:, 0]
    return k, v, model.logits(hidden, vocab_size)


def decode_step(
    model: Pi05Model,
    store: Prefix,
    slot_prefix: Int[Array, " b"],
    gen_k: Float[Array, "l b t k h"],
    gen_v: Float[Array, "l b t k h"],
    gen_len: Int[Array, " b"],
    tokens: Int[Array, " b"],
    active: Bool[Array, " b"],
    vocab_size: int | None = None,
) -> tuple[Float[Array, "b v"], Float[Array, "l b t k h"], Float[Array, "l b t k h"]]:
    """One token per slot row; returns logits [B, V] and the updated gen cache.

    Row b feeds `tokens[b]` at position valid_len(prefix) + gen_len[b], attends to its stored
    prefix `store[slot_prefix[b]]` where it lies in the store, to its first gen_len[b]
    gen-cache entries where they lie and to itself (cascade attention, `cascade.forward`),
    and its k/v are written at gen-cache index gen_len[b], in place when gen_k/gen_v are
    donated. Inactive rows see only themselves and write nothing. Logits cover the first
    `vocab_size` ids (None: all).
    """
    params = cascade.llm_params(model.llm)
    batch, capacity = gen_k.shape[1], gen_k.shape[2]
    hidden, k, v = cascade.forward(
        params,
        model.embed_tokens(tokens[:, None]),
        (_valid_len(store, slot_prefix) + gen_len)[:, None],
        store.k,
        store.v,
        slot_prefix,
        store.mask[slot_prefix] & active[:, None],
        jnp.ones((batch, 1, 1), dtype=bool),
        gen_k,
        gen_v,
        (jnp.arange(capacity)[None, :] < gen_len[:, None]) & active[:, None],
    )
    rows = jnp.arange(batch)
    write_at = jnp.where(active, gen_len, capacity)  # out of range: dropped
    gen_k = gen_k.at[:, rows, write_at].set(k[:, :, 0], mode="drop")
    gen_v = gen_v.at[:, rows, write_at].set(v[:, :, 0], mode="drop")
    return model.logits(hidden[:, 0], vocab_size), gen_k, gen_v


def _num_chunks(size: int) -> int:
    """The divisor of `size` nearest its square root from below (1 for a prime)."""
    return max(d for d in range(1, math.isqrt(size) + 1) if size % d == 0)


def first_argmax(x: Float[Array, "b v"]) -> Int[Array, " b"]:
    """`jnp.argmax` over the last axis (the first maximum; a NaN counts as the maximum, the
    first NaN wins), in two levels: chunk maxima in one pass over the row, then the first hit
    inside the first chunk holding the maximum.

    XLA:CPU lowers `argmax` to one (value, index) reduction that does not vectorise (about 5x
    slower than a max on the 257,152-id head), and a max-then-first-index formulation makes a
    second pass over every row; here only one chunk is read twice. Its vectorised max may drop
    a NaN, so the maximum is taken over keys: NaN -> +inf, +inf -> the largest finite float
    (the one case that differs from `jnp.argmax`: a row holding +inf and, before it, a logit
    equal to that largest float).
    """
    batch, size = x.shape
    chunks = _num_chunks(size)
    largest = jnp.finfo(x.dtype).max
    keys = jnp.where(jnp.isnan(x), jnp.inf, jnp.where(x == jnp.inf, largest, x))
    tiles = keys.reshape(batch, chunks, size // chunks)
    chunk_top = jnp.max(tiles, axis=-1)  # [B, C]
    top = jnp.max(chunk_top, axis=-1, keepdims=True)
    chunk = jnp.argmax(chunk_top == top, axis=-1)  # the first chunk holding the maximum
    tile = jnp.take_along_axis(tiles, chunk[:, None, None], axis=1)[:, 0]  # [B, size / C]
    return (chunk * (size // chunks) + jnp.argmax(tile == top, axis=-1)).astype(jnp.int32)


def sample_tokens(
    logits: Float[Array, "b v"],
    temperature: Float[Array, " b"],
    seeds: Int[Array, " b"],
    indices: Int[Array, " b"],
    sampling: bool = True,
) -> Int[Array, " b"]:
    """Greedy (temperature <= 0) or temperature sampling; token i of a request uses
    fold_in(key(seed), i).

    A row with temperature t > 0 draws `jax.random.categorical(key, logits / t)` (what JAX
    computes: Gumbel noise over every id added to logits / t, then the argmax); each row's
    noise comes from its own key (vmapped), so the same key gives the same id whatever the
    batch. Vectorised over rows: one argmax for every row, and, when `sampling` (static: the
    caller knows whether any row samples; XLA:CPU would run both sides of a `lax.cond` here),
    noise for every row, kept where t > 0. Two compilations per shape, greedy and sampling.
    """
    logits = logits.astype(jnp.float32)
    greedy = first_argmax(logits)
    if not sampling:
        return greedy
    keys = jax.vmap(lambda seed, index: jax.random.fold_in(jax.random.key(seed), index))(
        seeds, indices
    )
    noise = jax.vmap(lambda key: jax.random.gumbel(key, logits.shape[1:], jnp.float32))(keys)
    scaled = logits / jnp.maximum(temperature, MIN_TEMPERATURE)[:, None]
    return jnp.where(temperature > 0, first_argmax(scaled + noise), greedy)


def needs_sampling(temperature: object) -> bool:
    """Whether any row of a host-side temperature array samples (`sample_tokens`' flag)."""
    return bool(np.any(np.asarray(temperature) > 0))


def decode_sample(
    model: Pi05Model,
    store: Prefix,
    slot_prefix: Int[Array, " b"],
    gen_k: Float[Array, "l b t k h"],
    gen_v: Float[Array, "l b t k h"],
    gen_len: Int[Array, " b"],
    tokens: Int[Array, " b"],
    active: Bool[Array, " b"],
    temperature: Float[Array, " b"],
    seeds: Int[Array, " b"],
    indices: Int[Array, " b"],
    vocab_size: int | None = None,
    sampling: bool = True,
) -> tuple[Int[Array, " b"], Float[Array, "l b t k h"], Float[Array, "l b t k h"]]:
    """`decode_step` then `sample_tokens` in one call: the next id of every row (inactive rows
    give junk) and the updated gen cache. `indices[b]` is the index of the sampled id in row
    b's output stream."""
    logits, gen_k, gen_v = decode_step(
        model, store, slot_prefix, gen_k, gen_v, gen_len, tokens, active, vocab_size
    )
    return sample_tokens(logits, temperature, seeds, indices, sampling), gen_k, gen_v


@dataclasses.dataclass(frozen=True)
class _Compiled:
    treedef: jax.tree_util.PyTreeDef
    prefill: object
    denoise: object
    denoise_rtc: object
    extend: object
    decode_step: object
    decode_sample: object
    sample_tokens: object
    full_forward_logits: object
    extend_openpi: object
    decode_step_openpi: object
    prefill_openpi: object


@functools.cache
def _compiled(config: ModelConfig) -> _Compiled:
    # Both build on this module's velocity, Prefix and inputs.
    from oxygen_ros.engine import openpi_reference, rtc

    graphdef, abstract_state = nnx.split(abstract_model(config))
    treedef = jax.tree.structure(abstract_state)

    def bind(fn):
        def with_leaves(leaves, *args):
            return fn(nnx.merge(graphdef, jax.tree.unflatten(treedef, leaves)), *args)

        return with_leaves

    return _Compiled(
        treedef=treedef,
        prefill=jax.jit(bind(prefill), static_argnums=2),
        denoise=jax.jit(bind(denoise), static_argnums=3),
        denoise_rtc=jax.jit(bind(rtc.denoise_rtc), static_argnums=3),
        extend=jax.jit(bind(extend), static_argnums=5),
        decode_step=jax.jit(bind(decode_step), static_argnums=8, donate_argnums=(3, 4)),
        decode_sample=jax.jit(bind(decode_sample), static_argnums=(11, 12), donate_argnums=(3, 4)),
        sample_tokens=jax.jit(sample_tokens, static_argnums=4),
        full_forward_logits=jax.jit(bind(openpi_reference.full_forward_logits), static_argnums=4),
        extend_openpi=jax.jit(bind(openpi_reference.extend_openpi), static_argnums=5),
        prefill_openpi=jax.jit(bind(openpi_reference.prefill_openpi)),
        decode_step_openpi=jax.jit(
            bind(openpi_reference.decode_step_openpi), static_argnums=8, donate_argnums=(3, 4)
        ),
    )


class JitModel:
    """The model functions above, jitted once per `ModelConfig`, bound to one model's parameters.

    All logits cover the first `vocab_size` ids (the tokenizer's vocabulary; None: the whole
    257,152-row embedding), so ids the tokenizer cannot decode are never sampled.
    """

    def __init__(self, model: Pi05Model, vocab_size: int | None = None) -> None:
        self.config: ModelConfig = model.config
        self.vocab_size = vocab_size
        self._fns = _compiled(self.config)
        leaves, treedef = jax.tree.flatten(nnx.state(model))
        if treedef != self._fns.treedef:
            raise ValueError(f"model state does not match the {self.config.name!r} parameter tree")
        self._leaves = leaves

    def prefill(self, inputs: PrefixInputs, valid_slots: Sequence[str] | None = None) -> Prefix:
        """`prefill`; `valid_slots` (one compilation per set in use): only those slots are
        encoded; every slot (None, or all of them) is the one compilation openpi's way."""
        if valid_slots is not None:
            valid_slots = tuple(k for k in self.config.image_keys if k in set(valid_slots))
            if len(valid_slots) == len(self.config.image_keys):
                valid_slots = None
        return self._fns.prefill(self._leaves, inputs, valid_slots)

    def denoise(self, prefix: Prefix, noise: Array, num_steps: int | None = None) -> Array:
        steps = self.config.num_denoise_steps if num_steps is None else num_steps
        return self._fns.denoise(self._leaves, prefix, noise, steps)

    def denoise_rtc(
        self,
        prefix: Prefix,
        noise: Array,
        previous: Array,
        frozen_rows: int | Array,
        guided_rows: int | Array,
        max_guidance: float | Array,
        num_steps: int | None = None,
    ) -> Array:
        """`rtc.denoise_rtc`. Row counts become int32 and `max_guidance` float32 arrays here
        (a Python int, a NumPy scalar or a device array of one shape share one compilation);
        a scalar and a per-row [B] count are two shapes, so two compilations."""
        steps = self.config.num_denoise_steps if num_steps is None else num_steps
        rows = (np.asarray(frozen_rows, np.int32), np.asarray(guided_rows, np.int32))
        beta = np.asarray(max_guidance, np.float32)
        return self._fns.denoise_rtc(self._leaves, prefix, noise, steps, previous, *rows, beta)

    def extend(
        self, store: Prefix, prefix_index: Array, tail_tokens: Array, tail_mask: Array
    ) -> tuple[Array, Array, Array]:
        return self._fns.extend(
            self._leaves, store, prefix_index, tail_tokens, tail_mask, self.vocab_size
        )

    def decode_step(self, *args: Array | Prefix) -> tuple[Array, Array, Array]:
        """`decode_step(store, slot_prefix, gen_k, gen_v, gen_len, tokens, active)`; gen_k and
        gen_v are donated (do not reuse the passed arrays)."""
        return self._fns.decode_step(self._leaves, *args, self.vocab_size)

    def prefill_openpi(self, inputs: PrefixInputs) -> Prefix:
        """`prefill_openpi`: every slot, through openpi's module (the reference)."""
        return self._fns.prefill_openpi(self._leaves, inputs)

    def extend_openpi(self, *args: Array | Prefix) -> tuple[Array, Array, Array]:
        """`extend_openpi`, arguments as `extend`: the reference through openpi's module."""
        return self._fns.extend_openpi(self._leaves, *args, self.vocab_size)

    def decode_step_openpi(self, *args: Array | Prefix) -> tuple[Array, Array, Array]:
        """`decode_step_openpi`, arguments as `decode_step` (donated likewise): the reference
        through openpi's module."""
        return self._fns.decode_step_openpi(self._leaves, *args, self.vocab_size)

    def decode_sample(
        self,
        store: Prefix,
        slot_prefix: Array,
        gen_k: Array,
        gen_v: Array,
        gen_len: Array,
        tokens: Array,
        active: Array,
        temperature: Array,
        seeds: Array,
        indices: Array,
    ) -> tuple[Array, Array, Array]:
        """As `decode_sample`; gen_k and gen_v are donated."""
        args = (store, slot_prefix, gen_k, gen_v, gen_len, tokens, active)
        sampling = (temperature, seeds, indices, self.vocab_size, needs_sampling(temperature))
        return self._fns.decode_sample(self._leaves, *args, *sampling)

    def sample_tokens(
        self, logits: Array, temperature: Array, seeds: Array, indices: Array
    ) -> Array:
        """`sample_tokens`; `temperature` is read on the host (greedy or sampling variant)."""
        return self._fns.sample_tokens(
            logits, temperature, seeds, indices, needs_sampling(temperature)
        )

    def full_forward_logits(
        self, inputs: PrefixInputs, text_tokens: Array, text_mask: Array
    ) -> Array:
        return self._fns.full_forward_logits(
            self._leaves, inputs, text_tokens, text_mask, self.vocab_size
        )

    def lower(self, name: str, *args: object) -> jax.stages.Lowered:
        """The jitted function `name` lowered for these parameters and `args` (its arguments
        after the parameters, static ones included, e.g. `self.vocab_size`), without running
        it: `.compile().cost_analysis()` gives XLA's FLOP and byte counts (benchmarks)."""
        fn = getattr(self._fns, name)
        if name == "sample_tokens":  # the one function without parameters
            return fn.lower(*args)
        return fn.lower(self._leaves, *args)

    def empty_gen_cache(self, num_slots: int, max_seq_len: int) -> tuple[Array, Array]:
        """Zeroed gen cache k, v [L, num_slots, max_seq_len, K, H] in the compute dtype."""
        llm = gemma_config(self.config.paligemma_variant)
        shape = (llm.depth, num_slots, max_seq_len, llm.num_kv_heads, llm.head_dim)
        return jnp.zeros(shape, self.config.dtype), jnp.zeros(shape, self.config.dtype)
