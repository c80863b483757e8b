"""The prefix LLM's forward for new language tokens, with cascade attention over the cache.

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

The layer is openpi's math with openpi's parameters (the first expert of
`openpi.models.gemma.Module`, read from the model's state, nothing copied): RMSNorm with
`1 + scale` computed in float32, RoPE (max wavelength 10,000) on q and k, q scaled by
head_dim^-0.5 after RoPE, grouped-query heads (`q_einsum`, `kv_einsum`), scores in float32
masked with openpi's finite big negative, softmax probabilities cast to the compute dtype
before they weight v, the output projection, the tanh-approximated GELU-gated MLP, residuals
after attention and MLP, the final norm, and the tied embedding as output head.
`test/test_cascade.py` compares it with openpi's module.

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


class LlmParams(NamedTuple):
    """The prefix LLM's parameters (openpi's first expert), layers stacked on axis 0."""

    embedding: Float[Array, "v d"]
    q: Float[Array, "l n d h"]
    kv: Float[Array, "l 2 k d h"]
    out: Float[Array, "l n h d"]
    gating: Float[Array, "l 2 d f"]
    linear: Float[Array, "l f d"]
    attn_norm: Float[Array, "l d"]
    ffw_norm: Float[Array, "l d"]
    final_norm: Float[Array, " d"]


def llm_params(llm: nnx.Module) -> LlmParams:
    """The first expert's parameters of openpi's two-expert Gemma (`Pi05Model.llm`)."""
    state = nnx.state(llm)
    layers = state["layers"]
    if "q_einsum" not in layers["attn"]:
        raise ValueError("cascade decoding needs grouped-query heads (q_einsum and kv_einsum)")

    def value(leaf: object) -> Array:
        return leaf.get_value()  # type: ignore[attr-defined]

    return LlmParams(
        embedding=value(state["embedder"]["input_embedding"]),
        q=value(layers["attn"]["q_einsum"]["w"]),
        kv=value(layers["attn"]["kv_einsum"]["w"]),
        out=value(layers["attn"]["attn_vec_einsum"]["w"]),
        gating=value(layers["mlp"]["gating_einsum"]),
        linear=value(layers["mlp"]["linear"]),
        attn_norm=value(layers["pre_attention_norm"]["scale"]),
        ffw_norm=value(layers["pre_ffw_norm"]["scale"]),
        final_norm=value(state["final_norm"]["scale"]),
    )


def rms_norm(x: Float[Array, "*n d"], scale: Float[Array, " d"]) -> Float[Array, "*n d"]:
    variance = jnp.mean(jnp.square(x.astype(jnp.float32)), axis=-1, keepdims=True)
    normed = x * jnp.reciprocal(jnp.sqrt(variance + RMS_EPS))
    return (normed * (1 + scale)).astype(x.dtype)


def rope(x: Float[Array, "b q n h"], positions: Int[Array, "b q"]) -> Float[Array, "b q n h"]:
    half = x.shape[-1] // 2
    exponents = (2.0 / x.shape[-1]) * jnp.arange(half, dtype=jnp.float32)
    radians = positions[..., None, None] / (ROPE_MAX_WAVELENGTH**exponents)
    sin, cos = jnp.sin(radians), jnp.cos(radians)
    x1, x2 = x[..., :half], x[..., half:]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


def embed(params: LlmParams, tokens: Int[Array, "b q"], dtype: jnp.dtype) -> Float[Array, "b q d"]:
    table = params.embedding
    scale = jnp.sqrt(table.shape[-1]).astype(table.dtype)
    return (table[tokens] * scale).astype(dtype)


def logits(
    params: LlmParams, hidden: Float[Array, "*n d"], vocab_size: int | None = None
) -> Float[Array, "*n v"]:
    """The tied-embedding head over the first `vocab_size` rows (None: all)."""
    table = params.embedding if vocab_size is None else params.embedding[:vocab_size]
    return jnp.dot(hidden, table.T)


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
    scores = jnp.einsum("bkgqh,bskh->bkgqs", q, k, preferred_element_type=jnp.float32)
    visible = visible[:, None, None]
    scores = jnp.where(visible, scores, BIG_NEG)
    top = jnp.max(scores, axis=-1)
    weights = jnp.where(visible, jnp.exp(scores - top[..., None]), 0.0)
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
    store_k: Float[Array, "l p s k h"],
    store_v: Float[Array, "l p s k h"],
    prefix_index: Int[Array, " b"],
    prefix_visible: Bool[Array, "b s"],
    new_visible: Bool[Array, "b q q"],
    cache_k: Float[Array, "l b t k h"] | None = None,
    cache_v: Float[Array, "l b t k h"] | None = None,
    cache_visible: Bool[Array, "b t"] | None = None,
) -> tuple[Float[Array, "b q d"], Float[Array, "l b q k h"], Float[Array, "l b q k h"]]:
    """The new tokens `x` (embedded) through every layer; returns the final-normed hidden
    states and the new tokens' k/v per layer (keys rotated, as openpi stores them).

    Row b's tokens see prefix `prefix_index[b]` where `prefix_visible[b]`, the row's generated
    cache where `cache_visible[b]`, and each other where `new_visible[b]`; a token that sees
    nothing else must see itself (every row of `new_visible` holds its diagonal).
    """
    heads, kv_heads = params.q.shape[1], params.kv.shape[2]
    scale = params.q.shape[-1] ** -0.5
    dtype = x.dtype
    prefix_mask = prefix_visible[:, None, :]
    cache_mask = None if cache_visible is None else cache_visible[:, None, :]

    def layer(x: Array, xs: tuple) -> tuple[Array, tuple[Array, Array]]:
        p, store_k_l, store_v_l, cache_k_l, cache_v_l = xs
        h = rms_norm(x, p.attn_norm)
        q = jnp.einsum("bqd,ndh->bqnh", h, p.q.astype(dtype))
        k, v = jnp.einsum("bqd,2kdh->2bqkh", h, p.kv.astype(dtype))
        q = rope(q, positions) * jnp.asarray(scale, dtype)
        k = rope(k, positions)
        q5 = q.reshape(*q.shape[:2], kv_heads, heads // kv_heads, q.shape[-1])
        q5 = jnp.transpose(q5, (0, 2, 3, 1, 4))  # b k g q h
        parts = [
            _part(q5, store_k_l[prefix_index], store_v_l[prefix_index], prefix_mask),
            _part(q5, k, v, new_visible),
        ]
        if cache_k_l is not None:
            parts.append(_part(q5, cache_k_l, cache_v_l, cache_mask))
        attended = jnp.transpose(merge(parts, dtype), (0, 3, 1, 2, 4))  # b q k g h
        attended = attended.reshape(*attended.shape[:2], heads, attended.shape[-1])
        x = x + jnp.einsum("bqnh,nhd->bqd", attended, p.out.astype(dtype))
        h = rms_norm(x, p.ffw_norm)
        gating = p.gating.astype(dtype)
        hidden = jax.nn.gelu(jnp.dot(h, gating[0])) * jnp.dot(h, gating[1])
        x = x + jnp.dot(hidden, p.linear.astype(dtype))
        return x, (k, v)

    layer_params = params._replace(embedding=None, final_norm=None)
    x, (new_k, new_v) = jax.lax.scan(layer, x, (layer_params, store_k, store_v, cache_k, cache_v))
    return rms_norm(x, params.final_norm), new_k, new_v
