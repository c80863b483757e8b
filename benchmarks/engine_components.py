"""Times the engine's model functions on a preset, with their roofline (not collected by pytest).

Median wall-clock seconds over `--runs` calls after one warm-up (compilation) call, device
work waited for: prefix prefill, action denoising (plain and real-time chunking), language
tail extend of one admitted request (at the width the runner uses for it, and at the full
`extend_rows` width every admission paid before extends were bucketed), one decode step (all
slots active; logits alone and fused with greedy sampling; and the fused step reading only
the first 128 prefix tokens, which shows what gathering and concatenating each row's stored
prefix costs a step), an argmax over those logits, a
whole shared-prefix frame with two language requests, and the real pi0.5 preset's parameter
count from shapes only.

For every component: XLA's FLOPs and bytes and the fraction of this machine's roofline it
reaches (`roofline.py`: matmul peak and memory bandwidth probed in the same run). And the
greedy-decode check: a greedy decode step at `num_slots` rows (the engine's fused decode +
sample) against the logits alone plus an argmax, `greedy_over_logits_plus_argmax` <= 1.2 is
the target (`--vocab full` gives the 257,152-row head PaliGemma's tokenizer has).

Writes JSON (`--output`) and prints the component table.

Usage (repository root, after `source scripts/env.sh`):
    python benchmarks/engine_components.py [--preset tiny] [--vocab full] [--runs 10]
        [--output FILE]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import pathlib
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))  # roofline, full_vocab (benchmarks/ is no package)

import full_vocab  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import roofline  # noqa: E402

from oxygen_ros.engine import prompts  # noqa: E402
from oxygen_ros.engine.config import (  # noqa: E402
    PALIGEMMA_VOCAB_SIZE,
    get_engine_config,
    get_model_config,
)
from oxygen_ros.engine.engine import Engine  # noqa: E402
from oxygen_ros.engine.kv_cache import write_tail_rows  # noqa: E402
from oxygen_ros.engine.model import abstract_model, param_count  # noqa: E402
from oxygen_ros.engine.model_fns import Prefix  # noqa: E402
from oxygen_ros.engine.types import LanguageRequest, Observation, RequestKind  # noqa: E402

GREEDY_TARGET = 1.2  # greedy decode step <= (logits + argmax) x this
SHORT_PREFIX = 128  # prefix tokens of the decode step that shows what the prefix costs


def _median_s(fn: Callable[[], object], runs: int) -> float:
    jax.block_until_ready(fn())  # warm-up: compile
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _observation(engine: Engine) -> Observation:
    config = engine.config.model
    rng = np.random.default_rng(0)
    images = {
        k: rng.integers(0, 256, (*config.image_resolution, 3), dtype=np.uint8)
        for k in config.image_keys
    }
    return Observation(
        images=images,
        image_masks={k: True for k in config.image_keys},
        state=rng.uniform(-1, 1, (8,)).astype(np.float32),
        prompt="pick up the red block and put it in the bowl",
        stamp=0.0,
    )


def measure(preset: str, vocab: str, runs: int, workdir: pathlib.Path) -> dict[str, object]:
    peaks = roofline.machine_peaks()
    tokenizer_path, _ = full_vocab.tokenizer_for(preset, vocab, workdir)
    overrides = {} if tokenizer_path is None else {"tokenizer_path": tokenizer_path}
    config = get_engine_config(preset, **overrides)
    engine = Engine(config)
    model, cache = engine.model, config.cache
    slots = cache.num_slots
    head_rows = model.vocab_size or PALIGEMMA_VOCAB_SIZE
    observation = _observation(engine)
    inputs = engine.prepare_inputs(observation)
    prefix = jax.block_until_ready(model.prefill(inputs))
    noise = engine.make_noise(0)
    steps = config.model.num_denoise_steps
    tail_tokens, tail_mask = prompts.tokenize_tail(
        engine.tokenizer, config.prompt.narration.tail, config.prompt.max_tail_len
    )

    def extend_args(rows: int) -> tuple[np.ndarray, ...]:
        """One admitted request's tail in row 0 of a `rows`-row extend (the rest padding)."""
        tails = np.zeros((rows, tail_tokens.shape[0]), np.int32)
        masks = np.zeros((rows, tail_mask.shape[0]), bool)
        tails[0], masks[0] = tail_tokens, tail_mask
        zeros = np.zeros((rows,), np.int32)
        return tails, masks, zeros, np.zeros((rows,), np.float32)

    def extend_once(rows: int) -> Callable[[], object]:
        tails, masks, zeros, temperature = extend_args(rows)

        def call() -> object:  # the admission's device work: extend + first ids
            _, _, logits = model.extend(prefix, zeros, tails, masks)
            return model.sample_tokens(logits, temperature, zeros, zeros)

        return call

    def extend_lowered(rows: int) -> list[jax.stages.Lowered]:
        tails, masks, zeros, temperature = extend_args(rows)
        logits = np.zeros((rows, head_rows), np.float32)
        return [
            model.lower("extend", prefix, zeros, tails, masks, model.vocab_size),
            model.lower("sample_tokens", logits, temperature, zeros, zeros, False),
        ]

    # Decode: every slot active, reading the frame's prefix, after its narration tail.
    tails = np.repeat(tail_tokens[None], slots, 0)
    masks = np.repeat(tail_mask[None], slots, 0)
    rows = np.zeros((slots,), np.int32)
    tail_k, tail_v, _ = model.extend(prefix, rows, tails, masks)
    gen_len = masks.sum(axis=1).astype(np.int32)
    tokens = np.full((slots,), 5, np.int32)
    active = np.ones((slots,), bool)
    greedy = np.zeros((slots,), np.float32)
    seeds = np.zeros((slots,), np.int32)
    sampling = (greedy, seeds, seeds)  # every row greedy

    def gen_cache() -> dict[str, jax.Array]:
        """A generated cache holding every slot's narration tail (donated by each step)."""
        k, v = model.empty_gen_cache(slots, cache.max_seq_len)
        k, v = write_tail_rows(k, v, tail_k, tail_v, np.arange(slots, dtype=np.int32))
        return {"k": k, "v": v}

    def step_args(step_prefix: Prefix, gen: dict[str, jax.Array]) -> tuple[object, ...]:
        """A decode step's arguments after the parameters, reading `step_prefix`."""
        return (step_prefix, rows, gen["k"], gen["v"], gen_len, tokens, active)

    state = gen_cache()

    def decode_logits() -> object:  # decode step, logits out (no sampling)
        logits, state["k"], state["v"] = model.decode_step(*step_args(prefix, state))
        return logits

    def greedy_step(step_prefix: Prefix, gen: dict[str, jax.Array]) -> Callable[[], object]:
        def call() -> object:  # the engine's fused decode + sample
            sampled, gen["k"], gen["v"] = model.decode_sample(
                *step_args(step_prefix, gen), *sampling
            )
            return sampled

        return call

    # The same step reading a 128-token prefix: what the per-step gather and concatenation of
    # each row's stored prefix ([L, B, S, K, H]) with the generated cache cost.
    short = Prefix(
        prefix.k[:, :, :SHORT_PREFIX], prefix.v[:, :, :SHORT_PREFIX], prefix.mask[:, :SHORT_PREFIX]
    )
    short_state = gen_cache()

    logits = jax.block_until_ready(decode_logits())
    argmax = jax.jit(lambda x: jnp.argmax(x, axis=-1))
    previous = np.zeros_like(noise)
    requests = (
        LanguageRequest(RequestKind.NARRATION, max_tokens=16),
        LanguageRequest(RequestKind.MEMORY, max_tokens=16),
    )
    one_row = engine.runner.extend_width(1)
    full_rows = config.extend_rows
    times = {
        "prefill": _median_s(lambda: model.prefill(inputs), runs),
        "denoise": _median_s(lambda: model.denoise(prefix, noise), runs),
        # Real-time chunking: the same loop plus one VJP per step (a 3-row delay, 5 guided).
        "denoise_rtc": _median_s(
            lambda: model.denoise_rtc(prefix, noise, previous, 3, 8, 5.0), runs
        ),
        f"extend_1req_w{one_row}": _median_s(extend_once(one_row), runs),
        f"extend_1req_w{full_rows}": _median_s(extend_once(full_rows), runs),
        f"decode_logits_b{slots}": _median_s(decode_logits, runs),
        f"decode_greedy_b{slots}": _median_s(greedy_step(prefix, state), runs),
        f"argmax_b{slots}": _median_s(lambda: argmax(logits), runs),
        f"decode_greedy_b{slots}_prefix{SHORT_PREFIX}": _median_s(
            greedy_step(short, short_state), runs
        ),
    }
    lowered = {
        "prefill": model.lower("prefill", inputs),
        "denoise": model.lower("denoise", prefix, noise, steps),
        "denoise_rtc": model.lower(
            "denoise_rtc",
            prefix,
            noise,
            steps,
            previous,
            np.int32(3),
            np.int32(8),
            np.float32(5.0),
        ),
        f"extend_1req_w{one_row}": extend_lowered(one_row),
        f"extend_1req_w{full_rows}": extend_lowered(full_rows),
        f"decode_logits_b{slots}": model.lower(
            "decode_step", *step_args(prefix, state), model.vocab_size
        ),
        f"decode_greedy_b{slots}": model.lower(
            "decode_sample", *step_args(prefix, state), *sampling, model.vocab_size, False
        ),
        f"argmax_b{slots}": argmax.lower(logits),
        f"decode_greedy_b{slots}_prefix{SHORT_PREFIX}": model.lower(
            "decode_sample", *step_args(short, short_state), *sampling, model.vocab_size, False
        ),
    }
    tail_len = tail_tokens.shape[0]
    embedded = {  # token ids each component embeds (XLA counts the whole table per gather)
        "prefill": config.model.max_token_len,
        f"extend_1req_w{one_row}": one_row * tail_len,
        f"extend_1req_w{full_rows}": full_rows * tail_len,
        f"decode_logits_b{slots}": slots,
        f"decode_greedy_b{slots}": slots,
        f"decode_greedy_b{slots}_prefix{SHORT_PREFIX}": slots,
    }
    table = {
        name: roofline.entry(
            lowered[name],
            seconds,
            peaks,
            roofline.embedding_overcount(config.model, embedded[name]) if name in embedded else 0,
        )
        for name, seconds in times.items()
    }
    logits_plus_argmax = times[f"decode_logits_b{slots}"] + times[f"argmax_b{slots}"]
    greedy_ratio = times[f"decode_greedy_b{slots}"] / logits_plus_argmax
    frame_runs = max(3, runs // 3)
    return {
        "preset": preset,
        "vocab": vocab,
        "lm_head_rows": head_rows,
        "runs": runs,
        "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform()},
        "jax_backend": jax.default_backend(),
        "machine_peaks": peaks,
        "prefix_len": config.model.prefix_len,
        "num_slots": slots,
        "extend_rows": full_rows,
        "extend_widths": list(engine.runner.extend_widths),
        "max_seq_len": cache.max_seq_len,
        "denoise_steps": steps,
        "action_horizon": config.model.action_horizon,
        "components": table,
        "greedy_decode": {
            "rows": slots,
            "greedy_step_s": times[f"decode_greedy_b{slots}"],
            "logits_s": times[f"decode_logits_b{slots}"],
            "argmax_s": times[f"argmax_b{slots}"],
            "greedy_over_logits_plus_argmax": greedy_ratio,
            "target": GREEDY_TARGET,
            "within_target": greedy_ratio <= GREEDY_TARGET,
        },
        "prefix_in_decode": {
            "prefix_len": config.model.prefix_len,
            "step_s": times[f"decode_greedy_b{slots}"],
            "short_prefix_len": SHORT_PREFIX,
            "short_step_s": times[f"decode_greedy_b{slots}_prefix{SHORT_PREFIX}"],
        },
        "extend_one_request": {
            "bucketed_width": one_row,
            "bucketed_s": times[f"extend_1req_w{one_row}"],
            "fixed_width": full_rows,
            "fixed_s": times[f"extend_1req_w{full_rows}"],
            "speedup": times[f"extend_1req_w{full_rows}"] / times[f"extend_1req_w{one_row}"],
        },
        # Kept from earlier versions of this file (same definitions).
        "prefill_s": times["prefill"],
        "denoise_s": times["denoise"],
        "denoise_rtc_s": times["denoise_rtc"],
        "frame_2x16_tokens_s": _median_s(
            lambda: engine.step(observation, requests).timings.total_s, frame_runs
        ),
        "frame_actions_only_s": _median_s(lambda: engine.step(observation).timings.total_s, runs),
        "pi05_param_count": param_count(abstract_model(get_model_config("pi05"))),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="tiny")
    parser.add_argument(
        "--vocab",
        choices=("tokenizer", "full"),
        default="tokenizer",
        help="language head: the tokenizer's rows (tiny: 640) or all 257,152",
    )
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--output", type=pathlib.Path, default=None)
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    with tempfile.TemporaryDirectory(prefix="engine_components_") as workdir:
        result = measure(args.preset, args.vocab, args.runs, pathlib.Path(workdir))
    text = json.dumps(result, indent=2)
    if args.output is not None:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(text + "\n")
    print(roofline.format_table(result["components"], result["machine_peaks"]))  # type: ignore[arg-type]
    greedy = result["greedy_decode"]
    extend = result["extend_one_request"]
    print(
        f"greedy decode step ({greedy['rows']} rows, {result['lm_head_rows']}-row head): "  # type: ignore[index]
        f"{1e3 * greedy['greedy_step_s']:.2f} ms = {greedy['greedy_over_logits_plus_argmax']:.2f}"  # type: ignore[index]
        f" x (logits {1e3 * greedy['logits_s']:.2f} + argmax {1e3 * greedy['argmax_s']:.2f} ms);"  # type: ignore[index]
        f" target <= {GREEDY_TARGET}"
    )
    print(
        f"extend of one admitted request: {1e3 * extend['bucketed_s']:.2f} ms at width "  # type: ignore[index]
        f"{extend['bucketed_width']}, {1e3 * extend['fixed_s']:.2f} ms at the fixed width "  # type: ignore[index]
        f"{extend['fixed_width']} ({extend['speedup']:.1f}x)"  # type: ignore[index]
    )
    print(f"json: {args.output}" if args.output else text)


if __name__ == "__main__":
    main()
