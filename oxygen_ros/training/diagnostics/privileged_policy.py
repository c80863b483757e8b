"""Diagnostic: does behaviour cloning of the reactive expert act closed-loop when the learner
sees what the expert's control law reads (physics only, no cameras)?

Run 15's state MLP (`state_policy`, docs/TRAINING.md) succeeds in about one
episode in four. Its state is what the perception node gives: the joints and the cube
detector's tracked (x, y), which jump by 1-2 cm while the fingers cover the cube. The reactive
expert's command (`sim/reactive_expert.py`) reads more: the named cube's true position
including its height, its yaw (the wrist turns with it) and, for move, the goal. This diagnostic
gives the same MLP those quantities from the simulator's true state, one block at a time, so
what the learner lacks can be told apart from what the regression cannot fit.

Inputs, per observation (every 0.1 s of simulated time):
- always: the 14 measured joints, the named cube's true (x, y), the instruction's words
  (`state_policy.instruction_features`), and per arm the named cube minus the pinch point
  (forward kinematics of the measured joints): (dx, dy, pinch height) as `state_policy
  --pinch`, or with block `pinch3` the 3-D difference;
- `z`: the cube centre's height (lifted or not);
- `yaw`: (sin 4 yaw, cos 4 yaw) of the cube's current yaw (a cube looks the same every 90
  degrees);
- `goal`: for move, the goal minus the cube's (x, y); (0, 0) for the picks;
- `start`: the cube's (x, y) at the episode's start minus its current (what a tracker keeping
  each cube's first position gives; with the direction word it fixes the goal).

Demonstrations: the reactive expert drives the arms at the control rate (50 Hz) with the
cameras off, exactly as `generate_demos --expert reactive` does, and each observation's target
is the chunk of its next `horizon` commands at 10 Hz (the last repeated past the end). The MLP
(`state_policy.train`: 3 x 512, 5000 steps of batch 256) regresses them with the arm joints
relative to the state and the grippers absolute (openpi's delta mask), normalised. Evaluation:
the MLP alone on held-out seeds (`--seeds`), each chunk executed for 0.1 s as
`training.rollout` executes it (linear between rows), success by `tasks.SuccessTracker`.
DAgger (`--dagger-rounds R`): after each fit the MLP (with the expert's chunk instead at
`--beta` of the frames) runs `--dagger-episodes` episodes from seed 5000 on, every observation
is labelled with the reactive expert's chunk from that state (`training.dagger.expert_chunk`),
the rows join the training set and the MLP is fit again from scratch.

`--perception tracked|whole|inhand|inhand_whole` takes the cube's blocks from the top camera
instead (`Perception`: the perception node's tracker and the detector's yaw;
`perception.cube_poses` from whole views only; or as served, and while a gripper holds the
cube the pinch point; or that from whole views only), for the demonstrations and the
evaluation alike; `z` only with `inhand`/`inhand_whole` (the pinch point's height while
held, the table plane's otherwise: a top camera does not measure height).

Towards the VLA (run 45): `--batch-size 16 --steps 4618` gives the MLP the VLA's sample budget;
`--prompt-bins` reduces every input to what the pi0.5 prompt keeps of it (its 256 quantile
bins); `--flow-steps N` fits the MLP as a flow-matching velocity field sampled in N Euler steps
(`--flow-draws K` (noise, time) pairs per sample, `--noise-scale` on the starting noise), as
the VLA's action expert is trained and sampled; `--heldout first:stop` keeps demonstrations out
of the fit and reports the action error on them. `--gripper-scale F` (run 46) multiplies the
grippers' normalised targets by F: their share of the loss, and for the flow their size against
the noise. `--execute-s` executes each evaluated chunk that long before the next
observation (0.1 s by default; the VLA's rollouts use 0.2 s).

`python -m oxygen_ros.training.diagnostics.privileged_policy --blocks z,yaw,goal,pinch3
--demos 1000:2000 --seeds 0:40 [--perception whole] [--dagger-rounds 3] [--cache F.npz]
--out results.json` from the repository root (2 worker processes by default). The cache
keeps every block of the demonstrations (true or perceived: one cache per `--perception`), so
runs with other `--blocks` reuse it. Results: docs/TRAINING.md runs 16 and 17. Nothing here
imports rclpy.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from oxygen_ros.perception import workcell_cubes
from oxygen_ros.perception.cube_poses import CubePoses
from oxygen_ros.sim import robot, tasks
from oxygen_ros.sim.generate_demos import CONTROL_HZ, FPS
from oxygen_ros.sim.reactive_expert import ReactiveExpert
from oxygen_ros.sim.workcell import Workcell, WorkcellConfig
from oxygen_ros.training import dagger, data
from oxygen_ros.training.diagnostics import state_policy
from oxygen_ros.training.diagnostics.mlp_policy import HORIZON, Policy, action_error, fit
from oxygen_ros.training.rollout import chunk_target

# name -> width, in the order the features are laid out; "base" is always in
BLOCK_WIDTHS = {
    "base": robot.NUM_JOINTS + 2 + len(state_policy.instruction_features("pick up the red cube")),
    "z": 1,
    "yaw": 2,
    "goal": 2,
    "start": 2,
    "pinch2": 3 * len(robot.ARMS),
    "pinch3": 3 * len(robot.ARMS),
}
OPTIONAL = ("z", "yaw", "goal", "start", "pinch3")


def yaw_of(quaternion: np.ndarray) -> float:
    """The rotation about the world's z axis of a (w, x, y, z) quaternion."""
    w, x, y, z = (float(v) for v in quaternion)
    return float(np.arctan2(2 * (w * z + x * y), 1 - 2 * (y * y + z * z)))


