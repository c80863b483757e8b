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
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import itertools
import json
import logging
import math
import os
import pathlib
import platform
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence

ROOT = pathlib.Path(__file__).resolve().parents[1]
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(ROOT / ".build" / "jax_cache"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))  # roofline, full_vocab (benchmarks/ is no package)

import full_vocab  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402
import psutil  # noqa: E402
import roofline  # noqa: E402

from oxygen_ros.engine import compiles, prompts  # noqa: E402
from oxygen_ros.engine.config import (  # noqa: E402
    PALIGEMMA_VOCAB_SIZE,
    CacheConfig,
    ModelConfig,
    get_engine_config,
    get_model_config,
)
from oxygen_ros.engine.engine import Engine  # noqa: E402
from oxygen_ros.engine.kv_cache import write_tail_rows  # noqa: E402
from oxygen_ros.engine.model import Pi05Model, create_model  # noqa: E402
from oxygen_ros.engine.model_fns import Prefix, needs_sampling  # noqa: E402
from oxygen_ros.engine.tokenizer import BUNDLED_TOKENIZER_PATH  # noqa: E402
from oxygen_ros.engine.types import (  # noqa: E402
    LanguageRequest,
    Observation,
    RequestKind,
)

METHODS = ("isolated", "shared_kv", "cb_k1", "cb_k5", "cb_k10", "deadline")
# Not in the default grid: isolated on the continuous engines' shapes (`--slots` rows per decode
# step and extend), the baseline this benchmark used before; shows how much it inflated speedups.
EXTRA_METHODS = ("isolated_cb_shapes",)
VOCABS = full_vocab.VOCABS
ARRIVALS = ("u0.5", "u1", "u2", "poisson", "mixed")
MIXED_LENGTHS = (5, 20)
COMPLETED = ("FINISHED_STOPPED", "FINISHED_LENGTH")  # statuses counted in latency
REQUEST_KIND = RequestKind.NARRATION
ACTION_FRAME_WARMUP = 3  # action-only frames run and dropped before measuring the budget base
ACTION_FRAME_RUNS = 20
HEADLINE = {"method": "cb_k5", "denoise_steps": 10, "max_tokens": 30, "arrival": "u1"}
TABLE_WIDTH = 99

# ------------------------------------------------------------------------------------------
# Memory.


def rss_mb() -> float:
    return psutil.Process().memory_info().rss / 2**20


