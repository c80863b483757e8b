"""OxyGen's comparison in the paper's setting, on an accelerator: `benchmarks/gpu`.

Only where JAX has a GPU or TPU backend (elsewhere one line, exit 0), in stages whose wall and
XLA compile seconds the JSON records (`stages`):
- `model`: the `pi05` preset (openpi gemma_2b + gemma_300m + SigLIP So400m/14, 3 cameras at
  224 px, prefix 968 tokens, horizon 50) randomly initialised in bfloat16, its all-zero
  parameters given small noise so actions depend on the observation;
- `equality`: the engine's isolated action path against openpi's own `Pi0.sample_actions`,
  same parameters, noise and inputs, with its stated tolerance (`openpi_equality.py`); a
  failure is reported (`openpi_equal: false`) and the run goes on;
- `peaks`, `components` .. `measured`: oxygen_bench's pieces (`oxygen_bench.py`, loaded by
  path): machine peaks, component times with their roofline at each method's shapes, engines,
  runners and metrics (the run loop is here, to size the measured frames after the warm-up),
  with the full 257,152-row language head (`--vocab`), N=10 denoise steps, M=30 tokens per
  request, one request per frame (`u1`), the methods isolated / shared_kv / cb_k5 / deadline
  (budget `--deadline-factor` x p90 action-only frame) and deadline_143ms (budget 10 / 70 s),
  run interleaved; speedups by wall time and in steady state;
- the 70 Hz answer: frames run back to back, so horizon-10 chunks come every 10 / 70 s =
  142.9 ms with language running iff cb_k5's p99 frame time stays under it
  (`chunk_every_143ms`); the p99 of the action path alone (`FrameTimings.action_s`) beside.

`--budget-s S`: the JSON is written within S s of process start (imports included). From what
ran (the equality's compile and frame times, then the warm-up frames' times and tokens per
frame) it trims, in this order: measured frames (down to 20; smoke 2), the deadline_143ms
run, component runs, and last openpi's side of the equality (the one check that the timed
path computes openpi's actions). `trimmed` lists each trim; a minimum that does not fit, an
error, or a budget that runs out mid-stage (a watchdog then writes what ran) gives
`complete: false`.

Outputs: JSON (`--out`, default benchmarks/results/gpu_bench_<preset>.json: device, JAX and
jaxlib versions, compile times), a PNG beside it where matplotlib imports (`--plot-from JSON`
draws it elsewhere), a table and the last line
    gpu_bench device=<kind> action_hz=<x> tokens_per_s=<y> speedup_vs_isolated=<z>
    chunk_every_143ms=<yes|no> openpi_equal=<yes|no|skipped> complete=<yes|no>
(one line, spaces in the device kind as "_", nan where nothing was measured;
speedup_vs_isolated is cb_k5's steady-state figure, `speedup_steady_vs_isolated` in the
JSON's headline, beside the finite run's `speedup_vs_isolated`); without an
accelerator `no accelerator (jax backend: cpu): benchmarks/gpu not run`. `--force-cpu-smoke`:
the same code on the CPU, `tiny` preset, a couple of frames (tests).

Runs in a repository or beside oxygen_bench.py, openpi_equality.py, roofline.py and
full_vocab.py with the engine installed. JAX's compilation cache: $JAX_COMPILATION_CACHE_DIR,
else .build/jax_cache in a repository, else under the temp dir.

Usage (repository root): benchmarks/gpu [--frames 100] [--budget-s 420] [--out FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.util
import json
import math
import os
import pathlib
import platform
import shutil
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Iterator, Sequence
from types import ModuleType

MODULE_LOADED = time.time()
BENCH_DIR = pathlib.Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
JAX_CACHE = ROOT / ".build" / "jax_cache"  # a repository's (oxygen_bench's)
if not JAX_CACHE.parent.is_dir():  # no repository around: a bundle
    JAX_CACHE = pathlib.Path(tempfile.gettempdir()) / "gpu_bench_jax_cache"
# Same JAX settings as oxygen_bench (set before jax is imported, which reads them).
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(JAX_CACHE))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
if (ROOT / "oxygen_ros").is_dir():  # a repository: its source tree (else the installed engine)
    sys.path.insert(0, str(ROOT))

import jax  # noqa: E402
import numpy as np  # noqa: E402

PERIOD_S = 10 / 70.0  # the 70 Hz question: horizon-10 chunks executed at 70 Hz
METHODS = ("isolated", "shared_kv", "cb_k5", "deadline")  # oxygen_bench method names
CONTINUOUS = ("cb_k5", "deadline", "deadline_143ms")  # requests outlive their frame
HEADLINE_METHOD = "cb_k5"
DEADLINE_PERIOD = "deadline_143ms"  # deadline mode, budget PERIOD_S
ARRIVAL = "u1"  # one request per frame
MIN_FRAMES, MIN_FRAMES_SMOKE = 20, 2  # measured frames never trimmed below
MIN_COMPONENT_RUNS = 3
WATCHDOG_MARGIN_S = 2.0  # the watchdog writes what ran this long before the budget ends
# Compile seconds after the equality per second of its own first-call compile (prefill +
# denoise): roofline recompiles, extends and decode steps at two cache shapes (5.0 on the
# CPU smoke: 8.8 s after 1.75 s).
COMPILE_FACTOR = 5.0
LANGUAGE_FACTOR = 2.0  # a frame with language ~ this x an action-only frame (before measuring)
SAFETY = 1.15  # estimates are scaled by this

# ------------------------------------------------------------------------------------------
# Environment, modules beside this file.


@functools.cache
def environment() -> dict[str, object]:
    import importlib.metadata

    import jaxlib

    device = jax.devices()[0]
    plugins = {
        str(d.metadata["Name"]): d.version
        for d in importlib.metadata.distributions()
        if str(d.metadata["Name"]).lower().startswith(("jax-cuda", "jax_cuda", "libtpu"))
    }
    return {
        "device": device.device_kind,
        "device_platform": device.platform,
        "jax_backend": jax.default_backend(),
        "devices": [str(d) for d in jax.devices()],
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "jax_plugins": plugins,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "jax_compilation_cache_dir": os.environ.get("JAX_COMPILATION_CACHE_DIR"),
    }


def not_run(backend: str, out: pathlib.Path | None) -> None:
    """Prints why nothing ran (one line on stdout) and writes the JSON if asked to."""
    reason = f"no accelerator (jax backend: {backend})"
    hint = None
    if pathlib.Path("/proc/driver/nvidia/version").exists() or shutil.which("nvidia-smi"):
        hint = (
            "an NVIDIA driver is present but JAX has no CUDA backend: install the plugin "
            "matching the pinned jax, e.g. .build/venv/bin/pip install 'jax[cuda12]==0.10.2'"
        )
        print(hint, file=sys.stderr)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        document = {"benchmark": "gpu_bench", "ran": False, "reason": reason, "hint": hint}
        out.write_text(json.dumps({**document, **environment()}, indent=2) + "\n")
    print(f"{reason}: benchmarks/gpu not run")


def load_module(name: str) -> ModuleType:
    """benchmarks/<name>.py beside this file, as a module (benchmarks/ is no package)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, BENCH_DIR / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def process_start() -> float:
    """Epoch seconds this process started (psutil; else when this module loaded)."""
    try:
        import psutil

        return min(float(psutil.Process().create_time()), MODULE_LOADED)
    except Exception:  # any failure: the module's load time is the floor
        return MODULE_LOADED


