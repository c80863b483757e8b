"""oxygen_bench's protocol: the workload, one engine per method, and the interleaved run.

Settings (`Setting`: method, N, M, arrivals, head) that share N, M, arrivals and head run as
one group (`run_group`): every engine warms up (`Engine.warmup()`), then `--warmup-frames`
frames with the setting's arrivals, `--frames` measured frames, and drain frames (no
arrivals) until every request finished, one frame of each method in turn; each `Runner` keeps
its own clock and a `FrameRecord` per engine call, which `oxygen_bench_metrics` reads. The
phases are separate functions (`run_warmup_frames`, `run_measured_frames`) so gpu_bench can
size the measured window after the warm-up. See oxygen_bench.py for the methods and metrics.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import resource
import time
from collections.abc import Sequence

import full_vocab
import numpy as np
import psutil

from oxygen_ros.engine import compiles
from oxygen_ros.engine.config import CacheConfig, ModelConfig, get_engine_config
from oxygen_ros.engine.engine import Engine
from oxygen_ros.engine.model import Pi05Model
from oxygen_ros.engine.tokenizer import BUNDLED_TOKENIZER_PATH
from oxygen_ros.engine.types import LanguageRequest, Observation, RequestKind

METHODS = ("isolated", "shared_kv", "cb_k1", "cb_k5", "cb_k10", "deadline")
# Not in the default grid: isolated on the continuous engines' shapes (`--slots` rows per decode
# step and extend), the baseline this benchmark used before; shows how much it inflated speedups.
EXTRA_METHODS = ("isolated_cb_shapes",)
VOCABS = full_vocab.VOCABS
ARRIVALS = ("u0.5", "u1", "u2", "poisson", "mixed")
MIXED_LENGTHS = (5, 20)
REQUEST_KIND = RequestKind.NARRATION

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


def make_runners(
    settings: Sequence[Setting], engines: Sequence[Engine], seed: int
) -> list[Runner]:
    return [Runner(e, s.method, seed) for s, e in zip(settings, engines, strict=True)]


def run_warmup_frames(
    runners: Sequence[Runner], setting: Setting, args: argparse.Namespace
) -> None:
    """`args.warmup_frames` frames with `setting`'s arrivals, one of each runner in turn
    (excluded from every metric)."""
    warm = arrival_schedule(setting.arrival, setting.max_tokens, args.warmup_frames, args.seed + 1)
    for lengths in warm:
        for runner in runners:
            runner.run_frame(lengths, "warmup")


def run_measured_frames(
    runners: Sequence[Runner],
    setting: Setting,
    args: argparse.Namespace,
    frames: int | None = None,
) -> None:
    """`frames` (default `args.frames`) measured frames with `setting`'s arrivals, then drain
    frames (no arrivals, at most `args.max_drain_frames`) until every request finished."""
    frames = args.frames if frames is None else frames
    measured = arrival_schedule(setting.arrival, setting.max_tokens, frames, args.seed)
    for lengths in measured:
        for runner in runners:
            runner.run_frame(lengths, "measured")
    for _ in range(args.max_drain_frames):
        pending = [runner for runner in runners if runner.num_unfinished]
        if not pending:
            break
        for runner in pending:
            runner.run_frame((), "drain")


def peak_rss_mb(runners: Sequence[Runner], floor: float = 0.0) -> float:
    """The largest RSS sampled after any frame of `runners` (at least `floor`) [MiB]."""
    return max([floor] + [frame.rss_mb for runner in runners for frame in runner.frames])


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
    runners = make_runners(settings, engines, args.seed)
    for engine in engines:
        engine.warmup()  # compiles; the warm-up frames then feed the cost model real costs
    peak_rss = rss_mb()
    run_warmup_frames(runners, settings[0], args)
    run_measured_frames(runners, settings[0], args)
    return runners, peak_rss_mb(runners, peak_rss)


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