def max_rss_mb() -> float:
    """Peak RSS of this process since it started (ru_maxrss is KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# ------------------------------------------------------------------------------------------
# Workload.


@dataclasses.dataclass(frozen=True)
class Setting:
    """One grid point."""

    method: str  # one of METHODS or EXTRA_METHODS
    denoise_steps: int  # N
    max_tokens: int | None  # M; None for `mixed` (lengths from MIXED_LENGTHS)
    arrival: str  # one of ARRIVALS
    vocab: str = "tokenizer"  # one of VOCABS: rows of the language head

    @property
    def label(self) -> str:
        m = "5|20" if self.max_tokens is None else str(self.max_tokens)
        head = " full-head" if self.vocab == "full" else ""
        return f"{self.method} N={self.denoise_steps} M={m} {self.arrival}{head}"


def arrival_schedule(
    arrival: str, max_tokens: int | None, num_frames: int, seed: int
) -> list[list[int]]:
    """Per frame, the max_tokens of each request arriving in it (deterministic)."""
    rng = np.random.default_rng(seed)
    frames: list[list[int]] = []
    for frame in range(num_frames):
        if arrival.startswith("u"):
            rate = float(arrival[1:])
            count = math.floor((frame + 1) * rate + 1e-9) - math.floor(frame * rate + 1e-9)
        elif arrival == "poisson":
            count = int(rng.poisson(1.0))
        elif arrival == "mixed":
            count = 1
        else:
            raise ValueError(f"unknown arrival pattern {arrival!r}")
        if arrival == "mixed":
            frames.append([int(rng.choice(MIXED_LENGTHS)) for _ in range(count)])
        else:
            assert max_tokens is not None
            frames.append([max_tokens] * count)
    return frames


def make_observation(config_model: ModelConfig, frame: int, seed: int) -> Observation:
    """Same random images every frame, a new state per frame (so a new prefix)."""
    rng = np.random.default_rng(seed)
    images = {
        key: rng.integers(0, 256, (*config_model.image_resolution, 3), dtype=np.uint8)
        for key in config_model.image_keys
    }
    state = np.random.default_rng([seed, frame]).uniform(-1, 1, (8,)).astype(np.float32)
    return Observation(
        images=images,
        image_masks={key: True for key in config_model.image_keys},
        state=state,
        prompt="pick up the red block and put it in the bowl",
        stamp=float(frame),
    )


# ------------------------------------------------------------------------------------------
# Engine construction: one scheduler configuration per method.


def scheduler_overrides(setting: Setting, budget_s: float, max_waiting: int) -> dict[str, object]:
    """`SchedulerConfig` fields that make an engine run `setting.method`."""
    overrides: dict[str, object] = {"max_waiting": max_waiting}
    if setting.method in ("isolated", "isolated_cb_shapes"):  # decode to completion
        return {**overrides, "mode": "isolated"}
    if setting.method == "shared_kv":  # also decodes to completion
        return {**overrides, "mode": "shared_kv"}
    overrides["mode"] = "continuous"
    if setting.method == "deadline":
        return {**overrides, "policy": "deadline", "frame_deadline_s": budget_s}
    k = int(setting.method.removeprefix("cb_k"))
    return {**overrides, "policy": "fixed", "decode_steps_per_frame": k}


def method_cache(
    preset: str, setting: Setting, args: argparse.Namespace, schedule: Sequence[Sequence[int]]
) -> CacheConfig:
    """The cache shapes each method runs at, as a user would run it.

    `isolated` is openpi's way: one request at a time, so batch-1 shapes (one slot, a one-row
    tail extend, one stored prefix). `shared_kv` decodes every request of a frame together
    from that frame's prefix: as many slots as the most requests one frame of `schedule`
    brings, one stored prefix. Continuous batching keeps requests across frames: `--slots`
    slots and `--prefixes` stored prefixes. `isolated_cb_shapes` is isolated at those shapes.
    """
    base = get_engine_config(preset).cache
    if setting.method == "isolated":
        return dataclasses.replace(base, num_slots=1, num_prefixes=1)
    if setting.method == "shared_kv":
        most = max((len(frame) for frame in schedule), default=1)
        return dataclasses.replace(base, num_slots=max(most, 1), num_prefixes=1)
    return dataclasses.replace(base, num_slots=args.slots, num_prefixes=args.prefixes)


def make_engine(
    preset: str,
    model: Pi05Model,
    setting: Setting,
    args: argparse.Namespace,
    budget_s: float,
    *,
    cache: CacheConfig | None = None,
    tokenizer_path: str | None = None,
) -> Engine:
    """An engine running `setting.method` at `cache` shapes (default: the continuous ones)."""
    base = get_engine_config(preset)
    if cache is None:
        cache = dataclasses.replace(base.cache, num_slots=args.slots, num_prefixes=args.prefixes)
    scheduler = scheduler_overrides(setting, budget_s, args.max_waiting)
    overrides: dict[str, object] = {
        "model": model.config,
        "cache": cache,
        "scheduler": dataclasses.replace(base.scheduler, **scheduler),
    }
    if args.checkpoint_dir:
        overrides["checkpoint_dir"] = args.checkpoint_dir
    if tokenizer_path is not None:
        overrides["tokenizer_path"] = tokenizer_path
    elif preset == "tiny" and not args.checkpoint_dir:
        overrides["tokenizer_path"] = str(BUNDLED_TOKENIZER_PATH)
    return Engine(get_engine_config(preset, **overrides), model=model)


def make_request(request_id: str, max_tokens: int) -> LanguageRequest:
    """A benchmark request: greedy, and only max_tokens stops it (fixed, equal work)."""
    return LanguageRequest(
        REQUEST_KIND, max_tokens=max_tokens, request_id=request_id, ignore_eos=True
    )


# ------------------------------------------------------------------------------------------
# Component times (for the bound).


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


# ------------------------------------------------------------------------------------------
# Running one setting.


@dataclasses.dataclass
class Tracked:
    """Harness-side view of one request."""

    max_tokens: int
    arrival_s: float
    measured: bool  # arrived in a measured frame
    num_tokens: int = 0
    finish_s: float | None = None
    status: str | None = None


@dataclasses.dataclass
class FrameRecord:
    """One engine call as the harness saw it."""

    phase: str  # "warmup", "measured", "drain"
    wall_s: float
    has_actions: bool
    num_tokens: int
    step_batches: list[int]  # active requests per decode step (reconstructed)
    num_prefills: int
    num_extends: int
    num_admitted: int  # requests whose first id came this frame (from a tail extend)
    num_decode_steps: int  # from engine stats
    num_compiles: int  # XLA compilations during this engine call
    rss_mb: float
    timings: dict[str, object]


def engine_counters(engine: Engine) -> dict[str, int]:
    stats = engine.stats()
    return {
        "num_prefills": stats.num_prefills,
        "num_extends": stats.num_extends,
        "num_decode_steps": stats.num_decode_steps,
    }


class Runner:
    """Drives one engine through arrivals, frame by frame, and records what happened."""

    def __init__(self, engine: Engine, method: str, seed: int) -> None:
        self.engine = engine
        self.method = method
        self.seed = seed
        self.requests: dict[str, Tracked] = {}
        self.frames: list[FrameRecord] = []
        self.clock_s = 0.0  # this engine's own time: the sum of its frames' wall times
        self._frame = 0
        self._next_id = 0

    @property
    def num_unfinished(self) -> int:
        return sum(1 for tracked in self.requests.values() if tracked.finish_s is None)

    def run_frame(self, lengths: Sequence[int], phase: str) -> None:
        engine = self.engine
        observation = make_observation(engine.config.model, self._frame, self.seed)
        before = engine_counters(engine)
        specs = []
        for max_tokens in lengths:
            request_id = f"bench-{self._next_id}"
            self._next_id += 1
            self.requests[request_id] = Tracked(max_tokens, self.clock_s, phase == "measured")
            specs.append(make_request(request_id, max_tokens))
        compiles_before = compiles.num_compiles()
        start = time.perf_counter()
        result = engine.step(observation, specs)  # adds them, then runs the frame
        wall_s = time.perf_counter() - start
        num_compiles = compiles.num_compiles() - compiles_before
        self.clock_s += wall_s
        end = self.clock_s
        self._frame += 1
        after = engine_counters(engine)
        per_request_steps: list[int] = []
        num_tokens = num_admitted = 0
        for output in result.outputs:
            tracked = self.requests.get(output.request_id)
            if tracked is None:
                continue
            new = len(output.new_token_ids)
            if new:
                # A request's first id comes from the tail extend, the rest from decode steps.
                per_request_steps.append(new - 1 if tracked.num_tokens == 0 else new)
                num_admitted += tracked.num_tokens == 0
            tracked.num_tokens += new
            num_tokens += new
            if output.status.finished and tracked.status is None:
                tracked.finish_s = end
                tracked.status = output.status.name
        if self.method == "isolated":
            step_batches = [1] * sum(per_request_steps)
        else:
            longest = max(per_request_steps, default=0)
            step_batches = [
                sum(1 for steps in per_request_steps if steps > j) for j in range(longest)
            ]
        timings = dataclasses.asdict(result.timings)
        self.frames.append(
            FrameRecord(
                phase=phase,
                wall_s=wall_s,
                has_actions=result.actions is not None,
                num_tokens=num_tokens,
                step_batches=step_batches,
                num_prefills=after["num_prefills"] - before["num_prefills"],
                num_extends=after["num_extends"] - before["num_extends"],
                num_admitted=num_admitted,
                num_decode_steps=after["num_decode_steps"] - before["num_decode_steps"],
                num_compiles=num_compiles,
                rss_mb=rss_mb(),
                timings={k: v for k, v in timings.items() if isinstance(v, int | float)},
            )
        )


def _percentile(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def _charged_s(frame: FrameRecord) -> float:
    """Seconds a frame costs the served window: all of a measured frame; only the language
    work of a drain frame (its prefill + denoise make an action chunk beyond the window)."""
    if frame.phase == "drain":
        return float(frame.timings.get("language_s", frame.wall_s))
    return frame.wall_s


def _bound_frame_s(frame: FrameRecord, components: dict[str, object]) -> float:
    """Component-time floor of what the frame ran (same charging rule as `_charged_s`)."""
    steps = components["decode_step_s"]
    assert isinstance(steps, dict)
    largest = max(steps)
    decode = sum(
        steps[min(batch, largest)] * max(1, batch / largest) for batch in frame.step_batches
    )
    if frame.num_decode_steps > len(frame.step_batches):  # steps the tokens do not show
        decode += (frame.num_decode_steps - len(frame.step_batches)) * steps[1]
    extend_s = components["extend_s"]
    assert isinstance(extend_s, dict)
    widths = sorted(extend_s)
    extend = 0.0
    admitted = frame.num_admitted
    if frame.num_extends >= admitted:  # one request per extend (isolated admits one by one)
        extend, admitted = admitted * extend_s[widths[0]], 0
    while admitted > 0:  # the runner's chunks: at most the widest extend each
        chunk = min(admitted, widths[-1])
        extend += extend_s[next(w for w in widths if w >= chunk)]
        admitted -= chunk
    language = extend + decode
    if frame.phase == "drain":
        return language
    actions = float(components["denoise_s"]) if frame.has_actions else 0.0
    return frame.num_prefills * float(components["prefill_s"]) + actions + language


def run_group(
    settings: Sequence[Setting],
    engines: Sequence[Engine],
    args: argparse.Namespace,
) -> tuple[list[Runner], float]:
    """Runs settings that share N, M and arrivals frame by frame in turn (interleaved).

    Interleaving spreads load changes on a shared machine over every method alike; each
    runner keeps its own clock (the sum of its own frame times), so latencies are what the
    method would show running alone. Returns the runners and the group's peak RSS [MiB].
    """
    first = settings[0]
    runners = [Runner(e, s.method, args.seed) for s, e in zip(settings, engines, strict=True)]
    for engine in engines:
        engine.warmup()  # compiles; the warm-up frames then feed the cost model real costs
    peak_rss = rss_mb()
    warm = arrival_schedule(first.arrival, first.max_tokens, args.warmup_frames, args.seed + 1)
    for lengths in warm:
        for runner in runners:
            runner.run_frame(lengths, "warmup")
    measured = arrival_schedule(first.arrival, first.max_tokens, args.frames, args.seed)
    for lengths in measured:
        for runner in runners:
            runner.run_frame(lengths, "measured")
    for _ in range(args.max_drain_frames):
        pending = [runner for runner in runners if runner.num_unfinished]
        if not pending:
            break
        for runner in pending:
            runner.run_frame((), "drain")
    peak_rss = max([peak_rss] + [frame.rss_mb for runner in runners for frame in runner.frames])
    return runners, peak_rss


def steady_state_s(
    frame_s: Sequence[float], emitted: int, arrived: int
) -> tuple[float | None, float]:
    """(steady_s, token_balance) of a measured window: its frames' time, stretched where they
    emitted fewer tokens than arrived in them, never shrunk where warm-up requests' tokens
    added to theirs (None if they emitted none of what arrived)."""
    balance = emitted / arrived if arrived else 1.0
    return (sum(frame_s) / min(1.0, balance) if balance > 0 else None), balance


def summarize(
    setting: Setting,
    runner: Runner,
    components: dict[str, object],
    budget_s: float,
    peak_rss: float,
) -> dict[str, object]:
    """Metrics of one setting from its runner's frames (see the module docstring)."""
    engine = runner.engine
    measured = [frame for frame in runner.frames if frame.phase == "measured"]
    served = [frame for frame in runner.frames if frame.phase in ("measured", "drain")]
    num_drain = sum(1 for frame in served if frame.phase == "drain")
    frame_s = [frame.wall_s for frame in measured]
    action_frames = [frame.wall_s for frame in measured if frame.has_actions]
    requests = [tracked for tracked in runner.requests.values() if tracked.measured]
    done = [tracked for tracked in requests if tracked.status in COMPLETED]
    latency_s = [
        tracked.finish_s - tracked.arrival_s for tracked in done if tracked.finish_s is not None
    ]
    batches = [batch for frame in measured for batch in frame.step_batches]
    measured_tokens = sum(frame.num_tokens for frame in measured)
    expected_tokens = sum(tracked.max_tokens for tracked in requests)
    generated_tokens = sum(tracked.num_tokens for tracked in requests)
    bound_measured_s = sum(_bound_frame_s(frame, components) for frame in measured)
    bound_e2e_s = sum(_bound_frame_s(frame, components) for frame in served)
    e2e_s = sum(_charged_s(frame) for frame in served)
    steady_s, token_balance = steady_state_s(frame_s, measured_tokens, expected_tokens)
    horizon = engine.config.model.action_horizon
    result: dict[str, object] = {
        **dataclasses.asdict(setting),
        "label": setting.label,
        "num_frames": len(measured),
        "num_drain_frames": num_drain,
        "num_requests": len(requests),
        "num_finished": len(done),
        "statuses": dict(collections.Counter(str(tracked.status) for tracked in requests)),
        "deterministic_lengths": generated_tokens == expected_tokens,
        "tokens_generated": generated_tokens,
        "tokens_expected": expected_tokens,
        "frame_ms_mean": 1e3 * statistics.fmean(frame_s),
        "frame_ms_p50": 1e3 * _percentile(frame_s, 50),
        "frame_ms_p99": 1e3 * _percentile(frame_s, 99),
        "action_hz": horizon / statistics.fmean(action_frames) if action_frames else 0.0,
        "tokens_per_s": measured_tokens / sum(frame_s),
        "latency_ms_p50": 1e3 * _percentile(latency_s, 50) if latency_s else None,
        "latency_ms_p99": 1e3 * _percentile(latency_s, 99) if latency_s else None,
        "mean_batch": statistics.fmean(batches) if batches else 0.0,
        "compiles_after_warmup": sum(frame.num_compiles for frame in served),
        "peak_rss_mb": peak_rss,
        "cache_mb": engine.stats().cache_bytes_total / 2**20,
        "e2e_s": e2e_s,
        "steady_s": steady_s,
        "token_balance": token_balance,
        "e2e_wall_s": sum(frame.wall_s for frame in served),
        "bound_e2e_s": bound_e2e_s,
        "num_slots": engine.config.cache.num_slots,
        "num_prefixes": engine.config.cache.num_prefixes,
        "gap": e2e_s / bound_e2e_s if bound_e2e_s > 0 else None,
        "bound_action_hz": horizon * len(measured) / bound_measured_s,
        "bound_tokens_per_s": measured_tokens / bound_measured_s,
        "num_prefills": sum(frame.num_prefills for frame in served),
        "num_decode_steps": sum(frame.num_decode_steps for frame in served),
    }
    if setting.method == "deadline":
        result["budget_ms"] = 1e3 * budget_s
        result["budget_action_hz"] = horizon / budget_s
        result["p99_over_budget"] = float(np.percentile(frame_s, 99)) / budget_s
        result["mandatory_p99_over_budget"] = float(components["action_frame_p99_s"]) / budget_s
    timing_keys = sorted({key for frame in measured for key in frame.timings})
    result["timings_ms_mean"] = {
        key: 1e3 * statistics.fmean(float(frame.timings.get(key, 0.0)) for frame in measured)
        for key in timing_keys
        if key.endswith("_s")
    }
    # The engine's own view of its decode batches, next to the reconstruction above.
    engine_steps = [float(frame.timings.get("num_decode_steps", 0)) for frame in measured]
    engine_batch = [float(frame.timings.get("mean_batch_size", 0.0)) for frame in measured]
    if sum(engine_steps) > 0:
        weighted = sum(s * b for s, b in zip(engine_steps, engine_batch, strict=True))
        result["engine_mean_batch"] = weighted / sum(engine_steps)
    return result


