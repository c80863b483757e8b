"""Times one training step per workcell preset, in one process (not collected by pytest).

What a step costs is set by the tokens the model attends over. A step runs two passes, as
the engine serves: the prefix LLM over [prefix | language block], where the prefix is 36 image
tokens per camera plus the preset's prompt budget, then the action expert over each draw's
noisy chunk reading that pass's KV cache (the chunk attends to the prefix and to itself; the
language block is masked out). The table's `stream` is the first pass's rows plus one chunk
(prefix + language block + horizon) and `action rows` the noisy rows of all draws. With
openpi's `dummy` Gemma (width 64, 8 heads of 16) the attention, not the matrix products, takes
most of a step on a CPU, so a shorter prompt budget pays about quadratically. This diagnostic
builds a `trainer.Trainer` per preset (the tokenizer the preset is sized for:
`workcell_poses_bins` needs the state-bins tokenizer) and times `Trainer.step` on fixed random
batches of the preset's shapes (image dropout 0.5, as the workcell runs train), the variants
interleaved round by round so that a noisy machine slows them alike. A variant is a preset and
a number of action draws per sample
(`TrainConfig.action_draws`: k noisy chunks read against one prefix pass). Reports per
variant the stream length, XLA's flop count for the compiled step, the median step time and
its ratio to the first variant's.

    python -m oxygen_ros.training.diagnostics.train_step
        [--presets workcell_poses,workcell_poses_bins] [--action-draws 1[,4,...]]
        [--batch-size 16] [--rounds 5] [--steps 4] [--out F]

writes JSON (default benchmarks/results/train_step.json) and prints a table; the last line is
`train_step <variant>=<s> ... ratio=<last / first>` (a variant: `<preset>` with one draw,
`<preset>:k<draws>` otherwise).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

import jax
import numpy as np

from oxygen_ros.engine.config import get_model_config
from oxygen_ros.engine.model import create_model
from oxygen_ros.engine.tokenizer import Tokenizer
from oxygen_ros.training import data as _data
from oxygen_ros.training import loss as _loss
from oxygen_ros.training import train_config as _train_config
from oxygen_ros.training import trainer as _trainer

ROOT = pathlib.Path(__file__).resolve().parents[3]  # the source tree


def random_batch(preset: str, batch_size: int, vocab: int, seed: int) -> _loss.Batch:
    """A batch of the preset's shapes: random images, ids and actions, half the rows blind."""
    config = get_model_config(preset)
    rng = np.random.default_rng(seed)
    size, block = batch_size, _data.LANGUAGE_BLOCK_LEN
    h, w = config.image_resolution
    rows = {
        "images": {k: rng.integers(0, 256, (size, h, w, 3), np.uint8) for k in config.image_keys},
        "tokens": rng.integers(1, vocab, (size, config.max_token_len), np.int32),
        "token_mask": np.ones((size, config.max_token_len), bool),
        "actions": rng.normal(size=(size, config.action_horizon, config.action_dim)).astype(
            np.float32
        ),
        "lang_tokens": rng.integers(1, vocab, (size, block), np.int32),
        "lang_mask": np.ones((size, block), bool),
        "lang_segment": np.repeat(np.arange(3), block // 3 + 1)[None, :block].repeat(size, 0),
        "lang_index": np.tile(np.arange(block) % (block // 3 + 1), (size, 1)),
        "lang_labels": rng.integers(1, vocab, (size, block), np.int32),
        "lang_loss_mask": np.ones((size, block), bool),
    }
    batch = _trainer.to_batch(rows, config.image_keys)
    return _trainer.drop_images(batch, rng.random(size) >= 0.5)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--presets", default="workcell_poses,workcell_poses_bins")
    parser.add_argument("--action-draws", default="1", help="comma list of draws per sample")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds per preset")
    parser.add_argument("--steps", type=int, default=4, help="timed steps per round")
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/train_step.json"))
    args = parser.parse_args(argv)
    variants = [
        (p, int(d)) for p in args.presets.split(",") if p for d in args.action_draws.split(",")
    ]
    names = [p if d == 1 else f"{p}:k{d}" for p, d in variants]
    trainers, batches, result = {}, {}, {}
    for name, (preset, draws) in zip(names, variants, strict=True):
        config = get_model_config(preset)
        tokenizer = Tokenizer(_data.preset_tokenizer(preset))
        train_config = _train_config.TrainConfig(
            data_dir="-",
            out_dir="-",
            preset=preset,
            object_state=_data.object_state_of(preset),
            batch_size=args.batch_size,
            action_draws=draws,
        )
        trainer = _trainer.Trainer(
            train_config, create_model(config, seed=0), tokenizer.vocab_size
        )
        batches[name] = [
            random_batch(preset, args.batch_size, tokenizer.vocab_size, seed)
            for seed in range(args.steps)
        ]
        started = time.perf_counter()
        trainer.step(jax.random.key(0), batches[name][0])
        compile_s = time.perf_counter() - started
        # XLA's estimate of the lowered step (compiling it again only for the count would
        # double the benchmark's start-up).
        analysis = trainer._fns.step.lower(
            trainer.params, trainer.opt_state, jax.random.key(0), batches[name][0]
        ).cost_analysis()
        analysis = analysis[0] if isinstance(analysis, list) else analysis
        trainers[name] = trainer
        stream = config.prefix_len + _data.LANGUAGE_BLOCK_LEN + config.action_horizon
        result[name] = {
            "preset": preset,
            "action_draws": draws,
            "prefix_len": config.prefix_len,
            "stream_len": stream,
            "action_rows": draws * config.action_horizon,
            "gflop_per_step": float(analysis.get("flops", 0.0)) / 1e9,
            "first_step_s": compile_s,
            "step_s": [],
        }
    for _ in range(args.rounds):
        for name in names:
            trainer = trainers[name]
            started = time.perf_counter()
            for i, batch in enumerate(batches[name]):
                trainer.step(jax.random.key(i + 1), batch)  # returns floats: waits for the step
            result[name]["step_s"].append((time.perf_counter() - started) / args.steps)
    first = float(np.median(result[names[0]]["step_s"]))
    for name in names:
        median = float(np.median(result[name]["step_s"]))
        result[name]["median_step_s"] = median
        result[name]["ratio_to_first"] = median / first
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    summary = {
        "batch_size": args.batch_size,
        "rounds": args.rounds,
        "steps_per_round": args.steps,
        "jax": jax.__version__,
        "devices": [str(d) for d in jax.devices()],
        "variants": result,
    }
    out.write_text(json.dumps(summary, indent=1))
    print("| variant | prefix | stream | action rows | GFLOP/step | median step (s) | ratio |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name in names:
        r = result[name]
        print(
            f"| {name} | {r['prefix_len']} | {r['stream_len']} | {r['action_rows']} "
            f"| {r['gflop_per_step']:.2f} "
            f"| {r['median_step_s']:.3f} | {r['ratio_to_first']:.2f} |"
        )
    times = " ".join(f"{n}={result[n]['median_step_s']:.3f}" for n in names)
    print(f"train_step {times} ratio={result[names[-1]]['ratio_to_first']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
