"""DAgger's labels from the feedback expert: what it would command from the states a learner
visits (ROS-free).

Behaviour cloning only ever sees the expert's own states; in closed loop the learner drifts off
them and has no label there (docs/TRAINING.md, runs 12-13). DAgger (Ross et al. 2011) runs the
learner, asks the expert what it would have done at each state the learner reached, and trains
on the union. Here the expert is `FeedbackExpert` and "what it would have done" is its chunk:
from the workcell's state at an observation, the expert drives the arms at the control rate for
one horizon and its command every 1/fps seconds is a row, exactly as `generate_demos` records
a demonstration's chunk (row 0 is the command at the observation). Then the physics state and
the expert's phase machine are put back, so the learner's episode goes on unchanged.

The expert's phase machine follows the learner: the command at each observation is kept
(a waypoint the learner reached advances the phase), the rest of the look-ahead is not; with
`regrasp_m` a cube the learner dropped is picked up again.

`LabellingPolicy` wraps any rollout policy (`training.rollout.run_episode`'s reset/act):
it records (state, joint velocities, time, expert chunk, expert subtask) at every observation
and executes the learner's chunk (or, with probability `beta`, the expert's: DAgger's mixture).
`RecordingLabeller` also writes each episode in the recorder's layout with the chunks as
`/action_chunk` (full-size cameras, joints, physics state, the stage as the subtask), which
`training.data.load_episodes` trains on like a demonstration, failed episodes included.

`python -m oxygen_ros.training.dagger --checkpoint DIR --seeds 5000:5030 --out data/dagger_1
[--object-state [positions|poses|reach|target]] [--beta 0.5] [--execute-s 0.1]
[--expert reactive]` runs a checkpoint through the engine (as `training.rollout` does) and
writes its relabelled episodes.
`--expert reactive`
labels with `ReactiveExpert` instead (`make_labeller`): it keeps no phase machine, so its label
at a state does not depend on how the learner got there; `--keep-held` has it keep (and lift) a
cube the fingers hold off the centre, where it would let go (`ReactiveConfig.keep_held`);
`--aligned-m M` has it descend onto and close on a cube within M horizontally (its `aligned_m`
and `close_xy_m`) and `--gripper-open V` open the fingers to V (1: 6.9 cm between them, 0.8:
5.5 cm; the cube is 4 cm): a funnel as wide as the learner's precision; `--grip-high-m M`
has it let go of a cube still on the table that the fingers hold more than M above its centre
(on its top edge) and grasp again lower (`ReactiveConfig.grip_high_m`).

Invariants:
- Labelling does not change the episode: the physics state and the expert's phase machine after
  `expert_chunk()` equal those before, except for the phase advance of the kept first command.
- Labels use the expert's privileged state (true cube poses); the recorded inputs are only what
  the policy observed.
- Nothing here imports rclpy.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from oxygen_ros.sim import robot, tasks
from oxygen_ros.sim.feedback_expert import FeedbackConfig, FeedbackExpert
from oxygen_ros.sim.generate_demos import CONTROL_HZ, FPS, expert_name
from oxygen_ros.sim.reactive_expert import ReactiveConfig, ReactiveExpert
from oxygen_ros.sim.recorder import EpisodeWriter, episode_path, list_episodes
from oxygen_ros.sim.workcell import CAMERAS, Workcell, WorkcellConfig

LABELLERS = ("feedback", "reactive")  # the experts that label from any state


def make_labeller(
    kind: str,
    workcell: Workcell,
    regrasp_m: float | None = 0.03,
    reactive: ReactiveConfig | None = None,
) -> FeedbackExpert | ReactiveExpert:
    """The labelling expert `kind` (one of LABELLERS); `regrasp_m` is the feedback expert's
    lost-grasp limit (the reactive expert needs none: it remembers no grasp); `reactive` the
    reactive expert's configuration (default `ReactiveConfig()`)."""
    if kind == "feedback":
        if reactive is not None:
            raise ValueError("a ReactiveConfig configures the reactive expert only")
        return FeedbackExpert(workcell.model, FeedbackConfig(regrasp_m=regrasp_m))
    if kind == "reactive":
        return ReactiveExpert(workcell.model, reactive or ReactiveConfig())
    raise ValueError(f"expert must be one of {LABELLERS}, got {kind!r}")