# ------------------------------------------------------------------------------------------
# Grid, table, plot.

DEFINITIONS = {
    "speedup": "finite run, wall time: e2e_wall_s(isolated) / e2e_wall_s(method), same N, M, "
    "arrivals and head (serving this burst of frames + requests and draining it)",
    "speedup_steady": "headline, steady state: steady_s(isolated) / steady_s(method), what a "
    "brain that runs for hours and never drains lives through; the quick mode's "
    "speedup_vs_isolated",
    "steady_s": "the measured frames' wall time / min(1, token_balance): the time of frames "
    "that keep up with the arrivals (stretched if they emitted fewer tokens than arrived)",
    "token_balance": "tokens emitted in the measured frames / tokens of the requests that "
    "arrived in them (1 in steady state: as many tokens leave as arrive)",
    "act_speedup": "action_hz(method) / action_hz(isolated) (OxyGen's frequency ratio)",
    "isolated": "openpi's way at batch-1 shapes: its own engine with one cache slot, a "
    "one-row tail extend, one stored prefix; a prefill per task, each request decoded alone",
    "shared_kv": "one prefill per frame, that frame's requests decoded together to completion; "
    "slots = the most requests one frame brings",
    "continuous": "cb_k*, deadline: --slots slots, --prefixes stored prefixes",
    "isolated_cb_shapes": "isolated at the continuous engines' shapes (the old, inflated "
    "baseline; not in the default grid)",
    "vocab": "language head rows: tokenizer = the tokenizer's vocabulary (tiny: 640), "
    "full = 257,152 (PaliGemma's tokenizer size)",
    "requests": "greedy, ignore_eos=True: each decodes exactly its max_tokens",
    "e2e_s": "time to serve the measured frames' actions and all requests that "
    "arrived in them: measured frames' wall time + drain frames' language_s",
    "e2e_wall_s": "wall time of measured + drain frames (finite burst)",
    "bound_e2e_s": "the same frames' work at component times measured alone, at the "
    "method's own shapes",
    "gap": "e2e_s / bound_e2e_s",
    "roofline": "per component: XLA cost-analysis FLOPs and bytes; roofline_s = max(FLOPs / "
    "peak matmul FLOP/s, bytes / peak bytes/s) with the peaks probed in the same run; "
    "roofline_fraction = roofline_s / measured seconds (1.0 = at the limit)",
}


