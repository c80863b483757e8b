"""The prefix prefill with every camera valid and with one masked, through openpi's module,
through the engine's LLM forward with every slot encoded, and with masked slots skipped (not
collected by pytest).

- `openpi_*`: `JitModel.prefill_openpi`, openpi's `gemma.Module` (every slot encoded by the
  image tower and run through the LLM, then masked): the prefill served before issue 67;
- `encoded_*`: `JitModel.prefill(inputs)`, the engine's LLM forward (`cascade.forward`), every
  slot still encoded (the masked one's mask False);
- `two_cameras_skipped`: `JitModel.prefill(inputs, valid_slots)`, what the engine runs: only
  the valid slots encoded.

Timing on `--preset` (median over `--rounds` interleaved rounds of the median of `--runs`
calls, device work waited for), and XLA's FLOPs and bytes (cost analysis of the compiled
function, not run) for the timing preset and for `pi05`, lowered with abstract parameters
(shapes only: no weights are allocated). XLA:CPU counts a scanned loop's body once (the
JSON's `xla_scan_check`: a 10-step scan of a matmul counts as one matmul), and openpi scans
the Gemma layers and the SigLIP blocks, so its counts cover one layer of each stack plus the
rest: compare before with after, not with the minimum. Beside XLA's counts, the matmul
minimum: 2 x the
weights each token passes through x the tokens that need them (image tower per valid camera's
patches, prefix LLM per valid token), plus attention (4 x valid tokens^2 x heads x head dim
per layer); and the weights' bytes (each read once).

Writes JSON (`--output`) and prints the table.

Usage (repository root, after `source scripts/env.sh`):
    python benchmarks/prefill_slots.py [--preset tiny] [--runs 10] [--rounds 3]
        [--cost-presets tiny,pi05] [--output FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import statistics
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))  # roofline (benchmarks/ is no package)

import flax.nnx as nnx  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402
import roofline  # noqa: E402

from oxygen_ros.engine.config import ModelConfig, get_model_config  # noqa: E402
from oxygen_ros.engine.model import abstract_model, create_model, gemma_config  # noqa: E402
from oxygen_ros.engine.model_fns import JitModel, PrefixInputs, _compiled  # noqa: E402

MASKED = "left_wrist_0_rgb"  # the camera masked in the 2-camera case


def _inputs(config: ModelConfig, masked: tuple[str, ...]) -> PrefixInputs:
    rng = np.random.default_rng(0)
    height, width = config.image_resolution
    images = {
        key: rng.uniform(-1, 1, (1, height, width, 3)).astype(np.float32)
        for key in config.image_keys
    }
    masks = {key: np.array([key not in masked]) for key in config.image_keys}
    tokens = rng.integers(1, 600, (1, config.max_token_len)).astype(np.int32)
    token_mask = np.arange(config.max_token_len)[None] < 40  # a 40-token prompt
    return PrefixInputs(images, masks, tokens, token_mask)


def _abstract(tree: object) -> object:
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype), tree)


def matmul_weights(config: ModelConfig) -> tuple[float, float, float]:
    """(image tower weights per patch, prefix LLM weights per token, bytes of both), counted
    from the parameter shapes: kernels (2+ dims) of the tower and of the LLM's first expert
    (the action expert, suffix `_1`, and the embedding table are not on the prefix path)."""
    state = nnx.state(abstract_model(config), nnx.Param)
    tower = llm = weight_bytes = 0.0
    for path, leaf in nnx.to_flat_state(state):
        names = [str(p) for p in path]
        value = leaf.get_value()
        size = float(np.prod(value.shape))
        if len(value.shape) < 2 or any(n.endswith("_1") for n in names):
            continue
        if "img" in names:
            tower += size
        elif "layers" in names:
            llm += size
        else:
            continue
        weight_bytes += size * np.dtype(value.dtype).itemsize
    return tower, llm, weight_bytes


def minimum(config: ModelConfig, valid_cameras: int) -> dict[str, float]:
    tower, llm, weight_bytes = matmul_weights(config)
    patches = config.num_image_tokens * valid_cameras
    tokens = patches + 40  # the prompt's valid tokens
    gemma = gemma_config(config.paligemma_variant)
    attention = 4.0 * tokens**2 * gemma.num_heads * gemma.head_dim * gemma.depth
    return {
        "flops": 2.0 * tower * patches + 2.0 * llm * tokens + attention,
        "weight_bytes": weight_bytes,
        "valid_tokens": tokens,
    }


def _cases(config: ModelConfig) -> dict[str, tuple[PrefixInputs, tuple[str, ...] | None]]:
    valid_two = tuple(key for key in config.image_keys if key != MASKED)
    three, two = _inputs(config, ()), _inputs(config, (MASKED,))
    return {
        "openpi_three_cameras": (three, None),
        "openpi_two_cameras": (two, None),
        "encoded_three_cameras": (three, None),
        "encoded_two_cameras": (two, None),
        "two_cameras_skipped": (two, valid_two),
    }


def xla_costs(preset: str) -> dict[str, object]:
    config = get_model_config(preset)
    fns = _compiled(config)
    leaves = [
        jax.ShapeDtypeStruct(leaf.shape, leaf.dtype)
        for leaf in jax.tree.leaves(nnx.state(abstract_model(config)))
    ]
    out: dict[str, object] = {}
    for name, (inputs, slots) in _cases(config).items():
        start = time.perf_counter()
        if name.startswith("openpi"):
            lowered = fns.prefill_openpi.lower(leaves, _abstract(inputs))
        else:
            lowered = fns.prefill.lower(leaves, _abstract(inputs), slots)
        counted = roofline.cost(lowered)
        counted["compile_s"] = time.perf_counter() - start
        counted["minimum"] = minimum(config, 3 if name.endswith("three_cameras") else 2)
        out[name] = counted
    return out


def scan_check() -> dict[str, float]:
    """XLA's FLOPs of a 10-step scan of a 64x64 matmul against one such matmul."""
    x, weights = jax.numpy.ones((64, 64)), jax.numpy.ones((10, 64, 64))
    scanned = jax.jit(lambda x, ws: jax.lax.scan(lambda c, w: (c @ w, None), x, ws)[0])
    single = jax.jit(lambda x, w: x @ w)
    return {
        "scan_10_steps_flops": roofline.cost(scanned.lower(x, weights))["flops"],
        "one_step_flops": roofline.cost(single.lower(x, weights[0]))["flops"],
    }


