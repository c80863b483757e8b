"""The training loss: openpi's own action loss, and language logits exactly where the engine
decodes them (the uncached reference the cached decode is tested equal to)."""

from __future__ import annotations

import dataclasses
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from engine_factories import TINY, perturb_zero_params
from flax import nnx
from openpi.models import model as openpi_model
from openpi.models import pi0 as openpi_pi0
from openpi.models import pi0_config
from openpi.shared import nnx_utils

from oxygen_ros.engine import model_fns, openpi_reference
from oxygen_ros.engine.config import get_model_config
from oxygen_ros.engine.model import create_model
from oxygen_ros.training import loss

WORKCELL = get_model_config("workcell")
VOCAB = 640
SEGMENT_LENGTHS = (5, 9, 7)  # three packed texts, as the training block packs its kinds


def make_batch(config, batch_size: int, seed: int, block_len: int = 24) -> loss.Batch:
    rng = np.random.default_rng(seed)
    keys = config.image_keys
    height, width = config.image_resolution
    prompt_len = config.max_token_len
    token_mask = np.arange(prompt_len)[None] < rng.integers(10, prompt_len, (batch_size, 1))
    segment = np.full((batch_size, block_len), len(SEGMENT_LENGTHS) - 1, np.int32)
    index = np.zeros((batch_size, block_len), np.int32)
    lang_mask = np.zeros((batch_size, block_len), bool)
    at = 0
    for seg, length in enumerate(SEGMENT_LENGTHS):
        segment[:, at : at + length] = seg
        index[:, at : at + length] = np.arange(length)
        lang_mask[:, at : at + length] = True
        at += length
    return loss.Batch(
        images={k: jnp.asarray(rng.uniform(-1, 1, (batch_size, height, width, 3))) for k in keys},
        image_masks={k: jnp.ones((batch_size,), bool) for k in keys},
        tokens=jnp.asarray(rng.integers(4, VOCAB, (batch_size, prompt_len)) * token_mask),
        token_mask=jnp.asarray(token_mask),
        actions=jnp.asarray(
            rng.normal(size=(batch_size, config.action_horizon, config.action_dim))
        ),
        lang_tokens=jnp.asarray(rng.integers(4, VOCAB, (batch_size, block_len)) * lang_mask),
        lang_mask=jnp.asarray(lang_mask),
        lang_segment=jnp.asarray(segment),
        lang_index=jnp.asarray(index),
        lang_labels=jnp.asarray(rng.integers(4, VOCAB, (batch_size, block_len))),
        lang_loss_mask=jnp.asarray(lang_mask),
    )


@pytest.fixture(scope="module")
def workcell_model():
    return perturb_zero_params(create_model(WORKCELL, seed=5), seed=6)


REFERENCE_VISION = "mu/16"  # the workcell's tower; openpi's So400m/14 took 170 s on CI here


@pytest.fixture
def openpi_vision_tower(monkeypatch):
    """openpi's Pi0 hard-codes the So400m/14 tower; its loss does not depend on which tower
    embeds the images, so both sides use a small one (the engine's equality with So400m is
    test_engine_frame's). Only pi0.py's reference to the siglip module is swapped."""
    real = openpi_pi0._siglip

    def module(**kwargs):
        assert kwargs["variant"] == "So400m/14", kwargs  # what this patch assumes openpi does
        return real.Module(**{**kwargs, "variant": REFERENCE_VISION})

    monkeypatch.setattr(openpi_pi0, "_siglip", types.SimpleNamespace(Module=module))
    return REFERENCE_VISION


@pytest.mark.filterwarnings("ignore:`flax.nnx.State` will be deprecated:DeprecationWarning")
def test_action_loss_equals_openpi_pi0_compute_loss(openpi_vision_tower) -> None:
    """openpi's own Pi0.compute_loss (tiny experts, at openpi's 224 px, with augmentation)."""
    config = dataclasses.replace(TINY, vision_variant=openpi_vision_tower, action_horizon=10)
    ours = perturb_zero_params(create_model(config, seed=3), seed=4)
    reference = pi0_config.Pi0Config(
        pi05=True,
        paligemma_variant="dummy",
        action_expert_variant="dummy",
        dtype="float32",
        action_horizon=config.action_horizon,
        max_token_len=config.max_token_len,
    ).load(nnx.to_pure_dict(nnx.state(ours)))
    batch = make_batch(config, batch_size=2, seed=0)
    observation = openpi_model.Observation(
        images=batch.images,
        image_masks=batch.image_masks,
        state=jnp.zeros((2, config.action_dim)),
        tokenized_prompt=batch.tokens,
        tokenized_prompt_mask=batch.token_mask,
    )
    rng = jax.random.key(11)
    expected = nnx_utils.module_jit(reference.compute_loss)(rng, observation, batch.actions)
    got = jax.jit(lambda b: loss.compute_losses(ours, rng, b, vocab_size=VOCAB).action)(batch)
    assert got.shape == (2, config.action_horizon)
    np.testing.assert_allclose(np.asarray(got), np.asarray(expected), rtol=2e-5, atol=2e-6)
    # Another rng draws other noise and times: the comparison is not vacuous.
    other = nnx_utils.module_jit(reference.compute_loss)(
        jax.random.key(12), observation, batch.actions
    )
    assert np.abs(np.asarray(other) - np.asarray(expected)).max() > 1e-3


