"""One training step and its batches (training/trainer.py): host and device batches agree,
image dropout masks whole rows' cameras, a step averages the configured action draws, and
the moving average is what is evaluated and saved."""

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
from oxygen_ros.training import data, loss, norm_stats
from oxygen_ros.training.train_config import TrainConfig
from oxygen_ros.training.trainer import DeviceSamples, Trainer, drop_images, to_batch

pytestmark = pytest.mark.slow


def _workcell_samples(demos_dir):
    config = get_model_config("workcell")
    tokenizer = Tokenizer(str(BUNDLED_TOKENIZER_PATH))
    eps = data.load_episodes(recorder.list_episodes(demos_dir), config)
    normalizer = Normalizer(norm_stats.compute_norm_stats(eps, NormConfig()), NormConfig())
    return config, data.build_samples(eps, config, tokenizer, normalizer, PromptConfig())


def test_device_data_batches_equal_host_batches(demos_dir) -> None:
    config, samples = _workcell_samples(demos_dir)
    index = np.array([0, 3, 7, 20])
    want = to_batch(samples.take(index), config.image_keys)
    got = DeviceSamples(samples, config.image_keys).batch(index)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-6)


def test_image_dropout_masks_every_camera_of_the_dropped_rows(demos_dir) -> None:
    config, samples = _workcell_samples(demos_dir)
    batch = to_batch(samples.take(np.array([0, 1, 2])), config.image_keys)
    keep = np.array([True, False, True])
    dropped = drop_images(batch, keep)
    assert set(dropped.image_masks) == set(config.image_keys)
    for mask in dropped.image_masks.values():
        np.testing.assert_array_equal(np.asarray(mask), keep)
    # Only the masks change, and the batch it came from keeps its cameras.
    np.testing.assert_array_equal(np.asarray(dropped.tokens), np.asarray(batch.tokens))
    assert all(np.asarray(m).all() for m in batch.image_masks.values())
    with pytest.raises(ValueError, match="image_dropout"):
        TrainConfig(data_dir="d", out_dir="o", image_dropout=1.5)


def test_a_step_trains_on_the_configured_action_draws(demos_dir) -> None:
    """The step's action loss is the mean over `action_draws` draws of the loss module's
    (held-out evaluation keeps one draw); one and two draws give different losses."""
    config, samples = _workcell_samples(demos_dir)
    batch = to_batch(samples.take(np.array([0, 5])), config.image_keys)
    vocab = Tokenizer(str(BUNDLED_TOKENIZER_PATH)).vocab_size
    rng = jax.random.key(3)
    got = {}
    for draws in (1, 2):
        trainer = Trainer(
            TrainConfig(data_dir="d", out_dir="o", action_draws=draws),
            create_model(config, seed=0),
            vocab,
        )
        model = trainer._fns.model(trainer.params)
        expected = jax.jit(
            lambda b, m=model, k=draws: (
                loss.compute_losses(m, rng, b, vocab_size=vocab, action_draws=k).action
            )
        )(batch)
        got[draws] = trainer.step(rng, batch)["action_loss"]
        assert got[draws] == pytest.approx(float(np.mean(expected)), rel=1e-5)
    assert abs(got[1] - got[2]) > 1e-3 * got[1]
    with pytest.raises(ValueError, match="action_draws"):
        TrainConfig(data_dir="d", out_dir="o", action_draws=0)


def test_ema_is_what_is_evaluated_and_saved(demos_dir) -> None:
    """With ema_decay d the trainer keeps d x average + (1 - d) x params after every step,
    starting at the starting parameters; evaluation, denoised actions and the saved params
    read the average. The raw parameters move away from it (positive control), and without
    ema_decay the served parameters are the raw ones."""
    config, samples = _workcell_samples(demos_dir)
    batch = to_batch(samples.take(np.array([0, 5])), config.image_keys)
    vocab = Tokenizer(str(BUNDLED_TOKENIZER_PATH)).vocab_size
    decay = 0.75
    trainer = Trainer(
        TrainConfig(data_dir="d", out_dir="o", ema_decay=decay, peak_lr=3e-3, warmup_steps=1),
        create_model(config, seed=0),
        vocab,
    )
    expected = [np.asarray(x, np.float64) for x in trainer.params]
    for k in range(3):
        trainer.step(jax.random.key(k), batch)
        expected = [decay * e + (1 - decay) * np.asarray(p) for e, p in zip(
            expected, trainer.params, strict=True
        )]  # fmt: skip
    for got, want in zip(trainer.ema, expected, strict=True):
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-7)
    gap = max(
        float(np.max(np.abs(np.asarray(p) - np.asarray(e))))
        for p, e in zip(trainer.params, trainer.ema, strict=True)
    )
    assert gap > 1e-4  # the average is not the last step's parameters
    assert trainer.served_params is trainer.ema
    rng = jax.random.key(9)
    on_ema = trainer._fns.eval(trainer.ema, rng, batch).action
    on_raw = trainer._fns.eval(trainer.params, rng, batch).action
    assert not np.allclose(np.asarray(on_ema), np.asarray(on_raw))
    np.testing.assert_array_equal(np.asarray(trainer.eval_losses(rng, batch).action), on_ema)
    saved = jax.tree.leaves(trainer.full_params())
    flat = jax.tree.leaves(
        nnx.to_pure_dict(jax.tree.unflatten(trainer._fns.treedef, list(trainer.ema)))
    )
    for s, e in zip(saved, flat, strict=True):
        np.testing.assert_array_equal(np.asarray(s)[: np.asarray(e).shape[0]], np.asarray(e))
    plain = Trainer(TrainConfig(data_dir="d", out_dir="o"), create_model(config, seed=0), vocab)
    assert plain.ema is None and plain.served_params is plain.params
    with pytest.raises(ValueError, match="ema_decay"):
        TrainConfig(data_dir="d", out_dir="o", ema_decay=1.0)