def grid(args: argparse.Namespace) -> list[Setting]:
    settings = []
    for vocab in args.vocab:
        for n in args.denoise_steps:
            for arrival in args.arrivals:
                lengths: list[int | None] = [None] if arrival == "mixed" else list(args.max_tokens)
                for m in lengths:
                    for method in args.methods:
                        settings.append(Setting(method, n, m, arrival, vocab))
    return settings


def add_speedups(results: list[dict[str, object]]) -> None:
    """Ratios against `isolated` (batch-1 shapes) at the same N, M, arrivals and head."""

    def key(r: dict[str, object]) -> tuple[object, ...]:
        return (r["denoise_steps"], r["max_tokens"], r["arrival"], r.get("vocab", "tokenizer"))

    isolated = {key(r): r for r in results if r["method"] == "isolated"}
    for r in results:
        base = isolated.get(key(r))
        if base is None:
            r["speedup"] = r["speedup_steady"] = r["act_speedup"] = r["bound_speedup"] = None
            continue
        r["speedup"] = base["e2e_wall_s"] / r["e2e_wall_s"]  # type: ignore[operator]
        r["speedup_steady"] = (
            None
            if base.get("steady_s") is None or r.get("steady_s") is None
            else base["steady_s"] / r["steady_s"]  # type: ignore[operator]
        )
        r["act_speedup"] = r["action_hz"] / base["action_hz"]  # type: ignore[operator]
        r["bound_speedup"] = base["bound_e2e_s"] / r["bound_e2e_s"]  # type: ignore[operator]


