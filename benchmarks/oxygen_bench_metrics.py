"""oxygen_bench's metrics: one setting's figures from its runner's frames, and the speedups.

`summarize` reads the `FrameRecord`s and tracked requests of one `Runner` (frame time
percentiles, action rate, token rate, latency, the component-time bound, the steady state:
`steady_state_s` with its token balance); `add_speedups` sets the ratios against `isolated`
at the same N, M, arrivals and head. `DEFINITIONS` (written into the JSON) says what each
figure means; oxygen_bench.py's docstring says it at length.
"""

from __future__ import annotations

import collections
import dataclasses
import statistics
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from oxygen_bench_protocol import FrameRecord, Runner, Setting


COMPLETED = ("FINISHED_STOPPED", "FINISHED_LENGTH")  # statuses counted in latency

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
