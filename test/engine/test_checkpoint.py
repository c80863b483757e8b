"""openpi-layout checkpoints: round trip through orbax + norm stats, and clear errors."""

from __future__ import annotations

import pathlib

import numpy as np
import orbax.checkpoint as ocp
import pytest
from engine_factories import TINY, make_engine_config, make_observation
from flax import nnx
from openpi.shared import normalize

from oxygen_ros.engine.checkpoint import Normalizer, load_norm_stats, load_params
from oxygen_ros.engine.checkpoint_assets import (
    ACTION_SPACE_FILE,
    LANGUAGE_FILE,
    STATE_LAYOUT_FILE,
    CheckpointError,
    StateLayout,
    load_delta_action_mask,
    load_narration_numbers,
    load_state_layout,
    save_delta_action_mask,
    save_narration_numbers,
    save_state_layout,
)
from oxygen_ros.engine.config import NormConfig
from oxygen_ros.engine.engine import Engine

ROBOT_DIM = 7
ASSETS_ID = "test_robot"


def _norm_stats() -> dict[str, normalize.NormStats]:
    rng = np.random.default_rng(0)

    def stats(dim: int) -> normalize.NormStats:
        q01 = rng.uniform(-2.0, -0.5, dim).astype(np.float32)
        q99 = rng.uniform(0.5, 2.0, dim).astype(np.float32)
        return normalize.NormStats(mean=(q01 + q99) / 2, std=(q99 - q01) / 4, q01=q01, q99=q99)

    return {"state": stats(8), "actions": stats(ROBOT_DIM)}


def _write_checkpoint(root: pathlib.Path, params: dict, norm_stats=None) -> pathlib.Path:
    """openpi layout: <root>/params (orbax {"params": tree}), assets/<id>/norm_stats.json."""
    with ocp.PyTreeCheckpointer() as checkpointer:
        checkpointer.save(root / "params", {"params": params})
    if norm_stats is not None:
        normalize.save(root / "assets" / ASSETS_ID, norm_stats)
    return root


@pytest.fixture(scope="module")
def pure_params(tiny_model) -> dict:
    return nnx.to_pure_dict(nnx.state(tiny_model))


def test_checkpoint_round_trip_gives_in_memory_actions(tiny_model, pure_params, tmp_path) -> None:
    root = _write_checkpoint(tmp_path / "ckpt", pure_params, _norm_stats())
    config = make_engine_config(checkpoint_dir=str(root), assets_id=ASSETS_ID)
    loaded = Engine(config)
    # Same stats as parsed from the JSON (floats come back as float64).
    stats = load_norm_stats(root, ASSETS_ID)
    np.testing.assert_allclose(stats["actions"].q99, _norm_stats()["actions"].q99, rtol=1e-7)
    in_memory = Engine(make_engine_config(), model=tiny_model, norm_stats=stats)
    observation = make_observation(8)
    noise = in_memory.make_noise(0)
    got = loaded.step(observation, noise=noise).actions.actions
    expected = in_memory.step(observation, noise=noise).actions.actions
    np.testing.assert_array_equal(got, expected)
    assert got.shape == (TINY.action_horizon, ROBOT_DIM)  # cut to the stats' action dim
    raw = Engine(make_engine_config(), model=tiny_model).step(observation, noise=noise)
    assert np.abs(raw.actions.actions[:, :ROBOT_DIM] - got).max() > 1e-3  # stats were applied


def test_missing_checkpoint_dir_and_params_are_named(tmp_path) -> None:
    missing = tmp_path / "nowhere"
    with pytest.raises(FileNotFoundError, match=f"checkpoint directory does not exist: {missing}"):
        load_params(missing, TINY)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"no orbax params directory: .*empty/params"):
        load_params(tmp_path / "empty", TINY)
    with pytest.raises(
        FileNotFoundError, match=r"norm stats not found: .*empty/assets/x/norm_stats\.json"
    ):
        load_norm_stats(tmp_path / "empty", "x")


def test_mismatched_tree_names_every_problem(pure_params, tmp_path) -> None:
    params = {k: v for k, v in pure_params.items() if k != "action_out_proj"}
    params["time_mlp_in"] = {
        **pure_params["time_mlp_in"],
        "kernel": np.zeros((64, 65), np.float32),
    }
    params["state_proj"] = {"kernel": np.zeros((32, 64), np.float32)}  # a pi0 (not pi0.5) param
    root = _write_checkpoint(tmp_path / "bad", params)
    with pytest.raises(CheckpointError) as error:
        load_params(root, TINY)
    message = str(error.value)
    assert "missing: action_out_proj/bias (32,)" in message
    assert "missing: action_out_proj/kernel (64, 32)" in message
    assert "shape: time_mlp_in/kernel expected (64, 64), got (64, 65)" in message
    assert "unexpected: state_proj/kernel (32, 64)" in message
    assert str(root / "params") in message


