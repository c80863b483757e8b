"""Where a checkpoint departs from the reactive expert along its own closed-loop episodes.

The checkpoint drives the workcell alone (as `oxygen_ros.training.rollout` runs it, fresh noise
per frame); at every observation the reactive expert's chunk from the same state is computed
too (`training.dagger.expert_chunk`, the DAgger label) but not executed. Per frame: the stage,
whether the cube is held, the pinch point's distance to the cube, the task arm's measured
gripper, both chunks' gripper rows and the largest difference between their arm-joint rows over
the rows a frame executes; with `--object-state target`, how far (x, y) the perceived target
cube in the observation's state is from the simulator's.

Summary, over frames where the cube is not held, by the pinch point's distance from the cube
(`BANDS_M`): the frames in each band and how many of them the learner's executed rows close the
task arm's gripper in (below `CLOSED_BELOW`), and the expert's; and the median arm deviation per
stage, and the frames whose perceived target is more than 1 and 2.5 cm off. The scripted
expert's demonstrations close only within a few centimetres of the cube (and sit closed at home
before the first open), so closing further out is the learner's own. `--whole-views-only` runs
the cube tracker as it was before 2026-11-29 (the camera read from whole views only, never from
a partial one; `perception.cube_poses`), to compare what the policy sees.

Usage: `python -m oxygen_ros.training.diagnostics.learner_vs_expert --checkpoint DIR
--seeds 0:5 [--object-state target --preset P]` (after `source scripts/env.sh`);
`--checkpoint expert` runs the scripted expert's plan as the learner (the control: in the
approach band it closes no more often than the reactive expert). Writes
benchmarks/results/learner_vs_expert.json; prints one line per band, then `learner_vs_expert
frames=<n> approach_close=<learner's closing share between 4 and 15 cm>`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]  # the source tree
CLOSED_BELOW = 0.4  # normalised gripper (0 closed .. 1 open): a row below this closes
# Pinch point to cube centre, m: the grasp stage begins at 0.025 (tasks.NEAR_M); 0.04-0.15 is
# the approach, where a closing gripper cannot catch the cube.
BANDS_M = ((0.0, 0.025), (0.025, 0.04), (0.04, 0.08), (0.08, 0.15), (0.15, 0.25), (0.25, 9.0))
APPROACH_M = (0.04, 0.15)


@dataclasses.dataclass
class Frame:
    seed: int
    t: float  # s since the episode began
    stage: str
    held: bool
    pinch_m: float
    gripper: float  # the task arm's measured gripper
    expert_gripper: list[float]  # per chunk row
    learner_gripper: list[float]
    arm_deviation_rad: float  # largest |expert - learner| over executed rows and arm joints
    target_error_m: float = float("nan")  # perceived target cube (x, y) to the true one


def closes(rows: Sequence[float], executed: int) -> bool:
    """Whether any of the first `executed` gripper rows closes the gripper."""
    return min(rows[:executed]) < CLOSED_BELOW


def summarise(frames: Sequence[Frame], executed: int) -> dict:
    """Closing by distance band over the frames with the cube not held (module docstring)."""
    free = [f for f in frames if not f.held]

    def band(lo: float, hi: float) -> dict:
        inside = [f for f in free if lo <= f.pinch_m < hi]
        return {
            "from_m": lo,
            "to_m": hi,
            "frames": len(inside),
            "learner_closes": sum(closes(f.learner_gripper, executed) for f in inside),
            "expert_closes": sum(closes(f.expert_gripper, executed) for f in inside),
            "target_off_1cm": sum(f.target_error_m > 0.01 for f in inside),
            "target_off_2.5cm": sum(f.target_error_m > 0.025 for f in inside),
        }

    lo, hi = APPROACH_M
    approach = band(lo, hi)
    stages = sorted({f.stage for f in frames})
    return {
        "frames": len(frames),
        "frames_not_held": len(free),
        "bands": [band(lo, hi) for lo, hi in BANDS_M],
        "approach_close": approach["learner_closes"] / approach["frames"]
        if approach["frames"]
        else float("nan"),
        "approach_expert_close": approach["expert_closes"] / approach["frames"]
        if approach["frames"]
        else float("nan"),
        "arm_deviation_rad_median": {
            s: float(np.median([f.arm_deviation_rad for f in frames if f.stage == s]))
            for s in stages
        },
    }


def main(argv: list[str] | None = None) -> int:
    from oxygen_ros.perception import workcell_cubes
    from oxygen_ros.sim import robot, tasks
    from oxygen_ros.sim.workcell import Workcell, WorkcellConfig
    from oxygen_ros.training import dagger, data, rollout

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--seeds", default="0:5", help='"first:stop" or "a,b,c"')
    parser.add_argument("--execute-s", type=float, default=0.2)
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/learner_vs_expert.json"))
    parser.add_argument("--whole-views-only", action="store_true")
    data.add_object_state_argument(parser)  # as the checkpoint was trained
    args = parser.parse_args(argv)
    config = rollout.RolloutConfig(
        execute_s=args.execute_s,
        object_state=args.object_state,
        preset=args.preset,
        speak=False,
        follow_partial_views=not args.whole_views_only,
    )
    learner, config = rollout.make_policy(args.checkpoint, config)
    workcell = Workcell(WorkcellConfig())
    expert = dagger.make_labeller("reactive", workcell)
    executed = rollout.executed_rows(args.execute_s, config.action_dt_s)
    frames: list[Frame] = []
    results = []

    class Watched:
        """The learner, with the expert's chunk from each state it acts in."""

        def reset(self, cell: Workcell, spec: tasks.EpisodeSpec) -> None:
            learner.reset(cell, spec)
            expert.reset(cell, spec)
            self.spec, self.start = spec, cell.time

        def act(self, cell: Workcell, observation):
            expert_rows, _ = dagger.expert_chunk(cell, expert)
            rows, said = learner.act(cell, observation)
            evaluation = tasks.evaluate(cell, self.spec)
            joints = robot.arm_columns(self.spec.arm)
            grip = robot.gripper_index(self.spec.arm)
            error = float("nan")
            # the target states' target.x, target.y follow the joints
            if args.object_state in workcell_cubes.TARGET_KINDS:
                true = cell.object_pose(self.spec.target).position[:2]
                seen = np.asarray(observation.state[robot.NUM_JOINTS : robot.NUM_JOINTS + 2])
                error = float(np.linalg.norm(seen - true))
            frames.append(
                Frame(
                    seed=self.spec.seed,
                    t=round(observation.stamp - self.start, 3),
                    stage=evaluation.stage,
                    held=bool(evaluation.held),
                    pinch_m=float(evaluation.pinch_distance_m),
                    gripper=float(cell.joint_positions()[grip]),
                    expert_gripper=[round(float(v), 3) for v in expert_rows[:, grip]],
                    learner_gripper=[round(float(v), 3) for v in rows[:, grip]],
                    arm_deviation_rad=float(
                        np.abs(expert_rows[:executed, joints] - rows[:executed, joints]).max()
                    ),
                    target_error_m=error,
                )
            )
            return rows, said

    watched = Watched()
    try:
        for seed in rollout.parse_seeds(args.seeds):
            result = rollout.run_episode(watched, workcell, seed, config)
            results.append(dataclasses.asdict(result))
            print(rollout.episode_line(seed, result), flush=True)
    finally:
        workcell.close()
    summary = summarise(frames, executed)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "checkpoint": args.checkpoint,
                "whole_views_only": args.whole_views_only,
                "execute_s": args.execute_s,
                "executed_rows": executed,
                "closed_below": CLOSED_BELOW,
                "summary": summary,
                "episodes": results,
                "frames": [dataclasses.asdict(f) for f in frames],
            },
            indent=1,
        )
    )
    for b in summary["bands"]:
        print(
            f"{b['from_m']:.3f}-{b['to_m']:.3f} m: frames {b['frames']:4} learner closes "
            f"{b['learner_closes']:4} expert closes {b['expert_closes']:4} target off 1 cm "
            f"{b['target_off_1cm']:4} 2.5 cm {b['target_off_2.5cm']:4}"
        )
    print(
        f"learner_vs_expert frames={summary['frames']} "
        f"approach_close={summary['approach_close']:.3f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
