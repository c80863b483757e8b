"""gpu_bench's run: one grid point (N, M, u1), every method interleaved, stage by stage.

`Run` builds the model (zeros perturbed), checks the action path against openpi
(`openpi_equality.py`), measures component times, builds and warms the engines, runs
oxygen_bench's warm-up frames, trims the measured frames to the budget and runs them with
oxygen_bench's protocol (`oxygen_bench_protocol.run_warmup_frames` / `run_measured_frames`),
then summarises each method with oxygen_bench's metrics and the 70 Hz question
(`period_stats`).
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import traceback
from collections.abc import Sequence

import numpy as np
from gpu_bench_budget import (
    ARRIVAL,
    DEADLINE_PERIOD,
    METHODS,
    MIN_COMPONENT_RUNS,
    MIN_FRAMES,
    MIN_FRAMES_SMOKE,
    PERIOD_S,
    Budget,
    Stages,
    choose_frames,
    method_costs,
    rest_estimate,
)
from gpu_bench_report import equality_line, load_module, run_document


def _p(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def period_stats(runner: object) -> dict[str, object]:
    """The 70 Hz question for one method's measured frames (an oxygen_bench Runner)."""
    measured = [f for f in runner.frames if f.phase == "measured"]  # type: ignore[attr-defined]
    action_s = [float(f.timings["action_s"]) for f in measured if f.has_actions]
    frame_s = [f.wall_s for f in measured]
    action_p99, frame_p99 = _p(action_s, 99), _p(frame_s, 99)
    return {
        "action_path_ms_p50": None if not action_s else 1e3 * _p(action_s, 50),
        "action_path_ms_p99": None if action_p99 is None else 1e3 * action_p99,
        "chunk_interval_ms_p99": None if frame_p99 is None else 1e3 * frame_p99,
        "action_path_within_143ms": action_p99 is not None and action_p99 <= PERIOD_S,
        "chunk_every_143ms": frame_p99 is not None and frame_p99 <= PERIOD_S,
    }


