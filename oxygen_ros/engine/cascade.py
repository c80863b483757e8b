"""One Gemma expert's forward for new tokens, with cascade attention over the cache: the
prefix LLM for the prefill, tail extends and decode steps, the action expert (adaRMS) for the
flow's velocity.

A language row (a slot) reads a stored prefix (images + prompt, shared by every row admitted
with it) and its own generated cache (tail, then generated tokens). openpi's `gemma.Module`
takes one contiguous cache per row, so the serving path used to gather each row's prefix
([L, B, S, K, H]), concatenate it with the generated cache, and openpi concatenated the new
token's k/v again in every layer: three copies of the largest thing a decode step reads.
Here attention is computed per part, where each part lies, and the parts are merged by their
log-sum-exp (FlashInfer's cascade attention, vLLM's `merge_attn_states`):

    prefix part:  the row's stored prefix, read in the store (one gather per layer)
    cache part:   the row's first `cache_len` generated-cache entries, read in place
    new part:     the new tokens themselves (causal among them)

and the new tokens' k/v are returned per layer, for the caller to write in place (one scatter
into the donated cache, `model_fns.decode_step`).

The layer is openpi's math with openpi's parameters (an expert of
`openpi.models.gemma.Module`, read from the model's state, nothing copied): RMSNorm with
`1 + scale` computed in float32 (the action expert's adaptive: scale, shift and gate from a
Dense of the condition, the gate on both residuals), RoPE (max wavelength 10,000) on q and k,
q scaled by head_dim^-0.5 after RoPE, grouped-query heads (`q_einsum`, `kv_einsum`), scores in
float32 masked with openpi's finite big negative, softmax probabilities cast to the compute
dtype before they weight v, the output projection, the tanh-approximated GELU-gated MLP,
residuals after attention and MLP, and the final norm (embedding and output head are the
model's own, openpi's `Embedder`).
With one kv head (every openpi Gemma) each attention product is a 3-axis batched dot over the
rows (XLA:CPU runs the 5-axis form about 2x slower) and, for one row, one 2D matmul (the
batched dot is about 3.5x slower still). `test/engine/test_cascade.py` compares it with openpi's
module.

Axes: L layers, B rows, Q new tokens per row, P stored prefixes, S prefix length, T generated
cache length, N query heads, K kv heads, G query heads per kv head, H head dim, D width,
F MLP width, V vocabulary.
"""

# jaxtyping shape strings ("b s d") are not Python expressions; pyflakes' F722 misreads them.

from __future__ import annotations

from typing import NamedTuple

import flax.nnx as nnx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

BIG_NEG = -2.3819763e38  # openpi's (big_vision's) masked score
ROPE_MAX_WAVELENGTH = 10_000
RMS_EPS = 1e-6


class Dense(NamedTuple):
    kernel: Float[Array, "*l w o"]
    bias: Float[Array, "*l o"]


class LlmParams(NamedTuple):
    """One expert's layers of openpi's two-expert Gemma, stacked on axis 0, and its final
    norm: the prefix LLM (expert 0: plain RMSNorm scales) or the action expert (expert 1:
    adaRMS modulations, Dense layers of the condition, in place of the scales). Embedding and
    output head stay the model's own (`Pi05Model.embed_tokens`, `.logits`)."""

    q: Float[Array, "l n d h"]
    kv: Float[Array, "l 2 k d h"]
    out: Float[Array, "l n h d"]
    gating: Float[Array, "l 2 d f"]
    linear: Float[Array, "l f d"]
    attn_norm: Float[Array, "l d"] | Dense
    ffw_norm: Float[Array, "l d"] | Dense
    final_norm: Float[Array, " d"] | Dense


def llm_params(llm: nnx.Module, expert: int = 0) -> LlmParams:
    """Expert `expert`'s parameters of openpi's two-expert Gemma (`Pi05Model.llm`): 0 the
    prefix LLM, 1 the action expert (its norms adaptive: `Dense` modulations)."""
    state = nnx.state(llm)
    layers = state["layers"]
    suffix = "" if expert == 0 else f"_{expert}"
    if f"q_einsum{suffix}" not in layers["attn"]:
        raise ValueError("cascade attention needs grouped-query heads (q_einsum and kv_einsum)")

    def value(leaf: object) -> Array:
        return leaf.get_value()  # type: ignore[attr-defined]

    def norm(node: object) -> Array | Dense:
        if "scale" in node:  # type: ignore[operator]
            return value(node["scale"])  # type: ignore[index]
        dense = node["Dense_0"]  # type: ignore[index]
        return Dense(value(dense["kernel"]), value(dense["bias"]))

    attn = layers["attn"]
    return LlmParams(
        q=value(attn[f"q_einsum{suffix}"]["w"]),
        kv=value(attn[f"kv_einsum{suffix}"]["w"]),
        out=value(attn[f"attn_vec_einsum{suffix}"]["w"]),
        gating=value(layers[f"mlp{suffix}"]["gating_einsum"]),
        linear=value(layers[f"mlp{suffix}"]["linear"]),
        attn_norm=norm(layers[f"pre_attention_norm{suffix}"]),
        ffw_norm=norm(layers[f"pre_ffw_norm{suffix}"]),
        final_norm=norm(state[f"final_norm{suffix}"]),
    )


