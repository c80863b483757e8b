"""Norm stats of the training data (training/norm_stats.py): widened dimensions and blinded
state dimensions. A run's own norm stats (`training_norm_stats`) are tested in
test_train.py, on its trained checkpoint."""

from __future__ import annotations

import numpy as np
import pytest

from oxygen_ros.engine.checkpoint import Normalizer
from oxygen_ros.engine.config import NormConfig, get_model_config
from oxygen_ros.engine.inputs import observation_to_inputs
from oxygen_ros.engine.tokenizer import STATE_BINS_TOKENIZER_PATH, Tokenizer
from oxygen_ros.engine.types import Observation
from oxygen_ros.sim import robot
from oxygen_ros.training import data, norm_stats


def test_widened_norm_stats_bound_a_departure_on_a_dimension_the_data_barely_moves() -> None:
    """A dimension whose 1-99 % range is 0.005 (the forearm roll's delta actions) turns a 0.1
    correction into about 40; widened to 0.2 it reads 1, and wider dimensions keep theirs."""
    from openpi.shared import normalize

    stats = {
        "state": normalize.NormStats(
            mean=np.zeros(2), std=np.ones(2), q01=-np.ones(2), q99=np.ones(2)
        ),
        "actions": normalize.NormStats(
            mean=np.array([0.0, 0.1]),
            std=np.array([0.001, 0.3]),
            q01=np.array([-0.0025, -0.5]),
            q99=np.array([0.0025, 0.7]),
        ),
    }
    widened, dims = norm_stats.widen_norm_stats(stats, 0.2)
    assert dims == {"state": [], "actions": [0]}
    np.testing.assert_allclose(widened["actions"].q01, [-0.1, -0.5])
    np.testing.assert_allclose(widened["actions"].q99, [0.1, 0.7])
    np.testing.assert_allclose(widened["actions"].std, [0.1, 0.3])
    np.testing.assert_array_equal(widened["actions"].mean, stats["actions"].mean)
    row = np.array([[-0.1, 0.1]])
    before = Normalizer(stats, NormConfig()).normalize_actions(row)
    after = Normalizer(widened, NormConfig()).normalize_actions(row)
    assert abs(before[0, 0]) > 30  # positive control: the narrow range blows the value up
    assert abs(after[0, 0]) <= 1.0 + 1e-6
    assert after[0, 1] == pytest.approx(before[0, 1])


def test_blinded_state_dims_reach_the_prompt_as_one_bin_whatever_is_measured() -> None:
    """The engine's prompt (observation_to_inputs, as served) is the same whether the blinded
    grippers read shut, open or past either end; without the blinding the same change moves
    the prompt (positive control), and an unblinded joint still does with it."""
    from openpi.shared import normalize

    config = get_model_config("workcell_target_bins")
    tokenizer = Tokenizer(STATE_BINS_TOKENIZER_PATH)
    names = data.state_names("target")
    assert names[: robot.NUM_JOINTS] == robot.JOINT_NAMES and len(names) == 27
    rng = np.random.default_rng(5)
    centre = rng.uniform(-0.5, 0.5, len(names))
    stats = {
        "state": normalize.NormStats(
            mean=centre, std=np.full(len(names), 0.3), q01=centre - 0.6, q99=centre + 0.6
        ),
        "actions": normalize.NormStats(
            mean=np.zeros(14), std=np.ones(14), q01=-np.ones(14), q99=np.ones(14)
        ),
    }
    grippers = [names.index("left_gripper"), names.index("right_gripper")]
    blinded = norm_stats.blind_norm_stats(stats, "state", grippers)

    def prompt(stats, state) -> np.ndarray:
        observation = Observation({}, {}, state.astype(np.float32), "pick up", 0.0)
        return observation_to_inputs(
            observation,
            config.image_keys,
            config.image_resolution,
            tokenizer,
            Normalizer(stats, NormConfig()),
            config.max_token_len,
        ).tokens

    base = centre.copy()
    variants = []
    for value in (0.0, 0.08, 0.5, 1.0, -0.4, 1.6):
        state = base.copy()
        state[grippers] = value
        variants.append(state)
    blind = [prompt(blinded, s) for s in variants]
    seen = [prompt(stats, s) for s in variants]
    for tokens in blind[1:]:
        np.testing.assert_array_equal(tokens, blind[0])
    assert not np.array_equal(seen[0], seen[3])  # positive control: unblinded, they differ
    moved = variants[0].copy()
    moved[names.index("left_waist")] += 0.3
    assert not np.array_equal(prompt(blinded, moved), blind[0])  # other dims still count
    # Only the named dimensions change, in both normalisations' fields.
    others = [i for i in range(len(names)) if i not in grippers]
    for field in ("mean", "std", "q01", "q99"):
        np.testing.assert_array_equal(
            getattr(blinded["state"], field)[others], getattr(stats["state"], field)[others]
        )
    assert blinded["actions"] is stats["actions"]
    again = norm_stats.blind_norm_stats(blinded, "state", grippers)  # fine-tuning blinds again
    for field in ("mean", "std", "q01", "q99"):
        np.testing.assert_array_equal(
            getattr(again["state"], field), getattr(blinded["state"], field)
        )
    z = Normalizer(blinded, NormConfig(use_quantiles=False)).normalize_state(
        np.stack(variants).astype(np.float32)
    )
    assert np.ptp(z[:, grippers]) < 2 / 256  # one bin with z-scores too