COLUMNS = (
    ("method", "method", "{}"),
    ("N", "denoise_steps", "{}"),
    ("M", "max_tokens", "{}"),
    ("arr", "arrival", "{}"),
    ("fr_mean", "frame_ms_mean", "{:.0f}"),
    ("fr_p50", "frame_ms_p50", "{:.0f}"),
    ("fr_p99", "frame_ms_p99", "{:.0f}"),
    ("act_Hz", "action_hz", "{:.1f}"),
    ("tok/s", "tokens_per_s", "{:.0f}"),
    ("lat_p50", "latency_ms_p50", "{:.0f}"),
    ("lat_p99", "latency_ms_p99", "{:.0f}"),
    ("batch", "mean_batch", "{:.1f}"),
    ("comp", "compiles_after_warmup", "{}"),
    ("rss_MB", "peak_rss_mb", "{:.0f}"),
    ("e2e_s", "e2e_s", "{:.2f}"),
    ("steady_s", "steady_s", "{:.2f}"),
    ("tok_bal", "token_balance", "{:.2f}"),
    ("bound_s", "bound_e2e_s", "{:.2f}"),
    ("gap", "gap", "{:.2f}"),
    ("head", "vocab", "{}"),
    ("slots", "num_slots", "{}"),
    ("speedup", "speedup", "{:.2f}"),
    ("steady_x", "speedup_steady", "{:.2f}"),
    ("act_x", "act_speedup", "{:.2f}"),
)