def _normalized(x: Float[Array, "*n d"]) -> Float[Array, "*n d"]:
    """x / rms(x), the variance in float32 (the product in float32)."""
    variance = jnp.mean(jnp.square(x.astype(jnp.float32)), axis=-1, keepdims=True)
    return x * jnp.reciprocal(jnp.sqrt(variance + RMS_EPS))


def rms_norm(x: Float[Array, "*n d"], scale: Float[Array, " d"]) -> Float[Array, "*n d"]:
    return (_normalized(x) * (1 + scale)).astype(x.dtype)


def norm(
    x: Float[Array, "b q d"], weights: Array | Dense, cond: Float[Array, "b c"] | None
) -> tuple[Float[Array, "b q d"], Float[Array, "b 1 d"] | None]:
    """openpi's RMSNorm: plain (`weights` a scale; no gate) or adaptive (`weights` the Dense
    of the condition: scale, shift and the residual's gate)."""
    if not isinstance(weights, Dense):
        return rms_norm(x, weights), None
    dtype = x.dtype
    modulation = cond.astype(dtype) @ weights.kernel.astype(dtype) + weights.bias.astype(dtype)
    scale, shift, gate = jnp.split(modulation[:, None, :], 3, axis=-1)
    return (_normalized(x) * (1 + scale) + shift).astype(dtype), gate


def _residual(x: Array, y: Array, gate: Array | None) -> Array:
    return x + y if gate is None else x + y * gate


def rope(x: Float[Array, "b q n h"], positions: Int[Array, "b q"]) -> Float[Array, "b q n h"]:
    half = x.shape[-1] // 2
    exponents = (2.0 / x.shape[-1]) * jnp.arange(half, dtype=jnp.float32)
    radians = positions[..., None, None] / (ROPE_MAX_WAVELENGTH**exponents)
    sin, cos = jnp.sin(radians), jnp.cos(radians)
    x1, x2 = x[..., :half], x[..., half:]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


class _Part(NamedTuple):
    """Attention of the queries over one part of the keys, before normalisation."""

    top: Float[Array, "b k g q"]  # max masked score (BIG_NEG where nothing is visible)
    total: Float[Array, "b k g q"]  # sum of exp(score - top) over visible keys
    weighted: Float[Array, "b k g q h"]  # sum of exp(score - top) * v over visible keys


def _part(
    q: Float[Array, "b k g q h"],
    k: Float[Array, "b s k h"],
    v: Float[Array, "b s k h"],
    visible: Bool[Array, "b q s"],
) -> _Part:
    batch, kv_heads, groups, queries, _ = q.shape
    if kv_heads == 1:  # 3-axis products: XLA:CPU's 5-axis batched dot is ~2x slower
        q3 = q.reshape(batch, groups * queries, q.shape[-1])
        if batch == 1:  # one 2D matmul: XLA:CPU's batched dot is ~3.5x slower still
            scores = jnp.dot(q3[0], k[0, :, 0].T, preferred_element_type=jnp.float32)[None]
        else:
            scores = jnp.einsum("bgh,bsh->bgs", q3, k[:, :, 0], preferred_element_type=jnp.float32)
        scores = scores.reshape(q.shape[:-1] + k.shape[1:2])
    else:
        scores = jnp.einsum("bkgqh,bskh->bkgqs", q, k, preferred_element_type=jnp.float32)
    visible = visible[:, None, None]
    scores = jnp.where(visible, scores, BIG_NEG)
    top = jnp.max(scores, axis=-1)
    weights = jnp.where(visible, jnp.exp(scores - top[..., None]), 0.0)
    if kv_heads == 1:
        flat = weights.astype(v.dtype).reshape(batch, groups * queries, k.shape[1])
        if batch == 1:
            weighted = jnp.dot(flat[0], v[0, :, 0], preferred_element_type=jnp.float32)[None]
        else:
            weighted = jnp.einsum(
                "bgs,bsh->bgh", flat, v[:, :, 0], preferred_element_type=jnp.float32
            )
        weighted = weighted.reshape(q.shape)
    else:
        weighted = jnp.einsum(
            "bkgqs,bskh->bkgqh", weights.astype(v.dtype), v, preferred_element_type=jnp.float32
        )
    return _Part(top, jnp.sum(weights, axis=-1), weighted)


