"""Times the engine's model functions on a preset and prints JSON (not collected by pytest).

Median wall-clock seconds over `--runs` calls after one warm-up (compilation) call, device
work waited for: prefix prefill, action denoising (plain and real-time chunking), language
tail extend, one decode step (all slots active), a whole shared-prefix frame with two language
requests, and the real pi0.5 preset's parameter count from shapes only.

Usage (repository root):
    python benchmarks/engine_components.py [--preset tiny] [--runs 10] [--output FILE]
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
import time
from collections.abc import Callable

import jax
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from oxygen_ros.engine import prompts
from oxygen_ros.engine.config import get_engine_config, get_model_config
from oxygen_ros.engine.engine import Engine
from oxygen_ros.engine.kv_cache import write_tail_rows
from oxygen_ros.engine.model import abstract_model, param_count
from oxygen_ros.engine.tokenizer import BUNDLED_TOKENIZER_PATH
from oxygen_ros.engine.types import LanguageRequest, Observation, RequestKind


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


def measure(preset: str, runs: int) -> dict[str, object]:
    config = get_engine_config(preset, tokenizer_path=str(BUNDLED_TOKENIZER_PATH))
    engine = Engine(config)
    model, cache = engine.model, config.cache
    observation = _observation(engine)
    inputs = engine.prepare_inputs(observation)
    prefix = jax.block_until_ready(model.prefill(inputs))
    noise = engine.make_noise(0)
    tail_tokens, tail_mask = prompts.tokenize_tail(
        engine.tokenizer, config.prompt.narration.tail, config.prompt.max_tail_len
    )
    tails = np.repeat(tail_tokens[None], cache.num_slots, 0)
    masks = np.repeat(tail_mask[None], cache.num_slots, 0)
    rows = np.zeros((cache.num_slots,), np.int32)
    tail_k, tail_v, _ = model.extend(prefix, rows, tails, masks)
    gen_len = masks.sum(axis=1).astype(np.int32)
    tokens = np.full((cache.num_slots,), 5, np.int32)
    active = np.ones((cache.num_slots,), bool)
    state = {}

    def decode_once() -> object:
        if "k" not in state:
            state["k"], state["v"] = model.empty_gen_cache(cache.num_slots, cache.max_seq_len)
            state["k"], state["v"] = write_tail_rows(
                state["k"], state["v"], tail_k, tail_v, np.arange(cache.num_slots)
            )
        logits, state["k"], state["v"] = model.decode_step(
            prefix, rows, state["k"], state["v"], gen_len, tokens, active
        )
        return logits

    previous = np.zeros_like(noise)
    requests = (
        LanguageRequest(RequestKind.NARRATION, max_tokens=16),
        LanguageRequest(RequestKind.MEMORY, max_tokens=16),
    )
    frame_runs = max(3, runs // 3)
    return {
        "preset": preset,
        "runs": runs,
        "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform()},
        "jax_backend": jax.default_backend(),
        "prefix_len": config.model.prefix_len,
        "num_slots": cache.num_slots,
        "max_seq_len": cache.max_seq_len,
        "prefill_s": _median_s(lambda: model.prefill(inputs), runs),
        "denoise_s": _median_s(lambda: model.denoise(prefix, noise), runs),
        # Real-time chunking: the same loop plus one VJP per step (a 3-row delay, 5 guided).
        "denoise_rtc_s": _median_s(
            lambda: model.denoise_rtc(prefix, noise, previous, 3, 8, 5.0), runs
        ),
        "denoise_steps": config.model.num_denoise_steps,
        "action_horizon": config.model.action_horizon,
        "extend_s": _median_s(lambda: model.extend(prefix, rows, tails, masks), runs),
        "decode_step_s": _median_s(decode_once, runs),
        "frame_2x16_tokens_s": _median_s(
            lambda: engine.step(observation, requests).timings.total_s, frame_runs
        ),
        "frame_actions_only_s": _median_s(lambda: engine.step(observation).timings.total_s, runs),
        "pi05_param_count": param_count(abstract_model(get_model_config("pi05"))),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--output", type=pathlib.Path, default=None)
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    result = json.dumps(measure(args.preset, args.runs), indent=2)
    print(result)
    if args.output is not None:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(result + "\n")


if __name__ == "__main__":
    main()