def format_table(results: list[dict[str, object]]) -> str:
    rows = [[title for title, _, _ in COLUMNS]]
    for r in results:
        row = []
        for _, key, fmt in COLUMNS:
            value = r.get(key)
            if key == "max_tokens" and value is None:
                value = "5|20"
            row.append("-" if value is None else fmt.format(value))
        rows.append(row)
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    lines = [
        "  ".join(cell.rjust(width) for cell, width in zip(row, widths, strict=True))
        for row in rows
    ]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def plot(results: list[dict[str, object]], path: pathlib.Path, title: str) -> None:
    """Action frequency vs tokens/s, one panel per N; hollow markers: the computed bound."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = sorted({int(r["denoise_steps"]) for r in results}) or [0]  # type: ignore[call-overload]
    fig, axes = plt.subplots(
        1, len(steps), figsize=(6.5 * len(steps), 5.0), squeeze=False, sharey=True
    )
    markers = dict(zip(METHODS, "osD^v*", strict=True))
    colors = dict(zip(METHODS, plt.rcParams["axes.prop_cycle"].by_key()["color"], strict=False))
    for ax, n in zip(axes[0], steps, strict=True):
        for method in METHODS:
            points = [r for r in results if r["method"] == method and r["denoise_steps"] == n]
            if not points:
                continue
            style = {"marker": markers[method], "color": colors[method]}
            ax.scatter(
                [r["tokens_per_s"] for r in points],
                [r["action_hz"] for r in points],
                label=method,
                alpha=0.85,
                **style,
            )
            ax.scatter(
                [r["bound_tokens_per_s"] for r in points],
                [r["bound_action_hz"] for r in points],
                facecolors="none",
                edgecolors=colors[method],
                marker=markers[method],
                alpha=0.5,
            )
        ax.set_xlabel("language throughput [tokens/s]")
        ax.set_title(f"{title}, N={n} denoise steps (hollow: bound)", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0][0].set_ylabel("action frequency [Hz] (horizon / frame time)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ------------------------------------------------------------------------------------------


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
    headlines = {
        vocab: next(
            (
                r
                for r in results
                if r["vocab"] == vocab and all(r[k] == v for k, v in HEADLINE.items())
            ),
            None,
        )
        for vocab in args.vocab
    }
    headline = headlines[args.vocab[0]]
    best = max(
        (r for r in results if r.get("speedup") is not None and r["method"] != "isolated"),
        key=lambda r: r["speedup"],  # type: ignore[arg-type, return-value]
        default=None,
    )
    document = {
        "benchmark": "oxygen_bench",
        "mode": mode,
        "preset": args.preset,
        "args": {k: str(v) if isinstance(v, pathlib.Path) else v for k, v in vars(args).items()},
        "machine": {
            "cpu_count": os.cpu_count(),
            "platform": platform.platform(),
            "jax": jax.__version__,
            "jax_backend": jax.default_backend(),
            "devices": [str(d) for d in jax.devices()],
        },
        "definitions": DEFINITIONS,
        "machine_peaks": bench.peaks,
        "components": bench.components_document(),
        "results": results,
        "headline": headline,
        "headline_per_head": headlines,
        "best_speedup": None
        if best is None
        else {"label": best["label"], "speedup": best["speedup"]},
        "max_rss_mb": max_rss_mb(),
        "wall_s": time.perf_counter() - started,
    }
    json_path = stem.with_suffix(".json")
    json_path.write_text(json.dumps(document, indent=2) + "\n")
    png_path = stem.with_suffix(".png")
    plot(results, png_path, f"oxygen_bench {mode}, preset {args.preset}")

    print(format_table(results))
    for r in results:
        if "p99_over_budget" in r:
            print(
                f"deadline {r['label']}: budget {r['budget_ms']:.0f} ms, p99 frame / budget = "
                f"{r['p99_over_budget']:.2f} (action-only frames alone: "
                f"{r['mandatory_p99_over_budget']:.2f})"
            )
    print(f"results: {json_path}  plot: {png_path}  ({document['wall_s']:.0f} s)")
    if best is not None:
        print(f"best speedup over the grid: {best['speedup']:.2f}x ({best['label']})")
    for vocab, r in headlines.items():
        if r is not None:
            print(
                f"headline ({r['label']}): wall-time speedup {r['speedup']:.2f}x, steady state "
                f"{r['speedup_steady']:.2f}x, action frequency {r['act_speedup']:.2f}x "
                f"(head: {vocab})"
            )
    wall = headline.get("speedup") if headline is not None else None
    speedup = headline.get("speedup_steady") if headline is not None else None
    print(f"wall-time speedup of this finite run: {'nan' if wall is None else f'{wall:.2f}'}")
    print(f"speedup_vs_isolated={'nan' if speedup is None else f'{speedup:.2f}'}")


if __name__ == "__main__":
    main()
