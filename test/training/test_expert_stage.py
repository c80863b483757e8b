"""Stage two: the action expert trained alone on a checkpoint's frozen prefix cache."""

from __future__ import annotations

import dataclasses
import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from flax import nnx

from oxygen_ros.engine import model_fns
from oxygen_ros.engine.checkpoint import load_params
from oxygen_ros.engine.config import get_model_config
from oxygen_ros.engine.engine import Engine
from oxygen_ros.engine.model import create_model
from oxygen_ros.engine.tokenizer import TOKENIZER_FILE
from oxygen_ros.engine.types import Observation
from oxygen_ros.training import expert_stage, loss, train
from oxygen_ros.training.trainer import drop_images, to_batch

pytestmark = pytest.mark.slow

# Jitted (eager op-by-op dispatch of the whole model is what would make these tests slow).
_prefill = nnx.jit(model_fns.prefill)
_denoise = nnx.jit(model_fns.denoise, static_argnums=3)
_compute_losses = nnx.jit(loss.compute_losses, static_argnames=("vocab_size", "action_draws"))

SHIPPED = pathlib.Path(__file__).parents[2] / "models" / "workcell_run38"
PRESET = "workcell_target_bins"


def _leaves(model) -> dict:
    return dict(jax.tree_util.tree_flatten_with_path(nnx.state(model))[0])


def _with(model, change) -> object:
    """`model` with every leaf `change(path, leaf)` returns (None: unchanged)."""
    graphdef, state = nnx.split(model)
    flat, treedef = jax.tree_util.tree_flatten_with_path(state)
    changed = [(change(path, leaf), leaf) for path, leaf in flat]
    leaves = [leaf if new is None else new for new, leaf in changed]
    return nnx.merge(graphdef, jax.tree.unflatten(treedef, leaves))


def _inputs(config, seed: int = 0) -> model_fns.PrefixInputs:
    rng = np.random.default_rng(seed)
    shape = (2, *config.image_resolution, 3)
    images = {k: jnp.asarray(rng.uniform(-1, 1, shape), jnp.float32) for k in config.image_keys}
    masks = {k: jnp.ones((2,), bool) for k in config.image_keys}
    tokens = jnp.asarray(rng.integers(1, 300, (2, config.max_token_len)), jnp.int32)
    token_mask = jnp.arange(config.max_token_len)[None] < jnp.array([[30], [41]])
    return model_fns.PrefixInputs(images, masks, tokens, token_mask)


@pytest.fixture(scope="module")
def model():
    return create_model(get_model_config(PRESET), seed=0)


def test_the_expert_leaves_are_what_the_prefix_never_reads(model) -> None:
    """Changing every expert leaf leaves the prefix cache bit for bit and changes the actions;
    changing the other leaves changes the cache (the control: the same check sees a change)."""
    config = model.config
    names = {jax.tree_util.keystr(p) for p in _leaves(model) if expert_stage.is_expert_leaf(p)}
    assert any("action_in_proj" in n for n in names) and any("mlp_1" in n for n in names)
    assert not any("img" in n or "embedder" in n for n in names)

    def bump(expert: bool):
        return lambda path, leaf: (
            leaf + 0.05 if expert_stage.is_expert_leaf(path) == expert else None
        )

    inputs = _inputs(config)
    base = _prefill(model, inputs)
    noise = jax.random.normal(jax.random.key(1), (2, config.action_horizon, config.action_dim))
    actions = _denoise(model, base, noise, 3)
    expert_changed = _with(model, bump(True))
    same = _prefill(expert_changed, inputs)
    np.testing.assert_array_equal(np.asarray(same.k), np.asarray(base.k))
    np.testing.assert_array_equal(np.asarray(same.v), np.asarray(base.v))
    assert np.abs(np.asarray(_denoise(expert_changed, base, noise, 3)) - actions).max() > 1e-3
    other = _prefill(_with(model, bump(False)), inputs)
    assert np.abs(np.asarray(other.k, np.float32) - np.asarray(base.k, np.float32)).max() > 1e-3


def test_a_wider_expert_keeps_the_prefix_and_only_its_shape_differs(model) -> None:
    trained = model
    wide = get_model_config("workcell_target_e256")
    expert_stage.check_expert_preset(trained.config, wide)
    with pytest.raises(ValueError, match="more than the action expert"):
        expert_stage.check_expert_preset(trained.config, get_model_config("workcell_target_wide"))
    staged = expert_stage.stage_model(trained, wide, reinit=False, seed=3)
    source, got = _leaves(trained), _leaves(staged)
    widened = 0
    for path, leaf in got.items():
        if expert_stage.is_expert_leaf(path):
            widened += np.shape(leaf) != np.shape(source[path])
        else:
            np.testing.assert_array_equal(np.asarray(leaf), np.asarray(source[path]))
    assert widened > 0
    # Every prefix leaf is the trained one, so the wider model's prefill gives the same cache.
    inputs = _inputs(trained.config)
    np.testing.assert_array_equal(
        np.asarray(_prefill(staged, inputs).k), np.asarray(_prefill(trained, inputs).k)
    )


