"""Training the language head alone changes what the model says and not one bit of what it
does (training/language_head.py)."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from flax import nnx

from oxygen_ros.engine.checkpoint import Normalizer
from oxygen_ros.engine.config import NormConfig, PromptConfig, get_model_config
from oxygen_ros.engine.model import create_model
from oxygen_ros.engine.tokenizer import BUNDLED_TOKENIZER_PATH, Tokenizer
from oxygen_ros.sim import recorder
from oxygen_ros.training import data, language_head, norm_stats
from oxygen_ros.training.train_config import TrainConfig
from oxygen_ros.training.trainer import Trainer, to_batch

pytestmark = pytest.mark.slow


def test_the_head_is_the_last_layers_non_kv_leaves_and_the_final_norm() -> None:
    model = create_model(get_model_config("workcell"), seed=0)
    names = language_head.head_leaf_names(model)
    assert sorted(names) == sorted(
        f"PaliGemma/llm/{leaf}"
        for leaf in (
            "final_norm/scale/value",
            "layers/attn/q_einsum/w/value",
            "layers/attn/attn_vec_einsum/w/value",
            "layers/mlp/gating_einsum/value",
            "layers/mlp/linear/value",
            "layers/pre_ffw_norm/scale/value",
        )
    )
    masks = language_head.update_mask(model)
    assert len(masks) == len(jax.tree.leaves(nnx.state(model)))
    stacked = [m for m in masks if np.ndim(m) > 0]  # they train their last layer's row only
    assert len(stacked) == 5
    for m in stacked:
        assert m.shape[0] == 4 and m.reshape(-1)[-1] == 1.0 and not m.reshape(-1)[:-1].any()
    assert sum(float(m) for m in masks if np.ndim(m) == 0) == 1.0  # the final norm


@pytest.fixture(scope="module")
def batch_and_vocab(demos_dir):
    config = get_model_config("workcell")
    tokenizer = Tokenizer(str(BUNDLED_TOKENIZER_PATH))
    eps = data.load_episodes(recorder.list_episodes(demos_dir), config)
    normalizer = Normalizer(norm_stats.compute_norm_stats(eps, NormConfig()), NormConfig())
    samples = data.build_samples(eps, config, tokenizer, normalizer, PromptConfig())
    batch = to_batch(samples.take(np.array([0, 5, 9, 14])), config.image_keys)
    return config, batch, tokenizer.vocab_size


def _steps(config, batch, vocab, head_only: bool) -> tuple[Trainer, list, np.ndarray]:
    """Three steps from one seed's model; the starting leaves and actions, the trainer."""
    trainer = Trainer(
        TrainConfig(
            data_dir="d", out_dir="o", peak_lr=3e-3, warmup_steps=1, language_head_only=head_only
        ),
        create_model(config, seed=0),
        vocab,
    )
    start = [np.asarray(x).copy() for x in trainer.params]
    noise = jax.random.normal(
        jax.random.key(7), (4, config.action_horizon, config.action_dim), np.float32
    )
    before = np.asarray(trainer.actions(batch, noise))
    for k in range(3):
        trainer.step(jax.random.key(k), batch)
    after = np.asarray(trainer.actions(batch, noise))
    return trainer, start, np.stack([before, after])


def test_a_head_step_changes_the_language_and_no_action(batch_and_vocab) -> None:
    """After head-only steps the head leaves moved (only the last layer's rows of the stacked
    ones), every other leaf and every denoised action is bit for bit the start's, and the
    language loss changed. Control: the same steps training everything change the actions
    (so the comparison sees a change when there is one)."""
    config, batch, vocab = batch_and_vocab
    trainer, start, actions = _steps(config, batch, vocab, head_only=True)
    masks = language_head.update_mask(create_model(config, seed=0))
    moved = 0
    for got, was, mask in zip(trainer.params, start, masks, strict=True):
        got = np.asarray(got)
        keep = np.broadcast_to(np.asarray(mask) == 0, got.shape)
        np.testing.assert_array_equal(got[keep], was[keep])
        moved += int(np.any(got[~keep] != was[~keep]))
    assert moved == 6  # all six head leaves trained
    np.testing.assert_array_equal(actions[0], actions[1])
    rng = jax.random.key(11)
    start_model = Trainer(
        TrainConfig(data_dir="d", out_dir="o"), create_model(config, seed=0), vocab
    )
    nll_start = np.asarray(start_model.eval_losses(rng, batch).token_nll)
    nll_after = np.asarray(trainer.eval_losses(rng, batch).token_nll)
    assert np.sum(nll_after) < np.sum(nll_start)
    _, _, control = _steps(config, batch, vocab, head_only=False)
    assert np.abs(control[1] - control[0]).max() > 1e-4
