"""Training loss: openpi's flow-matching action loss plus next-token cross-entropy on language
targets placed exactly as the engine serves them.

Token layout (the engine's prefill, extend and denoise, in two passes of the model):

    pass 1, prefix LLM:    [ prefix: images + pi0.5 prompt | language block: tail + target ]
    pass 2, action expert: [ noisy actions ], reading pass 1's KV cache

- prefix: bidirectional over its valid tokens (openpi), positions cumsum(mask) - 1;
- language block: each kind's segment attends the valid prefix and, causally, its own earlier
  tokens, never another segment; a segment's token i sits at position valid_len(prefix) + i.
  That is `model_fns.extend` + `decode_step` (and the uncached `full_forward_logits`): what
  the engine decodes at run time is what is trained here.
- actions: openpi's `Pi0.compute_loss` suffix: noisy actions x_t = t * noise + (1 - t) * a
  with t ~ Beta(1.5, 1) * 0.999 + 0.001, adaRMS time conditioning, attending the valid prefix
  and each other (never the language block); target u_t = noise - a; loss = mean over the
  action dim of (v_t - u_t)^2. The random streams are split as openpi splits them
  (preprocess, noise, time), so for the same rng the action loss equals openpi's (a test
  compares on openpi's own Pi0). With `action_draws` k > 1, each row gets k independent
  (noise, time) draws, each read against the same prefix cache (pass 2 runs k copies of the
  rows), and its loss is their mean: k samples of openpi's loss for one prefix pass.

Images pass through openpi's `preprocess_observation` at the model resolution (its training
augmentations when `augment` is on).

Invariants:
- The action loss does not depend on the language block (actions never attend it).
- Logits cover the first `vocab_size` ids, as the engine's `JitModel` does.
"""

# jaxtyping shape strings ("b s d") are not Python expressions; pyflakes' F722 misreads them.

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax
from jaxtyping import Array, Bool, Float, Int
from openpi.models import model as _openpi_model
from openpi.models.pi0 import make_attn_mask

from oxygen_ros.engine import model_fns
from oxygen_ros.engine.model import Pi05Model


class Batch(NamedTuple):
    """One training batch (images float in [-1, 1])."""

    images: dict[str, Float[Array, "b h w 3"]]
    image_masks: dict[str, Bool[Array, " b"]]
    tokens: Int[Array, "b l"]
    token_mask: Bool[Array, "b l"]
    actions: Float[Array, "b a j"]  # normalised, padded to the model's action dim
    lang_tokens: Int[Array, "b t"]
    lang_mask: Bool[Array, "b t"]
    lang_segment: Int[Array, "b t"]
    lang_index: Int[Array, "b t"]
    lang_labels: Int[Array, "b t"]
    lang_loss_mask: Bool[Array, "b t"]


class Losses(NamedTuple):
    action: Float[Array, "b a"]  # openpi's per-row flow-matching loss
    token_nll: Float[Array, "b t"]  # cross-entropy per language position (0 where unmasked)
    token_correct: Bool[Array, "b t"]  # argmax == label (False where unmasked)


