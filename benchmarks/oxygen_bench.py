"""OxyGen's experiment grid on the engine: isolated vs shared KV vs continuous batching.

What runs: a stream of control frames, each with a fresh observation (same images, a new
state, so every frame has its own prefix), and language requests arriving by frame index.
Frames run back to back (closed loop, no pacing), so every number is a capacity, not a rate
the robot asked for. Methods = the engine's `config.scheduler` (one engine per setting, all
sharing one model per N; requests are passed to `Engine.step`, which adds them first), each at
the cache shapes a user would run it with (`method_cache`):
- `isolated` (mode isolated): a prefix prefill for the actions and another for each
  request, each request decoded alone to its last token inside the frame it arrived in
  (what openpi would do for several tasks), on its own engine with batch-1 shapes: one cache
  slot, a one-row tail extend and decode step, one stored prefix;
- `shared_kv` (mode shared_kv): one prefill shared by the actions and every request of the
  frame, all requests decoded to completion inside that frame (OxyGen's cross-task sharing),
  with as many slots as the most requests one frame of the setting brings, one stored prefix;
- `cb_k{1,5,10}` (mode continuous, policy fixed): continuous batching, k batched decode steps
  per frame; unfinished requests keep decoding in later frames from their own frame's prefix
  (`--slots` slots, `--prefixes` stored prefixes);
- `deadline` (mode continuous, policy deadline): continuous batching where the scheduler
  picks the decode steps so the frame stays within a budget = `--deadline-factor` x the
  measured action-only frame time (p90 of `Engine.step` without requests: prefill + denoise
  alone vary by ~1.5x between p50 and p99 on a 2-vCPU CPU machine, and no scheduler can keep
  a frame under a budget its mandatory work already exceeds); the action rate that budget
  serves (horizon / budget) is recorded as `budget_action_hz`, and the action-only frames'
  own p99 / budget as `mandatory_p99_over_budget` (the floor under `p99_over_budget`).
- `isolated_cb_shapes` (not in the default grid): isolated at the continuous shapes, the
  baseline this benchmark used before; it shows how much that inflated every speedup.
Grid: denoise steps N in {5, 10}; max tokens M in {10, 30}; arrivals uniform 0.5/1/2 requests
per frame (`u0.5`, `u1`, `u2`), Poisson with mean 1 (`poisson`), and `mixed` (one per frame,
lengths drawn from {5, 20}; M is then "5|20"); language head (`--vocab`) `tokenizer` (the
tokenizer's rows: 640 for the tiny preset's bundled tokenizer) and `full` (257,152 rows, what
PaliGemma's tokenizer gives the real model: `full_vocab.py` pads the bundled tokenizer when
PaliGemma's is not cached), both in the full grid. Every request decodes exactly its max tokens
(EOS disabled for benchmark requests), greedy, so all methods do the same language work.

Settings that share N, M and arrivals run interleaved, one frame of each method in turn, so
load changes on a shared machine hit every method alike; each method keeps its own clock
(the sum of its own frame times), and latencies are read on it.
Protocol per setting: `Engine.warmup()` (compiles), then `--warmup-frames` frames with the
same arrival pattern to reach a steady state (excluded from every metric; requests they
started may still decode during the measured window, so continuous methods carry that extra
work: a conservative bias); then `--frames` measured frames with arrivals; then drain frames
(no arrivals) until every request finished.
Metrics:
- frame time mean/p50/p99 over the measured frames (wall time of the engine call);
- action_hz: action horizon / mean frame time, over measured frames that produced actions;
- tokens_per_s: tokens emitted in the measured frames / their summed time;
- latency p50/p99: request arrival (start of the frame it was submitted in) -> end of the frame
  that returned its last token, true end to end (waiting across frames counts), on the
  method's own clock;
- mean_batch: mean active requests per decode step (reconstructed from per-frame tokens);
- compiles: XLA compilations inside this method's measured + drain engine calls (the
  engine's counter, `oxygen_ros.engine.compiles`: JAX's backend-compile monitoring event);
- peak_rss_mb: peak resident memory of this process while the setting's interleaved group
  ran (psutil, sampled after every frame); cache_mb: the engine's fixed language cache;
- e2e_wall_s: wall time to serve the measured frames' action chunks and every request that
  arrived in them, to its last token: the measured frames plus the drain frames after them,
  charged in full. speedup (the finite run's figure) = e2e_wall_s(isolated) /
  e2e_wall_s(method) for the same N, M, arrivals and head.
- e2e_s: the same, but drain frames charged only their language time
  (`FrameTimings.language_s`): a drain frame's prefill and denoise make an action chunk
  beyond the window.
- steady_s (steady state, the headline): the measured frames' wall time / min(1,
  token_balance), token_balance = tokens emitted in the measured frames / tokens of the
  requests that arrived in them (1 when as many tokens leave as arrive: the warm-up frames,
  as many as a request lives, fill the pipeline first). speedup_steady = steady_s(isolated) /
  steady_s(method): a brain runs for hours and never drains. `act_speedup` (action_hz ratio,
  the paper's action-frequency speedup) is recorded too.
- bound: for the very schedule each method executed (prefills, extends and their widths,
  decode steps and their batch sizes per frame), the sum of the component times measured
  alone at the method's own shapes (fastest prefill, denoise, extend per width, decode step
  at each active batch size): the time with zero host overhead. bound_action_hz /
  bound_tokens_per_s are the measured window's work over that time. gap = e2e_s /
  bound_e2e_s (1.0 = at the limit).
- roofline (per component, in `components`): XLA's FLOPs and bytes of each compiled function
  and the fraction of this machine's roofline it reaches (`roofline.py`; peaks probed at the
  start of the run).

Outputs: JSON (`--out`, default benchmarks/results/), a printed table, a PNG of action
frequency vs tokens/s per method. Quick mode (tiny preset, N=10, M=30, one arrival per frame,
the tokenizer's head, isolated / shared_kv / cb_k5 / deadline; warm-up frames as many as a
cb_k5 request lives, so the measured window starts full) ends with the line
`speedup_vs_isolated=<x>`: cb_k5 vs isolated in steady state (`speedup_steady`, what a brain
that runs for hours and never drains lives through), after a line with the finite run's
wall-time figure (`speedup`) beside it.

Usage (repository root, after `bash scripts/setup.sh && source scripts/env.sh`):
    python benchmarks/oxygen_bench.py --quick          # or: benchmarks/quick
    python benchmarks/oxygen_bench.py [--preset tiny]  # full grid (tens of minutes on a CPU)

The pieces, beside this file (benchmarks/ is no package: this entry puts its folder on
sys.path, gpu_bench loads them the same way): `oxygen_bench_protocol.py` (settings, workload,
engines, runners, the interleaved run), `oxygen_bench_components.py` (component times and
rooflines), `oxygen_bench_metrics.py` (a setting's figures, speedups, steady state) and
`oxygen_bench_report.py` (JSON document, table, printed lines, plot).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import logging
import os
import pathlib
import sys
import tempfile
import time
from collections.abc import Sequence

ROOT = pathlib.Path(__file__).resolve().parents[1]
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(ROOT / ".build" / "jax_cache"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))  # its pieces, roofline, full_vocab (no package)

import full_vocab  # noqa: E402
import roofline  # noqa: E402
from oxygen_bench_components import measure_components  # noqa: E402
from oxygen_bench_metrics import add_speedups, summarize  # noqa: E402
from oxygen_bench_protocol import (  # noqa: E402
    ARRIVALS,
    EXTRA_METHODS,
    METHODS,
    VOCABS,
    Runner,
    Setting,
    arrival_schedule,
    grid,
    make_engine,
    method_cache,
    run_group,
)
from oxygen_bench_report import document, plot, print_summary  # noqa: E402

from oxygen_ros.engine.config import CacheConfig, get_model_config  # noqa: E402
from oxygen_ros.engine.engine import Engine  # noqa: E402
from oxygen_ros.engine.model import Pi05Model, create_model  # noqa: E402


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny preset, 4 settings, < 60 s")
    parser.add_argument("--preset", default=None, help="tiny (default) or pi05")
    parser.add_argument("--checkpoint-dir", default="", help="openpi checkpoint (pi05)")
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--methods", nargs="+", choices=METHODS + EXTRA_METHODS, default=None)
    parser.add_argument(
        "--vocab",
        nargs="+",
        choices=VOCABS,
        default=None,
        help="language head(s): tokenizer (its vocabulary) and/or full (257,152 rows); "
        "default: tokenizer quick, both for the full grid",
    )
    parser.add_argument("--denoise-steps", nargs="+", type=int, default=None)
    parser.add_argument("--max-tokens", nargs="+", type=int, default=None)
    parser.add_argument("--arrivals", nargs="+", choices=ARRIVALS, default=None)
    parser.add_argument("--frames", type=int, default=None, help="measured frames per setting")
    parser.add_argument("--warmup-frames", type=int, default=None)
    parser.add_argument("--max-drain-frames", type=int, default=2000)
    parser.add_argument("--slots", type=int, default=8, help="cache request slots")
    parser.add_argument("--prefixes", type=int, default=8, help="cache stored prefixes")
    parser.add_argument("--max-waiting", type=int, default=4096, help="scheduler queue bound")
    parser.add_argument(
        "--deadline-factor",
        type=float,
        default=1.5,
        help="deadline budget = factor x p90 action-only frame time",
    )
    parser.add_argument("--component-runs", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    quick = args.quick
    defaults = {
        "preset": "tiny",
        "methods": ["isolated", "shared_kv", "cb_k5", "deadline"] if quick else list(METHODS),
        "denoise_steps": [10] if quick else [5, 10],
        "max_tokens": [30] if quick else [10, 30],
        "arrivals": ["u1"] if quick else list(ARRIVALS),
        "frames": 10 if quick else 30,
        "warmup_frames": 6,  # a cb_k5 request of M=30 lives 6 frames: the window starts full
        "component_runs": 5 if quick else 10,
        "vocab": ["tokenizer"] if quick else list(VOCABS),
    }
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    return args


class Bench:
    """Models, component times and engines of one benchmark run, built on demand and shared.

    One model per (N, head) (parameters are shared by every engine of it), component times
    per (N, head, cache shapes) so each method's bound uses its own shapes, the machine's
    peaks once (the roofline), and one deadline budget per (N, head) from the continuous
    shapes' action-only frames. `run_settings` runs settings that share N, M, arrivals and
    head interleaved and returns their summaries (gpu_bench uses it too).
    """

    def __init__(self, args: argparse.Namespace, workdir: pathlib.Path) -> None:
        self.args = args
        self.workdir = workdir
        self.started = time.perf_counter()
        self.peaks = roofline.machine_peaks()
        self.models: dict[int, Pi05Model] = {}
        self.tokenizers: dict[str, tuple[str | None, str]] = {}  # vocab: (path, kind)
        self.components: dict[tuple[int, str, int, int], dict[str, object]] = {}
        self.budgets: dict[tuple[int, str], float] = {}

    def log(self, message: str) -> None:
        elapsed = time.perf_counter() - self.started
        print(f"[{elapsed:6.1f} s] {message}", file=sys.stderr, flush=True)

    def model(self, n: int) -> Pi05Model:
        if n not in self.models:
            args = self.args
            model_config = dataclasses.replace(get_model_config(args.preset), num_denoise_steps=n)
            if args.checkpoint_dir:
                from oxygen_ros.engine.checkpoint import load_params

                self.models[n] = load_params(args.checkpoint_dir, model_config)
            else:
                self.models[n] = create_model(model_config, args.seed)
        return self.models[n]

    def tokenizer(self, vocab: str) -> tuple[str | None, str]:
        """(path, kind) of the tokenizer engines of `vocab` read (`full_vocab.tokenizer_for`)."""
        if vocab not in self.tokenizers:
            self.tokenizers[vocab] = full_vocab.tokenizer_for(
                self.args.preset, vocab, self.workdir
            )
        return self.tokenizers[vocab]

    def engine(self, setting: Setting, budget_s: float, cache: CacheConfig | None) -> Engine:
        n, vocab = setting.denoise_steps, setting.vocab
        return make_engine(
            self.args.preset,
            self.model(n),
            setting,
            self.args,
            budget_s,
            cache=cache,
            tokenizer_path=self.tokenizer(vocab)[0],
        )

    def components_for(self, n: int, vocab: str, cache: CacheConfig) -> dict[str, object]:
        key = (n, vocab, cache.num_slots, cache.num_prefixes)
        if key not in self.components:
            probe = self.engine(Setting("isolated", n, 1, "u1", vocab), 1.0, cache)
            self.components[key] = measure_components(
                probe, self.args.seed, self.args.component_runs, self.peaks
            )
            del probe
            c = self.components[key]
            self.log(
                f"N={n} head={vocab} slots={cache.num_slots} prefixes={cache.num_prefixes}: "
                f"components (prefill {1e3 * float(c['prefill_s']):.0f} ms, decode step "
                f"{1e3 * float(c['decode_step_s'][cache.num_slots]):.1f} ms)"  # type: ignore[index]
            )
        return self.components[key]

    def budget(self, n: int, vocab: str) -> float:
        """The deadline budget: `--deadline-factor` x p90 action-only frame (continuous)."""
        if (n, vocab) not in self.budgets:
            cache = method_cache(self.args.preset, Setting("cb_k5", n, 1, "u1"), self.args, ())
            components = self.components_for(n, vocab, cache)
            factor = self.args.deadline_factor
            self.budgets[n, vocab] = factor * float(components["action_frame_p90_s"])
        return self.budgets[n, vocab]

    def run_settings(
        self, settings: Sequence[Setting], budgets: Sequence[float] | None = None
    ) -> tuple[list[dict[str, object]], list[Runner]]:
        """Settings sharing N, M, arrivals and head, interleaved; their summaries and runners
        (`budgets`: per setting, default `budget()`)."""
        args, first = self.args, settings[0]
        n, vocab = first.denoise_steps, first.vocab
        if budgets is None:
            budgets = [self.budget(n, vocab)] * len(settings)
        warm = arrival_schedule(first.arrival, first.max_tokens, args.warmup_frames, args.seed + 1)
        measured = arrival_schedule(first.arrival, first.max_tokens, args.frames, args.seed)
        caches = [method_cache(args.preset, s, args, warm + measured) for s in settings]
        components = [self.components_for(n, vocab, c) for c in caches]
        engines = [self.engine(s, b, c) for s, b, c in zip(settings, budgets, caches, strict=True)]
        runners, peak_rss = run_group(settings, engines, args)
        results = []
        for setting, runner, c, budget in zip(settings, runners, components, budgets, strict=True):
            result = summarize(setting, runner, c, budget, peak_rss)
            results.append(result)
            self.log(
                f"{setting.label}: frame {result['frame_ms_mean']:.0f} ms, "
                f"{result['tokens_per_s']:.0f} tok/s, wall {result['e2e_wall_s']:.2f} s"
            )
        return results, runners

    def components_document(self) -> dict[str, object]:
        horizon = get_model_config(self.args.preset).action_horizon
        document: dict[str, object] = {}
        for (n, vocab, slots, prefixes), c in self.components.items():
            entry = {**c, "denoise_steps": n, "vocab": vocab}
            if (n, vocab) in self.budgets and slots == self.args.slots:
                budget = self.budgets[n, vocab]
                entry["budget_s"] = budget
                entry["budget_action_hz"] = horizon / budget
                entry["action_only_p99_over_budget"] = float(c["action_frame_p99_s"]) / budget
            document[f"N={n} head={vocab} slots={slots} prefixes={prefixes}"] = entry
        return document


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    started = time.perf_counter()
    settings = grid(args)
    results: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="oxygen_bench_") as workdir:
        bench = Bench(args, pathlib.Path(workdir))
        bench.log(
            f"machine peaks: matmul {bench.peaks['peak_flops_per_s'] / 1e9:.1f} GFLOP/s, "  # type: ignore[operator]
            f"memory {bench.peaks['peak_bytes_per_s'] / 1e9:.1f} GB/s"  # type: ignore[operator]
        )
        groups = itertools.groupby(
            settings, key=lambda s: (s.vocab, s.denoise_steps, s.max_tokens, s.arrival)
        )
        for _, group in groups:
            group_results, _ = bench.run_settings(list(group))
            results.extend(group_results)
    add_speedups(results)

    mode = "quick" if args.quick else "full"
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"oxygen_bench_{mode}_{args.preset}"
    run = document(args, bench.peaks, bench.components_document(), results, started)
    json_path = stem.with_suffix(".json")
    json_path.write_text(json.dumps(run, indent=2) + "\n")
    png_path = stem.with_suffix(".png")
    plot(results, png_path, f"oxygen_bench {mode}, preset {args.preset}")
    print_summary(run, json_path, png_path)


if __name__ == "__main__":
    main()