class Run:
    """One grid point (N, M, u1), every method interleaved, stage by stage; `document()` is
    what ran so far (the final JSON, or the watchdog's)."""

    def __init__(
        self, args: argparse.Namespace, preset: str, workdir: pathlib.Path, started: float
    ) -> None:
        """`started`: epoch seconds the process started (the budget counts from it)."""
        self.args, self.preset, self.workdir = args, preset, workdir
        self.started = started
        self.stages = Stages(self.started)
        self.budget = Budget(args.budget_s, self.started)
        with self.stages("imports_engine"):  # oxygen_ros.engine, openpi, flax
            self.ob = load_module("oxygen_bench")  # puts its pieces on sys.path first
            self.protocol = load_module("oxygen_bench_protocol")
            self.metrics = load_module("oxygen_bench_metrics")
            self.eq = load_module("openpi_equality")
        self.bench: object | None = None
        self.info: dict[str, object] = {"preset": preset}
        self.equality: dict[str, object] | None = None
        self.results: list[dict[str, object]] = []
        self.setting: dict[str, object] = {"frames": None}
        self.incomplete: str | None = None
        self.min_frames = min(
            args.frames, MIN_FRAMES_SMOKE if args.force_cpu_smoke else MIN_FRAMES
        )

    def __call__(self) -> None:
        args, ob, n, m = self.args, self.ob, self.args.denoise_steps, self.args.max_tokens
        protocol, metrics = self.protocol, self.metrics
        vocab = "tokenizer" if self.preset == "tiny" else args.vocab  # the smoke's small head
        ob_args = ob.parse_args(
            [
                "--preset", self.preset, "--methods", *METHODS, "--denoise-steps", str(n),
                "--max-tokens", str(m), "--arrivals", ARRIVAL, "--vocab", vocab,
                "--frames", str(args.frames), "--warmup-frames", str(args.warmup_frames),
                "--component-runs", str(args.component_runs), "--slots", str(args.slots),
                "--prefixes", str(args.prefixes), "--seed", str(args.seed),
                "--deadline-factor", str(args.deadline_factor),
            ]
        )  # fmt: skip
        with self.stages("peaks"):
            self.bench = bench = ob.Bench(ob_args, self.workdir)
        with self.stages("model"):
            model = self.build_model(bench, n)
        with self.stages("equality"):
            self.run_equality(model)
        self.trim_component_runs(ob_args)
        names = [*METHODS] + ([] if args.no_deadline_143ms else [DEADLINE_PERIOD])
        methods = ["deadline" if name == DEADLINE_PERIOD else name for name in names]
        settings = [protocol.Setting(method, n, m, ARRIVAL, vocab) for method in methods]
        with self.stages("components"):
            budget_s = bench.budget(n, vocab)
            self.setting["deadline_budget_ms"] = 1e3 * budget_s
            schedule = protocol.arrival_schedule(ARRIVAL, m, args.warmup_frames + args.frames, 0)
            caches = [protocol.method_cache(self.preset, s, ob_args, schedule) for s in settings]
            components = [bench.components_for(n, vocab, c) for c in caches]
        budgets = [PERIOD_S if name == DEADLINE_PERIOD else budget_s for name in names]
        with self.stages("engines"):
            engines = [bench.engine(*sbc) for sbc in zip(settings, budgets, caches, strict=True)]
            for engine in engines:
                engine.warmup()
        self.info.update(
            lm_head_rows=engines[0].model.vocab_size or "all",
            tokenizer=str(engines[0].tokenizer.path),
            tokenizer_vocab=engines[0].tokenizer.vocab_size,
            tokenizer_kind=bench.tokenizer(vocab)[1],
        )
        runners = protocol.make_runners(settings, engines, args.seed)
        del engines
        with self.stages("warmup_frames"):
            protocol.run_warmup_frames(runners, settings[0], ob_args)
        frames, keep = self.trim_frames(runners, names, m)
        if not keep:
            index = names.index(DEADLINE_PERIOD)
            for group in (names, settings, runners, components, budgets):
                del group[index]
        self.setting["frames"] = frames
        with self.stages("measured"):
            protocol.run_measured_frames(runners, settings[0], ob_args, frames)
        peak_rss = protocol.peak_rss_mb(runners)
        results = []
        for name, *row in zip(names, settings, runners, components, budgets, strict=True):
            result = metrics.summarize(*row, peak_rss)
            result.update(method=name, label=protocol.Setting(name, n, m, ARRIVAL, vocab).label)
            result.update(period_stats(row[1]))
            results.append(result)
            bench.log(
                f"{result['label']}: frame p99 {result['frame_ms_p99']:.1f} ms, action path p99 "
                f"{result['action_path_ms_p99']:.1f} ms, {result['tokens_per_s']:.0f} tok/s"
            )
        metrics.add_speedups(results)
        self.results = results

    def build_model(self, bench: object, n: int) -> object:
        """The preset's model with its all-zero leaves perturbed: what every engine times."""
        from oxygen_ros.engine.model import param_count

        model, replaced = self.eq.perturb_zero_params(bench.model(n), self.args.seed + 1)  # type: ignore[attr-defined]
        bench.models[n] = model  # type: ignore[attr-defined]
        config = model.config
        self.info.update(
            random_init=True,
            perturbed_zero_leaves=replaced,
            dtype=config.dtype,
            param_dtype=config.param_dtype,
            num_params=param_count(model),
            vision_variant=config.vision_variant,
            action_horizon=config.action_horizon,
            prefix_len=config.prefix_len,
        )
        bench.log(f"{self.preset}: {self.info['num_params'] / 1e6:.0f}M parameters")  # type: ignore[attr-defined, operator]
        return model

    def run_equality(self, model: object) -> None:
        """Our side always (its compilations are the timed engines'); openpi's unless
        `--skip-equality`, an incompatible config, or the budget (trimmed last)."""
        reason = self.eq.openpi_incompatibility(model.config)  # type: ignore[attr-defined]
        reason = reason or ("--skip-equality" if self.args.skip_equality else None)

        def proceed(timings: dict[str, float]) -> str | None:
            if reason is not None:
                return reason
            need = timings["ours_first_s"] + timings["ours_second_s"]
            frames = self.min_frames + self.args.warmup_frames
            # Trimmed last: skipped only when the plain estimate (no safety factor) of the
            # minimum run and openpi's side (~ our first call) does not fit.
            rest = rest_estimate(timings, frames, MIN_COMPONENT_RUNS, safety=1.0)
            if need + rest <= (left := self.budget.left()):
                return None
            why = f"openpi's side (~{need:.0f} s) + the minimum run (~{rest:.0f} s) > {left:.0f} s"
            self.budget.trim("openpi_equality", True, False, why)
            return f"budget: {why}"

        try:
            self.equality = self.eq.compare(model, self.eq.equality_engine(model), proceed)
        except Exception as error:  # the timing still runs; the JSON says why
            traceback.print_exc()
            self.equality = {"openpi_equal": False, "error": f"{type(error).__name__}: {error}"}
        print(equality_line(self.equality), file=sys.stderr, flush=True)

    def trim_component_runs(self, ob_args: argparse.Namespace) -> None:
        requested = ob_args.component_runs
        if "ours_first_s" not in (self.equality or {}) or requested <= MIN_COMPONENT_RUNS:
            return
        frames = self.min_frames + self.args.warmup_frames
        rest = rest_estimate(self.equality, frames, requested)  # type: ignore[arg-type]
        if rest > (left := self.budget.left()):
            ob_args.component_runs = MIN_COMPONENT_RUNS
            why = f"~{rest:.0f} s needed at the minimum frames > {left:.0f} s left"
            self.budget.trim("component_runs", requested, MIN_COMPONENT_RUNS, why)

    def trim_frames(
        self, runners: Sequence[object], names: Sequence[str], max_tokens: int
    ) -> tuple[int, bool]:
        requested, left = self.args.frames, self.budget.left()
        costs = method_costs(runners, names, max_tokens, self.args.warmup_frames)
        frames, keep = choose_frames(left, costs, requested, self.min_frames)
        per_frame = ", ".join(f"{k} {1e3 * v[1]:.0f} ms" for k, v in costs.items())
        why = f"{left:.1f} s left; per measured frame (warm-up frames): {per_frame}"
        if frames < requested:
            self.budget.trim("frames", requested, frames, why)
        if not keep:
            self.budget.trim(DEADLINE_PERIOD, True, False, f"{self.min_frames} frames: {why}")
        if frames < self.min_frames:
            frames = max(frames, 1)
            self.incomplete = f"only {frames} measured frames fit (minimum {self.min_frames})"
        return frames, keep

    def document(self, incomplete: str | None = None) -> dict[str, object]:
        """What ran so far (`gpu_bench_report.run_document`)."""
        return run_document(self, incomplete)
