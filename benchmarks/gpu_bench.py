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

Runs in a repository or beside its pieces (`gpu_bench_budget.py`: the setting, stage times
and the budget's rules; `gpu_bench_run.py`: the run; `gpu_bench_report.py`: the JSON, the
printed summary, the plot), oxygen_bench.py with its pieces (`oxygen_bench_*.py`),
openpi_equality.py, roofline.py and full_vocab.py, with the engine installed. JAX's
compilation cache: $JAX_COMPILATION_CACHE_DIR, else .build/jax_cache in a repository, else
under the temp dir.

Usage (repository root): benchmarks/gpu [--frames 100] [--budget-s 420] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Sequence

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
sys.path.insert(0, str(BENCH_DIR))  # its pieces (benchmarks/ is no package; run with -P)

import jax  # noqa: E402
from gpu_bench_budget import WATCHDOG_MARGIN_S  # noqa: E402
from gpu_bench_report import Output, environment, plot, report  # noqa: E402
from gpu_bench_run import Run  # noqa: E402


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


def process_start() -> float:
    """Epoch seconds this process started (psutil; else when this module loaded)."""
    try:
        import psutil

        return min(float(psutil.Process().create_time()), MODULE_LOADED)
    except Exception:  # any failure: the module's load time is the floor
        return MODULE_LOADED


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
        run = Run(args, preset, pathlib.Path(workdir), process_start())

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