def reactive_config(
    keep_held: bool = False,
    aligned_m: float | None = None,
    gripper_open: float | None = None,
    grip_high_m: float | None = None,
) -> ReactiveConfig:
    """`ReactiveConfig()` with the command line's changes (None keeps its default): `aligned_m`
    is both the horizontal error it descends within and the one it closes within;
    `gripper_open` the open value."""
    config = dataclasses.replace(ReactiveConfig(), keep_held=keep_held)
    if grip_high_m is not None:
        config = dataclasses.replace(config, grip_high_m=grip_high_m)
    if aligned_m is not None:
        config = dataclasses.replace(config, aligned_m=aligned_m, close_xy_m=aligned_m)
    if gripper_open is not None:
        waypoints = dataclasses.replace(config.waypoints, gripper_open=gripper_open)
        config = dataclasses.replace(config, waypoints=waypoints)
    return config


@dataclasses.dataclass(frozen=True)
class LabelConfig:
    horizon: int = 10  # chunk rows
    fps: float = FPS  # rows per second
    control_hz: float = CONTROL_HZ  # expert commands per second during the look-ahead

    def __post_init__(self) -> None:
        if (
            self.horizon < 1
            or abs(round(self.control_hz / self.fps) * self.fps - self.control_hz) > 1e-9
        ):
            raise ValueError("need horizon >= 1 and control_hz a multiple of fps")


def expert_chunk(
    workcell: Workcell,
    expert: FeedbackExpert | ReactiveExpert,
    config: LabelConfig = LabelConfig(),
) -> tuple[np.ndarray, str]:
    """The expert's chunk [horizon, 14] from the workcell's current state and its subtask
    label there; the workcell and the expert are left as after the first command."""
    physics = workcell.physics_state()
    first = expert.command(workcell)  # kept: the phase machine follows the learner
    subtask = expert.subtask
    kept = expert.snapshot()
    per_row = round(config.control_hz / config.fps)
    dt = 1.0 / config.control_hz
    rows = [first]
    target = first
    try:
        for tick in range(1, config.horizon * per_row):
            workcell.set_targets(target)
            workcell.step(dt)
            target = expert.command(workcell)
            if tick % per_row == 0:
                rows.append(target)
    finally:
        expert.restore(kept)
        workcell.set_physics_state(physics)
    return np.stack(rows), subtask


@dataclasses.dataclass
class Labels:
    """Per observation of the labelled episodes (`arrays()` stacks them)."""

    state: list[np.ndarray] = dataclasses.field(default_factory=list)  # as observed [S]
    qvel: list[np.ndarray] = dataclasses.field(default_factory=list)  # [14]
    time: list[float] = dataclasses.field(default_factory=list)  # s since the episode began
    actions: list[np.ndarray] = dataclasses.field(default_factory=list)  # expert chunk [A, 14]
    subtask: list[str] = dataclasses.field(default_factory=list)  # the expert's phase label
    seed: list[int] = dataclasses.field(default_factory=list)

    def arrays(self) -> dict[str, np.ndarray]:
        return {
            "state": np.asarray(self.state, np.float32),
            "qvel": np.asarray(self.qvel, np.float32),
            "time": np.asarray(self.time, np.float32),
            "actions": np.asarray(self.actions, np.float32),
            "seed": np.asarray(self.seed, np.int64),
        }