def flow_inputs(
    rng: jax.Array, actions: Float[Array, "b a j"], draws: int = 1, noise_scale: float = 1.0
) -> tuple[jax.Array, Float[Array, "k b a j"], Float[Array, "k b a j"], Float[Array, "k b"]]:
    """openpi's draws for one batch: (preprocess rng, x_t, u_t, time), `draws` independent
    (noise, time) pairs per row; with one draw, exactly openpi's (same rng split and shapes).

    `noise_scale` multiplies the noise (1: openpi's). 0 trains the flow from zero noise, the
    path the engine samples with `action_noise_scale` 0: x_t = (1 - t) a and u_t = -a at every
    t, so Euler steps from zero stay on the line to the chunk: the head is trained as a
    deterministic function of the prefix, as a regression head is."""
    if draws < 1:
        raise ValueError(f"need draws >= 1, got {draws}")
    if not 0.0 <= noise_scale <= 1.0:
        raise ValueError(f"noise_scale must be in [0, 1], got {noise_scale}")
    preprocess_rng, noise_rng, time_rng = jax.random.split(rng, 3)
    shape = actions.shape if draws == 1 else (draws, *actions.shape)
    noise = jax.random.normal(noise_rng, shape).reshape(draws, *actions.shape)
    if noise_scale != 1.0:  # 1 leaves openpi's draws bit for bit
        noise = noise_scale * noise
    time = jax.random.beta(time_rng, 1.5, 1, shape[:-2]) * 0.999 + 0.001
    time = time.reshape(draws, actions.shape[0])
    expanded = time[..., None, None]
    return preprocess_rng, expanded * noise + (1 - expanded) * actions, noise - actions, time


def _preprocess_images(
    model: Pi05Model, rng: jax.Array, batch: Batch, augment: bool
) -> dict[str, Array]:
    observation = _openpi_model.Observation(
        images=batch.images,
        image_masks=batch.image_masks,
        state=jnp.zeros((batch.tokens.shape[0], model.config.action_dim), jnp.float32),
        tokenized_prompt=batch.tokens,
        tokenized_prompt_mask=batch.token_mask,
    )
    processed = _openpi_model.preprocess_observation(
        rng,
        observation,
        train=augment,
        image_keys=model.config.image_keys,
        image_resolution=model.config.image_resolution,
    )
    return processed.images


def context_layout(
    prefix_mask: Bool[Array, "b s"],
    lang_mask: Bool[Array, "b t"],
    lang_segment: Int[Array, "b t"],
    lang_index: Int[Array, "b t"],
) -> tuple[Bool[Array, "b n n"], Int[Array, "b n"]]:
    """Attention mask and positions of [prefix | language block] (n = s + t)."""
    num_lang = lang_mask.shape[1]
    # openpi's prefix: bidirectional over the valid tokens.
    prefix_prefix = make_attn_mask(prefix_mask, jnp.zeros((prefix_mask.shape[1],), dtype=bool))
    same_segment = lang_segment[:, :, None] == lang_segment[:, None, :]
    causal = lang_index[:, None, :] <= lang_index[:, :, None]
    lang_lang = same_segment & causal & lang_mask[:, :, None] & lang_mask[:, None, :]
    lang_prefix = lang_mask[:, :, None] & prefix_mask[:, None, :]
    rows_prefix = jnp.concatenate(
        [prefix_prefix, jnp.zeros((*prefix_mask.shape, num_lang), bool)], axis=2
    )
    rows_lang = jnp.concatenate([lang_prefix, lang_lang], axis=2)
    mask = jnp.concatenate([rows_prefix, rows_lang], axis=1)
    valid_len = jnp.sum(prefix_mask, axis=-1)[:, None]
    positions = jnp.concatenate([jnp.cumsum(prefix_mask, axis=1) - 1, valid_len + lang_index], 1)
    return mask, positions


class Forward(NamedTuple):
    v_t: Float[Array, "k b a j"]  # predicted flow of each draw's noisy actions
    u_t: Float[Array, "k b a j"]  # target flow (noise - actions)
    logits: Float[Array, "b t v"]  # after every language-block token (first vocab_size ids)