PERCEPTIONS = ("tracked", "whole", "inhand", "inhand_whole")


class Perception:
    """The named cube as the perception module sees it in the top camera, one episode.

    "tracked": the tracked (x, y) (`workcell_cubes.CubeState`, the cube part of the VLA's
    state) and the detector's yaw (`CubeDetector.yaws`; an unseen or shapeless blob keeps the
    last one). A gripper over the cube hides part of it and both estimates follow the visible
    part (up to 2 cm and 45 degrees off before the blob vanishes). No height: the cube centre
    is taken on the table plane.
    "whole": `workcell_cubes.cube_poses` without the arms: whole views only.
    "inhand": `workcell_cubes.cube_poses`, whole views and, while a gripper holds the cube,
    the hand's account of it (forward kinematics of the measured joints).
    "inhand_whole": "inhand" with the tracker before 2026-11-29, which moved an estimate on
    whole views only (`CubePoses.follow_partial_views` off, `rollout --whole-views-only`).
    The start is the first observation's (x, y)."""

    def __init__(self, kind: str = "tracked") -> None:
        if kind not in PERCEPTIONS:
            raise ValueError(f"perception must be one of {PERCEPTIONS}, got {kind!r}")
        self.kind = kind
        self.cubes = workcell_cubes.CubeState()
        self.poses: CubePoses | None = None
        self.yaw = 0.0
        self.start: np.ndarray | None = None

    def see(self, workcell: Workcell, target: str) -> tuple[np.ndarray, float, np.ndarray]:
        """(cube centre [3], yaw, start (x, y)) from a fresh top-camera image."""
        image = workcell.render(workcell_cubes.CAMERA)
        height, width = image.shape[:2]
        if self.kind != "tracked":
            if self.poses is None:
                self.poses = workcell_cubes.cube_poses(
                    width,
                    height,
                    follow_partial_views=self.kind == "inhand",
                    with_hands=self.kind != "whole",
                )
            pose = self.poses.update(image, workcell.joint_positions())[target]
            return np.r_[pose.xy, pose.z], pose.yaw, pose.start
        state = self.cubes.update(image)
        k = workcell_cubes.CUBE_NAMES.index(target)
        xy = np.asarray(state[2 * k : 2 * k + 2], np.float64)
        found = workcell_cubes.detector(width, height)
        yaw = found.yaws(image)[target]
        self.yaw = self.yaw if yaw is None else yaw
        if self.start is None:
            self.start = xy.copy()
        return np.r_[xy, found.plane_z], self.yaw, self.start


