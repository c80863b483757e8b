"""Training loss: openpi's flow-matching action loss plus next-token cross-entropy on language
targets placed exactly as the engine serves them, in one forward pass.

Token layout of one pass (prefix LLM stream, then the action expert stream):

    [ prefix: images + pi0.5 prompt | language block: per kind, tail + target | actions ]

- prefix: bidirectional over its valid tokens (openpi), positions cumsum(mask) - 1;
- language block: each kind's segment attends the valid prefix and, causally, its own earlier
  tokens, never another segment or the actions; a segment's token i sits at position
  valid_len(prefix) + i. That is `model_fns.extend` + `decode_step` (and the uncached
  `full_forward_logits`): what the engine decodes at run time is what is trained here.
- actions: openpi's `Pi0.compute_loss` suffix: noisy actions x_t = t * noise + (1 - t) * a
  with t ~ Beta(1.5, 1) * 0.999 + 0.001, adaRMS time conditioning, attending the valid prefix
  and each other; target u_t = noise - a; loss = mean over the action dim of (v_t - u_t)^2.
  The random streams are split as openpi splits them (preprocess, noise, time), so for the
  same rng the action loss equals openpi's (a test compares on openpi's own Pi0).

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
    rng: jax.Array, actions: Float[Array, "b a j"]
) -> tuple[jax.Array, Float[Array, "b a j"], Float[Array, "b a j"], Float[Array, " b"]]:
    """openpi's draws for one batch: (preprocess rng, x_t, u_t, time)."""
    preprocess_rng, noise_rng, time_rng = jax.random.split(rng, 3)
    noise = jax.random.normal(noise_rng, actions.shape)
    time = jax.random.beta(time_rng, 1.5, 1, actions.shape[:-2]) * 0.999 + 0.001
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


def attention_layout(
    prefix_mask: Bool[Array, "b s"],
    lang_mask: Bool[Array, "b t"],
    lang_segment: Int[Array, "b t"],
    lang_index: Int[Array, "b t"],
    horizon: int,
) -> tuple[Bool[Array, "b n n"], Int[Array, "b n"]]:
    """Attention mask and positions of [prefix | language block | actions] (n = s + t + a)."""
    batch, num_prefix = prefix_mask.shape
    num_lang = lang_mask.shape[1]
    suffix_mask = jnp.ones((batch, horizon), dtype=bool)
    suffix_ar = jnp.zeros((horizon,), dtype=bool).at[0].set(True)
    # openpi's compute_loss mask over [prefix | actions].
    openpi_mask = make_attn_mask(
        jnp.concatenate([prefix_mask, suffix_mask], axis=1),
        jnp.concatenate([jnp.zeros((num_prefix,), dtype=bool), suffix_ar]),
    )
    same_segment = lang_segment[:, :, None] == lang_segment[:, None, :]
    causal = lang_index[:, None, :] <= lang_index[:, :, None]
    lang_lang = same_segment & causal & lang_mask[:, :, None] & lang_mask[:, None, :]
    lang_prefix = lang_mask[:, :, None] & prefix_mask[:, None, :]
    none = jnp.zeros
    rows_prefix = jnp.concatenate(
        [
            openpi_mask[:, :num_prefix, :num_prefix],
            none((batch, num_prefix, num_lang), bool),
            openpi_mask[:, :num_prefix, num_prefix:],
        ],
        axis=2,
    )
    rows_lang = jnp.concatenate(
        [lang_prefix, lang_lang, none((batch, num_lang, horizon), bool)], axis=2
    )
    rows_actions = jnp.concatenate(
        [
            openpi_mask[:, num_prefix:, :num_prefix],
            none((batch, horizon, num_lang), bool),
            openpi_mask[:, num_prefix:, num_prefix:],
        ],
        axis=2,
    )
    mask = jnp.concatenate([rows_prefix, rows_lang, rows_actions], axis=1)
    valid_len = jnp.sum(prefix_mask, axis=-1)[:, None]
    positions = jnp.concatenate(
        [
            jnp.cumsum(prefix_mask, axis=1) - 1,
            valid_len + lang_index,
            valid_len + jnp.arange(horizon)[None, :],
        ],
        axis=1,
    )
    return mask, positions


class Forward(NamedTuple):
    v_t: Float[Array, "b a j"]  # predicted flow of the noisy actions
    u_t: Float[Array, "b a j"]  # target flow (noise - actions)
    logits: Float[Array, "b t v"]  # after every language-block token (first vocab_size ids)


def forward(
    model: Pi05Model,
    rng: jax.Array,
    batch: Batch,
    *,
    vocab_size: int,
    augment: bool = False,
) -> Forward:
    """One pass over [prefix | language block | noisy actions]."""
    preprocess_rng, x_t, u_t, time = flow_inputs(rng, batch.actions)
    images = _preprocess_images(model, preprocess_rng, batch, augment)
    prefix, prefix_mask, _ = model.embed_prefix(
        images, batch.image_masks, batch.tokens, batch.token_mask
    )
    horizon = batch.actions.shape[1]
    mask, positions = attention_layout(
        prefix_mask, batch.lang_mask, batch.lang_segment, batch.lang_index, horizon
    )
    suffix, adarms_cond = model.embed_suffix(x_t, time)
    stream = jnp.concatenate([prefix, model.embed_tokens(batch.lang_tokens)], axis=1)
    (stream_out, suffix_out), _ = model.llm(
        [stream, suffix], mask=mask, positions=positions, adarms_cond=[None, adarms_cond]
    )
    v_t = model.action_out_proj(suffix_out[:, -horizon:])
    logits = model.logits(stream_out[:, prefix.shape[1] :], vocab_size).astype(jnp.float32)
    return Forward(v_t, u_t, logits)


def compute_losses(
    model: Pi05Model,
    rng: jax.Array,
    batch: Batch,
    *,
    vocab_size: int,
    augment: bool = False,
) -> Losses:
    """Per-row action loss and per-token language loss of one batch (one forward pass)."""
    out = forward(model, rng, batch, vocab_size=vocab_size, augment=augment)
    action = jnp.mean(jnp.square(out.v_t - out.u_t), axis=-1)
    nll = optax.softmax_cross_entropy_with_integer_labels(out.logits, batch.lang_labels)
    nll = jnp.where(batch.lang_loss_mask, nll, 0.0)
    correct = (jnp.argmax(out.logits, axis=-1) == batch.lang_labels) & batch.lang_loss_mask
    return Losses(action, nll, correct)


def total_loss(losses: Losses, lang_mask: Bool[Array, "b t"], language_weight: float) -> Array:
    """Mean action loss + language_weight * mean token cross-entropy over target tokens."""
    tokens = jnp.maximum(jnp.sum(lang_mask), 1)
    return jnp.mean(losses.action) + language_weight * jnp.sum(losses.token_nll) / tokens
