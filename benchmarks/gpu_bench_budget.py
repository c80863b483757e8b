"""gpu_bench's setting, its stages' wall and compile seconds, and the `--budget-s` rules.

The constants of the one grid point gpu_bench runs; `Stages` (wall seconds per stage from
process start and JAX's compile events in each); `Budget` (seconds left, what was trimmed);
and the trimming rules: `rest_estimate` (what the stages after the equality need at the
least), `method_costs` (each method's cost from its warm-up frames) and `choose_frames` (the
measured frames that fit, then without the deadline_143ms run).
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Iterator, Sequence

import jax
import numpy as np

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
