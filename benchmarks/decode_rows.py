"""The batched decode step by active rows, before and after cascade attention (not collected
by pytest).

One greedy decode step (decode + sampling of the next id, device work waited for) of the
engine's `JitModel` on a preset, for both language heads (the bundled tokenizer's rows and
all 257,152), in one run, each method interleaved with the other:

- `before`: the path through openpi's `gemma.Module`
  (`openpi_reference.decode_step_openpi`: each row's stored prefix gathered and concatenated
  with its generated cache, then openpi concatenates the new k/v again) and the row-by-row
  sampler it was served with (`lax.map` over rows, a `lax.cond` per row, the
  max-then-first-index argmax), fused in one jitted call;
- `after`: `JitModel.decode_sample` (cascade attention, k/v written in place, the vectorised
  greedy variant of `sample_tokens`).

Shapes: a 1-slot cache (1 slot, 1 stored prefix) with its one row active, and the engine's
8-slot cache (8 slots, 8 stored prefixes) with 1..8 active rows, the rows either on distinct
prefixes (continuous batching's steady state: one request admitted per frame) or all on one
(requests admitted together). `ratio_8_over_1` is the 8-active-row step over the 1-slot step.
Each figure is the median over `--rounds` interleaved rounds of the median of `--runs` calls.

`costs` (not run, parameters abstract): per decode step at the preset's and pi05's shapes, the
analytic minimum (every weight matrix of the prefix LLM and the head rows read once; each row's
visible prefix and generated k/v read once, a shared prefix once for all its rows; FLOPs of
the weights and of the attention) and XLA's own counts of the compiled step (XLA counts a
scanned layer's body once, so its figures cover one layer plus the head, and a gather's whole
table: embedding 8 ids counts the 257,152-row table, see roofline.py). The minimum's
8-over-1 ratio is the least any implementation's step can grow by at those shapes where it
is bound by bytes (or FLOPs).

Writes JSON (`--output`) and prints the table.

Usage (repository root, after `source scripts/env.sh`):
    python benchmarks/decode_rows.py [--preset tiny] [--runs 20] [--rounds 3] [--output FILE]
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
from collections.abc import Callable

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import flax.nnx as nnx  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks"))  # roofline, prefill_slots (no package)

import prefill_slots  # noqa: E402
import roofline  # noqa: E402

from oxygen_ros.engine import model_fns, openpi_reference  # noqa: E402
from oxygen_ros.engine.config import PALIGEMMA_VOCAB_SIZE, ModelConfig, get_model_config  # noqa: E402
from oxygen_ros.engine.model import abstract_model, create_model, gemma_config  # noqa: E402
from oxygen_ros.engine.model_fns import JitModel, Prefix, _compiled  # noqa: E402
from oxygen_ros.engine.tokenizer import BUNDLED_TOKENIZER_PATH, Tokenizer  # noqa: E402

SLOTS = 8  # the engine's default cache (CacheConfig)
GEN_LEN = 64  # CacheConfig.max_seq_len
FED = 12  # generated-cache entries each row already holds (a tail and a few ids)
LAYOUTS = ("distinct", "shared")


def rowwise_argmax(x: jax.Array) -> jax.Array:
    """The argmax the rows were sampled with before: a max, then the first index hitting it."""
    hit = (x == jnp.max(x, axis=-1, keepdims=True)) | jnp.isnan(x)
    ids = jax.lax.broadcasted_iota(jnp.int32, x.shape, x.ndim - 1)
    return jnp.min(jnp.where(hit, ids, x.shape[-1]), axis=-1)


def rowwise_sampler(logits, temperature, seeds, indices):
    """The sampler served before: rows in turn (`lax.map`), each under `lax.cond`."""
    logits = logits.astype(jnp.float32)

    def row(args):
        row_logits, row_temperature, seed, index = args

        def draw():
            key = jax.random.fold_in(jax.random.key(seed), index)
            scaled = row_logits / jnp.maximum(row_temperature, model_fns.MIN_TEMPERATURE)
            return rowwise_argmax(scaled + jax.random.gumbel(key, scaled.shape, jnp.float32))

        return jax.lax.cond(row_temperature > 0, draw, lambda: rowwise_argmax(row_logits))

    return jax.lax.map(row, (logits, temperature, seeds, indices)).astype(jnp.int32)


def before_fn(model, vocab_size: int | None) -> Callable[..., tuple]:
    graphdef, state = nnx.split(model)

    def step(state, store, rows, gen_k, gen_v, gen_len, tokens, active, t, seeds, indices):
        bound = nnx.merge(graphdef, state)
        logits, gen_k, gen_v = openpi_reference.decode_step_openpi(
            bound, store, rows, gen_k, gen_v, gen_len, tokens, active, vocab_size
        )
        return rowwise_sampler(logits, t, seeds, indices), gen_k, gen_v

    jitted = jax.jit(step, donate_argnums=(3, 4))
    return lambda *args: jitted(state, *args)


def measure_step(fn, jit_model, slots: int, active_rows: int, shared: bool, runs: int) -> float:
    """Median seconds of one decode step at `slots` slots (as many stored prefixes)."""
    config = jit_model.config
    llm = gemma_config(config.paligemma_variant)
    rng = np.random.default_rng(slots * 100 + active_rows)
    shape = (llm.depth, slots, config.prefix_len, llm.num_kv_heads, llm.head_dim)
    valid = np.arange(config.prefix_len)[None] < config.prefix_len - 40
    store = Prefix(
        jnp.asarray(rng.normal(size=shape), config.dtype),
        jnp.asarray(rng.normal(size=shape), config.dtype),
        jnp.asarray(np.repeat(valid, slots, 0)),
    )
    gen = list(jit_model.empty_gen_cache(slots, GEN_LEN))
    rows = np.zeros((slots,), np.int32) if shared else np.arange(slots, dtype=np.int32)
    gen_len = np.full((slots,), FED, np.int32)
    tokens = np.full((slots,), 5, np.int32)
    active = np.arange(slots) < active_rows
    zeros = np.zeros((slots,), np.int32)
    greedy = np.zeros((slots,), np.float32)

    def call() -> None:
        sampled, gen[0], gen[1] = fn(
            store, rows, gen[0], gen[1], gen_len, tokens, active, greedy, zeros, zeros
        )
        jax.block_until_ready(sampled)

    call()  # compile
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(preset: str, runs: int, rounds: int) -> dict[str, object]:
    config = get_model_config(preset)
    model = create_model(config, seed=0)
    tokenizer_rows = Tokenizer(BUNDLED_TOKENIZER_PATH).vocab_size
    heads: dict[str, object] = {}
    for head, vocab in (("tokenizer", tokenizer_rows), ("full", None)):
        jit_model = JitModel(model, vocab_size=vocab)
        methods = {"before": before_fn(model, vocab), "after": jit_model.decode_sample}
        table: dict[str, dict[str, object]] = {name: {} for name in methods}
        shapes = [(1, 1, "one_slot")] + [
            (SLOTS, rows, layout) for rows in range(1, SLOTS + 1) for layout in LAYOUTS
        ]
        samples: dict[tuple[str, int, int, str], list[float]] = {}
        for _ in range(rounds):  # every shape and method once per round, interleaved
            for slots, rows, layout in shapes:
                for name, fn in methods.items():
                    seconds = measure_step(fn, jit_model, slots, rows, layout == "shared", runs)
                    samples.setdefault((name, slots, rows, layout), []).append(seconds)
        for (name, _, _, layout), values in samples.items():  # in shape order
            seconds = statistics.median(values)
            if layout == "one_slot":
                table[name]["one_slot_s"] = seconds
            else:
                table[name].setdefault(f"{layout}_s", []).append(seconds)
        for name in methods:
            entry = table[name]
            for layout in LAYOUTS:
                entry[f"{layout}_ratio_8_over_1"] = entry[f"{layout}_s"][-1] / entry["one_slot_s"]
        heads[head] = {"lm_head_rows": vocab or PALIGEMMA_VOCAB_SIZE, **table}
    return {
        "preset": preset,
        "runs": runs,
        "rounds": rounds,
        "slots": SLOTS,
        "prefix_len": config.prefix_len,
        "gen_len": GEN_LEN,
        "fed_entries": FED,
        "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform()},
        "jax_backend": jax.default_backend(),
        "heads": heads,
    }


def minimum(config: ModelConfig, rows: int, prefixes: int, vocab: int) -> dict[str, float]:
    """Least bytes and FLOPs of one decode step: `rows` active rows reading `prefixes` stored
    prefixes (40 masked positions, as measured) and FED generated entries each."""
    llm = gemma_config(config.paligemma_variant)
    _, params, _ = prefill_slots.matmul_weights(config)  # the prefix LLM's layer kernels
    weight_bytes = params * np.dtype(config.param_dtype).itemsize
    itemsize = np.dtype(config.dtype).itemsize
    per_token_kv = 2.0 * llm.depth * llm.num_kv_heads * llm.head_dim * itemsize
    visible = config.prefix_len - 40
    head_bytes = float(vocab) * llm.width * itemsize
    kv_bytes = per_token_kv * (prefixes * visible + rows * (FED + 1))
    attention = 4.0 * rows * (visible + FED + 1) * llm.num_heads * llm.head_dim * llm.depth
    return {
        "bytes": weight_bytes + head_bytes + kv_bytes,
        "weight_bytes": weight_bytes + head_bytes,
        "kv_bytes": kv_bytes,
        "flops": 2.0 * rows * (params + vocab * llm.width) + attention,
    }


def costs(preset: str, tokenizer_rows: int) -> dict[str, object]:
    """Analytic minimum and XLA's counts of the greedy decode step, 1-slot vs 8-slot."""
    config = get_model_config(preset)
    fns = _compiled(config)
    leaves = [
        jax.ShapeDtypeStruct(leaf.shape, leaf.dtype)
        for leaf in jax.tree.leaves(nnx.state(abstract_model(config)))
    ]
    llm = gemma_config(config.paligemma_variant)
    out: dict[str, object] = {}
    for head, vocab in (("tokenizer", tokenizer_rows), ("full", None)):
        rows_vocab = vocab or PALIGEMMA_VOCAB_SIZE
        entry: dict[str, object] = {}
        for slots in (1, SLOTS):
            kv = (llm.depth, slots, config.prefix_len, llm.num_kv_heads, llm.head_dim)
            cache = (llm.depth, slots, GEN_LEN, llm.num_kv_heads, llm.head_dim)
            dtype = jnp.dtype(config.dtype)
            ints = jax.ShapeDtypeStruct((slots,), jnp.int32)
            store = Prefix(
                jax.ShapeDtypeStruct(kv, dtype),
                jax.ShapeDtypeStruct(kv, dtype),
                jax.ShapeDtypeStruct((slots, config.prefix_len), jnp.bool_),
            )
            lowered = fns.decode_sample.lower(
                leaves, store, ints, jax.ShapeDtypeStruct(cache, dtype),
                jax.ShapeDtypeStruct(cache, dtype), ints, ints,
                jax.ShapeDtypeStruct((slots,), jnp.bool_),
                jax.ShapeDtypeStruct((slots,), jnp.float32), ints, ints, vocab, False,
            )  # fmt: skip
            entry[f"xla_{slots}_slot"] = roofline.cost(lowered)
        for name, rows, prefixes in (("one_row", 1, 1), ("distinct_8", 8, 8), ("shared_8", 8, 1)):
            entry[f"minimum_{name}"] = minimum(config, rows, prefixes, rows_vocab)
        for layout in ("distinct_8", "shared_8"):
            for unit in ("bytes", "flops"):
                ratio = entry[f"minimum_{layout}"][unit] / entry["minimum_one_row"][unit]
                entry[f"minimum_{layout}_over_1_{unit}"] = ratio
        out[head] = {"lm_head_rows": rows_vocab, **entry}
    return out


