"""OxyGen's comparison in the paper's setting, on an accelerator: `benchmarks/gpu`.

What runs (only where JAX has a GPU or TPU backend; elsewhere one line and exit 0):
- the `pi05` preset (openpi `gemma_2b` + `gemma_300m` + SigLIP So400m/14, 3 cameras at 224 px,
  prefix 968 tokens, horizon 50), randomly initialised, parameters and compute in bfloat16
  (the preset's `param_dtype` and `dtype`);
- the full 257,152-row language head (oxygen_bench `--vocab full`: openpi's cached PaliGemma
  tokenizer when there is one, else the bundled 640-piece model padded with unused pieces to
  257,152, `full_vocab.py`), so every decode step pays the real head (`--vocab tokenizer`
  keeps the head cut to the tokenizer's vocabulary);
- oxygen_bench's own run (`benchmarks/oxygen_bench.py`, loaded by path): its `Bench` (model,
  machine peaks, component times with their roofline at each method's shapes, engines at the
  shapes a user would run each method with: isolated at batch 1), its interleaved run and
  metrics (`run_settings`, `add_speedups`: the headline speedup is wall time), for N=10
  denoise steps, M=30 tokens per request, one request per frame (`u1`) and the methods
  isolated / shared_kv / cb_k5 (continuous, k=5) / deadline (budget `--deadline-factor` x
  p90 action-only frame), plus `deadline_143ms` (deadline mode with the budget 10 / 70 s);
- "the 70 Hz question": can horizon-10 chunks come every 10 / 70 s = 142.9 ms (10 actions at
  70 Hz) with language running? Frames run back to back, so the next chunk comes one whole
  frame after the last one: the answer (`chunk_every_143ms`) is whether cb_k5's p99 frame
  time (chunk interval, language included) stays under 142.9 ms. The p99 of the action path
  alone (step start -> actions handed off, `FrameTimings.action_s`: the observation -> chunk
  latency while language runs in the same loop) is reported next to it.

Outputs: JSON (`--out FILE`, default benchmarks/results/gpu_bench_<preset>.json) naming the
device (`jax.devices()[0].device_kind`), a PNG next to it (oxygen_bench's plot), oxygen_bench's
table plus a short summary, and the last line
    gpu_bench device=<kind> action_hz=<x> tokens_per_s=<y> speedup_vs_isolated=<z>
    chunk_every_143ms=<yes|no>
(one line; spaces in the device kind become "_"), or, without an accelerator,
    no accelerator (jax backend: cpu): benchmarks/gpu not run
and, with `--out`, a JSON `{"ran": false, "reason": ...}`. `--force-cpu-smoke` runs the same
code on the CPU with the `tiny` preset and a couple of frames (tests).

Usage (repository root): benchmarks/gpu [--frames 100] [--out FILE]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pathlib
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from types import ModuleType

ROOT = pathlib.Path(__file__).resolve().parents[1]
BENCH_DIR = ROOT / "benchmarks"
# Same JAX settings as oxygen_bench (set before jax is imported, which reads them).
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(ROOT / ".build" / "jax_cache"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
sys.path.insert(0, str(ROOT))

import jax  # noqa: E402
import numpy as np  # noqa: E402

CHUNK_ACTIONS = 10  # the 70 Hz question: horizon-10 chunks ...
ACTION_RATE_HZ = 70.0  # ... executed at 70 Hz
PERIOD_S = CHUNK_ACTIONS / ACTION_RATE_HZ  # 0.142857 s between chunks
METHODS = ("isolated", "shared_kv", "cb_k5", "deadline")  # oxygen_bench method names
HEADLINE_METHOD = "cb_k5"
DEADLINE_PERIOD = "deadline_143ms"  # deadline mode, budget PERIOD_S
ARRIVAL = "u1"  # one request per frame


# ------------------------------------------------------------------------------------------
# Accelerator detection.


def nvidia_visible() -> bool:
    """An NVIDIA driver on this machine (JAX may still lack its CUDA plugin)."""
    return pathlib.Path("/proc/driver/nvidia/version").exists() or bool(shutil.which("nvidia-smi"))


def accelerator() -> tuple[str, str]:
    """(jax backend, device kind of device 0)."""
    return jax.default_backend(), jax.devices()[0].device_kind


def not_run(backend: str, out: pathlib.Path | None) -> None:
    """Prints why nothing ran (one line on stdout) and writes the JSON if asked to."""
    reason = f"no accelerator (jax backend: {backend})"
    hint = None
    if nvidia_visible():
        hint = (
            "an NVIDIA driver is present but JAX has no CUDA backend: install the plugin "
            "matching the pinned jax, e.g. .build/venv/bin/pip install 'jax[cuda12]==0.10.2'"
        )
        print(hint, file=sys.stderr)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        document = {
            "benchmark": "gpu_bench",
            "ran": False,
            "reason": reason,
            "hint": hint,
            "jax": jax.__version__,
            "jax_backend": backend,
            "devices": [str(d) for d in jax.devices()],
            "platform": platform.platform(),
        }
        out.write_text(json.dumps(document, indent=2) + "\n")
    print(f"{reason}: benchmarks/gpu not run")


# ------------------------------------------------------------------------------------------
# The run, through oxygen_bench's functions.


def load_oxygen_bench() -> ModuleType:
    """benchmarks/oxygen_bench.py as a module (benchmarks/ is no package)."""
    name = "oxygen_bench"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, BENCH_DIR / "oxygen_bench.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


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


def run(args: argparse.Namespace, preset: str, workdir: pathlib.Path) -> dict[str, object]:
    """One grid point (N, M, u1) of oxygen_bench, every method interleaved; the document."""
    from oxygen_ros.engine.model import param_count

    ob = load_oxygen_bench()
    n, m = args.denoise_steps, args.max_tokens
    vocab = "tokenizer" if preset == "tiny" else args.vocab  # the smoke keeps its small head
    ob_args = ob.parse_args(
        [
            "--preset", preset,
            "--methods", *METHODS,
            "--denoise-steps", str(n),
            "--max-tokens", str(m),
            "--arrivals", ARRIVAL,
            "--vocab", vocab,
            "--frames", str(args.frames),
            "--warmup-frames", str(args.warmup_frames),
            "--component-runs", str(args.component_runs),
            "--slots", str(args.slots),
            "--prefixes", str(args.prefixes),
            "--deadline-factor", str(args.deadline_factor),
            "--seed", str(args.seed),
        ]
    )  # fmt: skip
    bench = ob.Bench(ob_args, workdir)
    model = bench.model(n)
    model_config = model.config
    num_params = param_count(model)
    bench.log(f"{preset}: {num_params / 1e6:.0f}M parameters, {model_config.param_dtype} weights")
    tokenizer_kind = bench.tokenizer(vocab)[1]
    probe = bench.engine(ob.Setting("isolated", n, 1, ARRIVAL, vocab), 1.0, None)
    head_rows = probe.model.vocab_size
    tokenizer_path, tokenizer_vocab = str(probe.tokenizer.path), probe.tokenizer.vocab_size
    del probe
    budget_s = bench.budget(n, vocab)

    names = list(METHODS)
    settings = [ob.Setting(method, n, m, ARRIVAL, vocab) for method in METHODS]
    budgets = [budget_s] * len(settings)
    if not args.no_deadline_143ms:
        names.append(DEADLINE_PERIOD)
        settings.append(ob.Setting("deadline", n, m, ARRIVAL, vocab))
        budgets.append(PERIOD_S)
    results, runners = bench.run_settings(settings, budgets)
    for name, result, runner in zip(names, results, runners, strict=True):
        result["method"] = name
        result["label"] = ob.Setting(name, n, m, ARRIVAL, vocab).label
        result.update(period_stats(runner))
        bench.log(
            f"{result['label']}: frame p99 {result['frame_ms_p99']:.1f} ms, action path p99 "
            f"{result['action_path_ms_p99']:.1f} ms, {result['tokens_per_s']:.0f} tok/s"
        )
    ob.add_speedups(results)
    del runners
    components = bench.components_document()
    started = bench.started

    headline = next(r for r in results if r["method"] == HEADLINE_METHOD)
    period = next((r for r in results if r["method"] == DEADLINE_PERIOD), None)
    backend, device_kind = accelerator()
    return {
        "benchmark": "gpu_bench",
        "ran": True,
        "smoke": args.force_cpu_smoke,
        "device": device_kind,
        "jax_backend": backend,
        "devices": [str(d) for d in jax.devices()],
        "jax": jax.__version__,
        "platform": platform.platform(),
        "model": {
            "preset": preset,
            "random_init": True,
            "dtype": model_config.dtype,
            "param_dtype": model_config.param_dtype,
            "num_params": num_params,
            "action_horizon": model_config.action_horizon,
            "prefix_len": model_config.prefix_len,
            "lm_head_rows": head_rows if head_rows is not None else "all",
            "tokenizer": tokenizer_path,
            "tokenizer_vocab": tokenizer_vocab,
            "tokenizer_kind": tokenizer_kind,
        },
        "setting": {
            "denoise_steps": n,
            "max_tokens": m,
            "k": 5,
            "arrival": ARRIVAL,
            "frames": args.frames,
            "warmup_frames": args.warmup_frames,
            "slots": args.slots,
            "prefixes": args.prefixes,
            "deadline_factor": args.deadline_factor,
            "deadline_budget_ms": 1e3 * budget_s,
            "seed": args.seed,
        },
        "machine_peaks": bench.peaks,
        "components": components,
        "results": results,
        "headline": {
            "method": HEADLINE_METHOD,
            "action_hz": headline["action_hz"],
            "tokens_per_s": headline["tokens_per_s"],
            "speedup_vs_isolated": headline["speedup"],
            "speedup_steady_vs_isolated": headline["speedup_steady"],
            "act_speedup_vs_isolated": headline["act_speedup"],
        },
        "seventy_hz": {
            "question": "can horizon-10 chunks come every 10/70 s with language running?",
            "period_ms": 1e3 * PERIOD_S,
            "method": HEADLINE_METHOD,
            "chunk_interval_ms_p99": headline["chunk_interval_ms_p99"],
            "action_path_ms_p99": headline["action_path_ms_p99"],
            "chunk_every_143ms": headline["chunk_every_143ms"],
            "action_path_within_143ms": headline["action_path_within_143ms"],
            DEADLINE_PERIOD: None
            if period is None
            else {
                "frame_ms_p99": period["frame_ms_p99"],
                "tokens_per_s": period["tokens_per_s"],
                "p99_over_budget": period.get("p99_over_budget"),
            },
        },
        "definitions": {
            "chunk_interval_ms_p99": "p99 of whole frame times (frames run back to back: the "
            "time from one chunk to the next, language work included)",
            "action_path_ms_p99": "p99 of FrameTimings.action_s: step start -> actions handed "
            "off (observation -> chunk latency) with language running in the same loop",
            "action_hz": "action horizon / mean frame time (oxygen_bench)",
            **ob.DEFINITIONS,
        },
        "wall_s": time.perf_counter() - started,
    }


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
    headline = document["headline"]
    seventy = document["seventy_hz"]
    assert isinstance(headline, dict) and isinstance(seventy, dict)
    device = "_".join(str(document["device"]).split())
    speedup = headline["speedup_vs_isolated"]
    return (
        f"gpu_bench device={device} action_hz={headline['action_hz']:.1f} "
        f"tokens_per_s={headline['tokens_per_s']:.0f} "
        f"speedup_vs_isolated={'nan' if speedup is None else f'{speedup:.2f}'} "
        f"chunk_every_143ms={'yes' if seventy['chunk_every_143ms'] else 'no'}"
    )


def report(document: dict[str, object], ob: ModuleType, json_path: pathlib.Path) -> None:
    results = document["results"]
    model, seventy = document["model"], document["seventy_hz"]
    assert isinstance(results, list) and isinstance(model, dict) and isinstance(seventy, dict)
    print(ob.format_table(results))
    print()
    print(
        f"device {document['device']} ({document['jax_backend']}), preset {model['preset']} "
        f"(random init, {model['param_dtype']} weights, {model['dtype']} compute, "
        f"{model['num_params'] / 1e6:.0f}M parameters, language head {model['lm_head_rows']} "
        f"rows), N={document['setting']['denoise_steps']}, "  # type: ignore[index]
        f"M={document['setting']['max_tokens']}, k=5, one request per frame"  # type: ignore[index]
    )
    print(summary_table(results))
    print(
        f"70 Hz question (horizon-10 chunks every {seventy['period_ms']:.1f} ms, language "
        f"running, {seventy['method']}): chunk interval p99 "
        f"{_fmt(seventy['chunk_interval_ms_p99'], '.1f')} ms -> "
        f"{'yes' if seventy['chunk_every_143ms'] else 'no'}; action path alone p99 "
        f"{_fmt(seventy['action_path_ms_p99'], '.1f')} ms -> "
        f"{'yes' if seventy['action_path_within_143ms'] else 'no'}"
    )
    period = seventy.get(DEADLINE_PERIOD)
    if isinstance(period, dict):
        print(
            f"{DEADLINE_PERIOD} (deadline scheduler, budget {seventy['period_ms']:.1f} ms): "
            f"frame p99 {period['frame_ms_p99']:.1f} ms, {period['tokens_per_s']:.0f} tok/s"
        )
    print(f"results: {json_path}  ({document['wall_s']:.0f} s)")
    print(last_line(document))


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=pathlib.Path, default=None, help="JSON file to write")
    parser.add_argument(
        "--force-cpu-smoke",
        action="store_true",
        help="run on the CPU with the tiny preset and a couple of frames (tests)",
    )
    parser.add_argument("--frames", type=int, default=None, help="measured frames per method")
    parser.add_argument("--warmup-frames", type=int, default=None)
    parser.add_argument("--denoise-steps", type=int, default=10, help="N")
    parser.add_argument("--max-tokens", type=int, default=None, help="M (30; smoke: 8)")
    parser.add_argument("--component-runs", type=int, default=None)
    parser.add_argument("--slots", type=int, default=8, help="cache request slots")
    parser.add_argument("--prefixes", type=int, default=8, help="cache stored prefixes")
    parser.add_argument("--deadline-factor", type=float, default=1.5)
    parser.add_argument(
        "--vocab",
        choices=("full", "tokenizer"),
        default="full",
        help="full: a 257,152-row language head even without PaliGemma's tokenizer (pi05); "
        "tokenizer: the head cut to whatever tokenizer oxygen_bench's engine loads",
    )
    parser.add_argument(
        "--no-deadline-143ms", action="store_true", help="skip the deadline run at 10/70 s"
    )
    parser.add_argument("--seed", type=int, default=0)
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
    if args.force_cpu_smoke:
        jax.config.update("jax_platforms", "cpu")
    backend, _ = accelerator()
    if backend == "cpu" and not args.force_cpu_smoke:
        not_run(backend, args.out)
        return 0
    import logging

    logging.basicConfig(level=logging.ERROR)
    preset = "tiny" if args.force_cpu_smoke else "pi05"
    with tempfile.TemporaryDirectory(prefix="gpu_bench_") as workdir:
        document = run(args, preset, pathlib.Path(workdir))
    json_path = args.out or BENCH_DIR / "results" / f"gpu_bench_{preset}.json"
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(document, indent=2) + "\n")
    ob = load_oxygen_bench()
    ob.plot(document["results"], json_path.with_suffix(".png"), f"gpu_bench, {document['device']}")
    report(document, ob, json_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