# ------------------------------------------------------------------------------------------
# Stages, compile times, the budget.

COMPILE_EVENTS = {  # JAX's monitoring events -> stage fields
    "/jax/core/compile/backend_compile_duration": "backend_compile_s",
    "/jax/core/compile/jaxpr_trace_duration": "trace_s",
    "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower_s",
}
CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"
COMPILE_FIELDS = ("xla_compiles", "backend_compile_s", "trace_s", "lower_s", "cache_hits")


class Stages:
    """Wall seconds per stage from process start (`imports` first) and JAX's compile events
    in each: backend compilations (count, seconds; persistent-cache loads count too and
    `cache_hits` says how many), tracing and lowering seconds."""

    def __init__(self, started: float) -> None:
        self.started, self._lock = started, threading.Lock()
        self._totals = dict.fromkeys(COMPILE_FIELDS, 0.0)
        self.done = {"imports": {"wall_s": time.time() - started, **self._totals}}
        self.running: tuple[str, float, dict[str, float]] | None = None
        jax.monitoring.register_event_duration_secs_listener(self._on_duration)
        jax.monitoring.register_event_listener(self._on_event)

    def _on_duration(self, event: str, seconds: float, **_: object) -> None:
        if (field := COMPILE_EVENTS.get(event)) is not None:
            with self._lock:
                self._totals[field] += seconds
                self._totals["xla_compiles"] += field == "backend_compile_s"

    def _on_event(self, event: str, **_: object) -> None:
        if event == CACHE_HIT_EVENT:
            with self._lock:
                self._totals["cache_hits"] += 1

    def _since(self, start: float, before: dict[str, float]) -> dict[str, float]:
        with self._lock:
            now = dict(self._totals)
        return {"wall_s": time.time() - start, **{k: now[k] - before[k] for k in COMPILE_FIELDS}}

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        with self._lock:
            self.running = (name, time.time(), dict(self._totals))
        try:
            yield
        finally:
            self.done[name] = self._since(*self.running[1:])
            self.running = None

    def document(self) -> dict[str, dict[str, float]]:
        stages = dict(self.done)
        if (running := self.running) is not None:
            stages[running[0]] = {**self._since(*running[1:]), "interrupted": True}
        total = {k: sum(s[k] for s in stages.values()) for k in COMPILE_FIELDS}
        return {**stages, "total": {"wall_s": time.time() - self.started, **total}}


