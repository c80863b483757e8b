"""Scripted-expert demonstrations without ROS, deterministic from their seeds.

`python -m oxygen_ros.sim.generate_demos --episodes 200 --seed-start 1000 --out data/demos`
(`scripts/generate_demos` sets everything up first).

The same expert, physics and cameras as the ROS recording (`scripts/record_demos`), stepped in
this process: per episode, the workcell is reset to `tasks.sample_episode(seed)`, the expert
plans once, and the plan's targets drive the arms at `control_hz` (50 Hz, the sim node's
servo rate). Every 1 / fps seconds of sim time (10 Hz, the cameras' rate) one step is written in
the recorder's ALOHA HDF5 layout: the three 224 x 224 images and the joint state of that
instant, the commanded targets (`action`), the full physics state (`sim_state`), and as
`language/subtask` the phase the simulator's state is in (`tasks.evaluate(...).stage`, what the
closed-loop evaluation compares the model's speech with; the plan's own phase label is in
`extra.plan_subtasks`). The episode ends on success (after the tracker's dwell) or at its time
limit (the last step is the last frame before that); only successes are training data.

The same command (seeds, `--workers`, package versions, machine) writes the same arrays:
MuJoCo and the EGL renderer are deterministic, and each worker starts a fresh workcell at sim
time 0 on its own contiguous range of episodes (episodes of one worker follow each other in
sim time, so an episode is reproduced by the same split; a test regenerates one from a fresh
workcell and compares every array).
Nothing here imports rclpy.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import time
from collections.abc import Sequence
from pathlib import Path

from oxygen_ros.sim import robot, tasks
from oxygen_ros.sim.expert import ScriptedExpert
from oxygen_ros.sim.recorder import EpisodeWriter, episode_path
from oxygen_ros.sim.workcell import CAMERAS, Workcell, WorkcellConfig

logger = logging.getLogger("oxygen_ros.sim")

CONTROL_HZ = 50.0
FPS = 10.0


def generate_episode(
    workcell: Workcell,
    expert: ScriptedExpert,
    seed: int,
    path: Path,
    episode_index: int,
    fps: float = FPS,
    control_hz: float = CONTROL_HZ,
) -> bool:
    """Runs and writes one episode; returns whether it succeeded."""
    spec = tasks.sample_episode(seed)
    workcell.reset(robot.HOME, spec.objects)
    start = workcell.time
    plan = expert.plan_for(workcell, spec)
    tracker = tasks.SuccessTracker()
    per_frame = round(control_hz / fps)
    if abs(per_frame * fps - control_hz) > 1e-9:
        raise ValueError(f"control_hz {control_hz} must be a multiple of fps {fps}")
    writer = EpisodeWriter(
        path,
        joint_names=robot.JOINT_NAMES,
        camera_names=CAMERAS,
        image_shape=(workcell.config.image_height, workcell.config.image_width),
        instruction=spec.instruction,
        seed=seed,
        episode_index=episode_index,
        fps=fps,
        task_template=spec.template,
        sim_state_size=workcell.physics_state().shape[0],
    )
    plan_labels = []
    succeeded = False
    with writer:
        for tick in range(round(spec.time_limit_s * control_hz) + 1):
            now = workcell.time
            target = plan.sample(now)
            if tick % per_frame == 0:
                evaluation = tasks.evaluate(workcell, spec)
                writer.add_step(
                    timestamp=now - start,
                    qpos=workcell.joint_positions(),
                    qvel=workcell.joint_velocities(),
                    images={camera: workcell.render(camera) for camera in CAMERAS},
                    action=target,
                    subtask=evaluation.stage,
                    sim_state=workcell.physics_state(),
                )
                plan_labels.append(plan.subtask(now))
            workcell.set_targets(target)
            workcell.step(1.0 / control_hz)
            if tracker.update(tasks.evaluate(workcell, spec), workcell.time):
                succeeded = True
                break
        writer.close(
            success=succeeded,
            extra={
                "generator": "oxygen_ros.sim.generate_demos",
                "control_hz": control_hz,
                "plan_subtasks": plan_labels,
                "instabilities": workcell.instabilities,
            },
        )
    return succeeded


def _generate_range(out: Path, seed_start: int, first: int, count: int) -> dict[int, bool]:
    """Episodes first .. first + count - 1 (seeds seed_start + index) in one fresh workcell."""
    workcell = Workcell(WorkcellConfig())
    expert = ScriptedExpert(workcell.model)
    results = {}
    try:
        for index in range(first, first + count):
            seed = seed_start + index
            results[seed] = generate_episode(
                workcell, expert, seed, episode_path(out, index), index
            )
            logger.info("episode %d (seed %d): success=%s", index, seed, results[seed])
    finally:
        workcell.close()
    return results


def _log_to_stderr(level: int) -> None:
    """Pool initializer: a spawned worker logs its episodes like the parent process."""
    logging.basicConfig(level=level, format="%(asctime)s %(processName)s %(message)s")


def split_range(episodes: int, workers: int) -> list[tuple[int, int]]:
    """(first index, count) per worker: contiguous, sizes differing by at most one."""
    base, extra = divmod(episodes, workers)
    ranges, first = [], 0
    for worker in range(workers):
        count = base + (worker < extra)
        if count:
            ranges.append((first, count))
        first += count
    return ranges


def generate(out: Path, episodes: int, seed_start: int, workers: int = 1) -> dict:
    """Writes episodes seed_start .. seed_start + episodes - 1 into `out` (indices 0..), split
    into `workers` contiguous ranges, each run by its own process with its own workcell."""
    if episodes < 1 or workers < 1:
        raise ValueError(f"need episodes >= 1 and workers >= 1, got {episodes}, {workers}")
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    ranges = split_range(episodes, workers)
    results: dict[int, bool] = {}
    if len(ranges) == 1:
        results = _generate_range(out, seed_start, *ranges[0])
    else:
        # spawn: each worker starts its own MuJoCo / EGL context, nothing inherited.
        context = multiprocessing.get_context("spawn")
        level = logging.getLogger().getEffectiveLevel()
        with context.Pool(len(ranges), _log_to_stderr, (level,)) as pool:
            parts = [
                pool.apply_async(_generate_range, (out, seed_start, first, count))
                for first, count in ranges
            ]
            for part in parts:
                results.update(part.get())
    summary = {
        "episodes": episodes,
        "seed_start": seed_start,
        "workers": workers,
        "succeeded": sum(results.values()),
        "failed_seeds": sorted(s for s, ok in results.items() if not ok),
        "wall_s": time.monotonic() - started,
    }
    (out / f"generate_{seed_start}-{seed_start + episodes - 1}.json").write_text(
        json.dumps(summary, indent=1)
    )
    return summary


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--episodes", type=int, default=200)
    parser.add_argument("--seed-start", type=int, default=1000)
    parser.add_argument("--out", default="data/demos")
    parser.add_argument(
        "--workers", type=int, default=1, help="processes, each with its own workcell"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    summary = generate(Path(args.out), args.episodes, args.seed_start, args.workers)
    print(
        f"generated {summary['succeeded']}/{summary['episodes']} successful episodes "
        f"in {summary['wall_s']:.0f} s (seeds {args.seed_start}.."
        f"{args.seed_start + args.episodes - 1})"
    )
    return 0 if summary["succeeded"] == summary["episodes"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
