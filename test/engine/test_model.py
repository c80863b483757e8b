"""Pi05Model's parameter tree is openpi's Pi0(pi05=True) tree (shapes only, never materialised)."""

from __future__ import annotations

import dataclasses
import math

import jax
import pytest
from engine_factories import TINY
from flax import nnx
from openpi.models import gemma as openpi_gemma
from openpi.models import pi0_config

from oxygen_ros.engine.config import PALIGEMMA_VOCAB_SIZE, PRESET_NAMES, get_model_config
from oxygen_ros.engine.model import abstract_model, gemma_config, param_count, param_shapes


def _openpi_shapes(**config: object) -> dict[str, tuple[tuple[int, ...], str]]:
    openpi_config = pi0_config.Pi0Config(pi05=True, **config)  # type: ignore[arg-type]
    return param_shapes(nnx.eval_shape(openpi_config.create, jax.random.key(0)))


def test_tiny_tree_with_so400m_tower_equals_openpi_dummy_pi05() -> None:
    ours = param_shapes(abstract_model(dataclasses.replace(TINY, vision_variant="So400m/14")))
    theirs = _openpi_shapes(paligemma_variant="dummy", action_expert_variant="dummy")
    assert ours == theirs


def test_tiny_tree_differs_from_openpi_only_in_the_image_tower() -> None:
    ours = param_shapes(abstract_model(TINY))
    theirs = _openpi_shapes(paligemma_variant="dummy", action_expert_variant="dummy")
    not_img = {k for k in theirs if not k.startswith("PaliGemma/img/")}
    assert {k: ours[k] for k in not_img} == {k: theirs[k] for k in not_img}
    assert set(ours) == set(theirs)  # same paths: only the tower's widths differ
    assert ours["PaliGemma/img/embedding/kernel"][0] == (14, 14, 3, 32)  # mu/14 width
    assert ours["PaliGemma/img/head/kernel"][0] == (32, 64)  # projects into Gemma width


def test_pi05_preset_tree_equals_openpi_pi05() -> None:
    preset = get_model_config("pi05")
    ours = param_shapes(abstract_model(dataclasses.replace(preset, param_dtype="float32")))
    theirs = _openpi_shapes()  # Pi0Config defaults: gemma_2b + gemma_300m
    assert ours == theirs
    assert param_count(abstract_model(preset)) == sum(math.prod(s) for s, _ in theirs.values())
    # Abstract preset parameters are in the configured dtype (bf16 checkpoints).
    assert {dtype for _, dtype in param_shapes(abstract_model(preset)).values()} == {"bfloat16"}


def test_presets_have_openpi_image_layout() -> None:
    assert PALIGEMMA_VOCAB_SIZE == openpi_gemma.PALIGEMMA_VOCAB_SIZE
    for name in PRESET_NAMES:
        config = get_model_config(name)
        assert config.image_keys == ("base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb")
        tokens = 36 if name.startswith("workcell") else 256  # 96 px / 16 vs 224 px / 14
        assert config.num_image_tokens == tokens
        assert config.prefix_len == 3 * tokens + config.max_token_len


def test_workcell_tree_differs_from_tiny_only_in_sizes() -> None:
    """Same code paths: every parameter path of `tiny` exists in `workcell` and vice versa."""
    tiny = param_shapes(abstract_model(get_model_config("tiny")))
    workcell = param_shapes(abstract_model(get_model_config("workcell")))
    assert set(tiny) == set(workcell)
    differ = {k for k in tiny if tiny[k] != workcell[k]}
    assert differ and all(k.startswith("PaliGemma/img/") for k in differ), differ
    with pytest.raises(ValueError, match="unknown model preset 'big'"):
        get_model_config("big")


def test_wide_preset_widens_only_the_gemma_experts() -> None:
    """`workcell_target_wide` is `workcell_target_bins` with both experts at model.py's
    `oxygen_w256`: the same parameter paths; every shape that differs is one of the experts'
    (or a projection into or out of them), now 256 wide where openpi's `dummy` is 64."""
    narrow = param_shapes(abstract_model(get_model_config("workcell_target_bins")))
    wide = param_shapes(abstract_model(get_model_config("workcell_target_wide")))
    assert set(narrow) == set(wide)
    differ = {k for k in narrow if narrow[k] != wide[k]}
    gemma_paths = ("PaliGemma/llm/", "PaliGemma/img/head/", "action_", "time_mlp_")
    assert differ and all(k.startswith(gemma_paths) for k in differ), differ
    assert not any(k.startswith("PaliGemma/img/") and "head" not in k for k in differ)
    q_narrow, q_wide = (s["PaliGemma/llm/layers/attn/q_einsum/w"][0] for s in (narrow, wide))
    assert q_narrow == (4, 8, 64, 16)  # openpi's dummy: depth 4, 8 heads of 16, width 64
    assert q_wide == (4, 8, 256, 32)
    assert gemma_config("dummy") == openpi_gemma.get_config("dummy")  # openpi's names pass through
    assert gemma_config("oxygen_w256").width == 256
    with pytest.raises(ValueError, match="Unknown variant"):
        gemma_config("oxygen_w999")