class Budget:
    """`--budget-s` from process start, and what was trimmed to keep it."""

    def __init__(self, budget_s: float | None, started: float) -> None:
        self.budget_s, self.started = budget_s, started
        self.trimmed: list[dict[str, object]] = []

    def left(self) -> float:
        """Seconds left, less a reserve for the results (inf without a budget)."""
        if self.budget_s is None:
            return math.inf
        reserve = WATCHDOG_MARGIN_S + 1.0 + 0.03 * self.budget_s
        return self.budget_s - (time.time() - self.started) - reserve

    def trim(self, what: str, requested: object, used: object, why: str) -> None:
        self.trimmed.append({"what": what, "requested": requested, "used": used, "why": why})


def choose_frames(
    left_s: float, costs: dict[str, tuple[float, float]], requested: int, minimum: int
) -> tuple[int, bool]:
    """(measured frames, keep deadline_143ms) for per-method (fixed s, s per measured frame)
    x SAFETY: fewer frames first, down to `minimum`; then without deadline_143ms; fewer than
    `minimum` only when nothing else fits (the caller marks the run incomplete)."""

    def fit(names: Sequence[str]) -> int:
        fixed, per_frame = (SAFETY * sum(costs[n][i] for n in names) for i in (0, 1))
        if math.isinf(left_s) or per_frame <= 0:
            return requested
        return max(0, min(requested, math.floor((left_s - fixed) / per_frame)))

    frames = fit(list(costs))
    if frames >= minimum or DEADLINE_PERIOD not in costs:
        return frames, True
    return fit([name for name in costs if name != DEADLINE_PERIOD]), False


def method_costs(
    runners: Sequence[object], names: Sequence[str], max_tokens: int, warmup_frames: int
) -> dict[str, tuple[float, float]]:
    """(fixed s, s per measured frame) of each method from its warm-up frames (the first
    dropped when there are more): a frame's mean time; continuous methods also drain
    M / (tokens per frame) frames, plus the backlog of frames whose M tokens outran it."""
    costs = {}
    for name, runner in zip(names, runners, strict=True):
        frames = [f for f in runner.frames if f.phase == "warmup"]  # type: ignore[attr-defined]
        steady = frames[1:] or frames
        frame_s = float(np.mean([f.wall_s for f in steady]))
        if name not in CONTINUOUS:
            costs[name] = (0.0, frame_s)
            continue
        served = max(float(np.mean([f.num_tokens for f in steady])), 1.0)
        backlog = max(0.0, max_tokens - served) / served  # drain frames per frame run
        fixed = (math.ceil(max_tokens / served) + backlog * warmup_frames) * frame_s
        costs[name] = (fixed, (1.0 + backlog) * frame_s)
    return costs


