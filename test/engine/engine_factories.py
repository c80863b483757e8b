"""Small factories shared by the engine tests (imported by conftest.py and the test modules).

Kept out of conftest.py because test/conftest.py already owns the module name `conftest`.
"""

from __future__ import annotations

import dataclasses
import pathlib
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from oxygen_ros.engine.checkpoint import Normalizer
from oxygen_ros.engine.config import (
    CacheConfig,
    EngineConfig,
    ModelConfig,
    NormConfig,
    get_model_config,
)
from oxygen_ros.engine.inputs import observation_to_inputs
from oxygen_ros.engine.model import Pi05Model
from oxygen_ros.engine.model_fns import PrefixInputs
from oxygen_ros.engine.tokenizer import BUNDLED_TOKENIZER_PATH, Tokenizer
from oxygen_ros.engine.types import LanguageRequest, Observation, RequestKind

TINY = get_model_config("tiny")
PERTURB_SCALE = 0.1
# One cache shape for every engine test, so they all share the runner's compilations.
TEST_CACHE = CacheConfig(num_slots=4, num_prefixes=4, max_seq_len=64)


def perturb_zero_params(model: Pi05Model, seed: int, scale: float = PERTURB_SCALE) -> Pi05Model:
    """Replaces every all-zero parameter with small normal noise.

    At random init pi0.5's adaRMS modulation (scale, shift, gate), the SigLIP head, norm
    scales and biases are zero, so actions ignore the observation; this makes every
    parameter matter. Non-zero parameters are kept.
    """
    graphdef, state = nnx.split(model)
    leaves, treedef = jax.tree.flatten(state)
    key = jax.random.key(seed)
    out = []
    for index, leaf in enumerate(leaves):
        # The zero test, the scaling and the cast in numpy (the same IEEE float32 multiply
        # and round-to-nearest cast, so the same bits): eager jnp ops compiled one XLA program
        # per op and leaf shape, about 20 s per model on CI. Only the draw stays in JAX.
        if not np.any(np.asarray(leaf) != 0):
            noise = jax.random.normal(jax.random.fold_in(key, index), leaf.shape, jnp.float32)
            scaled = np.float32(scale) * np.asarray(noise)
            leaf = jnp.asarray(scaled.astype(leaf.dtype))
        out.append(leaf)
    return nnx.merge(graphdef, jax.tree.unflatten(treedef, out))


def make_engine_config(model: ModelConfig = TINY, **overrides: object) -> EngineConfig:
    """Engine config on the bundled tokenizer (no PaliGemma model on CI machines) and the
    shared test cache shape."""
    base = EngineConfig(model=model, tokenizer_path=str(BUNDLED_TOKENIZER_PATH), cache=TEST_CACHE)
    return dataclasses.replace(base, **overrides)


def make_observation(
    seed: int = 0,
    *,
    model: ModelConfig = TINY,
    state_dim: int = 8,
    prompt: str = "pick up the red block and put it in the bowl",
    stamp: float = 12.5,
) -> Observation:
    """Random uint8 images for every slot and a state partly outside [-1, 1]."""
    rng = np.random.default_rng(seed)
    height, width = model.image_resolution
    images = {
        k: rng.integers(0, 256, (height, width, 3), dtype=np.uint8) for k in model.image_keys
    }
    state = rng.uniform(-1.2, 1.2, (state_dim,)).astype(np.float32)
    return Observation(
        images=images,
        image_masks={k: True for k in model.image_keys},
        state=state,
        prompt=prompt,
        stamp=stamp,
    )


def make_request(kind: RequestKind = RequestKind.SUBTASK, **fields: object) -> LanguageRequest:
    return LanguageRequest(kind=kind, **fields)  # type: ignore[arg-type]


def record_decode_sizes(engine) -> list[int]:
    """Wraps `engine.runner.decode_step` so that each call appends its number of active rows
    to the returned list (the engine is otherwise unchanged)."""
    sizes: list[int] = []
    decode_step = engine.runner.decode_step

    def spy(running):
        sizes.append(len(running))
        return decode_step(running)

    engine.runner.decode_step = spy
    return sizes


def use_bundled_tokenizer_for_openpi(monkeypatch: pytest.MonkeyPatch, home: pathlib.Path) -> None:
    """Points openpi's PaliGemma tokenizer download cache at the bundled small model."""
    target = home / "big_vision" / "paligemma_tokenizer.model"
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(BUNDLED_TOKENIZER_PATH, target)
    monkeypatch.setenv("OPENPI_DATA_HOME", str(home))


def make_batch_inputs(tokenizer: Tokenizer, *seeds: int) -> PrefixInputs:
    """Model inputs of len(seeds) observations (`make_observation(seed)`, one row each)."""
    rows = [
        observation_to_inputs(
            make_observation(seed, prompt=f"task number {seed}"),
            TINY.image_keys,
            TINY.image_resolution,
            tokenizer,
            Normalizer(None, NormConfig()),
            TINY.max_token_len,
        )
        for seed in seeds
    ]
    return jax.tree.map(lambda *xs: np.concatenate(xs, axis=0), *rows)