def _stage_config(demos_dir, out, **overrides) -> expert_stage.StageConfig:
    fields = dict(
        checkpoint=str(SHIPPED),
        data_dir=str(demos_dir),
        out_dir=str(out),
        heldout=1,
        steps=8,
        batch_size=8,
        action_draws=2,
        warmup_steps=2,
        peak_lr=3e-3,
        eval_every=4,
    )
    fields.update(overrides)
    return expert_stage.StageConfig(**fields)


@pytest.fixture(scope="module")
def staged(demos_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("stage")
    config = _stage_config(demos_dir, out / "ckpt", cache_dir=str(out / "cache"))
    return config, expert_stage.run(config)


def saved_cache(config, engine, model, samples) -> expert_stage.PrefixCache:
    """The training samples' prefix cache the `staged` run wrote, read back (not recomputed:
    the files stay untouched). Its prefix is the starting checkpoint's, so any checkpoint with
    that prefix (the start's or the stage's) reads it."""
    files = sorted((pathlib.Path(config.cache_dir) / "train").iterdir())
    written = {f: f.stat().st_mtime_ns for f in files}
    digest = expert_stage.prefix_digest(model)
    cache = expert_stage.prefix_cache(config, engine, digest, "train", samples)
    assert files and {f: f.stat().st_mtime_ns for f in files} == written
    return cache


def test_the_stage_loss_is_openpis_loss_read_from_the_cached_prefix(staged) -> None:
    """The same rows, rng and draws: the stage's per-row loss on the cached prefix equals the
    full training loss's action term (`loss.compute_losses`, which runs the prefix itself)."""
    config, _ = staged
    engine = Engine(train.engine_config(str(SHIPPED), preset=PRESET))
    samples, _, _ = expert_stage.load_samples(
        engine,
        config.data_dir,
        config.preset,
        config.object_state,
        config.heldout,
        workers=1,
        narration_numbers=expert_stage.starting_assets(config)["narration_numbers"],
    )
    model = load_params(SHIPPED, engine.config.model)
    cache = saved_cache(config, engine, model, samples)
    trainer = expert_stage.ExpertTrainer(model, config)
    index = np.array([0, 3, 7, 12, 15])
    batch = to_batch(samples.take(index), engine.config.model.image_keys)
    rng = jax.random.key(7)
    full = _compute_losses(model, rng, batch, vocab_size=engine.tokenizer.vocab_size,
                               action_draws=2).action  # fmt: skip
    cached = trainer.losses(rng, cache.take(index), batch.actions)
    np.testing.assert_allclose(cached, np.asarray(full), rtol=2e-2, atol=1e-3)
    # The blind cache is the prefix with every camera masked, as train's image dropout.
    blind = drop_images(batch, np.zeros(len(index), bool))
    full_blind = _compute_losses(model, rng, blind, vocab_size=engine.tokenizer.vocab_size,
                                     action_draws=2).action  # fmt: skip
    cached_blind = trainer.losses(rng, cache.take(index, np.ones(len(index), bool)), batch.actions)
    np.testing.assert_allclose(cached_blind, np.asarray(full_blind), rtol=2e-2, atol=1e-3)
    assert np.abs(np.asarray(full_blind) - np.asarray(full)).max() > 1e-3  # cameras matter
    # noise_scale 0: the same expert trained on the path from zero noise (the engine's
    # action_noise_scale 0): its loss is the flow's error against -a at x_t = (1 - t) a.
    zero = expert_stage.ExpertTrainer(model, dataclasses.replace(config, noise_scale=0.0))
    _, _, u_t, time = loss.flow_inputs(rng, batch.actions, 2)
    line = (1 - time[..., None, None]) * batch.actions[None]
    velocity = loss.draw_velocities(model, cache.take(index), line, time)
    want = loss.flow_loss(velocity, -jnp.broadcast_to(batch.actions, u_t.shape))
    got = zero.losses(rng, cache.take(index), batch.actions)
    np.testing.assert_allclose(got, np.asarray(want), rtol=1e-4, atol=1e-5)
    assert np.abs(got - cached).max() > 1e-2  # the control: with noise the loss differs


def test_the_stage_changes_only_the_expert_and_keeps_the_assets(staged) -> None:
    config, final = staged
    out = pathlib.Path(config.out_dir)
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(9))  # 0: the starting expert
    assert "val_action_mae_rad" in records[0] and "action_loss" not in records[0]
    assert {"val_action_mae_rad", "val_action_mae_rad_from_zero"} <= set(final)
    assert (out / "loss_curve.png").stat().st_size > 0
    with ocp.PyTreeCheckpointer() as checkpointer:
        got = checkpointer.restore(out / "params")["params"]
        was = checkpointer.restore(SHIPPED / "params")["params"]
    flat_got = dict(jax.tree_util.tree_flatten_with_path(got)[0])
    changed = {True: 0, False: 0}
    for path, before in jax.tree_util.tree_flatten_with_path(was)[0]:
        expert = expert_stage.is_expert_leaf(path)
        differs = not np.array_equal(np.asarray(flat_got[path]), np.asarray(before))
        assert expert or not differs, jax.tree_util.keystr(path)
        changed[expert] += differs
    assert changed[True] > 0
    for name in ("norm_stats.json", TOKENIZER_FILE, "action_space.json", "state_layout.json"):
        mine = out / "assets" / "workcell" / name
        assert mine.read_bytes() == (SHIPPED / "assets" / "workcell" / name).read_bytes()