def rest_estimate(
    timings: dict[str, object], frames: int, runs: int, safety: float = SAFETY
) -> float:
    """Seconds the stages after the equality need at the least, from its two calls of our
    side (the first compiles): compiles ~ COMPILE_FACTOR x the first call's extra time;
    components ~ (46 action-only frames + 2 shapes x runs x ~4 frames); frames (warm-up
    included) ~ LANGUAGE_FACTOR x an action-only frame per method; all x `safety`."""
    first, second = float(timings["ours_first_s"]), float(timings["ours_second_s"])  # type: ignore[arg-type]
    compile_s = COMPILE_FACTOR * max(first - second, 0.0)
    components_s = (46 + 8 * runs) * second
    return safety * (compile_s + components_s + frames * len(METHODS) * LANGUAGE_FACTOR * second)


# ------------------------------------------------------------------------------------------
# The run.


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

    def __init__(self, args: argparse.Namespace, preset: str, workdir: pathlib.Path) -> None:
        self.args, self.preset, self.workdir = args, preset, workdir
        self.started = process_start()
        self.stages = Stages(self.started)
        self.budget = Budget(args.budget_s, self.started)
        with self.stages("imports_engine"):  # oxygen_ros.engine, openpi, flax
            self.ob = load_module("oxygen_bench")
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
        settings = [ob.Setting(method, n, m, ARRIVAL, vocab) for method in methods]
        with self.stages("components"):
            budget_s = bench.budget(n, vocab)
            self.setting["deadline_budget_ms"] = 1e3 * budget_s
            schedule = ob.arrival_schedule(ARRIVAL, m, args.warmup_frames + args.frames, 0)
            caches = [ob.method_cache(self.preset, s, ob_args, schedule) for s in settings]
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
        runners = [
            ob.Runner(e, s.method, args.seed) for s, e in zip(settings, engines, strict=True)
        ]
        del engines
        with self.stages("warmup_frames"):
            for lengths in ob.arrival_schedule(ARRIVAL, m, args.warmup_frames, args.seed + 1):
                for runner in runners:
                    runner.run_frame(lengths, "warmup")
        frames, keep = self.trim_frames(runners, names, m)
        if not keep:
            index = names.index(DEADLINE_PERIOD)
            for group in (names, settings, runners, components, budgets):
                del group[index]
        self.setting["frames"] = frames
        with self.stages("measured"):
            for lengths in ob.arrival_schedule(ARRIVAL, m, frames, args.seed):
                for runner in runners:
                    runner.run_frame(lengths, "measured")
            for _ in range(ob_args.max_drain_frames):
                pending = [runner for runner in runners if runner.num_unfinished]
                if not pending:
                    break
                for runner in pending:
                    runner.run_frame((), "drain")
        peak_rss = max(f.rss_mb for runner in runners for f in runner.frames)
        results = []
        for name, *row in zip(names, settings, runners, components, budgets, strict=True):
            result = ob.summarize(*row, peak_rss)
            result.update(method=name, label=ob.Setting(name, n, m, ARRIVAL, vocab).label)
            result.update(period_stats(row[1]))
            results.append(result)
            bench.log(
                f"{result['label']}: frame p99 {result['frame_ms_p99']:.1f} ms, action path p99 "
                f"{result['action_path_ms_p99']:.1f} ms, {result['tokens_per_s']:.0f} tok/s"
            )
        ob.add_speedups(results)
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
        incomplete, bench, args = incomplete or self.incomplete, self.bench, self.args
        components = None
        with contextlib.suppress(Exception):  # the watchdog may read while a stage writes
            components = bench.components_document()  # type: ignore[union-attr]
        document: dict[str, object] = {
            "benchmark": "gpu_bench",
            "ran": True,
            "complete": incomplete is None,
            "incomplete_reason": incomplete,
            "smoke": args.force_cpu_smoke,
            **environment(),
            "openpi_equal": (self.equality or {}).get("openpi_equal"),
            "openpi_equality": self.equality,
            "model": self.info,
            "setting": {
                "denoise_steps": args.denoise_steps,
                "max_tokens": args.max_tokens,
                "k": 5,
                "arrival": ARRIVAL,
                "frames_requested": args.frames,
                "min_frames": self.min_frames,
                "warmup_frames": args.warmup_frames,
                "slots": args.slots,
                "prefixes": args.prefixes,
                "deadline_factor": args.deadline_factor,
                "seed": args.seed,
                **self.setting,
            },
            "budget": {"budget_s": args.budget_s, "from": "process start"},
            "trimmed": self.budget.trimmed,
            "stages": self.stages.document(),
            "machine_peaks": getattr(bench, "peaks", None),
            "components": components,
            "results": self.results,
            "headline": None,
            "seventy_hz": None,
        }
        headline = next((r for r in self.results if r["method"] == HEADLINE_METHOD), None)
        if headline is not None:
            keys = ("action_hz", "tokens_per_s", "speedup", "speedup_steady", "act_speedup")
            document["headline"] = {
                "method": HEADLINE_METHOD,
                **{k if k in keys[:2] else f"{k}_vs_isolated": headline[k] for k in keys},
            }
            period = next((r for r in self.results if r["method"] == DEADLINE_PERIOD), None)
            keys = ("chunk_interval_ms_p99", "action_path_ms_p99", "chunk_every_143ms")
            document["seventy_hz"] = {
                "question": "can horizon-10 chunks come every 10/70 s with language running?",
                "period_ms": 1e3 * PERIOD_S,
                "method": HEADLINE_METHOD,
                **{k: headline[k] for k in (*keys, "action_path_within_143ms")},
                DEADLINE_PERIOD: period
                and {
                    k: period.get(k) for k in ("frame_ms_p99", "tokens_per_s", "p99_over_budget")
                },
            }
        document["definitions"] = {
            "chunk_interval_ms_p99": "p99 of whole frame times (frames run back to back: the "
            "time from one chunk to the next, language work included)",
            "action_path_ms_p99": "p99 of FrameTimings.action_s: step start -> actions handed "
            "off (observation -> chunk latency) with language running in the same loop",
            "action_hz": "action horizon / mean frame time (oxygen_bench)",
            "stages": "wall seconds per stage, from process start; xla_compiles, "
            "backend_compile_s: JAX's backend compile events (persistent-cache loads "
            "included: cache_hits), trace_s, lower_s: tracing and MLIR lowering",
            **self.ob.DEFINITIONS,
        }
        document["wall_s"] = time.time() - self.started
        return document


