"""gpu_bench's report: the device and versions, the JSON document, the printed summary.

`environment()` names the device, JAX, jaxlib and their plugins; `run_document` is what a
`Run` ran so far (the final JSON, or the watchdog's); `report` prints oxygen_bench's table,
gpu_bench's summary and the last line (`last_line`); `plot` draws oxygen_bench's plot where
matplotlib imports; `Output` writes the JSON once. `load_module` loads a benchmarks/ module
beside this file by path (benchmarks/ is no package).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import os
import pathlib
import platform
import sys
import threading
import time
from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING

import jax
from gpu_bench_budget import ARRIVAL, DEADLINE_PERIOD, HEADLINE_METHOD, PERIOD_S

if TYPE_CHECKING:
    from gpu_bench_run import Run

BENCH_DIR = pathlib.Path(__file__).resolve().parent


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


def run_document(run: Run, incomplete: str | None = None) -> dict[str, object]:
    """What `run` ran so far: the final JSON, or the watchdog's (`incomplete`: why not all)."""
    incomplete, bench, args = incomplete or run.incomplete, run.bench, run.args
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
        "openpi_equal": (run.equality or {}).get("openpi_equal"),
        "openpi_equality": run.equality,
        "model": run.info,
        "setting": {
            "denoise_steps": args.denoise_steps,
            "max_tokens": args.max_tokens,
            "k": 5,
            "arrival": ARRIVAL,
            "frames_requested": args.frames,
            "min_frames": run.min_frames,
            "warmup_frames": args.warmup_frames,
            "slots": args.slots,
            "prefixes": args.prefixes,
            "deadline_factor": args.deadline_factor,
            "seed": args.seed,
            **run.setting,
        },
        "budget": {"budget_s": args.budget_s, "from": "process start"},
        "trimmed": run.budget.trimmed,
        "stages": run.stages.document(),
        "machine_peaks": getattr(bench, "peaks", None),
        "components": components,
        "results": run.results,
        "headline": None,
        "seventy_hz": None,
    }
    headline = next((r for r in run.results if r["method"] == HEADLINE_METHOD), None)
    if headline is not None:
        keys = ("action_hz", "tokens_per_s", "speedup", "speedup_steady", "act_speedup")
        document["headline"] = {
            "method": HEADLINE_METHOD,
            **{k if k in keys[:2] else f"{k}_vs_isolated": headline[k] for k in keys},
        }
        period = next((r for r in run.results if r["method"] == DEADLINE_PERIOD), None)
        keys = ("chunk_interval_ms_p99", "action_path_ms_p99", "chunk_every_143ms")
        document["seventy_hz"] = {
            "question": "can horizon-10 chunks come every 10/70 s with language running?",
            "period_ms": 1e3 * PERIOD_S,
            "method": HEADLINE_METHOD,
            **{k: headline[k] for k in (*keys, "action_path_within_143ms")},
            DEADLINE_PERIOD: period
            and {k: period.get(k) for k in ("frame_ms_p99", "tokens_per_s", "p99_over_budget")},
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
        **run.metrics.DEFINITIONS,
    }
    document["wall_s"] = time.time() - run.started
    return document


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
        print(load_module("oxygen_bench_report").format_table(results) + "\n")
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
    load_module("oxygen_bench_report").plot(document.get("results") or [], png, title)
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
