"""Closed-loop evaluation in the simulated workcell, through the whole ROS graph.

Starts the workcell graph (`profile:=workcell use_sim:=true policy:=<policy>`: the MuJoCo sim
node, and the scripted expert or perception + inference), then runs N seeded episodes: episode i
is reset with seed S+i through the sim's ResetEpisode service and ends when its EpisodeStatus
leaves RUNNING (success decided from the simulator state, or the time limit). Measured here,
from what the graph publishes:
- success rate and time to success (simulated seconds);
- the real-time factor achieved (simulated seconds per wall second over each episode);
- action-row starvation events (the sim ran out of, or outlived, the rows it was given);
- smoothness: joint jerk from the published joint states (third finite difference over the
  sim-time stamps, arm joints, rad/s^3: mean of |jerk| and its max), and the jump at chunk
  boundaries (a new chunk's first row against the previous chunk at the same time, max over
  joints);
- the idle arm's start: the largest move of the arm the task does not use (joints, grippers
  left out) in the first `START_WINDOW_S` after the reset (the start-of-episode pull towards
  the last episode's pose showed here);
- with `--policy model`: language accuracy. Each finished subtask and narration request (final
  SpeechToken) and each memory entry is compared with what the phase the simulator state was
  in at the observation it was started from calls for (`sim.language.targets`: the stage label
  itself, "step i of n with the <arm> arm" with i and n as digits or words,
  `sim.language.same_text`, the fact the episode's events established), the
  stage looked up in the sim's EpisodeStatus history at that observation stamp;
- with `--policy model`: the inference node's frame time and token rate from its diagnostics
  (what separates the scheduler modes; `--scheduler` picks one).

Writes JSON + a PNG strip of camera frames from the first episode to benchmarks/results/ and
prints a table; the last line is `success_rate=<x> episodes=<n> realtime_factor=<r>`
(plus ` subtask_accuracy=<y> narration_accuracy=<z> memory_accuracy=<w>` when the policy
speaks).

The pieces, beside this file: `closed_loop_evaluator.py` (the graph, the measuring node, one
episode's record, `--record-frames`) and `closed_loop_metrics.py` (per-episode measures,
language scoring, the summary); this file parses the arguments, runs the episodes and reports.

Usage: `benchmarks/closed_loop --policy expert --episodes 50 --seed-start 0
--real-time-factor 1.0` (the wrapper sets everything up first).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its pieces (run with python -P)

from closed_loop_evaluator import SCHEDULERS, Evaluator
from closed_loop_metrics import EpisodeRecord, inference_figures, summarise

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--policy", choices=("expert", "model"), default="expert")
    parser.add_argument("--episodes", type=int, default=10)
    parser.add_argument("--seed-start", type=int, default=0, help="episode i uses seed S+i")
    parser.add_argument("--real-time-factor", type=float, default=1.0)
    parser.add_argument("--instruction", default="", help="fixed instruction ('' = by seed)")
    parser.add_argument("--params-file", default="", help="YAML (default config/workcell.yaml)")
    parser.add_argument(
        "--ros-arg",
        action="append",
        default=[],
        metavar="NODE:PARAM:=VALUE",
        help="extra parameter override, for example inference:scheduler_mode:=isolated",
    )
    parser.add_argument(
        "--scheduler",
        choices=("", *SCHEDULERS),
        default="",
        help="inference scheduler: isolated, shared_kv, continuous (fixed k) or deadline "
        "(continuous with the deadline policy); '' keeps the YAML's",
    )
    parser.add_argument("--out", default="", help="JSON path (default benchmarks/results/...)")
    parser.add_argument("--log-dir", default="", help="node logs (default: a temporary dir)")
    parser.add_argument(
        "--record-frames",
        default="",
        metavar="DIR",
        help="save each episode's observation frames as perception published them (stamps, "
        "state names and values, model images) and what the model said, to DIR/seed_<S>.npz: "
        "to compare with what training's data.observe builds",
    )
    return parser.parse_args(argv)


def print_table(records: list[EpisodeRecord], summary: dict[str, float]) -> None:
    header = (
        f"{'seed':>6} {'ok':>3} {'t_succ':>7} {'rtf':>5} {'starve':>6} {'jerk':>8} "
        f"{'jump':>6} {'chunks':>6} {'furthest':>9}  instruction"
    )
    print(header)
    for r in records:
        print(
            f"{r.seed:>6} {'yes' if r.success else 'no':>3} {r.time_to_success_s:7.2f} "
            f"{r.realtime_factor:5.2f} {r.starvation_events:>6} {r.jerk_mean:8.1f} "
            f"{r.chunk_jump_mean:6.3f} {r.chunks:>6} {r.furthest_stage_label.split(' ')[0]:>9}  "
            f"{r.instruction}"
        )
    print(
        f"success {summary['success_rate']:.2%} of {summary['episodes']}, time to success "
        f"{summary['time_to_success_s_mean']:.2f} s, real-time factor "
        f"{summary['realtime_factor_mean']:.2f}, starvation events "
        f"{summary['starvation_events_total']}, jerk mean {summary['jerk_mean']:.1f} "
        f"max {summary['jerk_max']:.1f} rad/s^3, chunk jump mean {summary['chunk_jump_mean']:.4f}"
        f" max {summary['chunk_jump_max']:.4f} rad"
    )
    if summary.get("subtasks_spoken") or summary.get("memories_written"):
        print(
            f"language: subtask {summary['subtask_accuracy']:.2%} of "
            f"{summary['subtasks_spoken']}, narration {summary['narration_accuracy']:.2%} of "
            f"{summary['narrations_spoken']}, memory {summary['memory_accuracy']:.2%} of "
            f"{summary['memories_written']}; frame time p50 "
            f"{1e3 * summary.get('frame_time_s_p50', float('nan')):.0f} ms, p90 "
            f"{1e3 * summary.get('frame_time_s_p90', float('nan')):.0f} ms, "
            f"{summary.get('tokens_per_s_mean', float('nan')):.0f} tokens/s"
        )
        for r in records[:3]:
            for line in r.spoken_examples[:4]:
                print(f"  seed {r.seed} {line}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    RESULTS.mkdir(parents=True, exist_ok=True)
    tag = f"closed_loop_{args.policy}_rtf{args.real_time_factor:g}"
    if args.scheduler:
        tag += f"_{args.scheduler}"
    out = Path(args.out) if args.out else RESULTS / f"{tag}.json"
    log_dir = Path(args.log_dir or tempfile.mkdtemp(prefix="oxygen_closed_loop_"))
    log_dir.mkdir(parents=True, exist_ok=True)
    evaluator = Evaluator(args, log_dir)
    records: list[EpisodeRecord] = []
    strip_path = out.with_suffix(".png")
    started = time.monotonic()
    try:
        evaluator.wait_ready()
        with evaluator.lock:
            evaluator.diagnostics.clear()  # frame times of the episodes, not of the warm-up
        for i in range(args.episodes):
            record = evaluator.run_episode(args.seed_start + i, capture=(i == 0))
            if i == 0 and not evaluator.strip(strip_path, evaluator.last_reset_s):
                strip_path = None
            records.append(record)
            print(
                f"[closed_loop] episode {i + 1}/{args.episodes} seed {record.seed}: "
                f"{'success' if record.success else 'FAILED'} ({record.instruction})",
                file=sys.stderr,
                flush=True,
            )
    finally:
        evaluator.close()
    summary = summarise(records)
    summary.update(inference_figures(evaluator.diagnostics))
    result = {
        "benchmark": "closed_loop",
        "policy": args.policy,
        "scheduler": args.scheduler or "yaml",
        "real_time_factor_requested": args.real_time_factor,
        "seed_start": args.seed_start,
        "ros_args": args.ros_arg,
        "params_file": str(evaluator.params_file),
        "machine": {"platform": platform.platform(), "python": platform.python_version()},
        "wall_s": time.monotonic() - started,
        "summary": summary,
        "episodes": [dataclasses.asdict(r) for r in records],
        "strip_png": str(strip_path) if strip_path else "",
        "definitions": {
            "jerk": "|d3q/dt3| of the published arm joint positions, finite differences over "
            "their sim-time stamps (rad/s^3)",
            "chunk_jump": "max over joints of |first row of a new chunk - previous chunk at that "
            "time| (rad or gripper units)",
            "realtime_factor": "simulated seconds / wall seconds per episode",
            "starvation_events": "the sim's count of command rows running out or expiring "
            "while an episode ran",
            "subtask_accuracy": "finished subtask requests whose text equals the stage label "
            "of the sim state at the request's observation stamp, over all such requests",
            "narration_accuracy": "the same for narration ('step i of n with the <arm> arm')",
            "memory_accuracy": "memory entries whose text equals sim.language.memory_text of "
            "the stage at the entry's observation stamp",
            "frame_time_s": "the inference node's last engine frame time, sampled from its "
            "diagnostics during the episodes (p50, p90)",
        },
    }
    out.write_text(json.dumps(result, indent=2, default=float))
    print_table(records, summary)
    print(f"wrote {out}" + (f" and {strip_path}" if strip_path else ""))
    line = (
        f"success_rate={summary['success_rate']:.2f} episodes={summary['episodes']} "
        f"realtime_factor={summary['realtime_factor_mean']:.2f}"
    )
    if args.policy == "model":
        line += (
            f" subtask_accuracy={summary['subtask_accuracy']:.2f}"
            f" narration_accuracy={summary['narration_accuracy']:.2f}"
            f" memory_accuracy={summary['memory_accuracy']:.2f}"
        )
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