# ------------------------------------------------------------------------------------------
# Report.


def _fmt(value: object, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def summary_table(results: Sequence[dict[str, object]]) -> str:
    header = ("method", "act_Hz", "tok/s", "speedup", "act_path_p99", "chunk_p99", "<=143ms")
    rows = [header]
    for r in results:
        rows.append(
            (
                str(r["method"]),
                _fmt(r["action_hz"], ".1f"),
                _fmt(r["tokens_per_s"], ".0f"),
                _fmt(r.get("speedup"), ".2f"),
                _fmt(r["action_path_ms_p99"], ".1f") + " ms",
                _fmt(r["chunk_interval_ms_p99"], ".1f") + " ms",
                "yes" if r["chunk_every_143ms"] else "no",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def last_line(document: dict[str, object]) -> str:
    headline = document.get("headline") or {}
    seventy = document.get("seventy_hz") or {}
    assert isinstance(headline, dict) and isinstance(seventy, dict)
    equal = document.get("openpi_equal")

    def number(key: str, spec: str) -> str:
        return "nan" if headline.get(key) is None else format(headline[key], spec)

    return (
        f"gpu_bench device={'_'.join(str(document['device']).split())} "
        f"action_hz={number('action_hz', '.1f')} tokens_per_s={number('tokens_per_s', '.0f')} "
        f"speedup_vs_isolated={number('speedup_steady_vs_isolated', '.2f')} "
        f"chunk_every_143ms={'yes' if seventy.get('chunk_every_143ms') else 'no'} "
        f"openpi_equal={'skipped' if equal is None else 'yes' if equal else 'no'} "
        f"complete={'yes' if document['complete'] else 'no'}"
    )


def equality_line(record: dict[str, object] | None) -> str:
    if record is None:
        return "openpi equality: not reached"
    if "error" in record:
        return f"openpi equality: FAILED to run ({record['error']})"
    if record.get("openpi_equal") is None:
        return f"openpi equality: skipped ({record.get('skipped')})"
    verdict = "equal" if record["openpi_equal"] else "NOT EQUAL"
    return (
        f"openpi equality ({record['dtype']}): {verdict}, max |diff| "
        f"{record['max_abs_diff']:.3g} (tolerance {record['tolerance']:.3g}); "
        f"another observation moves the chunk by {record['observation_dependence']:.3g} "
        f"({record['dependence_over_tolerance']:.0f}x the tolerance); {record['openpi_model']}"
    )


def report(document: dict[str, object], json_path: pathlib.Path) -> None:
    results, model, setting = document["results"], document["model"], document["setting"]
    assert isinstance(results, list) and isinstance(model, dict) and isinstance(setting, dict)
    if results:
        print(load_module("oxygen_bench").format_table(results) + "\n")
    print(
        f"device {document['device']} ({document['jax_backend']}, jax {document['jax']}), "
        f"preset {model['preset']} (random init, zeros perturbed, {model.get('dtype')} compute, "
        f"{model.get('num_params', 0) / 1e6:.0f}M parameters, language head "
        f"{model.get('lm_head_rows')} rows), N={setting['denoise_steps']}, "
        f"M={setting['max_tokens']}, k=5, one request per frame, {setting['frames']} frames"
    )
    seventy = document.get("seventy_hz")
    if results and isinstance(seventy, dict):
        print(summary_table(results))
        print(
            f"70 Hz question (horizon-10 chunks every {seventy['period_ms']:.1f} ms, language "
            f"running, {seventy['method']}): chunk interval p99 "
            f"{_fmt(seventy['chunk_interval_ms_p99'], '.1f')} ms -> "
            f"{'yes' if seventy['chunk_every_143ms'] else 'no'}; action path alone p99 "
            f"{_fmt(seventy['action_path_ms_p99'], '.1f')} ms -> "
            f"{'yes' if seventy['action_path_within_143ms'] else 'no'}"
        )
        if isinstance(period := seventy.get(DEADLINE_PERIOD), dict):
            print(
                f"{DEADLINE_PERIOD} (deadline scheduler, budget {seventy['period_ms']:.1f} ms): "
                f"frame p99 {period['frame_ms_p99']:.1f} ms, {period['tokens_per_s']:.0f} tok/s"
            )
    print(equality_line(document["openpi_equality"]))  # type: ignore[arg-type]
    stages = document["stages"]
    assert isinstance(stages, dict)
    print(
        "stages (wall s / XLA compiles / compile s): "
        + ", ".join(
            f"{name} {s['wall_s']:.1f}/{s['xla_compiles']:.0f}/{s['backend_compile_s']:.1f}"
            for name, s in stages.items()
        )
    )
    for trim in document["trimmed"]:  # type: ignore[attr-defined]
        print(f"trimmed {trim['what']}: {trim['requested']} -> {trim['used']} ({trim['why']})")
    if not document["complete"]:
        print(f"INCOMPLETE: {document['incomplete_reason']}")
    print(f"results: {json_path}  ({document['wall_s']:.0f} s from process start)")
    print(last_line(document), flush=True)


def plot(document: dict[str, object], png: pathlib.Path) -> bool:
    """oxygen_bench's plot of the results; False (and a line) without matplotlib."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print(f"matplotlib not importable: no {png.name} (--plot-from JSON draws it elsewhere)")
        return False
    title = f"gpu_bench, {document['device']}"
    load_module("oxygen_bench").plot(document.get("results") or [], png, title)
    return True


class Output:
    """Writes the JSON once: the final document or, first, the watchdog's."""

    def __init__(self, path: pathlib.Path) -> None:
        self.path, self.lock, self.written = path, threading.Lock(), False

    def write(self, document: dict[str, object]) -> bool:
        with self.lock:
            if not self.written:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self.path.write_text(json.dumps(document, indent=2, default=str) + "\n")
                self.written = True
                return True
            return False


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--out", type=pathlib.Path, default=None, help="JSON file to write")
    add("--force-cpu-smoke", action="store_true", help="the CPU, the tiny preset (tests)")
    add("--budget-s", type=float, default=None, help="seconds from process start to the JSON")
    add("--plot-from", type=pathlib.Path, default=None, help="only draw this JSON's PNG")
    add("--skip-equality", action="store_true", help="no openpi side of the equality")
    add("--frames", type=int, default=None, help="measured frames per method")
    add("--warmup-frames", type=int, default=None)
    add("--denoise-steps", type=int, default=10, help="N")
    add("--max-tokens", type=int, default=None, help="M (30; smoke: 8)")
    add("--component-runs", type=int, default=None)
    add("--slots", type=int, default=8, help="cache request slots")
    add("--prefixes", type=int, default=8, help="cache stored prefixes")
    add("--deadline-factor", type=float, default=1.5)
    add(
        "--vocab",
        choices=("full", "tokenizer"),
        default="full",
        help="full: a 257,152-row language head even without PaliGemma's tokenizer (pi05); "
        "tokenizer: the head cut to whatever tokenizer oxygen_bench's engine loads",
    )
    add("--no-deadline-143ms", action="store_true", help="skip the deadline run at 10/70 s")
    add("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    smoke = args.force_cpu_smoke
    defaults = {
        "frames": 2 if smoke else 100,
        "warmup_frames": 1 if smoke else 10,
        "max_tokens": 8 if smoke else 30,
        "component_runs": 1 if smoke else 10,
    }
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.plot_from is not None:
        png = (args.out or args.plot_from).with_suffix(".png")
        if plot(json.loads(args.plot_from.read_text()), png):
            print(f"plot: {png}")
        return 0
    if args.force_cpu_smoke:
        jax.config.update("jax_platforms", "cpu")
    if (backend := jax.default_backend()) == "cpu" and not args.force_cpu_smoke:
        not_run(backend, args.out)
        return 0
    import logging

    logging.basicConfig(level=logging.ERROR)
    preset = "tiny" if args.force_cpu_smoke else "pi05"
    output = Output(args.out or BENCH_DIR / "results" / f"gpu_bench_{preset}.json")
    failed = None
    with tempfile.TemporaryDirectory(prefix="gpu_bench_") as workdir:
        run = Run(args, preset, pathlib.Path(workdir))

        def stop() -> None:  # the watchdog: what ran, then exit
            document = run.document(f"the budget ({args.budget_s} s) ran out")
            if output.write(document):
                report(document, output.path)
                shutil.rmtree(workdir, ignore_errors=True)
                os._exit(0)

        if args.budget_s is not None:
            delay = args.budget_s - (time.time() - run.started) - WATCHDOG_MARGIN_S
            watchdog = threading.Timer(max(delay, 0.0), stop)
            watchdog.daemon = True
            watchdog.start()
        try:
            run()
        except Exception as error:  # what ran still goes into the JSON
            traceback.print_exc()
            stage = run.stages.running[0] if run.stages.running else "between stages"
            failed = f"{type(error).__name__} in stage {stage}: {error}"
        document = run.document(failed)
        written = output.write(document)  # the watchdog writes nothing once this is written
    if written:
        plot(document, output.path.with_suffix(".png"))
        report(document, output.path)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