def test_the_engine_serves_the_chunk_the_stage_trained(staged) -> None:
    """The stage's checkpoint served through the engine's observation path (an episode's frame
    as an Observation: the cameras, the raw state, the instruction) gives the chunk the stage's
    own path gives for that sample and noise (the cached prefix, the trained expert, then
    unnormalised and made absolute): what the stage evaluates is what the robot gets. The
    control: the starting checkpoint's engine gives another chunk on the same frame."""
    config, _ = staged
    engine = Engine(train.engine_config(config.out_dir, preset=PRESET))
    samples, _, (episodes, _) = expert_stage.load_samples(
        engine,
        config.data_dir,
        PRESET,
        config.object_state,
        config.heldout,
        workers=1,
        narration_numbers=expert_stage.starting_assets(config)["narration_numbers"],
    )
    model = load_params(config.out_dir, engine.config.model)
    cache = saved_cache(config, engine, model, samples)
    trainer = expert_stage.ExpertTrainer(model, config)
    robot_dim = engine.action_output_dim
    noise = engine.make_noise(0)
    for row in (3, len(samples) - 2):  # a frame of the first episode and one of the last
        spec = episodes.specs[int(episodes.episode[row])]
        observation = Observation(
            images={slot: images[row] for slot, images in episodes.images.items()},
            image_masks=dict.fromkeys(episodes.images, True),
            state=episodes.state[row],
            prompt=spec.instruction,
            stamp=0.0,
        )
        served = engine.step(observation, noise=noise).actions.actions
        staged_chunk = trainer.actions(cache.take(np.array([row])), noise)[0]
        staged_chunk = engine.normalizer.unnormalize_actions(staged_chunk)[:, :robot_dim]
        staged_chunk = engine.normalizer.absolute_actions(
            staged_chunk, episodes.state[row], engine.delta_action_mask
        )
        assert served.shape == (engine.config.model.action_horizon, robot_dim)
        np.testing.assert_allclose(served, staged_chunk, atol=1e-5)
    starting = Engine(train.engine_config(str(SHIPPED), preset=PRESET))
    before = starting.step(observation, noise=noise).actions.actions
    assert np.abs(before - served).max() > 1e-2


def test_the_cached_prefix_is_reused_and_the_stage_reproduces(staged, tmp_path) -> None:
    """A second run of the same config on the kept cache gives the same parameters; a run on
    the stage's output (the same prefix) reads the same cache; a cache of other inputs is
    refused."""
    config, _ = staged
    again = dataclasses.replace(config, out_dir=str(tmp_path / "again"))
    expert_stage.run(again)
    with ocp.PyTreeCheckpointer() as checkpointer:
        first = checkpointer.restore(pathlib.Path(config.out_dir) / "params")["params"]
        second = checkpointer.restore(tmp_path / "again" / "params")["params"]
    jax.tree.map(np.testing.assert_array_equal, first, second)
    # The stage's own output has the same prefix: its cache is the same one.
    chained = dataclasses.replace(config, checkpoint=config.out_dir, out_dir=str(tmp_path / "c"))
    assert expert_stage.run(chained)["step"] == config.steps
    other = dataclasses.replace(again, heldout=2)
    with pytest.raises(ValueError, match="other inputs"):
        expert_stage.run(other)
