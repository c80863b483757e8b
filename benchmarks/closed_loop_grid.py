"""The trained model in closed loop for every scheduler mode, slowed and in real time.

Runs `closed_loop.py --policy model` once per (scheduler, real-time factor) on the same
held-out seeds, each in its own process (a fresh graph per setting), then writes one summary:
JSON (every setting's summary), a table, and a PNG (success rate, subtask accuracy and frame
time per setting). Settings: isolated, shared_kv, continuous (fixed k), deadline x the factors
given (default 0.5 = slowed, 1.0 = real time).

Usage: `benchmarks/closed_loop_grid --episodes 10 --seed-start 0 --factors 0.5 1.0
[--ros-arg node:param:=value ...] [--out PATH]`: every `--ros-arg` goes to each run (another
checkpoint, its presets and state names); each setting's JSON is written next to PATH as
`<PATH's stem>_rtf<factor>_<scheduler>.json`.
Last line: `grid success_rate_min=<x> subtask_accuracy_min=<y> settings=<n>`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
SCHEDULERS = ("isolated", "shared_kv", "continuous", "deadline")
KEYS = (
    "success_rate", "subtask_accuracy", "narration_accuracy", "memory_accuracy",
    "time_to_success_s_mean", "realtime_factor_mean", "frame_time_s_p50", "frame_time_s_p90",
    "tokens_per_s_mean", "starvation_events_total", "jerk_mean", "subtasks_spoken",
)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=10)
    parser.add_argument("--seed-start", type=int, default=0)
    parser.add_argument("--factors", type=float, nargs="+", default=[0.5, 1.0])
    parser.add_argument("--schedulers", nargs="+", default=list(SCHEDULERS))
    parser.add_argument("--out", default=str(RESULTS / "closed_loop_model_grid.json"))
    parser.add_argument(
        "--ros-arg",
        action="append",
        default=[],
        help="node:param:=value, passed to every closed_loop run (repeatable)",
    )
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    settings = []
    started = time.monotonic()
    for factor in args.factors:
        for scheduler in args.schedulers:
            path = out.parent / f"{out.stem}_rtf{factor:g}_{scheduler}.json"
            command = [
                sys.executable, "-P", str(ROOT / "benchmarks" / "closed_loop.py"),
                "--policy", "model", "--episodes", str(args.episodes),
                "--seed-start", str(args.seed_start), "--real-time-factor", str(factor),
                "--scheduler", scheduler, "--out", str(path),
            ]  # fmt: skip
            for ros_arg in args.ros_arg:
                command += ["--ros-arg", ros_arg]
            print(f"[grid] {scheduler} at real-time factor {factor:g}", file=sys.stderr)
            done = subprocess.run(command, check=False, capture_output=True, text=True)
            if done.returncode != 0:
                print(done.stdout[-2000:] + done.stderr[-2000:], file=sys.stderr)
                return 1
            summary = json.loads(path.read_text())["summary"]
            settings.append(
                {"scheduler": scheduler, "real_time_factor": factor, "json": path.name}
                | {k: summary.get(k, float("nan")) for k in KEYS}
            )
            print(done.stdout.strip().splitlines()[-1], file=sys.stderr)
    result = {
        "benchmark": "closed_loop_grid",
        "episodes": args.episodes,
        "seed_start": args.seed_start,
        "ros_args": args.ros_arg,
        "wall_s": time.monotonic() - started,
        "settings": settings,
    }
    out.write_text(json.dumps(result, indent=2, default=float))
    plot(settings, out.with_suffix(".png"))
    print(
        f"{'scheduler':>10} {'rtf':>4} {'success':>7} {'subtask':>7} {'narr':>5} {'mem':>5} "
        f"{'frame p50':>9} {'p90':>6} {'tok/s':>6}"
    )
    for s in settings:
        print(
            f"{s['scheduler']:>10} {s['real_time_factor']:4.2f} {s['success_rate']:7.2f} "
            f"{s['subtask_accuracy']:7.2f} {s['narration_accuracy']:5.2f} "
            f"{s['memory_accuracy']:5.2f} {1e3 * s['frame_time_s_p50']:7.1f}ms "
            f"{1e3 * s['frame_time_s_p90']:4.1f}ms {s['tokens_per_s_mean']:6.0f}"
        )
    print(f"wrote {out} and {out.with_suffix('.png')}")
    print(
        f"grid success_rate_min={min(s['success_rate'] for s in settings):.2f} "
        f"subtask_accuracy_min={min(s['subtask_accuracy'] for s in settings):.2f} "
        f"settings={len(settings)}"
    )
    return 0


def plot(settings: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{s['scheduler']}\nrtf {s['real_time_factor']:g}" for s in settings]
    x = np.arange(len(settings))
    fig, axes = plt.subplots(1, 2, figsize=(14, 4))
    width = 0.2
    for i, key in enumerate(("success_rate", "subtask_accuracy", "narration_accuracy",
                             "memory_accuracy")):  # fmt: skip
        axes[0].bar(x + (i - 1.5) * width, [s[key] for s in settings], width, label=key)
    axes[0].set_xticks(x, labels, fontsize=8)
    axes[0].set_ylim(0, 1.05)
    axes[0].legend(fontsize=8)
    axes[0].set_title("held-out closed loop")
    axes[1].bar(x - 0.15, [1e3 * s["frame_time_s_p50"] for s in settings], 0.3, label="p50")
    axes[1].bar(x + 0.15, [1e3 * s["frame_time_s_p90"] for s in settings], 0.3, label="p90")
    axes[1].set_xticks(x, labels, fontsize=8)
    axes[1].set_ylabel("engine frame time (ms)")
    axes[1].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
