"""openpi's own module path for every model function the engine runs its own way: the
references the engine's paths are tested against and the before of their benchmarks.

`prefill_openpi`, `action_velocity_openpi`, `extend_openpi`, `decode_step_openpi` and
`full_forward_logits` (the uncached pass: prefix and text in one forward) all call
`openpi.models.gemma.Module` (`Pi05Model.llm`): caches are gathered and concatenated into
one per row, attention is openpi's five-axis einsum. `model_fns` jits them beside its own
(`JitModel.prefill_openpi`, `.extend_openpi`, `.decode_step_openpi`,
`.full_forward_logits`); `test/engine/test_cascade.py` and `test_model_fns.py` compare.
"""

# jaxtyping shape strings ("b s d") are not Python expressions; pyflakes' F722 misreads them.

from __future__ import annotations

from collections.abc import Callable

import einops
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int
from openpi.models.pi0 import make_attn_mask

from oxygen_ros.engine.model import Pi05Model
from oxygen_ros.engine.model_fns import Prefix, PrefixInputs, suffix_layout


def prefill_openpi(model: Pi05Model, inputs: PrefixInputs) -> Prefix:
    """`prefill` (every slot) through openpi's `gemma.Module`: the reference and the before of
    `benchmarks/prefill_slots.py`."""
    embedded, mask, ar_mask = model.embed_prefix(
        inputs.images, inputs.image_masks, inputs.tokens, inputs.token_mask
    )
    positions = jnp.cumsum(mask, axis=1) - 1
    _, (k, v) = model.llm(
        [embedded, None], mask=make_attn_mask(mask, ar_mask), positions=positions
    )
    return Prefix(k, v, mask)


def action_velocity_openpi(
    model: Pi05Model, prefix: Prefix, horizon: int
) -> Callable[[Float[Array, "b a j"], Float[Array, ""]], Float[Array, "b a j"]]:
    """`action_velocity` through openpi's `gemma.Module` (prefix cache concatenated with the
    action tokens' k/v in every layer): the reference `test_cascade` compares with."""
    batch = prefix.mask.shape[0]
    among, positions = suffix_layout(prefix, horizon)
    attn_mask = jnp.concatenate(
        [einops.repeat(prefix.mask, "b s -> b a s", a=horizon), among], axis=-1
    )

    def velocity(x_t: Array, time: Array) -> Array:
        tokens, adarms_cond = model.embed_suffix(x_t, jnp.broadcast_to(time, batch))
        (_, out), _ = model.llm(
            [None, tokens],
            mask=attn_mask,
            positions=positions,
            kv_cache=(prefix.k, prefix.v),
            adarms_cond=[None, adarms_cond],
        )
        return model.action_out_proj(out[:, -horizon:])

    return velocity


def _gather_prefix(store: Prefix, index: Int[Array, " b"]) -> Prefix:
    return Prefix(store.k[:, index], store.v[:, index], store.mask[index])


def extend_openpi(
    model: Pi05Model,
    store: Prefix,
    prefix_index: Int[Array, " b"],
    tail_tokens: Int[Array, "b t"],
    tail_mask: Bool[Array, "b t"],
    vocab_size: int | None = None,
) -> tuple[Float[Array, "l b t k h"], Float[Array, "l b t k h"], Float[Array, "b v"]]:
    """`extend` through openpi's `gemma.Module`, the row's prefix gathered and concatenated
    (the serving path before cascade attention; the reference `test_cascade` compares with).

    Row b reads prefix `store[prefix_index[b]]`; its tail is left-aligned (tail_mask a run
    of True then False) and starts at the prefix's valid length. Returns the tails' k/v
    [L, B, T, K, H] (padded positions hold junk, beyond the row's tail length) and the
    logits of each row's last valid tail token (first `vocab_size` ids; None: all).
    """
    prefix = _gather_prefix(store, prefix_index)
    num_tail = tail_tokens.shape[1]
    start = jnp.sum(prefix.mask, axis=-1)
    positions = start[:, None] + jnp.cumsum(tail_mask, axis=-1) - 1
    causal = make_attn_mask(tail_mask, jnp.ones((num_tail,), dtype=bool))
    attn_mask = jnp.concatenate(
        [einops.repeat(prefix.mask, "b s -> b t s", t=num_tail), causal], axis=-1
    )
    (out, _), (k, v) = model.llm(
        [model.embed_tokens(tail_tokens), None],
        mask=attn_mask,
        positions=positions,
        kv_cache=(prefix.k, prefix.v),
    )
    last = jnp.maximum(jnp.sum(tail_mask, axis=-1) - 1, 0)
    hidden = jnp.take_along_axis(out, last[:, None, None], axis=1)[:, 0]
    num_prefix = prefix.k.shape[2]
    return k[:, :, num_prefix:], v[:, :, num_prefix:], model.logits(hidden, vocab_size)