def test_language_logits_equal_the_engines_uncached_reference(workcell_model) -> None:
    batch = make_batch(WORKCELL, batch_size=2, seed=1)
    out = jax.jit(lambda b: loss.forward(workcell_model, jax.random.key(0), b, vocab_size=VOCAB))(
        batch
    )
    inputs = model_fns.PrefixInputs(
        batch.images, batch.image_masks, batch.tokens, batch.token_mask
    )
    at = 0
    for length in SEGMENT_LENGTHS:
        text = batch.lang_tokens[:, at : at + length]
        expected = jax.jit(openpi_reference.full_forward_logits, static_argnums=(0, 4))(
            workcell_model, inputs, text, jnp.ones_like(text, bool), VOCAB
        )
        np.testing.assert_allclose(
            np.asarray(out.logits[:, at : at + length]), np.asarray(expected), atol=2e-4
        )
        at += length


def test_actions_ignore_the_language_block_but_see_the_prompt(workcell_model) -> None:
    @jax.jit
    def action_loss(b):
        return loss.compute_losses(workcell_model, jax.random.key(3), b, vocab_size=VOCAB).action

    batch = make_batch(WORKCELL, batch_size=2, seed=2)
    base = np.asarray(action_loss(batch))
    other_text = batch._replace(lang_tokens=(batch.lang_tokens * 7 + 5) % VOCAB * batch.lang_mask)
    np.testing.assert_allclose(np.asarray(action_loss(other_text)), base, rtol=1e-6, atol=1e-7)
    other_prompt = batch._replace(tokens=(batch.tokens * 7 + 5) % VOCAB * batch.token_mask)
    assert np.abs(np.asarray(action_loss(other_prompt)) - base).max() > 1e-4


def test_cross_entropy_counts_only_target_tokens(workcell_model) -> None:
    batch = make_batch(WORKCELL, batch_size=2, seed=3)
    only_first = batch._replace(lang_loss_mask=batch.lang_loss_mask.at[:, 3:].set(False))
    losses = jax.jit(
        lambda b: loss.compute_losses(workcell_model, jax.random.key(0), b, vocab_size=VOCAB)
    )(only_first)
    assert np.all(np.asarray(losses.token_nll[:, 3:]) == 0)
    assert np.all(np.asarray(losses.token_nll[:, :3]) > 0)
    assert not np.asarray(losses.token_correct[:, 3:]).any()


def test_each_action_draw_is_the_engines_flow_at_its_own_noise_and_time(workcell_model) -> None:
    """k draws per row in one pass: draw d of row i is what the engine's denoiser computes
    from that row's prefill at (x_t, t) of that draw, and the row's loss is their mean."""
    draws = 3
    batch = make_batch(WORKCELL, batch_size=2, seed=4)
    rng = jax.random.key(7)
    out = jax.jit(
        lambda b: loss.forward(workcell_model, rng, b, vocab_size=VOCAB, action_draws=draws)
    )(batch)
    _, x_t, u_t, time = loss.flow_inputs(rng, batch.actions, draws)
    assert out.v_t.shape == (draws, 2, WORKCELL.action_horizon, WORKCELL.action_dim)
    np.testing.assert_allclose(np.asarray(out.u_t), np.asarray(u_t), atol=1e-6)
    # Independent draws: every row's times and noises differ between draws.
    assert np.abs(np.diff(np.asarray(time), axis=0)).min() > 1e-4
    assert np.abs(np.asarray(u_t[0] - u_t[1])).max() > 0.1

    @jax.jit
    def served(inputs, x, t):
        prefix = model_fns.prefill(workcell_model, inputs)
        return model_fns.action_velocity(workcell_model, prefix, WORKCELL.action_horizon)(x, t)

    for i in range(2):
        inputs = model_fns.PrefixInputs(
            {k: im[i : i + 1] for k, im in batch.images.items()},
            {k: m[i : i + 1] for k, m in batch.image_masks.items()},
            batch.tokens[i : i + 1],
            batch.token_mask[i : i + 1],
        )
        for d in range(draws):
            expected = served(inputs, x_t[d, i : i + 1], time[d, i])
            np.testing.assert_allclose(
                np.asarray(out.v_t[d, i]), np.asarray(expected[0]), rtol=1e-4, atol=1e-4
            )
    # The flows differ between draws, so matching each one above is not vacuous.
    assert np.abs(np.asarray(out.v_t[0] - out.v_t[1])).max() > 0.05
    per_draw = np.mean(np.square(np.asarray(out.v_t) - np.asarray(u_t)), axis=-1)
    got = jax.jit(
        lambda b: (
            loss.compute_losses(
                workcell_model, rng, b, vocab_size=VOCAB, action_draws=draws
            ).action
        )
    )(batch)
    np.testing.assert_allclose(np.asarray(got), per_draw.mean(axis=0), rtol=1e-5, atol=1e-7)