def print_table(result: dict[str, object]) -> None:
    print(f"decode step (ms), {result['preset']}, rows 1..{result['slots']} of {result['slots']}")
    for head, entry in result["heads"].items():
        for name in ("before", "after"):
            row = entry[name]
            for layout in LAYOUTS:
                steps = " ".join(f"{s * 1e3:6.2f}" for s in row[f"{layout}_s"])
                print(
                    f"{head:9s} {name:6s} {layout:8s} 1-slot {row['one_slot_s'] * 1e3:6.2f} | "
                    f"{steps} | 8/1 {row[f'{layout}_ratio_8_over_1']:.2f}"
                )
    for preset, heads in result.get("costs", {}).items():
        for head, entry in heads.items():
            print(
                f"minimum 8/1, {preset} {head}: distinct bytes "
                f"{entry['minimum_distinct_8_over_1_bytes']:.2f} flops "
                f"{entry['minimum_distinct_8_over_1_flops']:.2f}; shared bytes "
                f"{entry['minimum_shared_8_over_1_bytes']:.2f} flops "
                f"{entry['minimum_shared_8_over_1_flops']:.2f}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--runs", type=int, default=20, help="timed calls per measurement")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (median)")
    parser.add_argument("--output", type=pathlib.Path, default=None)
    args = parser.parse_args()
    result = measure(args.preset, args.runs, args.rounds)
    tokenizer_rows = Tokenizer(BUNDLED_TOKENIZER_PATH).vocab_size
    result["costs"] = {
        preset: costs(preset, tokenizer_rows) for preset in dict.fromkeys((args.preset, "pi05"))
    }
    print_table(result)
    if args.output is not None:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
