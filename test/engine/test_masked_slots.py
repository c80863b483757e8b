"""A masked camera slot is not encoded: the prefix of the valid slots only equals openpi's
compute-then-mask prefix where it is valid, and the engine compiles one prefill per valid-slot
pattern, at warm-up for `warmup_masked_slots`. (Actions against openpi's own `sample_actions`
with a masked camera: `test_engine_frame.test_isolated_actions_equal_openpi_pi0_sample_actions`.)
"""

from __future__ import annotations

import dataclasses
import logging

import jax
import numpy as np
import pytest
from engine_factories import TINY, make_engine_config, make_observation

from oxygen_ros.engine import compiles
from oxygen_ros.engine.checkpoint import Normalizer
from oxygen_ros.engine.config import NormConfig
from oxygen_ros.engine.engine import Engine
from oxygen_ros.engine.inputs import observation_to_inputs
from oxygen_ros.engine.model_fns import JitModel, PrefixInputs, valid_slots_of
from oxygen_ros.engine.tokenizer import BUNDLED_TOKENIZER_PATH, Tokenizer

WRIST = "left_wrist_0_rgb"


@pytest.fixture(scope="module")
def jit_model(tiny_model) -> JitModel:
    return JitModel(tiny_model, vocab_size=Tokenizer(BUNDLED_TOKENIZER_PATH).vocab_size)


def _inputs(masked: tuple[str, ...], seed: int = 0) -> PrefixInputs:
    observation = make_observation(seed, prompt="stack the cubes")
    masks = {key: key not in masked for key in observation.image_masks}
    return observation_to_inputs(
        dataclasses.replace(observation, image_masks=masks),
        TINY.image_keys,
        TINY.image_resolution,
        Tokenizer(BUNDLED_TOKENIZER_PATH),
        Normalizer(None, NormConfig()),
        TINY.max_token_len,
    )


@pytest.mark.parametrize(
    "masked", [(WRIST,), ("base_0_rgb", "right_wrist_0_rgb"), TINY.image_keys]
)
def test_valid_slots_prefix_equals_compute_then_mask(jit_model, masked) -> None:
    inputs = _inputs(masked)
    slots = valid_slots_of(TINY.image_keys, inputs.image_masks)
    assert slots == tuple(key for key in TINY.image_keys if key not in masked)
    full = jit_model.prefill(inputs)  # openpi's way: every slot encoded, then masked
    compact = jit_model.prefill(inputs, slots)
    assert compact.k.shape == full.k.shape  # padded to the full prefix length
    full_mask, compact_mask = np.asarray(full.mask[0]), np.asarray(compact.mask[0])
    assert full_mask.sum() == compact_mask.sum()
    image_tokens = TINY.num_image_tokens
    assert full_mask.sum() <= TINY.prefix_len - image_tokens * len(masked)
    # Valid tokens first, in order, then masked padding.
    assert (
        compact_mask[: compact_mask.sum()].all() and not compact_mask[compact_mask.sum() :].any()
    )
    for ours, reference in ((compact.k, full.k), (compact.v, full.v)):
        np.testing.assert_allclose(
            np.asarray(ours)[:, 0, compact_mask],
            np.asarray(reference)[:, 0, full_mask],
            atol=1e-5,
        )
    noise = np.random.default_rng(1).standard_normal((1, TINY.action_horizon, TINY.action_dim))
    noise = noise.astype(np.float32)
    np.testing.assert_allclose(
        jit_model.denoise(compact, noise), jit_model.denoise(full, noise), atol=1e-5
    )
    # Language reads the stored prefix by its mask: the same logits from either layout.
    tokens = np.array([[5, 6, 7, 0]], np.int32)
    tail_mask = np.array([[True, True, True, False]])
    rows = np.zeros((1,), np.int32)
    _, _, ours = jit_model.extend(compact, rows, tokens, tail_mask)
    _, _, reference = jit_model.extend(full, rows, tokens, tail_mask)
    np.testing.assert_allclose(ours, reference, atol=2e-5)


def test_the_masked_camera_changes_the_prefix(jit_model) -> None:
    """Control: masking the camera is not a no-op (the valid tokens read fewer images)."""
    valid = jit_model.prefill(_inputs(()))
    masked = jit_model.prefill(
        _inputs((WRIST,)), valid_slots_of(TINY.image_keys, _inputs((WRIST,)).image_masks)
    )
    prompt = slice(0, 8)  # the first base-camera tokens sit first in both layouts
    assert (
        np.abs(np.asarray(valid.k)[:, 0, prompt] - np.asarray(masked.k)[:, 0, prompt]).max() > 1e-4
    )


def test_warmed_up_mask_patterns_serve_without_compiling(tiny_model, caplog) -> None:
    config = make_engine_config(warmup_masked_slots=(WRIST,))
    engine = Engine(config, model=tiny_model)
    engine.warmup()
    observation = make_observation(4)
    wrist_off = dataclasses.replace(
        observation, image_masks={k: k != WRIST for k in observation.image_masks}
    )
    before = compiles.num_compiles()
    with caplog.at_level(logging.WARNING, logger="oxygen_ros.engine"):
        for frame in (observation, wrist_off, observation, wrist_off):
            engine.step(frame)
        assert compiles.num_compiles() == before
        assert "on first use" not in caplog.text
        # Positive control: a pattern outside warmup_masked_slots compiles, and says so.
        base_off = dataclasses.replace(
            observation, image_masks={k: k != "base_0_rgb" for k in observation.image_masks}
        )
        engine.step(base_off)
    assert compiles.num_compiles() > before
    assert "valid image slots (left_wrist_0_rgb, right_wrist_0_rgb) on first use" in caplog.text


def test_warmup_masked_slots_must_be_model_slots() -> None:
    with pytest.raises(ValueError, match="not image slots"):
        make_engine_config(warmup_masked_slots=("head_cam",))


def test_unknown_slot_patterns_normalise_to_one_compilation(jit_model) -> None:
    """Every slot listed (in any order) is the full prefill's one compilation."""
    inputs = _inputs(())
    jax.block_until_ready(jit_model.prefill(inputs))
    before = compiles.num_compiles()
    jax.block_until_ready(jit_model.prefill(inputs, tuple(reversed(TINY.image_keys))))
    assert compiles.num_compiles() == before