def timings(preset: str, runs: int, rounds: int) -> dict[str, float]:
    config = get_model_config(preset)
    model = JitModel(create_model(config, seed=0))
    cases = _cases(config)

    def call(name: str, inputs: PrefixInputs, slots: tuple[str, ...] | None) -> None:
        if name.startswith("openpi"):
            jax.block_until_ready(model.prefill_openpi(inputs))
        else:
            jax.block_until_ready(model.prefill(inputs, slots))

    for name, (inputs, slots) in cases.items():
        call(name, inputs, slots)  # compile
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(rounds):
        for name, (inputs, slots) in cases.items():
            times = []
            for _ in range(runs):
                start = time.perf_counter()
                call(name, inputs, slots)
                times.append(time.perf_counter() - start)
            samples[name].append(statistics.median(times))
    return {f"{name}_s": statistics.median(values) for name, values in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cost-presets", default="tiny,pi05")
    parser.add_argument("--output", type=pathlib.Path, default=None)
    args = parser.parse_args()
    measured = timings(args.preset, args.runs, args.rounds)
    three = measured["encoded_three_cameras_s"]
    measured["two_over_three_openpi"] = (
        measured["openpi_two_cameras_s"] / measured["openpi_three_cameras_s"]
    )
    measured["two_over_three_encoded"] = measured["encoded_two_cameras_s"] / three
    measured["two_over_three_skipped"] = measured["two_cameras_skipped_s"] / three
    measured["openpi_over_engine_three_cameras"] = measured["openpi_three_cameras_s"] / three
    costs = {preset: xla_costs(preset) for preset in args.cost_presets.split(",") if preset}
    result = {
        "preset": args.preset,
        "masked_slot": MASKED,
        "runs": args.runs,
        "rounds": args.rounds,
        "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform()},
        "jax_backend": jax.default_backend(),
        "timing": measured,
        "xla": costs,
        "xla_scan_check": scan_check(),
    }
    print(f"prefill ({args.preset}), ms:")
    for name in _cases(get_model_config(args.preset)):
        print(f"  {name:22s} {measured[name + '_s'] * 1e3:7.1f}")
    print(
        f"2 cameras / 3: openpi {measured['two_over_three_openpi']:.2f}, encoded "
        f"{measured['two_over_three_encoded']:.2f}, skipped "
        f"{measured['two_over_three_skipped']:.2f}; openpi / engine at 3 cameras "
        f"{measured['openpi_over_engine_three_cameras']:.2f}"
    )
    for preset, cases in costs.items():
        for name, entry in cases.items():
            low = entry["minimum"]
            print(
                f"{preset:5s} {name:20s} XLA {entry['flops'] / 1e9:8.2f} GFLOP "
                f"{entry['bytes'] / 1e9:7.2f} GB | minimum {low['flops'] / 1e9:8.2f} GFLOP "
                f"{low['weight_bytes'] / 1e9:6.2f} GB weights"
            )
    if args.output is not None:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
