"""Scripted-expert demonstrations without ROS, deterministic from their seeds.

`python -m oxygen_ros.sim.generate_demos --episodes 200 --seed-start 1000 --out data/demos`
(`scripts/generate_demos` sets everything up first).

The same expert, physics and cameras as the ROS recording (`scripts/record_demos`), stepped in
this process: per episode, the workcell is reset to `tasks.sample_episode(seed)`, the expert
plans once (with `--expert feedback`: commands from the state each tick), and its targets drive
the arms at `control_hz` (50 Hz, the sim node's servo rate). Every 1 / fps seconds of sim time
(10 Hz, the cameras' rate) one step is written in the recorder's ALOHA HDF5 layout: the three
224 x 224 images and the joint state of that instant, the commanded targets (`action`), the
full physics state (`sim_state`), and as `language/subtask` the phase the simulator's state is
in (`tasks.evaluate(...).stage`, what the closed-loop evaluation compares the model's speech
with; the plan's own phase label is in `extra.plan_subtasks`). The episode ends on success
(after the tracker's dwell) or at its time limit (the last step is the last frame before that);
only successes are training data.

Command noise (`--command-noise-rad`, DART: Laskey et al. 2017, "DART: Noise Injection for
Robust Imitation Learning"): the arm joints are driven to the plan's targets plus
time-correlated Gaussian noise (an Ornstein-Uhlenbeck process at the control rate, stationary
standard deviation the given value, time constant `NOISE_TIME_CONSTANT_S`, seeded by the
episode's seed), while `action` records the plan's clean targets. The arm is then off the
expert's path in the recorded states and the labels lead back to it: the states a policy
reaches when it drifts. Grippers are never perturbed. 0 (the default) writes exactly the
noiseless episode.

Experts (`--expert`): `plan` (the default) is the scripted expert, which plans once per episode
(targets a function of time); `feedback` is `feedback_expert.FeedbackExpert`, whose target at
every control tick is computed from the measured joints and the true cube pose, so every
recorded state, noisy ones included, is labelled with a command that steers back. With it,
`extra.plan_subtasks` holds the feedback expert's phase labels. `reactive` is
`reactive_expert.ReactiveExpert`: state feedback with nothing remembered between ticks (no
phase machine or timer), so the same observed state is always labelled the same way; its
`plan_subtasks` are the evaluated stages.

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
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from oxygen_ros.sim import robot, tasks
from oxygen_ros.sim.expert import ScriptedExpert
from oxygen_ros.sim.feedback_expert import FeedbackExpert
from oxygen_ros.sim.reactive_expert import ReactiveExpert
from oxygen_ros.sim.recorder import EpisodeWriter, episode_path
from oxygen_ros.sim.workcell import CAMERAS, Workcell, WorkcellConfig

logger = logging.getLogger("oxygen_ros.sim")

CONTROL_HZ = 50.0
FPS = 10.0
EXPERTS = ("plan", "feedback", "reactive")  # ScriptedExpert's one plan | FeedbackExpert's
#   state feedback with a phase machine | ReactiveExpert's memoryless state feedback
NOISE_TIME_CONSTANT_S = 0.5  # correlation time of the command noise


class CommandNoise:
    """Ornstein-Uhlenbeck noise on the arm joints (grippers zero), one draw per control tick:
    n <- a n + sqrt(1 - a^2) sigma xi, a = exp(-dt / tau); starts at 0."""

    def __init__(self, sigma_rad: float, dt: float, seed: int) -> None:
        if sigma_rad < 0:
            raise ValueError(f"command noise must be >= 0, got {sigma_rad}")
        self._sigma = sigma_rad
        self._decay = float(np.exp(-dt / NOISE_TIME_CONSTANT_S))
        self._rng = np.random.default_rng(seed)
        self._arm = np.array([not name.endswith("_gripper") for name in robot.JOINT_NAMES])
        self._value = np.zeros(len(robot.JOINT_NAMES))

    def sample(self) -> np.ndarray:
        if self._sigma == 0:
            return self._value
        draw = self._rng.standard_normal(len(self._value)) * self._arm
        scale = np.sqrt(1.0 - self._decay**2) * self._sigma
        self._value = self._decay * self._value + scale * draw
        return self._value


def generate_episode(
    workcell: Workcell,
    expert: ScriptedExpert | FeedbackExpert | ReactiveExpert,
    seed: int,
    path: Path,
    episode_index: int,
    fps: float = FPS,
    control_hz: float = CONTROL_HZ,
    command_noise_rad: float = 0.0,
) -> bool:
    """Runs and writes one episode; returns whether it succeeded (`command_noise_rad`: see
    the module docstring)."""
    spec = tasks.sample_episode(seed)
    workcell.reset(robot.HOME, spec.objects)
    start = workcell.time
    feedback = isinstance(expert, FeedbackExpert | ReactiveExpert)
    if feedback:
        expert.reset(workcell, spec)

        def command(now: float) -> tuple[np.ndarray, str]:
            return expert.command(workcell), expert.subtask

    else:
        plan = expert.plan_for(workcell, spec)

        def command(now: float) -> tuple[np.ndarray, str]:
            return plan.sample(now), plan.subtask(now)

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
    noise = CommandNoise(command_noise_rad, 1.0 / control_hz, seed)
    plan_labels = []
    succeeded = False
    with writer:
        for tick in range(round(spec.time_limit_s * control_hz) + 1):
            now = workcell.time
            target, label = command(now)
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
                plan_labels.append(label)
            workcell.set_targets(target + noise.sample())
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
                "command_noise_rad": command_noise_rad,
                "expert": expert_name(expert),
                "unreachable_ticks": expert.unreachable_ticks if feedback else 0,
            },
        )
    return succeeded


_EXPERT_NAMES = {ScriptedExpert: "plan", FeedbackExpert: "feedback", ReactiveExpert: "reactive"}


def expert_name(expert: ScriptedExpert | FeedbackExpert | ReactiveExpert) -> str:
    """The `--expert` name (one of EXPERTS) of a demonstrator, as episodes record it."""
    return _EXPERT_NAMES[type(expert)]


def make_expert(kind: str, workcell: Workcell) -> ScriptedExpert | FeedbackExpert | ReactiveExpert:
    """The demonstrator `kind` (one of EXPERTS) for `workcell`'s model."""
    if kind not in EXPERTS:
        raise ValueError(f"expert must be one of {EXPERTS}, got {kind!r}")
    by_name = {name: cls for cls, name in _EXPERT_NAMES.items()}
    return by_name[kind](workcell.model)


