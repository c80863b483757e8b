"""openpi equality on the accelerator: the engine's isolated action path (`Engine.run_isolated`)
against openpi's own `Pi0.sample_actions`, same parameters, same noise, same inputs.

gpu_bench's first stage (loaded by path: benchmarks/ is no package); the CPU test of the same
comparison is test/engine/test_engine_frame.py (float32, a tiny model).

- Parameters: every all-zero leaf (at random init pi0.5's adaRMS modulation, the SigLIP head,
  biases and norm scales are zero, so actions ignore the observation) is replaced by small
  normal noise first (`perturb_zero_params`); openpi's `Pi0Config(pi05=True, ...).load` then
  takes the perturbed tree (openpi's own tree check) and uses its arrays (no copy).
- Inputs: openpi's `Observation.from_dict` gets the engine's own model inputs of the same
  observation (`Engine.prepare_inputs`: images in [-1, 1], masks, the pi0.5 prompt with the
  discretised state in the engine's tokenization), so both sides see identical tokens without
  openpi's PaliGemma tokenizer (not available offline).
- Meaningful: two observations (random vs flat images, other state and prompt), same noise;
  the largest difference between their chunks (`observation_dependence`) must be at least
  `MIN_DEPENDENCE_OVER_TOLERANCE` x the tolerance (`meaningful`), else equality could hide an
  error in the observation path (or only show that both sides ignore their input).
- Tolerance: float32 compute: 1e-5 absolute (the CPU test's). bfloat16 compute:
  `BF16_RELATIVE_TOLERANCE` = 2^-6 of the flow openpi's chunk integrates, max |chunk - noise|
  (the noise is the same input on both sides, not something either computes). bfloat16
  keeps 8 significant bits (unit roundoff u = 2^-9); both sides run openpi's modules, but not
  the same XLA programs (the engine's prefill and denoise are two, around a bfloat16 KV cache;
  openpi's is one), so where XLA fuses or tiles differently, roundings differ: a few u per
  layer that do not cancel, growing with depth (~sqrt of 18 + 27 layers), which the 10 Euler
  steps (dt = 1/10 each) average rather than add. 2^-6 = 8 u of the flow bounds that; a
  wrong mask, position, layer or step moves the chunk by the order of the flow itself. On a
  CPU the two sides agree to the bit, in float32 and in bfloat16.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from oxygen_ros.engine.config import CacheConfig, ModelConfig, get_engine_config
from oxygen_ros.engine.engine import Engine
from oxygen_ros.engine.model import SMALL_GEMMA_VARIANTS, Pi05Model
from oxygen_ros.engine.tokenizer import BUNDLED_TOKENIZER_PATH
from oxygen_ros.engine.types import Observation

PERTURB_SCALE = 0.1  # std of the noise in all-zero leaves (test/engine's), for fan-in <= 64
FLOAT32_TOLERANCE = 1e-5  # absolute, as test_engine_frame's openpi equality
BF16_RELATIVE_TOLERANCE = 2.0**-6  # of max |chunk - noise| (module docstring)
MIN_DEPENDENCE_OVER_TOLERANCE = 4.0  # observation dependence / tolerance, at least
OPENPI_IMAGE_KEYS = ("base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb")
OPENPI_TOWER = "So400m/14"  # openpi's Pi0 hard-codes this SigLIP tower ...
OPENPI_RESOLUTION = (224, 224)  # ... and resizes every image to this
SEEDS = (0, 1)  # the two observations
NOISE_FRAME = 0  # engine.make_noise(NOISE_FRAME) for both sides and both observations


def perturb_zero_params(
    model: Pi05Model, seed: int, scale: float = PERTURB_SCALE
) -> tuple[Pi05Model, int]:
    """The model with every all-zero leaf replaced by normal noise; (model, leaves replaced).

    The std is `scale` for leaves of fan-in (second-to-last dim) <= 64 (openpi's `dummy`
    Gemma, width 64: the CPU test's perturbation) and scale x 8 / sqrt(fan-in) beyond, so
    wide layers (gemma_300m's adaRMS modulation, fan-in 1024) get modulations of that size.
    Non-zero leaves are kept (the same arrays). On the device: one jitted zero test over the
    whole tree and one jitted draw for the zero leaves (two compilations, no host copy).
    """
    graphdef, state = nnx.split(model)
    leaves, treedef = jax.tree.flatten(state)
    is_zero = jax.device_get(jax.jit(lambda xs: jnp.stack([jnp.all(x == 0) for x in xs]))(leaves))
    specs = tuple(
        (index, tuple(leaves[index].shape), str(leaves[index].dtype))
        for index, zero in enumerate(is_zero)
        if zero
    )

    def std(shape: tuple[int, ...]) -> float:
        fan_in = shape[-2] if len(shape) >= 2 else 1
        return scale * min(1.0, 8.0 / math.sqrt(max(fan_in, 1)))

    def draw(key: jax.Array) -> list[jax.Array]:
        return [
            (std(shape) * jax.random.normal(jax.random.fold_in(key, index), shape)).astype(dtype)
            for index, shape, dtype in specs
        ]

    for (index, _, _), leaf in zip(specs, jax.jit(draw)(jax.random.key(seed)), strict=True):
        leaves[index] = leaf
    return nnx.merge(graphdef, jax.tree.unflatten(treedef, leaves)), len(specs)


def openpi_incompatibility(config: ModelConfig) -> str | None:
    """Why openpi's `Pi0` cannot run this model config (None: it can; another tower is put
    in place of openpi's, `openpi_reference`)."""
    if tuple(config.image_resolution) != OPENPI_RESOLUTION:
        return f"image resolution {config.image_resolution} (openpi resizes to 224 x 224)"
    if tuple(config.image_keys) != OPENPI_IMAGE_KEYS:
        return f"image keys {config.image_keys} (openpi's are {OPENPI_IMAGE_KEYS})"
    for variant in (config.paligemma_variant, config.action_expert_variant):
        if variant in SMALL_GEMMA_VARIANTS:
            return f"gemma variant {variant} is this project's, not openpi's"
    return None


def openpi_reference(model: Pi05Model) -> tuple[nnx.Module, str]:
    """openpi's `Pi0` holding `model`'s parameters (its arrays, not copies); how it was built.

    With openpi's tower (pi05): `Pi0Config(pi05=True, ...).load`, openpi's own loading path
    (its tree check). With another tower (the tiny preset's SigLIP mu/14; openpi's Pi0
    hard-codes So400m/14, whose 400M parameters take ~50 s per comparison on a 2-core CPU):
    openpi's Pi0 built shape-only with `model`'s own tower module (openpi's `siglip.Module`,
    another variant) put in place of its So400m, then filled the same way (openpi's tree
    check, `replace_by_pure_dict`); everything but the tower's size is openpi's Pi0.
    """
    import openpi.shared.array_typing as at
    from openpi.models import pi0_config

    config = model.config
    openpi_config = pi0_config.Pi0Config(
        pi05=True,
        paligemma_variant=config.paligemma_variant,  # type: ignore[arg-type]
        action_expert_variant=config.action_expert_variant,  # type: ignore[arg-type]
        dtype=config.dtype,
        action_dim=config.action_dim,
        action_horizon=config.action_horizon,
        max_token_len=config.max_token_len,
    )
    params = nnx.to_pure_dict(nnx.state(model))
    if config.vision_variant == OPENPI_TOWER:
        return openpi_config.load(params), "openpi Pi0Config(pi05=True).load"
    reference = nnx.eval_shape(openpi_config.create, jax.random.key(0))
    reference.PaliGemma["img"] = model.PaliGemma["img"]  # type: ignore[attr-defined]
    graphdef, state = nnx.split(reference)
    at.check_pytree_equality(
        expected=state.to_pure_dict(), got=params, check_shapes=True, check_dtypes=False
    )
    state.replace_by_pure_dict(params)
    return nnx.merge(graphdef, state), (
        f"openpi Pi0(pi05=True) with the model's own {config.vision_variant} tower module in "
        f"place of its {OPENPI_TOWER} (openpi hard-codes that tower)"
    )


def tolerance(config: ModelConfig, flow_scale: float) -> tuple[float, str]:
    """(absolute tolerance, why) for chunks computed in `config.dtype` whose flow (max |chunk
    - noise|) is `flow_scale` (module docstring)."""
    if config.dtype == "float32":
        return FLOAT32_TOLERANCE, "float32 compute: 1e-5 absolute (the CPU test's)"
    return BF16_RELATIVE_TOLERANCE * flow_scale, (
        f"{config.dtype} compute: 2^-6 x openpi's flow max |chunk - noise| ({flow_scale:.3g}): "
        "8 bfloat16 roundoffs (u = 2^-9) where the two sides' XLA programs round differently"
    )


def equality_engine(model: Pi05Model) -> Engine:
    """An isolated engine of `model` on the bundled tokenizer (the prompt only needs ids that
    both sides share) with the smallest language cache. Its prefill and denoise are the
    timed engines' own compilations (jitted per ModelConfig)."""
    base = get_engine_config(model.config.name)
    config = dataclasses.replace(
        base,
        model=model.config,
        tokenizer_path=str(BUNDLED_TOKENIZER_PATH),
        cache=CacheConfig(num_slots=1, num_prefixes=1, max_seq_len=base.cache.max_seq_len),
    )
    config = dataclasses.replace(
        config, scheduler=dataclasses.replace(config.scheduler, mode="isolated")
    )
    return Engine(config, model=model)


def make_observation(config: ModelConfig, seed: int) -> Observation:
    """Observation `seed`: 0 random uint8 images, 1 flat grey-level images (image tokens of
    another mean: random images of the same statistics barely move a randomly initialised
    model's attention average); another 8-dim state in [-1, 1] and another prompt."""
    rng = np.random.default_rng([17, seed])
    height, width = config.image_resolution
    images = {}
    for index, key in enumerate(config.image_keys):
        if seed % 2 == 0:
            images[key] = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
        else:
            images[key] = np.full((height, width, 3), 40 + 80 * index, np.uint8)
    return Observation(
        images=images,
        image_masks={key: True for key in config.image_keys},
        state=rng.uniform(-1, 1, (8,)).astype(np.float32),
        prompt=("pick up the red block", "put the cup in the sink")[seed % 2],
        stamp=0.0,
    )


def openpi_observation(engine: Engine, observation: Observation) -> object:
    """openpi's Observation of the engine's own model inputs for `observation`."""
    from openpi.models import model as openpi_model

    inputs = engine.prepare_inputs(observation)
    config = engine.config.model
    state = np.zeros((1, config.action_dim), np.float32)  # pi0.5 reads the state from tokens
    normalized = engine.normalizer.normalize_state(np.asarray(observation.state, np.float32))
    state[0, : normalized.shape[0]] = normalized
    return openpi_model.Observation.from_dict(
        {
            "image": {k: np.asarray(v, np.float32) for k, v in inputs.images.items()},
            "image_mask": {k: np.asarray(v, bool) for k, v in inputs.image_masks.items()},
            "state": state,
            "tokenized_prompt": np.asarray(inputs.tokens, np.int32),
            "tokenized_prompt_mask": np.asarray(inputs.token_mask, bool),
        }
    )


def compare(
    model: Pi05Model,
    engine: Engine,
    proceed: Callable[[dict[str, float]], str | None] | None = None,
) -> dict[str, object]:
    """Our isolated chunks of two observations, then openpi's, same noise; the record.

    `proceed(timings)` is asked after our side ran (timings: `ours_first_s`, the first call
    with its compilations, and `ours_second_s`, a compiled call); a string it returns skips
    openpi's side and is recorded as `skipped`.
    """
    config = model.config
    record: dict[str, object] = {
        "model": config.name,
        "vision_variant": config.vision_variant,
        "dtype": config.dtype,
        "param_dtype": config.param_dtype,
        "num_denoise_steps": config.num_denoise_steps,
        "observations": len(SEEDS),
        "noise": f"engine.make_noise({NOISE_FRAME}) for both sides and observations",
    }
    noise = engine.make_noise(NOISE_FRAME)
    observations = [make_observation(config, seed) for seed in SEEDS]
    ours, timings = [], {}
    for index, observation in enumerate(observations):
        start = time.perf_counter()
        chunk = engine.run_isolated(observation, noise=noise).actions
        assert chunk is not None
        ours.append(np.asarray(chunk.actions, np.float32))
        timings[("ours_first_s", "ours_second_s")[index]] = time.perf_counter() - start
    record.update(timings)
    dependence = float(np.max(np.abs(ours[0] - ours[1])))
    record["observation_dependence"] = dependence
    record["action_scale"] = float(max(np.max(np.abs(chunk)) for chunk in ours))
    skipped = None if proceed is None else proceed(timings)
    if skipped is not None:
        record.update(openpi_equal=None, skipped=skipped)
        return record

    from openpi.shared import nnx_utils

    start = time.perf_counter()
    reference, record["openpi_model"] = openpi_reference(model)
    sample_actions = nnx_utils.module_jit(reference.sample_actions, static_argnames="num_steps")
    expected = []
    for index, observation in enumerate(observations):
        actions = sample_actions(
            jax.random.key(0),
            openpi_observation(engine, observation),
            num_steps=config.num_denoise_steps,
            noise=noise,
        )
        expected.append(np.asarray(actions, np.float32)[0, :, : ours[index].shape[-1]])
        if index == 0:
            record["openpi_first_s"] = time.perf_counter() - start
    del reference, sample_actions  # openpi's copy of the graph (the arrays are ours)
    record["openpi_s"] = time.perf_counter() - start
    diffs = [float(np.max(np.abs(a - b))) for a, b in zip(ours, expected, strict=True)]
    start_noise = noise[0, :, : ours[0].shape[-1]]
    flow_scale = float(max(np.max(np.abs(chunk - start_noise)) for chunk in expected))
    atol, why = tolerance(config, flow_scale)
    max_diff = max(diffs)
    record.update(
        max_abs_diff=max_diff,
        max_abs_diff_per_observation=diffs,
        flow_scale=flow_scale,
        max_diff_over_flow=max_diff / flow_scale if flow_scale else None,
        tolerance=atol,
        tolerance_rule=why,
        dependence_over_tolerance=dependence / atol,
        dependence_over_diff=dependence / max_diff if max_diff else None,
        openpi_equal=bool(max_diff <= atol),
        meaningful=bool(dependence >= MIN_DEPENDENCE_OVER_TOLERANCE * atol),
    )
    return record