def decode_step_openpi(
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
    """`decode_step` through openpi's `gemma.Module`: each row's prefix gathered and
    concatenated with the gen cache (the serving path before cascade attention; the reference
    `test_cascade` compares with).

    Row b feeds `tokens[b]` at position valid_len(prefix) + gen_len[b], attends to its stored
    prefix `store[slot_prefix[b]]`, to its first gen_len[b] gen-cache entries and to itself,
    and writes its k/v at gen-cache index gen_len[b]. Inactive rows write nothing. Logits
    cover the first `vocab_size` ids (None: all).
    """
    batch, capacity = gen_k.shape[1], gen_k.shape[2]
    prefix = _gather_prefix(store, slot_prefix)
    positions = (jnp.sum(prefix.mask, axis=-1) + gen_len)[:, None]
    gen_valid = jnp.arange(capacity)[None, :] < gen_len[:, None]
    attn_mask = jnp.concatenate(
        [
            prefix.mask & active[:, None],
            gen_valid & active[:, None],
            jnp.ones((batch, 1), dtype=bool),
        ],
        axis=-1,
    )[:, None, :]
    cache = (
        jnp.concatenate([prefix.k, gen_k], axis=2),
        jnp.concatenate([prefix.v, gen_v], axis=2),
    )
    (out, _), (k, v) = model.llm(
        [model.embed_tokens(tokens[:, None]), None],
        mask=attn_mask,
        positions=positions,
        kv_cache=cache,
    )
    rows = jnp.arange(batch)
    write_at = jnp.where(active, gen_len, capacity)  # out of range: dropped
    gen_k = gen_k.at[:, rows, write_at].set(k[:, :, -1], mode="drop")
    gen_v = gen_v.at[:, rows, write_at].set(v[:, :, -1], mode="drop")
    return model.logits(out[:, 0], vocab_size), gen_k, gen_v


def full_forward_logits(
    model: Pi05Model,
    inputs: PrefixInputs,
    text_tokens: Int[Array, "b t"],
    text_mask: Bool[Array, "b t"],
    vocab_size: int | None = None,
) -> Float[Array, "b t v"]:
    """Uncached reference: prefix (bidirectional) + text (causal) in one pass.

    Returns the logits after every text token (first `vocab_size` ids; None: all).
    """
    embedded, mask, ar_mask = model.embed_prefix(
        inputs.images, inputs.image_masks, inputs.tokens, inputs.token_mask
    )
    embedded = jnp.concatenate([embedded, model.embed_tokens(text_tokens)], axis=1)
    mask = jnp.concatenate([mask, text_mask], axis=1)
    ar_mask = jnp.concatenate([ar_mask, jnp.ones((text_tokens.shape[1],), dtype=bool)])
    positions = jnp.cumsum(mask, axis=1) - 1
    (out, _), _ = model.llm(
        [embedded, None], mask=make_attn_mask(mask, ar_mask), positions=positions
    )
    return model.logits(out[:, -text_tokens.shape[1] :], vocab_size)