def generate_range(
    out: Path,
    seed_start: int,
    first: int,
    count: int,
    command_noise_rad: float = 0.0,
    expert: str = "plan",
) -> Iterator[tuple[int, Path, bool]]:
    """Episodes first .. first + count - 1 (seeds seed_start + index) in one fresh workcell,
    written to `out`; yields (seed, path, succeeded) after each, so a caller may consume the
    file before the next episode runs."""
    workcell = Workcell(WorkcellConfig())
    demonstrator = make_expert(expert, workcell)
    try:
        for index in range(first, first + count):
            seed = seed_start + index
            path = episode_path(out, index)
            ok = generate_episode(
                workcell, demonstrator, seed, path, index, command_noise_rad=command_noise_rad
            )
            logger.info("episode %d (seed %d): success=%s", index, seed, ok)
            yield seed, path, ok
    finally:
        workcell.close()


def _generate_range(
    out: Path,
    seed_start: int,
    first: int,
    count: int,
    command_noise_rad: float = 0.0,
    expert: str = "plan",
) -> dict[int, bool]:
    """`generate_range`'s outcomes, seed -> succeeded."""
    return {
        seed: ok
        for seed, _, ok in generate_range(out, seed_start, first, count, command_noise_rad, expert)
    }


def log_to_stderr(level: int) -> None:
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


def generate(
    out: Path,
    episodes: int,
    seed_start: int,
    workers: int = 1,
    command_noise_rad: float = 0.0,
    expert: str = "plan",
) -> dict:
    """Writes episodes seed_start .. seed_start + episodes - 1 into `out` (indices 0..), split
    into `workers` contiguous ranges, each run by its own process with its own workcell."""
    if episodes < 1 or workers < 1:
        raise ValueError(f"need episodes >= 1 and workers >= 1, got {episodes}, {workers}")
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    ranges = split_range(episodes, workers)
    results: dict[int, bool] = {}
    if len(ranges) == 1:
        results = _generate_range(out, seed_start, *ranges[0], command_noise_rad, expert)
    else:
        # spawn: each worker starts its own MuJoCo / EGL context, nothing inherited.
        context = multiprocessing.get_context("spawn")
        level = logging.getLogger().getEffectiveLevel()
        with context.Pool(len(ranges), log_to_stderr, (level,)) as pool:
            parts = [
                pool.apply_async(
                    _generate_range, (out, seed_start, first, count, command_noise_rad, expert)
                )
                for first, count in ranges
            ]
            for part in parts:
                results.update(part.get())
    summary = {
        "episodes": episodes,
        "seed_start": seed_start,
        "workers": workers,
        "command_noise_rad": command_noise_rad,
        "expert": expert,
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
    parser.add_argument(
        "--command-noise-rad",
        type=float,
        default=0.0,
        help="DART: std of correlated noise added to the executed arm targets (labels stay clean)",
    )
    parser.add_argument(
        "--expert",
        choices=EXPERTS,
        default="plan",
        help="plan: the scripted expert's one plan; feedback: targets from the state each tick "
        "and a phase machine; reactive: targets from the current state alone",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    summary = generate(
        Path(args.out),
        args.episodes,
        args.seed_start,
        args.workers,
        args.command_noise_rad,
        args.expert,
    )
    print(
        f"generated {summary['succeeded']}/{summary['episodes']} successful episodes "
        f"in {summary['wall_s']:.0f} s (seeds {args.seed_start}.."
        f"{args.seed_start + args.episodes - 1})"
    )
    return 0 if summary["succeeded"] == summary["episodes"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