def test_the_noise_scale_trains_the_path_the_engine_samples_with_that_scale() -> None:
    """`noise_scale` 1 is openpi's draws bit for bit; 0 puts every x_t on the line from zero
    to the chunk (x_t = (1 - t) a, u_t = -a), the path Euler steps from zero noise follow when
    the flow is exact; in between, the noise is scaled and the times are unchanged."""
    rng = jax.random.key(3)
    actions = jnp.asarray(np.random.default_rng(0).normal(size=(4, 10, 32)), jnp.float32)
    _, x1, u1, t1 = loss.flow_inputs(rng, actions, 2)
    _, xd, ud, td = loss.flow_inputs(rng, actions, 2, 1.0)
    for a, b in ((x1, xd), (u1, ud), (t1, td)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    _, x0, u0, t0 = loss.flow_inputs(rng, actions, 2, 0.0)
    np.testing.assert_array_equal(np.asarray(t0), np.asarray(t1))
    expanded = np.asarray(t0)[..., None, None]
    line = (1 - expanded) * np.asarray(actions)[None]
    np.testing.assert_allclose(np.asarray(x0), line, atol=1e-6)
    np.testing.assert_allclose(np.asarray(u0), -np.broadcast_to(np.asarray(actions), u0.shape))
    # The control: with noise the draws leave that line.
    assert np.abs(np.asarray(x1 - x0)).max() > 0.1
    _, _, uh, _ = loss.flow_inputs(rng, actions, 2, 0.5)
    np.testing.assert_allclose(np.asarray(uh - u0), 0.5 * np.asarray(u1 - u0), atol=1e-5)
    with pytest.raises(ValueError, match="noise_scale"):
        loss.flow_inputs(rng, actions, 1, 1.5)


def test_an_insulated_prefix_learns_nothing_from_the_action_loss(workcell_model) -> None:
    """`insulate`: the same action loss, whose gradient reaches the action expert's leaves
    and no prefix leaf; the language loss still reaches the prefix. The control: without
    insulation the action loss's gradient reaches the prefix too."""
    from oxygen_ros.training import expert_stage

    batch = make_batch(WORKCELL, batch_size=2, seed=9)
    rng = jax.random.key(1)
    graphdef, state = nnx.split(workcell_model)

    def term(which: str, insulate: bool):
        def f(s):
            out = loss.compute_losses(
                nnx.merge(graphdef, s), rng, batch, vocab_size=VOCAB, insulate=insulate
            )
            return jnp.mean(out.action) if which == "action" else jnp.sum(out.token_nll)

        return jax.jit(jax.value_and_grad(f))(state)

    def reached(grads) -> dict[bool, float]:
        """The largest |gradient| over the expert's leaves (True) and the prefix's (False)."""
        most = {True: 0.0, False: 0.0}
        for path, g in jax.tree_util.tree_flatten_with_path(grads)[0]:
            expert = expert_stage.is_expert_leaf(path)
            most[expert] = max(most[expert], float(jnp.max(jnp.abs(g))))
        return most

    value, grads = term("action", True)
    value_open, grads_open = term("action", False)
    np.testing.assert_allclose(float(value), float(value_open), rtol=1e-6)
    insulated, open_ = reached(grads), reached(grads_open)
    assert insulated[False] == 0.0 and insulated[True] > 1e-4
    assert open_[False] > 1e-4  # the control: the same check sees the prefix's gradient
    _, language = term("language", True)
    assert reached(language)[False] > 1e-4
