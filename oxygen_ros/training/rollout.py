"""Closed-loop rollouts of a checkpoint in the workcell without ROS (engine and physics only).

Each episode: the workcell is reset to `tasks.sample_episode(seed)`; then, until success (after
the tracker's dwell) or the task's time limit, an observation is taken exactly as the perception
node builds it (three cameras resized to the model resolution, the joint state, optionally the
tracked cube positions), the engine runs one frame with a subtask request, and the chunk drives
the arms for `execute_s` of sim time: row k is the target at the observation time + k * dt,
linear in between (the sim node's command buffer), held after the last row. With
`blend_steps` N > 0 each chunk is first handed over from the previous one over N rows by the
inference node's own action stream (`engine/action_stream.py`, a pure module), as the graph
does. Nothing waits on a wall clock, so a rollout measures the policy alone: what the ROS graph
adds (latency, rates, and the blend where it is off here) is the difference to
`benchmarks/closed_loop` on the same seeds.

Measured per episode: success, the furthest stage reached (`tasks.evaluate`'s stage index), the
spoken subtask against the stage at each observation (with the confusion: stage -> what was
said -> frames, per episode and summed in the summary), the highest the held cube rose and
whether the arm still held it at the end, and the frames run. With `log_frames`
(`--log-frames`), every frame as well: its stage, what was said and the cube state the policy
read (`frame_record`).

`python -m oxygen_ros.training.rollout --checkpoint DIR --seeds 0:10 [--execute-s 0.5]
[--noise fresh|episode] [--noise-scale 1.0] [--object-state [positions|poses|reach|target]]
[--blind] [--rtc-guidance BETA] [--blend-steps N] [--log-frames] [--out results.json]`.
Nothing here imports rclpy.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import math
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from oxygen_ros.engine.action_stream import ActionStream, StreamConfig
from oxygen_ros.engine.config import RtcConfig, SchedulerConfig
from oxygen_ros.engine.engine import Engine
from oxygen_ros.engine.types import LanguageRequest, Observation, RequestKind
from oxygen_ros.perception import workcell_cubes
from oxygen_ros.sim import robot, tasks
from oxygen_ros.sim.generate_demos import CONTROL_HZ, FPS
from oxygen_ros.sim.workcell import Workcell, WorkcellConfig
from oxygen_ros.training import data

NOISE_MODES = ("fresh", "episode")


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
    """How chunks are executed between observations."""

    execute_s: float = 0.5  # sim seconds of each chunk executed before the next observation
    action_dt_s: float = 1.0 / FPS  # seconds between chunk rows (the demonstrations' rate)
    control_hz: float = CONTROL_HZ  # target updates per sim second (the demonstrations' rate)
    noise: str = "fresh"  # fresh: new action noise per frame; episode: one draw per episode
    # The flow's starting noise times this (1: openpi's standard normal; 0: every frame starts
    # the denoising from zero, the deterministic sample).
    noise_scale: float = 1.0
    object_state: str = ""  # what follows the joints in the state (workcell_cubes.OBJECT_STATES)
    # The cube tracker moves its estimate on partial views too (False: whole views only, the
    # tracker before 2026-11-29; diagnostics.learner_vs_expert --whole-views-only).
    follow_partial_views: bool = True
    speak: bool = True  # a subtask request every frame, scored against the stage
    resolution: tuple[int, int] = (96, 96)  # model image size (the preset's image_resolution)
    preset: str = ""  # the checkpoint's model preset ("": the object state's, data.model_preset)
    # Every camera masked out of each frame (as `train --image-dropout` masks a sample's): the
    # policy sees the instruction and the state only.
    blind: bool = False
    # Real-time chunking (engine/rtc.py) with this cap on the guidance weight (the paper's
    # beta; 0: off): each chunk is denoised to continue the previous one where they overlap.
    # The sim waits for the engine, so the measured delay is 0 and no row is frozen.
    rtc_guidance: float = 0.0
    # Each new chunk handed over from the previous one over this many rows, as the inference
    # node's action stream does (`engine/action_stream.py`, `chunk_transition: blend`; the
    # workcell profile's `blend_steps` is 3): row k < N of the new chunk is (k + 1) / (N + 1)
    # of its own value and the rest the previous chunk's at the same time. 0: off (each chunk
    # at once, the rollouts before 2026-12-02).
    blend_steps: int = 0
    # Every frame's stage, spoken subtask and cube state in `EpisodeResult.frame_log` (where
    # the spoken phase goes wrong, and what the state said there).
    log_frames: bool = False

    def __post_init__(self) -> None:
        if self.noise not in NOISE_MODES:
            raise ValueError(f"noise must be one of {NOISE_MODES}, got {self.noise!r}")
        if self.object_state not in workcell_cubes.OBJECT_STATES:
            raise ValueError(
                f"object_state must be one of {workcell_cubes.OBJECT_STATES}, "
                f"got {self.object_state!r}"
            )
        if self.blend_steps < 0:
            raise ValueError(f"blend_steps must be >= 0, got {self.blend_steps}")
        if self.rtc_guidance < 0:
            raise ValueError(f"rtc_guidance must be >= 0, got {self.rtc_guidance}")
        if not 0.0 <= self.noise_scale <= 1.0:
            raise ValueError(f"noise_scale must be in [0, 1], got {self.noise_scale}")
        if not self.execute_s > 0 or not self.action_dt_s > 0 or not self.control_hz > 0:
            raise ValueError("execute_s, action_dt_s and control_hz must be > 0")
        data.model_preset(self.preset, self.object_state)  # raises for a mismatched preset


@dataclasses.dataclass
class EpisodeResult:
    seed: int
    instruction: str
    template: str
    arm: str
    success: bool
    furthest_stage: int  # index into tasks.subtask_labels(spec)
    num_stages: int
    min_pinch_distance_m: float  # closest the episode arm's pinch point came to the cube centre
    frames: int
    sim_s: float
    subtask_hits: int  # frames whose spoken subtask equals the stage at the observation
    subtask_said: int  # frames with a spoken subtask
    moved_arms: list[str]  # per frame: the arm the chunk moves more (evaluation.moved_arm's rule)
    # stage at the observation -> spoken subtask -> frames (the confusion behind subtask_hits)
    subtask_confusion: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)
    # the highest the cube's bottom rose above the table while the episode's arm held it
    # (tasks.evaluate's held and lift_m; 0 when never held), and whether it held it at the end
    # (a grasp that stalls below the hold height from one that dropped the cube)
    highest_held_lift_m: float = 0.0
    held_at_end: bool = False
    # the pinch point's distance from the cube centre at the first tick the arm held the cube
    # (None: never held): where on the cube the grasp closed, a drop's cause or not
    first_held_pinch_m: float | None = None
    # with `RolloutConfig.log_frames`: per observation frame, `frame_record`'s fields
    frame_log: list[dict] | None = None


def frame_record(
    elapsed_s: float,
    evaluation: tasks.Evaluation,
    said: str | None,
    state: np.ndarray,
    names: Sequence[str],
) -> dict:
    """One frame of `EpisodeResult.frame_log`: its time in the episode, the stage of the state
    it was observed in (with `tasks.evaluate`'s held, lift and pinch distance), what the policy
    said, and the state's entries after the joints by name (the cube state the policy read)."""
    extra = np.asarray(state, np.float64)[robot.NUM_JOINTS :]
    return {
        "t": round(float(elapsed_s), 3),
        "stage": evaluation.stage,
        "said": said,
        "held": bool(evaluation.held),
        "lift_m": round(float(evaluation.lift_m), 4),
        "pinch_m": round(float(evaluation.pinch_distance_m), 4),
        "state": {name: round(float(v), 4) for name, v in zip(names, extra, strict=True)},
    }


def executed_rows(execute_s: float, dt: float) -> int:
    """How many of a chunk's first rows `chunk_target` passes through (or towards) while the
    chunk is executed for `execute_s`."""
    return int(np.ceil(execute_s / dt)) + 1


def episode_line(seed: int, e: EpisodeResult, seconds: float = math.nan) -> str:
    """One episode's result as the rollouts print it."""
    grasped = "-" if e.first_held_pinch_m is None else f"{1000 * e.first_held_pinch_m:.0f}mm"
    line = (
        f"seed {seed:>4} {e.instruction:45} success={e.success!s:5} "
        f"stage={e.furthest_stage}/{e.num_stages - 1} "
        f"closest={1000 * e.min_pinch_distance_m:.0f}mm "
        f"lifted={1000 * e.highest_held_lift_m:.0f}mm{' held' if e.held_at_end else ''} "
        f"grasped_at={grasped} "
        f"subtask={e.subtask_hits}/{e.subtask_said} "
        f"first_arm={e.moved_arms[0]} ({e.arm})"
    )
    return line if math.isnan(seconds) else f"{line} {seconds:.0f} s"


def chunk_target(rows: np.ndarray, dt: float, elapsed: float) -> np.ndarray:
    """The target `elapsed` seconds after row 0: linear between rows, the last row after it."""
    position = max(elapsed, 0.0) / dt
    k = min(int(np.floor(position)), len(rows) - 1)
    if k == len(rows) - 1:
        return rows[-1]
    w = position - k
    return rows[k] + w * (rows[k + 1] - rows[k])


class EnginePolicy:
    """A checkpoint served by the engine (shared_kv, one frame per observation)."""

    def __init__(self, engine: Engine, config: RolloutConfig) -> None:
        self.engine = engine
        self.config = config
        self._seed = 0
        self._frame = 0
        self.stamp = 0.0  # the engine's clock: the sim waits for it, so no latency

    def reset(self, workcell: Workcell, spec: tasks.EpisodeSpec) -> None:
        self._seed, self._frame = spec.seed, 0
        self.engine.new_task()  # real-time chunking does not continue the last episode

    def act(self, workcell: Workcell, observation: Observation) -> tuple[np.ndarray, str | None]:
        """The chunk's joint rows [A, 14] and the spoken subtask (None when not asked)."""
        index = self._seed * 100_000 + (0 if self.config.noise == "episode" else self._frame)
        self._frame += 1
        self.stamp = observation.stamp
        requests = [LanguageRequest(RequestKind.SUBTASK)] if self.config.speak else []
        result = self.engine.step(observation, requests, noise=self.engine.make_noise(index))
        said = next((o.text for o in result.outputs if o.kind is RequestKind.SUBTASK), None)
        return np.asarray(result.actions.actions, np.float64)[:, : robot.NUM_JOINTS], said


class ExpertPolicy:
    """The scripted expert's plan, cut into chunks like the model's (the harness's positive
    control: the same execution must succeed with the demonstrations' own targets)."""

    def __init__(self, config: RolloutConfig, horizon: int = 10) -> None:
        self.config = config
        self.horizon = horizon
        self._plan = None

    def reset(self, workcell: Workcell, spec: tasks.EpisodeSpec) -> None:
        from oxygen_ros.sim.expert import ScriptedExpert

        self._plan = ScriptedExpert(workcell.model).plan_for(workcell, spec)

    def act(self, workcell: Workcell, observation: Observation) -> tuple[np.ndarray, str | None]:
        rows = self._plan.rows(observation.stamp, self.config.action_dt_s, self.horizon)
        return rows, self._plan.subtask(observation.stamp)


def blending_stream(config: RolloutConfig) -> ActionStream | None:
    """The inference node's action stream with only its blend (no clamps, no age limit: the
    sim waits for the engine), or None when `config.blend_steps` is 0."""
    if not config.blend_steps:
        return None
    stream_config = StreamConfig(
        dt=config.action_dt_s,
        num_joints=robot.NUM_JOINTS,
        blend_mode="blend",
        blend_steps=config.blend_steps,
        max_chunk_age_s=math.inf,
    )
    return ActionStream(stream_config)


def run_episode(policy, workcell: Workcell, seed: int, config: RolloutConfig) -> EpisodeResult:
    """One closed-loop episode of `policy` (`reset(workcell, spec)`, `act(workcell,
    observation) -> (rows [A, 14], subtask text or None)`)."""
    from oxygen_ros.training.evaluation import moved_arm  # pulls in the optimiser stack

    spec = tasks.sample_episode(seed)
    labels = tasks.subtask_labels(spec)
    workcell.reset(robot.HOME, spec.objects)
    start = workcell.time
    policy.reset(workcell, spec)
    tracker = tasks.SuccessTracker()
    cubes = workcell_cubes.object_state(
        config.object_state,
        data.target_of(config.object_state, spec),
        follow_partial_views=config.follow_partial_views,
    )
    ticks_per_frame = max(1, round(config.execute_s * config.control_hz))
    stream = blending_stream(config)  # one per episode: a new episode continues nothing
    furthest, frames, hits, said = 0, 0, 0, 0
    confusion: dict[str, collections.Counter[str]] = {}
    frame_log: list[dict] | None = [] if config.log_frames else None
    state_names = () if cubes is None else cubes.names
    closest, highest, first_held = np.inf, 0.0, None
    moved: list[str] = []
    evaluation = tasks.evaluate(workcell, spec)  # of the state each observation is taken in
    while workcell.time - start < spec.time_limit_s and not tracker.succeeded:
        observation = data.observe(
            workcell, spec.instruction, config.resolution, cubes, workcell.time
        )
        if config.blind:
            masks = dict.fromkeys(observation.image_masks, False)
            observation = dataclasses.replace(observation, image_masks=masks)
        stage = evaluation.stage
        rows, subtask = policy.act(workcell, observation)
        moved.append(moved_arm(rows, observation.state[: robot.NUM_JOINTS]))
        if stream is not None:  # the sim waits for the engine: no row has passed
            chunk = stream.offer(rows, observation.stamp, 0.0, now=observation.stamp)
            rows = np.asarray(chunk.rows, np.float64)
        if subtask is not None:
            said += 1
            hits += subtask == stage
            confusion.setdefault(stage, collections.Counter())[subtask] += 1
        if frame_log is not None:
            frame_log.append(
                frame_record(
                    observation.stamp - start, evaluation, subtask, observation.state, state_names
                )
            )
        frames += 1
        for tick in range(ticks_per_frame):
            workcell.set_targets(chunk_target(rows, config.action_dt_s, tick / config.control_hz))
            workcell.step(1.0 / config.control_hz)
            evaluation = tasks.evaluate(workcell, spec)
            furthest = max(furthest, labels.index(evaluation.stage))
            closest = min(closest, evaluation.pinch_distance_m)
            if evaluation.held:
                highest = max(highest, evaluation.lift_m)
                if first_held is None:
                    first_held = evaluation.pinch_distance_m
            if tracker.update(evaluation, workcell.time) or workcell.time - start >= (
                spec.time_limit_s
            ):
                break
    return EpisodeResult(
        seed=seed,
        instruction=spec.instruction,
        template=spec.template,
        arm=spec.arm,
        success=tracker.succeeded,
        furthest_stage=furthest,
        num_stages=len(labels),
        min_pinch_distance_m=float(closest),
        frames=frames,
        sim_s=workcell.time - start,
        subtask_hits=hits,
        subtask_said=said,
        moved_arms=moved,
        subtask_confusion={stage: dict(spoken) for stage, spoken in confusion.items()},
        highest_held_lift_m=float(highest),
        held_at_end=bool(evaluation.held),
        first_held_pinch_m=first_held,
        frame_log=frame_log,
    )


def summarise(episodes: Sequence[EpisodeResult]) -> dict:
    said = sum(e.subtask_said for e in episodes)
    grasped = [e.first_held_pinch_m for e in episodes if e.first_held_pinch_m is not None]
    return {
        "episodes": len(episodes),
        "success_rate": float(np.mean([e.success for e in episodes])) if episodes else 0.0,
        "subtask_accuracy": sum(e.subtask_hits for e in episodes) / said if said else None,
        "first_arm_right": float(np.mean([e.moved_arms[0] == e.arm for e in episodes]))
        if episodes
        else 0.0,
        "furthest_stage_mean": float(np.mean([e.furthest_stage for e in episodes]))
        if episodes
        else 0.0,
        "min_pinch_distance_median_m": float(np.median([e.min_pinch_distance_m for e in episodes]))
        if episodes
        else 0.0,
        "first_held_pinch_median_m": float(np.median(grasped)) if grasped else None,
        "subtask_confusion": merged_confusion(episodes),
    }


def merged_confusion(episodes: Sequence[EpisodeResult]) -> dict[str, dict[str, int]]:
    """Every episode's `subtask_confusion` summed: stage -> spoken subtask -> frames."""
    merged: dict[str, collections.Counter[str]] = {}
    for episode in episodes:
        for stage, spoken in episode.subtask_confusion.items():
            merged.setdefault(stage, collections.Counter()).update(spoken)
    return {stage: dict(spoken.most_common()) for stage, spoken in sorted(merged.items())}


def make_policy(
    checkpoint: str, config: RolloutConfig
) -> tuple[EnginePolicy | ExpertPolicy, RolloutConfig]:
    """The policy a checkpoint directory (or "expert") names, and `config` at its model's
    image resolution."""
    from oxygen_ros.training.train import engine_config

    if checkpoint == "expert":
        return ExpertPolicy(config), config
    preset = data.model_preset(config.preset, config.object_state)
    rtc = RtcConfig(
        enabled=config.rtc_guidance > 0,
        row_dt_s=config.action_dt_s,
        max_guidance=config.rtc_guidance,
    )
    served = engine_config(
        checkpoint,
        preset=preset,
        scheduler=SchedulerConfig(mode="shared_kv"),
        rtc=rtc,
        action_noise_scale=config.noise_scale,
    )
    policy = EnginePolicy(Engine(served, clock=lambda: policy.stamp), config)
    policy.config = dataclasses.replace(
        config, resolution=policy.engine.config.model.image_resolution
    )
    return policy, policy.config


def rollouts(
    checkpoint: str, seeds: Sequence[int], config: RolloutConfig
) -> tuple[list[EpisodeResult], dict]:
    """Runs every seed with one policy and one workcell (checkpoint "expert": the scripted
    expert); returns per-episode results and the summary."""
    policy, config = make_policy(checkpoint, config)
    workcell = Workcell(WorkcellConfig())
    episodes = []
    try:
        for seed in seeds:
            started = time.monotonic()
            episodes.append(run_episode(policy, workcell, seed, config))
            print(episode_line(seed, episodes[-1], time.monotonic() - started), flush=True)
    finally:
        workcell.close()
    return episodes, summarise(episodes)


def parse_seeds(text: str) -> list[int]:
    """ "0:10" -> 0..9; "3,5,8" -> those."""
    if ":" in text:
        first, stop = (int(v) for v in text.split(":"))
        return list(range(first, stop))
    return [int(v) for v in text.split(",") if v]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--checkpoint", required=True, help='a checkpoint dir, or "expert"')
    parser.add_argument("--seeds", default="0:10", help='"first:stop" or "a,b,c"')
    parser.add_argument("--execute-s", type=float, default=RolloutConfig.execute_s)
    parser.add_argument("--noise", choices=NOISE_MODES, default=RolloutConfig.noise)
    parser.add_argument("--noise-scale", type=float, default=RolloutConfig.noise_scale)
    data.add_object_state_argument(parser)
    parser.add_argument("--no-speak", action="store_true")
    parser.add_argument("--blind", action="store_true", help="every camera masked out")
    parser.add_argument(
        "--rtc-guidance", type=float, default=0.0, help="real-time chunking's beta (0: off)"
    )
    parser.add_argument(
        "--blend-steps",
        type=int,
        default=RolloutConfig.blend_steps,
        help="each new chunk blended in over this many rows, as the inference node does (0: off)",
    )
    parser.add_argument(
        "--log-frames", action="store_true", help="each frame's stage, words and cube state"
    )
    parser.add_argument("--out", default="")
    args = parser.parse_args(argv)
    config = RolloutConfig(
        execute_s=args.execute_s,
        noise=args.noise,
        noise_scale=args.noise_scale,
        object_state=args.object_state,
        speak=not args.no_speak,
        blind=args.blind,
        rtc_guidance=args.rtc_guidance,
        preset=args.preset,
        blend_steps=args.blend_steps,
        log_frames=args.log_frames,
    )
    episodes, summary = rollouts(args.checkpoint, parse_seeds(args.seeds), config)
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(
            json.dumps(
                {
                    "checkpoint": args.checkpoint,
                    "config": dataclasses.asdict(config),
                    "summary": summary,
                    "episodes": [dataclasses.asdict(e) for e in episodes],
                },
                indent=1,
            )
        )
    print(
        "rollout success={success_rate:.2f} subtask={subtask_accuracy} "
        "first_arm={first_arm_right:.2f} furthest_stage={furthest_stage_mean:.2f} "
        "episodes={episodes}".format(**summary)
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
