"""What a checkpoint decides at the first frame of held-out workcell episodes (engine only).

For each seed: the workcell is reset to the episode (robot at home), the three cameras are
rendered and resized as perception does, and the engine (shared_kv, greedy) runs one frame
with a subtask, a narration and a memory request. Reported per kind: the fraction of episodes
whose text equals the phase-0 target (`sim.language.targets`); and the arm choice: which arm's
joints the first chunk moves more (`evaluation.moved_arm`: summed over the rows, against home),
against the arm the task needs; `moved_rad` is each arm's largest joint move at the last row.

Usage: `python -m oxygen_ros.training.diagnostics.first_frame --seeds 20 --checkpoint DIR
[--object-state]` (after `source scripts/env.sh`). Writes benchmarks/results/first_frame.json;
last line
`first_frame subtask=<a> narration=<b> memory=<c> arm=<d> episodes=<n>`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]  # the source tree


def main(argv: list[str] | None = None) -> int:
    from oxygen_ros.engine.config import SchedulerConfig
    from oxygen_ros.engine.engine import Engine
    from oxygen_ros.engine.types import LanguageRequest
    from oxygen_ros.sim import language, robot, tasks
    from oxygen_ros.sim.workcell import Workcell, WorkcellConfig
    from oxygen_ros.training import data, evaluation, train

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=20, help="held-out seeds 0..N-1")
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/first_frame.json"))
    data.add_object_state_argument(parser)  # as the checkpoint was trained
    args = parser.parse_args(argv)
    checkpoint = args.checkpoint
    preset = data.model_preset(args.preset, args.object_state)
    engine = Engine(
        train.engine_config(checkpoint, preset=preset, scheduler=SchedulerConfig(mode="shared_kv"))
    )
    resolution = engine.config.model.image_resolution
    workcell = Workcell(WorkcellConfig())
    episodes = []
    try:
        for seed in range(args.seeds):
            spec = tasks.sample_episode(seed)
            observation = data.first_frame(workcell, spec, resolution, args.object_state)
            requests = [LanguageRequest(kind) for kind in data.LANGUAGE_KINDS]
            result = engine.step(observation, requests, noise=engine.make_noise(seed))
            said = {out.kind.value: out.text for out in result.outputs}
            chunk = result.actions.actions
            moved = np.abs(chunk[-1] - robot.HOME)
            # each arm's largest joint move at the last row (grippers left out)
            left, right = (moved[robot.arm_columns(arm)].max() for arm in robot.ARMS)
            episodes.append(
                {
                    "seed": seed,
                    "instruction": spec.instruction,
                    "arm": spec.arm,
                    "moved_arm": evaluation.moved_arm(chunk, robot.HOME),
                    "moved_rad": [float(left), float(right)],
                    "said": said,
                    "expected": language.targets(spec, 0),
                }
            )
    finally:
        workcell.close()
    summary = {
        kind: float(
            np.mean([language.same_text(e["said"][kind], e["expected"][kind]) for e in episodes])
        )
        for kind in ("subtask", "narration", "memory")
    }
    summary["arm"] = float(np.mean([e["moved_arm"] == e["arm"] for e in episodes]))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps({"checkpoint": checkpoint, "summary": summary, "episodes": episodes}, indent=1)
    )
    for e in episodes:
        print(
            f"{e['seed']:>3} {e['arm']:>5} moved {e['moved_arm']:>5}  "
            f"{e['said']['narration']!r:40} {e['instruction']}"
        )
    print(f"wrote {out}")
    print(
        f"first_frame subtask={summary['subtask']:.2f} narration={summary['narration']:.2f} "
        f"memory={summary['memory']:.2f} arm={summary['arm']:.2f} episodes={len(episodes)}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