def forward(
    model: Pi05Model,
    rng: jax.Array,
    batch: Batch,
    *,
    vocab_size: int,
    augment: bool = False,
    action_draws: int = 1,
    insulate: bool = False,
) -> Forward:
    """[prefix | language block] once, then `action_draws` noisy action chunks per row, each
    reading that pass's KV (the engine's prefill + denoise layout).

    `insulate`: the action pass reads the prefix's keys and values through a stop-gradient, so
    the action loss trains only the action expert and the prefix learns from the language
    targets alone (the knowledge insulation of Driess et al. 2025, the pi0.5 team's: there the
    backbone also learns discretised actions, here it does not). The forward values are the
    same either way."""
    preprocess_rng, x_t, u_t, time = flow_inputs(rng, batch.actions, action_draws)
    images = _preprocess_images(model, preprocess_rng, batch, augment)
    prefix, prefix_mask, _ = model.embed_prefix(
        images, batch.image_masks, batch.tokens, batch.token_mask
    )
    mask, positions = context_layout(
        prefix_mask, batch.lang_mask, batch.lang_segment, batch.lang_index
    )
    stream = jnp.concatenate([prefix, model.embed_tokens(batch.lang_tokens)], axis=1)
    (stream_out, _), (k, v) = model.llm([stream, None], mask=mask, positions=positions)
    logits = model.logits(stream_out[:, prefix.shape[1] :], vocab_size).astype(jnp.float32)
    # The engine's action expert over this cache, the language block masked out of it (actions
    # never attend it).
    cache_mask = jnp.concatenate([prefix_mask, jnp.zeros_like(batch.lang_mask)], axis=1)
    if insulate:
        k, v = jax.lax.stop_gradient(k), jax.lax.stop_gradient(v)
    v_t = draw_velocities(model, model_fns.Prefix(k, v, cache_mask), x_t, time)
    return Forward(v_t, u_t, logits)


def draw_velocities(
    model: Pi05Model,
    prefix: model_fns.Prefix,
    x_t: Float[Array, "k b a j"],
    time: Float[Array, "k b"],
) -> Float[Array, "k b a j"]:
    """The action expert's flow for k noisy chunks per row, each reading that row's prefix
    cache (`prefix` has b rows; draw-major copies: copy d of row i is row d * b + i)."""
    draws, rows, horizon = x_t.shape[:3]
    cache = model_fns.Prefix(
        jnp.tile(prefix.k, (1, draws, 1, 1, 1)),
        jnp.tile(prefix.v, (1, draws, 1, 1, 1)),
        jnp.tile(prefix.mask, (draws, 1)),
    )
    velocity = model_fns.action_velocity(model, cache, horizon)
    flat = x_t.reshape(draws * rows, *x_t.shape[2:])
    return velocity(flat, time.reshape(draws * rows)).reshape(x_t.shape)


def flow_loss(v_t: Float[Array, "k b a j"], u_t: Float[Array, "k b a j"]) -> Float[Array, "b a"]:
    """openpi's per-row flow-matching loss (mean square over the action dim), averaged over
    the draws."""
    return jnp.mean(jnp.square(v_t - u_t), axis=(0, -1))


def compute_losses(
    model: Pi05Model,
    rng: jax.Array,
    batch: Batch,
    *,
    vocab_size: int,
    augment: bool = False,
    action_draws: int = 1,
    insulate: bool = False,
) -> Losses:
    """Per-row action loss (the mean over the draws) and per-token language loss."""
    out = forward(
        model,
        rng,
        batch,
        vocab_size=vocab_size,
        augment=augment,
        action_draws=action_draws,
        insulate=insulate,
    )
    action = flow_loss(out.v_t, out.u_t)
    nll = optax.softmax_cross_entropy_with_integer_labels(out.logits, batch.lang_labels)
    nll = jnp.where(batch.lang_loss_mask, nll, 0.0)
    correct = (jnp.argmax(out.logits, axis=-1) == batch.lang_labels) & batch.lang_loss_mask
    return Losses(action, nll, correct)


def total_loss(losses: Losses, lang_mask: Bool[Array, "b t"], language_weight: float) -> Array:
    """Mean action loss + language_weight * mean token cross-entropy over target tokens."""
    tokens = jnp.maximum(jnp.sum(lang_mask), 1)
    return jnp.mean(losses.action) + language_weight * jnp.sum(losses.token_nll) / tokens
