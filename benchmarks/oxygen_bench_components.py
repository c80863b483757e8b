"""oxygen_bench's component times: each model function alone at a method's cache shapes.

`measure_components` gives the fastest seconds of the prefill, the denoise, the tail extend
per width and the fused decode step per active batch size (the computed bound of
`oxygen_bench_metrics` charges a frame's schedule with them), the action-only frame times the
deadline budget is based on, and with the machine's peaks a roofline row per component.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import jax
import numpy as np
import roofline
from oxygen_bench_protocol import REQUEST_KIND, make_observation

from oxygen_ros.engine import prompts
from oxygen_ros.engine.config import PALIGEMMA_VOCAB_SIZE
from oxygen_ros.engine.engine import Engine
from oxygen_ros.engine.kv_cache import write_tail_rows
from oxygen_ros.engine.model_fns import Prefix, needs_sampling

ACTION_FRAME_WARMUP = 3  # action-only frames run and dropped before measuring the budget base
ACTION_FRAME_RUNS = 20


def _fastest_s(fn: Callable[[], object], runs: int) -> float:
    """Fastest of `runs` timed calls after one untimed call (a bound wants the best case)."""
    jax.block_until_ready(fn())
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    return min(times)


def measure_components(
    engine: Engine, seed: int, runs: int, peaks: dict[str, object] | None = None
) -> dict[str, object]:
    """Fastest seconds of each model function alone, at this engine's shapes; with `peaks`
    (`roofline.machine_peaks()`), a `roofline` row per component too."""
    config = engine.config
    model, cache = engine.model, config.cache
    observation = make_observation(config.model, 0, seed)
    inputs = engine.prepare_inputs(observation)
    prefix = jax.block_until_ready(model.prefill(inputs))
    store = Prefix(
        *(
            jax.numpy.concatenate([x] * cache.num_prefixes, axis=axis)
            for x, axis in ((prefix.k, 1), (prefix.v, 1), (prefix.mask, 0))
        )
    )
    noise = engine.make_noise(0)
    task = config.prompt.task(REQUEST_KIND)
    tail_tokens, tail_mask = prompts.tokenize_tail(
        engine.tokenizer, task.tail, config.prompt.max_tail_len
    )
    slots = cache.num_slots
    tails = np.repeat(tail_tokens[None], slots, 0)
    masks = np.repeat(tail_mask[None], slots, 0)
    rows = np.arange(slots, dtype=np.int32) % cache.num_prefixes
    tail_k, tail_v, _ = model.extend(store, rows, tails, masks)
    gen_len = masks.sum(axis=1).astype(np.int32)
    tokens = np.full((slots,), 5, np.int32)
    temperature = np.zeros((slots,), np.float32)
    seeds = np.zeros((slots,), np.int32)
    state: dict[str, object] = {}
    state["k"], state["v"] = model.empty_gen_cache(slots, cache.max_seq_len)
    state["k"], state["v"] = write_tail_rows(
        state["k"], state["v"], tail_k, tail_v, np.arange(slots, dtype=np.int32)
    )

    widths = engine.runner.extend_widths

    def extend_once(width: int) -> object:  # an admission's device work: extend + first ids
        _, _, logits = model.extend(store, rows[:width], tails[:width], masks[:width])
        return model.sample_tokens(logits, *(x[:width] for x in (temperature, seeds, seeds)))

    def decode_once(active: np.ndarray) -> object:  # the engine's fused decode + sample
        sampled, state["k"], state["v"] = model.decode_sample(
            store,
            rows,
            state["k"],
            state["v"],
            gen_len,
            tokens,
            active,
            temperature,
            seeds,
            seeds,
        )
        return sampled

    engine.warmup()
    action_frames = []  # whole frames without requests: the deadline budget's base
    for frame in range(ACTION_FRAME_WARMUP + max(runs, ACTION_FRAME_RUNS)):
        total_s = engine.step(make_observation(config.model, frame, seed)).timings.total_s
        if frame >= ACTION_FRAME_WARMUP:  # the first frames after warm-up run slower
            action_frames.append(total_s)
    decode_step_s = {}
    for batch in range(1, slots + 1):
        active = np.arange(slots) < batch
        decode_step_s[batch] = _fastest_s(lambda active=active: decode_once(active), runs)
    components: dict[str, object] = {
        "num_slots": slots,
        "num_prefixes": cache.num_prefixes,
        "lm_head_rows": model.vocab_size or PALIGEMMA_VOCAB_SIZE,
        "prefill_s": _fastest_s(lambda: model.prefill(inputs), runs),
        "denoise_s": _fastest_s(lambda: model.denoise(prefix, noise), runs),
        # Per extend width (the runner's smallest width holding the requests admitted together).
        "extend_s": {w: _fastest_s(lambda w=w: extend_once(w), runs) for w in widths},
        "decode_step_s": decode_step_s,
        "action_frame_s": statistics.median(action_frames),
        "action_frame_p90_s": float(np.percentile(action_frames, 90)),
        "action_frame_p99_s": float(np.percentile(action_frames, 99)),
    }
    if peaks is not None:
        vocab = model.vocab_size
        steps = config.model.num_denoise_steps
        sampling = (temperature, seeds, seeds)
        decode = model.lower(
            "decode_sample", store, rows, state["k"], state["v"], gen_len, tokens,
            np.ones((slots,), bool), *sampling, vocab, needs_sampling(temperature),
        )  # fmt: skip
        extend_s = components["extend_s"]
        assert isinstance(extend_s, dict)

        def extend_lowered(width: int) -> list[jax.stages.Lowered]:
            logits = np.zeros((width, vocab or PALIGEMMA_VOCAB_SIZE), np.float32)
            narrow = (rows[:width], tails[:width], masks[:width])
            return [
                model.lower("extend", store, *narrow, vocab),
                model.lower(
                    "sample_tokens",
                    logits,
                    *(x[:width] for x in sampling),
                    needs_sampling(temperature[:width]),
                ),
            ]

        rows_of = {
            "prefill": (model.lower("prefill", inputs), components["prefill_s"]),
            "denoise": (model.lower("denoise", prefix, noise, steps), components["denoise_s"]),
            **{f"extend_w{w}": (extend_lowered(w), extend_s[w]) for w in widths},
            # One compiled step serves 1..B active rows at the same cost (fixed shapes).
            "decode_step_b1": (decode, decode_step_s[1]),
            f"decode_step_b{slots}": (decode, decode_step_s[slots]),
        }
        tail_len = tails.shape[1]
        embedded = {  # token ids each component embeds (XLA counts the whole table per gather)
            "prefill": config.model.max_token_len,
            **{f"extend_w{w}": w * tail_len for w in widths},
            "decode_step_b1": slots,
            f"decode_step_b{slots}": slots,
        }
        components["roofline"] = {
            name: roofline.entry(
                lowered,  # type: ignore[arg-type]
                float(seconds),  # type: ignore[arg-type]
                peaks,
                roofline.embedding_overcount(config.model, embedded[name])
                if name in embedded
                else 0.0,
            )
            for name, (lowered, seconds) in rows_of.items()
        }
    return components