def all_blocks(
    workcell: Workcell, spec: tasks.EpisodeSpec, perception: Perception | None = None
) -> np.ndarray:
    """Every block of BLOCK_WIDTHS, concatenated in its order, from the workcell's true state
    or, with `perception`, the cube's quantities as the top camera gives them."""
    goal = spec.goal_xy()
    if perception is None:
        pose = workcell.object_pose(spec.target)
        cube = np.asarray(pose.position, np.float64)
        yaw = yaw_of(pose.quaternion)
        start = np.asarray(spec.objects[spec.target][:2], np.float64)
    else:
        cube, yaw, start = perception.see(workcell, spec.target)
        if goal is not None:  # the goal as the perceived start and the words give it
            goal = start + (goal - np.asarray(spec.objects[spec.target][:2]))
    angle = 4 * yaw
    pinch = [workcell.site_position(f"{arm}_pinch") for arm in robot.ARMS]
    parts = [
        workcell.joint_positions().astype(np.float64),
        cube[:2],
        state_policy.instruction_features(spec.instruction).astype(np.float64),
        cube[2:],
        np.array([np.sin(angle), np.cos(angle)]),
        np.zeros(2) if goal is None else goal - cube[:2],
        start - cube[:2],
        np.concatenate([np.r_[cube[:2] - p[:2], p[2]] for p in pinch]),
        np.concatenate([cube - p for p in pinch]),
    ]
    out = np.concatenate(parts)
    assert len(out) == sum(BLOCK_WIDTHS.values())
    return out.astype(np.float32)


def columns(blocks: Sequence[str]) -> np.ndarray:
    """The columns of `all_blocks` that `blocks` (names from OPTIONAL) select: base, the
    chosen blocks, and the 2-D pinch form unless pinch3 is chosen."""
    unknown = set(blocks) - set(OPTIONAL)
    if unknown:
        raise ValueError(f"unknown blocks {sorted(unknown)}; choose from {OPTIONAL}")
    chosen = {"base", *blocks, "pinch3" if "pinch3" in blocks else "pinch2"}
    out, first = [], 0
    for name, width in BLOCK_WIDTHS.items():
        if name in chosen:
            out.extend(range(first, first + width))
        first += width
    return np.array(out)


@dataclasses.dataclass
class Episode:
    seed: int
    template: str
    success: bool
    furthest_stage: int
    min_pinch_distance_m: float
    sim_s: float


def run_episode(
    workcell: Workcell,
    expert: ReactiveExpert,
    seed: int,
    mode: str,
    policy: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None,
    beta: float = 0.0,
    rng: np.random.Generator | None = None,
    perception: str = "",
    execute_s: float = 1.0 / FPS,
) -> tuple[Episode, dict[str, np.ndarray]]:
    """One episode; mode "demo" (the expert at the control rate, chunks from its own next
    commands), "label" (the policy, or at `beta` of the frames the expert's chunk, executed;
    every observation labelled with `dagger.expert_chunk`) or "eval" (the policy alone, no
    rows). `perception` (one of PERCEPTIONS): the cube's blocks from the top camera
    (`Perception`; the workcell must render it). In "eval" each chunk is executed for
    `execute_s` before the next observation (the others observe every 1 / FPS). Returns the
    episode and its rows: features [N, F], joints [N, 14], chunks [N, A, 14]."""
    if mode not in ("demo", "label", "eval"):
        raise ValueError(f"unknown mode {mode!r}")
    spec = tasks.sample_episode(seed)
    labels = tasks.subtask_labels(spec)
    workcell.reset(robot.HOME, spec.objects)
    expert.reset(workcell, spec)
    start = workcell.time
    tracker = tasks.SuccessTracker()
    seen = Perception(perception) if perception else None
    per_frame = round(CONTROL_HZ * (execute_s if mode == "eval" else 1.0 / FPS))
    dt = 1.0 / CONTROL_HZ
    features, joints, chunks, commands = [], [], [], []
    furthest, closest = 0, np.inf
    done = False
    while not done and workcell.time - start < spec.time_limit_s:
        x = all_blocks(workcell, spec, seen)
        q = workcell.joint_positions().astype(np.float64)
        rows = None
        if mode == "label":
            label, _ = dagger.expert_chunk(workcell, expert, dagger.LabelConfig(HORIZON))
            chunks.append(label)
            rows = label if rng is not None and rng.random() < beta else policy(x, q)
        elif mode == "eval":
            rows = policy(x, q)
        if mode != "eval":
            features.append(x)
            joints.append(q)
        for tick in range(per_frame):
            if rows is None:
                target = expert.command(workcell)
                if tick == 0:
                    commands.append(target)
            else:
                target = chunk_target(rows, 1.0 / FPS, tick * dt)
            workcell.set_targets(target)
            workcell.step(dt)
            evaluation = tasks.evaluate(workcell, spec)
            furthest = max(furthest, labels.index(evaluation.stage))
            closest = min(closest, evaluation.pinch_distance_m)
            if tracker.update(evaluation, workcell.time) or workcell.time - start >= (
                spec.time_limit_s
            ):
                done = True
                break
    if mode == "demo":
        chunks = list(np.stack(commands)[data.chunk_indices(len(commands), HORIZON)])
    episode = Episode(
        seed, spec.template, tracker.succeeded, furthest, float(closest), workcell.time - start
    )
    if mode == "eval":
        return episode, {}
    return episode, {
        "features": np.stack(features),
        "joints": np.stack(joints).astype(np.float32),
        "chunks": np.stack(chunks).astype(np.float32),
    }


