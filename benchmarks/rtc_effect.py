"""How far real-time chunking pulls a checkpoint's chunk onto the previous one (not collected
by pytest).

For each seed: the workcell is reset to the seed's layout, the engine (with `rtc` on) serves
the first frame at stamp 0 and the same observation again one row later, so the second chunk's
rows 0.. cover the first chunk's rows 1.. in time. Reported per guidance cap beta: the largest
joint difference between the two over the frozen row(s) and over the first five rows, and the
denoise time. beta = 0 is the plain denoise (fresh noise only). A large gap that shrinks with
beta means the guidance works on this model; a gap that stays means the model's denoised
estimate hardly depends on the noisy sample there (its vector-Jacobian product is small), so
the guidance has little to act on.

Usage: `python benchmarks/rtc_effect.py --checkpoint models/workcell_run7 --preset
workcell_objects --seeds 0:5 [--out FILE]` (the workcell_objects preset adds the cube state; run
7 is in git history, models/README.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import logging
import pathlib
import statistics

import numpy as np

from oxygen_ros.engine.config import RtcConfig, get_model_config
from oxygen_ros.engine.engine import Engine
from oxygen_ros.sim import tasks
from oxygen_ros.sim.workcell import Workcell, WorkcellConfig
from oxygen_ros.training import data
from oxygen_ros.training.rollout import parse_seeds
from oxygen_ros.training.train import engine_config

ROW_DT_S = 0.1  # config/workcell.yaml's action_dt_s
LATENCY_S = 0.03  # hand-off latency the clock reports: one frozen row


def measure(checkpoint: str, preset: str, seeds: list[int], betas: list[float]) -> dict:
    resolution = get_model_config(preset).image_resolution
    cell = Workcell(WorkcellConfig())
    rows: dict[float, dict[str, list[float]]] = {b: {"frozen": [], "first5": []} for b in betas}
    denoise_s: dict[float, list[float]] = {b: [] for b in betas}
    try:
        for seed in seeds:
            spec = tasks.sample_episode(seed)
            observation = data.first_frame(
                cell, spec, resolution, object_state=data.object_state_of(preset)
            )
            for beta in betas:
                clock = itertools.count()
                rtc = RtcConfig(enabled=True, row_dt_s=ROW_DT_S, max_guidance=beta)
                engine = Engine(
                    engine_config(checkpoint, preset=preset, rtc=rtc),
                    clock=lambda clock=clock: next(clock) * ROW_DT_S + LATENCY_S,
                )
                first = engine.step(dataclasses.replace(observation, stamp=0.0))
                plan = engine.chunk_guide.plan(ROW_DT_S, observation.state)
                second = engine.step(dataclasses.replace(observation, stamp=ROW_DT_S))
                a, b = first.actions.actions, second.actions.actions
                gap = np.abs(b[: len(b) - 1] - a[1:]).max(axis=1)
                rows[beta]["frozen"].append(float(gap[: plan.frozen_rows].max()))
                rows[beta]["first5"].append(float(gap[:5].max()))
                denoise_s[beta].append(second.timings.denoise_s)
    finally:
        cell.close()
    return {
        "checkpoint": checkpoint,
        "preset": preset,
        "seeds": seeds,
        "row_dt_s": ROW_DT_S,
        "frozen_rows": 1,
        "per_beta": {
            str(beta): {
                "frozen_gap_rad_median": statistics.median(rows[beta]["frozen"]),
                "first5_gap_rad_median": statistics.median(rows[beta]["first5"]),
                "denoise_ms_median": 1e3 * statistics.median(denoise_s[beta]),
            }
            for beta in betas
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--preset", default="workcell_objects")
    parser.add_argument("--seeds", default="0:5", help="a:b (b excluded) or a,b,c")
    parser.add_argument("--betas", default="0,5,50")
    parser.add_argument("--out", type=pathlib.Path, default=None)
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    betas = [float(b) for b in args.betas.split(",")]
    result = measure(args.checkpoint, args.preset, parse_seeds(args.seeds), betas)
    print(f"{'beta':>6} {'frozen gap [rad]':>17} {'rows 0-4 gap [rad]':>19} {'denoise [ms]':>13}")
    for beta, row in result["per_beta"].items():
        print(
            f"{float(beta):6g} {row['frozen_gap_rad_median']:17.4f} "
            f"{row['first5_gap_rad_median']:19.4f} {row['denoise_ms_median']:13.1f}"
        )
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"json: {args.out}")


if __name__ == "__main__":
    main()