def test_quantile_normalizer_uses_openpi_formulas() -> None:
    stats = _norm_stats()
    normalizer = Normalizer(stats, NormConfig(use_quantiles=True))
    q01, q99 = stats["state"].q01, stats["state"].q99
    np.testing.assert_allclose(normalizer.normalize_state(q01), -1.0, atol=1e-5)
    np.testing.assert_allclose(normalizer.normalize_state(q99), 1.0, atol=1e-5)
    model_actions = np.linspace(-1.0, 1.0, 3 * 32, dtype=np.float32).reshape(3, 32)
    out = normalizer.unnormalize_actions(model_actions)
    a01, a99 = stats["actions"].q01, stats["actions"].q99
    np.testing.assert_allclose(
        out[:, :ROBOT_DIM],
        (model_actions[:, :ROBOT_DIM] + 1) / 2 * (a99 - a01 + 1e-6) + a01,
        rtol=1e-6,
    )
    np.testing.assert_array_equal(out[:, ROBOT_DIM:], model_actions[:, ROBOT_DIM:])
    zscore = Normalizer(stats, NormConfig(use_quantiles=False))
    np.testing.assert_allclose(zscore.normalize_state(stats["state"].mean), 0.0, atol=1e-6)
    identity = Normalizer(None, NormConfig())
    np.testing.assert_array_equal(identity.unnormalize_actions(model_actions), model_actions)
    with pytest.raises(CheckpointError, match="need 'state' and 'actions'"):
        Normalizer({"state": stats["state"]}, NormConfig())


def test_delta_action_checkpoint_is_served_as_absolute_targets(
    tiny_model, pure_params, tmp_path
) -> None:
    """A checkpoint with action_space.json: the masked dims come out as state + delta (openpi's
    AbsoluteActions after Unnormalize); an explicit () serves the same checkpoint absolute."""
    mask = (True, True, False, True, False, False, True)
    root = _write_checkpoint(tmp_path / "delta", pure_params, _norm_stats())
    save_delta_action_mask(root / "assets" / ASSETS_ID, mask)
    assert load_delta_action_mask(root, ASSETS_ID) == mask
    served = Engine(make_engine_config(checkpoint_dir=str(root), assets_id=ASSETS_ID))
    assert served.delta_action_mask == mask
    as_absolute = Engine(
        make_engine_config(checkpoint_dir=str(root), assets_id=ASSETS_ID, delta_action_mask=())
    )
    assert as_absolute.delta_action_mask == ()
    observation = make_observation(8)
    noise = served.make_noise(3)
    got = served.step(observation, noise=noise).actions.actions
    raw = as_absolute.step(observation, noise=noise).actions.actions
    state = np.asarray(observation.state, np.float32)
    expected = raw + np.where(mask, state[:ROBOT_DIM], 0.0)
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)
    assert np.abs(got - raw)[:, list(mask)].min() > 0  # the state really moved them
    np.testing.assert_array_equal(got[:, ~np.array(mask)], raw[:, ~np.array(mask)])


def test_action_space_file_absent_or_malformed(tmp_path) -> None:
    (tmp_path / "assets" / "a").mkdir(parents=True)
    assert load_delta_action_mask(tmp_path, "a") == ()
    with pytest.raises(CheckpointError, match="asset directories"):  # unlike the other files
        load_delta_action_mask(tmp_path / "nowhere", None)
    (tmp_path / "assets" / "a" / ACTION_SPACE_FILE).write_text('{"delta_action_mask": [1, 0]}')
    with pytest.raises(CheckpointError, match="no valid delta_action_mask"):
        load_delta_action_mask(tmp_path, "a")
    (tmp_path / "assets" / "a" / ACTION_SPACE_FILE).write_text("not json")
    with pytest.raises(CheckpointError, match="no valid delta_action_mask"):
        load_delta_action_mask(tmp_path, "a")


def test_state_layout_round_trip_absent_or_malformed(tmp_path) -> None:
    assets = tmp_path / "assets" / "a"
    assets.mkdir(parents=True)
    assert load_state_layout(tmp_path, "a") is None  # no file: none recorded
    assert load_state_layout(tmp_path / "nowhere", None) is None  # no asset directory
    layout = StateLayout(("j0", "j1"), ("cube.x", "cube.y"))
    save_state_layout(assets, layout)
    assert load_state_layout(tmp_path, "a") == layout
    assert load_state_layout(tmp_path, None) == layout  # the single asset directory
    for text in ('{"joint_names": ["j0"]}', '{"joint_names": [1], "state_extra_names": []}', "{"):
        (assets / STATE_LAYOUT_FILE).write_text(text)
        with pytest.raises(CheckpointError, match="no valid state layout"):
            load_state_layout(tmp_path, "a")


def test_narration_numbers_round_trip_absent_or_malformed(tmp_path) -> None:
    assets = tmp_path / "assets" / "a"
    assets.mkdir(parents=True)
    assert load_narration_numbers(tmp_path, "a") == "digits"  # no file: digits
    assert load_narration_numbers(tmp_path / "nowhere", None) == "digits"
    save_narration_numbers(assets, "words")
    assert load_narration_numbers(tmp_path, "a") == "words"
    assert load_narration_numbers(tmp_path, None) == "words"  # the single asset directory
    save_narration_numbers(assets, "digits")
    assert load_narration_numbers(tmp_path, "a") == "digits"
    with pytest.raises(ValueError, match="narration_numbers"):
        save_narration_numbers(assets, "roman")
    for text in ('{"narration_numbers": "roman"}', '{"numbers": "words"}', "[", '["words"]'):
        (assets / LANGUAGE_FILE).write_text(text)
        with pytest.raises(CheckpointError, match="narration_numbers"):
            load_narration_numbers(tmp_path, "a")