class LabellingPolicy:
    """Runs `learner` and labels every observation with the expert's chunk."""

    def __init__(
        self,
        learner,
        expert: FeedbackExpert | ReactiveExpert,
        labels: Labels,
        beta: float = 0.0,
        config: LabelConfig = LabelConfig(),
        seed: int = 0,
    ) -> None:
        if not 0.0 <= beta <= 1.0:
            raise ValueError(f"beta must be in [0, 1], got {beta}")
        self.learner, self.expert, self.labels = learner, expert, labels
        self.beta, self.config = beta, config
        self._rng = np.random.default_rng(seed)
        self._start, self._seed = 0.0, 0

    def reset(self, workcell: Workcell, spec: tasks.EpisodeSpec) -> None:
        self.learner.reset(workcell, spec)
        self.expert.reset(workcell, spec)
        self._start, self._seed = workcell.time, spec.seed

    def act(self, workcell: Workcell, observation) -> tuple[np.ndarray, str | None]:
        rows, subtask = expert_chunk(workcell, self.expert, self.config)
        labels = self.labels
        labels.state.append(np.asarray(observation.state, np.float32))
        labels.qvel.append(workcell.joint_velocities().astype(np.float32))
        labels.time.append(observation.stamp - self._start)
        labels.actions.append(rows.astype(np.float32))
        labels.subtask.append(subtask)
        labels.seed.append(self._seed)
        if self._rng.random() < self.beta:
            return rows[:, : robot.NUM_JOINTS], None  # the expert speaks for nobody
        return self.learner.act(workcell, observation)