def merge(parts: list[_Part], dtype: jnp.dtype) -> Float[Array, "b k g q h"]:
    """Softmax attention over the union of the parts, from each part's (max, sum, weighted v)
    (their log-sum-exp): rescale each to the common max and normalise once."""
    top = parts[0].top
    for part in parts[1:]:
        top = jnp.maximum(top, part.top)
    total = sum(part.total * jnp.exp(part.top - top) for part in parts)
    weighted = sum(part.weighted * jnp.exp(part.top - top)[..., None] for part in parts)
    return (weighted / total[..., None]).astype(dtype)


def forward(
    params: LlmParams,
    x: Float[Array, "b q d"],
    positions: Int[Array, "b q"],
    store_k: Float[Array, "l p s k h"] | None,
    store_v: Float[Array, "l p s k h"] | None,
    prefix_index: Int[Array, " b"] | None,
    prefix_visible: Bool[Array, "b s"] | None,
    new_visible: Bool[Array, "b q q"],
    cache_k: Float[Array, "l b t k h"] | None = None,
    cache_v: Float[Array, "l b t k h"] | None = None,
    cache_visible: Bool[Array, "b t"] | None = None,
    cond: Float[Array, "b c"] | None = None,
) -> tuple[Float[Array, "b q d"], Float[Array, "l b q k h"], Float[Array, "l b q k h"]]:
    """The new tokens `x` (embedded) through every layer; returns the final-normed hidden
    states and the new tokens' k/v per layer (keys rotated, as openpi stores them).

    Row b's tokens see prefix `prefix_index[b]` where `prefix_visible[b]` (no store: no
    prefix part, as in the prefill), the row's generated cache where `cache_visible[b]`, and
    each other where `new_visible[b]`; a token that sees nothing else must see itself (give
    every row of `new_visible` its diagonal: an empty softmax would be 0 / 0).
    `prefix_index` None: row b reads stored prefix b (no gather). `cond`: the adaRMS condition
    of an action expert's parameters (its gated residuals).
    """
    heads, kv_heads = params.q.shape[1], params.kv.shape[2]
    scale = params.q.shape[-1] ** -0.5
    dtype = x.dtype
    prefix_mask = None if prefix_visible is None else prefix_visible[:, None, :]
    cache_mask = None if cache_visible is None else cache_visible[:, None, :]

    def layer(x: Array, xs: tuple) -> tuple[Array, tuple[Array, Array]]:
        p, store_k_l, store_v_l, cache_k_l, cache_v_l = xs
        h, gate = norm(x, p.attn_norm, cond)
        q = jnp.einsum("bqd,ndh->bqnh", h, p.q.astype(dtype))
        k, v = jnp.einsum("bqd,2kdh->2bqkh", h, p.kv.astype(dtype))
        q = rope(q, positions) * jnp.asarray(scale, dtype)
        k = rope(k, positions)
        q5 = q.reshape(*q.shape[:2], kv_heads, heads // kv_heads, q.shape[-1])
        q5 = jnp.transpose(q5, (0, 2, 3, 1, 4))  # b k g q h
        parts = [_part(q5, k, v, new_visible)]
        if store_k_l is not None:
            if prefix_index is not None:
                store_k_l, store_v_l = store_k_l[prefix_index], store_v_l[prefix_index]
            parts.append(_part(q5, store_k_l, store_v_l, prefix_mask))
        if cache_k_l is not None:
            parts.append(_part(q5, cache_k_l, cache_v_l, cache_mask))
        attended = jnp.transpose(merge(parts, dtype), (0, 3, 1, 2, 4))  # b q k g h
        attended = attended.reshape(*attended.shape[:2], heads, attended.shape[-1])
        x = _residual(x, jnp.einsum("bqnh,nhd->bqd", attended, p.out.astype(dtype)), gate)
        h, gate = norm(x, p.ffw_norm, cond)
        gating = p.gating.astype(dtype)
        hidden = jax.nn.gelu(jnp.dot(h, gating[0])) * jnp.dot(h, gating[1])
        x = _residual(x, jnp.dot(hidden, p.linear.astype(dtype)), gate)
        return x, (k, v)

    layer_params = params._replace(final_norm=None)
    x, (new_k, new_v) = jax.lax.scan(layer, x, (layer_params, store_k, store_v, cache_k, cache_v))
    return norm(x, params.final_norm, cond)[0], new_k, new_v