def _work(job: tuple) -> list[tuple[Episode, dict[str, np.ndarray]]]:
    seeds, mode, policy_parts, beta, perception, execute_s = job
    workcell = Workcell(
        WorkcellConfig(cameras=(workcell_cubes.CAMERA,))
        if perception
        else WorkcellConfig(render=False)
    )
    expert = ReactiveExpert(workcell.model)
    policy = Policy(*policy_parts) if policy_parts else None
    rng = np.random.default_rng(seeds[0]) if seeds else None
    try:
        return [
            run_episode(workcell, expert, s, mode, policy, beta, rng, perception, execute_s)
            for s in seeds
        ]
    finally:
        workcell.close()


def run_many(
    seeds: Sequence[int],
    mode: str,
    policy: Policy | None = None,
    beta: float = 0.0,
    workers: int = 2,
    perception: str = "",
    execute_s: float = 1.0 / FPS,
) -> list[tuple[Episode, dict[str, np.ndarray]]]:
    """`run_episode` over `seeds`, split round-robin over `workers` processes (in order)."""
    parts = None
    if policy:
        p = policy
        parts = (p.members, p.stats, p.columns, p.flow_steps, p.noise_scale)
    jobs = [
        (list(seeds[k::workers]), mode, parts, beta, perception, execute_s) for k in range(workers)
    ]
    if workers == 1:
        results = [_work(jobs[0])]
    else:
        with multiprocessing.get_context("spawn").Pool(workers) as pool:
            results = pool.map(_work, jobs)
    by_seed = {e.seed: (e, rows) for part in results for e, rows in part}
    return [by_seed[s] for s in seeds]


def stack(
    results: Sequence[tuple[Episode, dict[str, np.ndarray]]], successful_only: bool
) -> dict[str, np.ndarray]:
    kept = [rows for e, rows in results if rows and (e.success or not successful_only)]
    return {k: np.concatenate([r[k] for r in kept]) for k in ("features", "joints", "chunks")}