class RecordingLabeller(LabellingPolicy):
    """A `LabellingPolicy` that writes every episode to `out` (`episode_<index>.hdf5`, indices
    from `first_index`); call `finish(result)` after each `run_episode`."""

    def __init__(self, *args, out: Path, first_index: int = 0, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.out, self.index = Path(out), first_index
        self._writer: EpisodeWriter | None = None

    def reset(self, workcell: Workcell, spec: tasks.EpisodeSpec) -> None:
        if self._writer is not None:
            self._writer.abort()  # an episode left without finish()
        super().reset(workcell, spec)
        self._spec = spec
        self._writer = EpisodeWriter(
            episode_path(self.out, self.index),
            joint_names=robot.JOINT_NAMES,
            camera_names=CAMERAS,
            image_shape=(workcell.config.image_height, workcell.config.image_width),
            instruction=spec.instruction,
            seed=spec.seed,
            episode_index=self.index,
            fps=self.config.fps,
            task_template=spec.template,
            sim_state_size=workcell.physics_state().shape[0],
            chunk_horizon=self.config.horizon,
        )

    def act(self, workcell: Workcell, observation) -> tuple[np.ndarray, str | None]:
        step = {
            "timestamp": observation.stamp - self._start,
            "qpos": workcell.joint_positions(),
            "qvel": workcell.joint_velocities(),
            "images": {camera: workcell.render(camera) for camera in CAMERAS},
            "subtask": tasks.evaluate(workcell, self._spec).stage,
            "sim_state": workcell.physics_state(),
        }
        out = super().act(workcell, observation)
        chunk = self.labels.actions[-1]
        self._writer.add_step(action=chunk[0], action_chunk=chunk, **step)
        return out

    def finish(self, result) -> Path:
        """Closes the episode `run_episode` returned `result` for."""
        path = self._writer.close(
            success=result.success,
            extra={
                "generator": "oxygen_ros.training.dagger",
                "beta": self.beta,
                "expert": expert_name(self.expert),
                "labeller_config": dataclasses.asdict(self.expert.config),
                "expert_subtasks": self.labels.subtask[-result.frames :],
            },
        )
        self._writer = None
        self.index += 1
        return path


def collect(
    checkpoint: str,
    seeds: Sequence[int],
    out: Path,
    config,
    beta: float = 0.0,
    regrasp_m: float | None = 0.03,
    expert_kind: str = "feedback",
    reactive: ReactiveConfig | None = None,
) -> list:
    """Runs `checkpoint` (or "expert") on `seeds` and writes their relabelled episodes to
    `out`; returns the rollouts' results."""
    from oxygen_ros.training import rollout

    policy, config = rollout.make_policy(checkpoint, config)
    workcell = Workcell(WorkcellConfig())
    results = []
    try:
        expert = make_labeller(expert_kind, workcell, regrasp_m, reactive)
        labeller = RecordingLabeller(
            policy,
            expert,
            Labels(),
            beta=beta,
            seed=seeds[0] if seeds else 0,
            out=out,
            first_index=len(list_episodes(out)) if out.exists() else 0,  # appends
        )
        for seed in seeds:
            started = time.monotonic()
            result = rollout.run_episode(labeller, workcell, seed, config)
            path = labeller.finish(result)
            results.append(result)
            print(
                f"seed {seed:>5} {result.instruction:45} success={result.success!s:5} "
                f"stage={result.furthest_stage}/{result.num_stages - 1} frames={result.frames} "
                f"-> {path.name} {time.monotonic() - started:.0f} s",
                flush=True,
            )
    finally:
        workcell.close()
    return results


def main(argv: Sequence[str] | None = None) -> int:
    from oxygen_ros.training import data, rollout

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--checkpoint", required=True, help='a checkpoint dir, or "expert"')
    parser.add_argument("--seeds", required=True, help='"first:stop" or "a,b,c"')
    parser.add_argument("--out", required=True, help="directory of the relabelled episodes")
    parser.add_argument("--beta", type=float, default=0.0, help="share of frames the expert runs")
    parser.add_argument("--execute-s", type=float, default=0.1)
    parser.add_argument(
        "--blend-steps",
        type=int,
        default=rollout.RolloutConfig.blend_steps,
        help="each executed chunk blended in over this many rows, as the inference node does "
        "(rollout.RolloutConfig.blend_steps; 0: off)",
    )
    data.add_object_state_argument(parser)
    parser.add_argument("--regrasp-m", type=float, default=0.03)
    parser.add_argument("--expert", choices=LABELLERS, default="feedback", help="the labeller")
    default = ReactiveConfig()
    parser.add_argument(
        "--keep-held",
        action="store_true",
        help="reactive: a cube held off the centre is kept and lifted, not let go",
    )
    parser.add_argument(
        "--aligned-m",
        type=float,
        default=None,
        help="reactive: descend onto and close on a cube within this horizontally (default "
        f"{default.aligned_m} to descend, {default.close_xy_m} to close)",
    )
    parser.add_argument(
        "--gripper-open",
        type=float,
        default=None,
        help=f"reactive: the open gripper's value (default {default.waypoints.gripper_open}; "
        "1 is the widest)",
    )
    parser.add_argument(
        "--grip-high-m",
        type=float,
        default=None,
        help="reactive: fingers on a cube resting on the table with the pinch point more than "
        f"this above its centre let go and grasp again lower (default {default.grip_high_m}: "
        "off)",
    )
    args = parser.parse_args(argv)
    reactive = None
    names = ("keep_held", "aligned_m", "gripper_open", "grip_high_m")
    reactive_flags = tuple(getattr(args, name) for name in names)
    if args.expert == "reactive":
        reactive = reactive_config(*reactive_flags)
    elif reactive_flags != tuple(parser.get_default(name) for name in names):
        parser.error(
            "--keep-held, --aligned-m, --gripper-open and --grip-high-m configure the "
            "reactive expert"
        )
    config = rollout.RolloutConfig(
        execute_s=args.execute_s,
        object_state=args.object_state,
        speak=False,
        preset=args.preset,
        blend_steps=args.blend_steps,
    )
    results = collect(
        args.checkpoint,
        rollout.parse_seeds(args.seeds),
        Path(args.out),
        config,
        args.beta,
        args.regrasp_m,
        args.expert,
        reactive,
    )
    summary = rollout.summarise(results)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