def summarise(episodes: Sequence[Episode]) -> dict:
    by_template: dict[str, list[bool]] = {}
    for e in episodes:
        by_template.setdefault(e.template, []).append(e.success)
    return {
        "episodes": len(episodes),
        "successes": sum(e.success for e in episodes),
        "min_pinch_distance_median_mm": 1000
        * float(np.median([e.min_pinch_distance_m for e in episodes])),
        "by_template": {k: f"{sum(v)}/{len(v)}" for k, v in sorted(by_template.items())},
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--blocks", default="z,yaw,goal,pinch3", help=f"from {OPTIONAL}")
    parser.add_argument("--demos", default="1000:2000", help="demonstration seeds first:stop")
    parser.add_argument("--seeds", default="0:40", help="evaluation seeds first:stop")
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=0, help="the first MLP's seed")
    parser.add_argument("--fits", type=int, default=1)
    parser.add_argument("--min-std", type=float, default=1e-3, help="added to each input's std")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument(
        "--flow-steps",
        type=int,
        default=0,
        help="> 0: a flow-matching velocity field sampled in this many Euler steps (one fit)",
    )
    parser.add_argument("--flow-draws", type=int, default=1, help="(noise, time) per sample")
    parser.add_argument(
        "--gripper-scale", type=float, default=1.0, help="grippers' normalised targets times this"
    )
    parser.add_argument(
        "--noise-scale", type=float, default=1.0, help="the flow's starting noise times this"
    )
    parser.add_argument(
        "--prompt-bins",
        action="store_true",
        help="every input reduced to its pi0.5 prompt bin (256 bins over q01-q99), as the VLA "
        "reads its state",
    )
    parser.add_argument(
        "--execute-s",
        type=float,
        default=1.0 / FPS,
        help="seconds each evaluated chunk is executed before the next observation",
    )
    parser.add_argument("--dagger-rounds", type=int, default=0)
    parser.add_argument("--dagger-episodes", type=int, default=40)
    parser.add_argument("--beta", type=float, default=0.3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--perception",
        choices=PERCEPTIONS,
        default=None,
        help="the cube's blocks from the top camera (default: the simulator's true state)",
    )
    parser.add_argument(
        "--heldout",
        default="",
        help="first:stop demonstration seeds kept out of the fit: each fit's action error on "
        "them (mean |row - label| over every row and joint, as train's val_action_mae_rad)",
    )
    parser.add_argument("--cache", default="", help="demonstration rows (.npz), reused")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    blocks = [b for b in args.blocks.split(",") if b]
    cols = columns(blocks)
    perception = args.perception or ""
    if perception in ("tracked", "whole") and "z" in blocks:
        parser.error(f"--perception {perception} has no z block: a top camera measures no height")
    started = time.monotonic()
    first, stop = (int(v) for v in args.demos.split(":"))
    if args.cache and Path(args.cache).exists():
        rows = dict(np.load(args.cache))
    else:
        demos = run_many(range(first, stop), "demo", workers=args.workers, perception=perception)
        print("demonstrations", summarise([e for e, _ in demos]), flush=True)
        rows = stack(demos, successful_only=True)
        if args.cache:
            np.savez(args.cache, **rows)
    heldout = None
    if args.heldout:
        held = run_many(range(*(int(v) for v in args.heldout.split(":"))), "demo", workers=1)
        heldout = stack(held, successful_only=True)
    report = {"blocks": blocks, "args": vars(args), "rounds": []}
    next_seed = 5000
    for round_index in range(args.dagger_rounds + 1):
        policy = fit(
            rows,
            cols,
            args.steps,
            args.seed,
            args.fits,
            args.min_std,
            args.batch_size,
            args.prompt_bins,
            flow_steps=args.flow_steps,
            flow_draws=args.flow_draws,
            noise_scale=args.noise_scale,
            gripper_scale=args.gripper_scale,
        )
        evaluation = run_many(
            range(*(int(v) for v in args.seeds.split(":"))),
            "eval",
            policy,
            workers=args.workers,
            perception=perception,
            execute_s=args.execute_s,
        )
        episodes = [e for e, _ in evaluation]
        entry = {"round": round_index, "rows": len(rows["features"]), **summarise(episodes)}
        if heldout is not None:
            entry["heldout_action_mae"] = action_error(policy, heldout)
        print(f"round {round_index}", entry, f"{time.monotonic() - started:.0f} s", flush=True)
        report["rounds"].append({**entry, "episodes": [dataclasses.asdict(e) for e in episodes]})
        Path(args.out).write_text(json.dumps(report, indent=1))
        if round_index == args.dagger_rounds:
            break
        seeds = range(next_seed, next_seed + args.dagger_episodes)
        next_seed += args.dagger_episodes
        labelled = run_many(seeds, "label", policy, args.beta, args.workers, perception)
        print("  collected", summarise([e for e, _ in labelled]), flush=True)
        new = stack(labelled, successful_only=False)
        rows = {k: np.concatenate([rows[k], new[k]]) for k in rows}
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
