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
import threading
import time
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
STRIP_TIMES_S = (0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0)  # sim seconds after the reset
START_WINDOW_S = 0.5  # sim seconds after the reset the idle arm's start move is measured over
STARTUP_TIMEOUT_S = 300.0  # the inference node compiles the model at start
# --scheduler name -> inference (scheduler_mode, scheduler_policy)
SCHEDULERS = {
    "isolated": ("isolated", "fixed"),
    "shared_kv": ("shared_kv", "fixed"),
    "continuous": ("continuous", "fixed"),
    "deadline": ("continuous", "deadline"),
}


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


@dataclasses.dataclass
class EpisodeRecord:
    """What one episode measured."""

    seed: int
    instruction: str
    template: str
    success: bool
    time_to_success_s: float  # simulated seconds; NaN when it failed
    elapsed_s: float  # simulated seconds until the episode ended
    wall_s: float  # wall seconds from the reset to the end
    realtime_factor: float  # elapsed_s / wall_s
    starvation_events: int
    jerk_mean: float  # rad/s^3, arm joints
    jerk_max: float
    chunk_jump_mean: float  # rad, max over joints per chunk boundary, mean over boundaries
    chunk_jump_max: float
    chunks: int  # distinct chunks received during the episode
    subtasks_spoken: int
    subtasks_correct: int
    narrations_spoken: int = 0
    narrations_correct: int = 0
    memories_written: int = 0
    memories_correct: int = 0
    spoken_examples: tuple[str, ...] = ()  # a few "kind@t: said | expected" lines
    furthest_stage: int = -1  # index of the furthest phase the sim state reached (-1: none)
    furthest_stage_label: str = ""
    idle_arm_start_move_rad: float = float("nan")  # `idle_arm_start_move`


def _seconds(stamp) -> float:
    return stamp.sec + 1e-9 * stamp.nanosec


def joint_jerk(stamps: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """|third derivative| per sample and joint by finite differences over uneven stamps."""
    if len(stamps) < 4:
        return np.zeros((0, positions.shape[1] if positions.ndim == 2 else 0))
    v = np.diff(positions, axis=0) / np.diff(stamps)[:, None]
    a = np.diff(v, axis=0) / np.diff(stamps[1:])[:, None]
    j = np.diff(a, axis=0) / np.diff(stamps[2:])[:, None]
    return np.abs(j)


def chunk_jumps(chunks: list[tuple[int, float, float, np.ndarray]]) -> list[float]:
    """Jump at each chunk boundary: first row of a new chunk vs the previous chunk sampled at
    that row's time (linear between rows, held past its end). chunks: (id, start, dt, rows)."""
    jumps = []
    previous = None
    for chunk_id, start, dt, rows in chunks:
        if previous is not None and chunk_id != previous[0]:
            _, p_start, p_dt, p_rows = previous
            x = np.clip((start - p_start) / p_dt, 0.0, len(p_rows) - 1)
            k = int(np.floor(x))
            frac = x - k
            k1 = min(k + 1, len(p_rows) - 1)
            before = (1 - frac) * p_rows[k] + frac * p_rows[k1]
            jumps.append(float(np.max(np.abs(rows[0] - before))))
        if previous is None or chunk_id != previous[0]:
            previous = (chunk_id, start, dt, rows)
    return jumps


def idle_arm_start_move(
    joint_names: list[str],
    stamps: np.ndarray,
    positions: np.ndarray,
    task_arm: str,
    window_s: float = START_WINDOW_S,
) -> float:
    """The largest |move| from the first sample of the joints of the arm that is not
    `task_arm` (grippers left out) over the samples within `window_s` of the first; NaN
    without samples. stamps [T] sim seconds of this episode, positions [T, J]."""
    idle = [
        i
        for i, n in enumerate(joint_names)
        if not n.startswith(f"{task_arm}_") and not n.endswith("gripper")
    ]
    if not len(stamps) or not idle:
        return float("nan")
    early = positions[stamps <= stamps[0] + window_s][:, idle]
    return float(np.abs(early - early[0]).max())


def stage_at(stages: list[tuple[float, str]], stamp: float) -> str:
    """The last stage reported at or before `stamp` ("" before the first report)."""
    stamps = [t for t, _ in stages]
    i = int(np.searchsorted(stamps, stamp, side="right")) - 1
    return stages[i][1] if i >= 0 else ""


def furthest_stage(
    seed: int, instruction: str, stages: list[tuple[float, str]]
) -> tuple[int, str]:
    """The furthest phase (index, label) the sim reported this episode; (-1, "") if none."""
    from oxygen_ros.sim import tasks

    labels = tasks.subtask_labels(tasks.sample_episode(seed, instruction))
    reached = [labels.index(stage) for _, stage in stages if stage in labels]
    return (max(reached), labels[max(reached)]) if reached else (-1, "")


def score_language(
    seed: int,
    instruction: str,
    reset_s: float,
    stages: list[tuple[float, str]],
    spoken: list[tuple[int, str, float]],
    memories: list[tuple[str, float]],
) -> dict[str, object]:
    """Counts what the model said this episode and how much of it the sim state confirms.

    Only requests started from an observation of this episode count (observation stamp after
    the reset and at or after the first stage report)."""
    from oxygen_ros.msg import SpeechToken
    from oxygen_ros.sim import language, tasks

    spec = tasks.sample_episode(seed, instruction)
    counts = dict.fromkeys(
        (
            "subtasks_spoken", "subtasks_correct", "narrations_spoken", "narrations_correct",
            "memories_written", "memories_correct",
        ),
        0,
    )  # fmt: skip
    examples: list[str] = []
    first = stages[0][0] if stages else float("inf")

    def expected(kind: str, stamp: float) -> str | None:
        if stamp <= reset_s or stamp < first:
            return None
        return language.targets(spec, language.stage_index(spec, stage_at(stages, stamp)))[kind]

    kinds = {SpeechToken.KIND_SUBTASK: "subtask", SpeechToken.KIND_NARRATION: "narration"}
    items = [(kinds[k], text, t) for k, text, t in spoken if k in kinds]
    items += [("memory", text, t) for text, t in memories]
    for kind, text, stamp in sorted(items, key=lambda item: item[2]):
        want = expected(kind, stamp)
        if want is None:
            continue
        said, right = {
            "subtask": ("subtasks_spoken", "subtasks_correct"),
            "narration": ("narrations_spoken", "narrations_correct"),
            "memory": ("memories_written", "memories_correct"),
        }[kind]
        counts[said] += 1
        correct = language.same_text(text, want)
        counts[right] += int(correct)
        if len(examples) < 12 and (not correct or len(examples) < 4):
            examples.append(f"{kind}@{stamp - reset_s:.1f}s: {text!r} | {want!r}")
    return {**counts, "spoken_examples": tuple(examples)}


class Evaluator:
    """The graph's processes plus a measuring node in this process."""

    def __init__(self, args: argparse.Namespace, log_dir: Path) -> None:
        import rclpy
        from rclpy.executors import SingleThreadedExecutor

        from oxygen_ros import bringup, graph

        self.args = args
        self.lock = threading.Lock()
        launch = {
            "profile": "workcell",
            "use_sim": "true",
            "policy": args.policy,
            "real_time_factor": repr(args.real_time_factor),
        }
        if args.params_file:
            launch["params_file"] = args.params_file
        nodes = graph.resolve(launch)
        self.params_file = Path(nodes[0].params_file)
        self.config = yaml.safe_load(self.params_file.read_text())
        # Extra parameters ride on the graph's own overrides (`-p node:param:=value`).
        extra: dict[str, dict[str, str]] = {}
        for item in args.ros_arg:
            node_name, assignment = item.split(":", 1)
            key, value = assignment.split(":=", 1)
            extra.setdefault(node_name, {})[key] = value
        if args.policy == "model":
            extra.setdefault("inference", {})["memory_db_path"] = str(log_dir / "memory.sqlite3")
            if args.scheduler:
                mode, policy = SCHEDULERS[args.scheduler]
                extra["inference"].update(scheduler_mode=mode, scheduler_policy=policy)
        nodes = [
            dataclasses.replace(n, overrides={**n.overrides, **extra.get(n.spec.name, {})})
            for n in nodes
        ]
        self.children = bringup.start_children(nodes, log_dir)
        rclpy.init(args=[])  # not sys.argv: rcl would read --ros-arg values as remap rules
        self.node = rclpy.create_node("closed_loop_eval")
        self.executor = SingleThreadedExecutor()
        self.executor.add_node(self.node)
        self._subscribe()
        self.spin_thread = threading.Thread(target=self.executor.spin, daemon=True)
        self.spin_thread.start()

    # ------------------------------------------------------------------ wiring
    def _param(self, node: str, name: str, default):
        section = self.config.get(node, {}).get("ros__parameters", {})
        shared = self.config.get("/**", {}).get("ros__parameters", {})
        return section.get(name, shared.get(name, default))

    def _subscribe(self) -> None:
        from diagnostic_msgs.msg import DiagnosticArray
        from sensor_msgs.msg import Image, JointState

        from oxygen_ros.msg import ActionChunk, EpisodeStatus, MemoryEntry, SpeechToken
        from oxygen_ros.nodes.runtime import RELIABLE_QOS, SENSOR_QOS, SPEECH_QOS
        from oxygen_ros.srv import ResetEpisode

        self.status: EpisodeStatus | None = None
        self.joints: list[tuple[float, np.ndarray]] = []
        self.chunks: list[tuple[int, float, float, np.ndarray]] = []
        self.stages: list[tuple[float, str]] = []  # (sim stamp, stage) from EpisodeStatus
        self.spoken: list[tuple[int, str, float]] = []  # (kind, final text, observation stamp)
        self.memories: list[tuple[str, float]] = []  # (text, observation stamp)
        self.diagnostics: list[dict[str, str]] = []  # inference node status values
        self.frames: dict[str, list[tuple[float, np.ndarray]]] = {}
        self.observations: list[object] = []  # ObservationFrame messages (--record-frames)
        self.capture = False
        self.last_reset_s = 0.0  # sim time of the last episode's reset
        self.joint_names = list(self._param("workcell_sim", "joint_names", []))
        sim = "workcell_sim"
        self.node.create_subscription(
            EpisodeStatus,
            self._param(sim, "episode_status_topic", "workcell/episode_status"),
            self._on_status,
            10,
        )
        self.node.create_subscription(
            JointState, self._param(sim, "joint_state_topic", "joint_states"), self._on_joints,
            SENSOR_QOS,
        )  # fmt: skip
        self.node.create_subscription(
            ActionChunk, self._param("inference", "actions_topic", "oxygen/actions"),
            self._on_chunk, RELIABLE_QOS,
        )  # fmt: skip
        self.node.create_subscription(
            SpeechToken, self._param("inference", "speech_topic", "oxygen/speech"),
            self._on_speech, SPEECH_QOS,
        )  # fmt: skip
        cameras = self._param(sim, "cameras", {})
        for camera in self._param(sim, "camera_names", []):
            self.frames[camera] = []
            self.node.create_subscription(
                Image, cameras[camera]["topic"], lambda m, c=camera: self._on_image(c, m),
                SENSOR_QOS,
            )  # fmt: skip
        self.node.create_subscription(
            MemoryEntry, self._param("inference", "memory_topic", "oxygen/memory"),
            self._on_memory, RELIABLE_QOS,
        )  # fmt: skip
        self.node.create_subscription(DiagnosticArray, "/diagnostics", self._on_diagnostics, 10)
        if self.args.record_frames:
            from oxygen_ros.msg import ObservationFrame
            from oxygen_ros.nodes.runtime import OBSERVATION_QOS

            self.node.create_subscription(
                ObservationFrame,
                self._param("perception", "observation_topic", "oxygen/observation"),
                self._on_observation,
                OBSERVATION_QOS,
            )
        self.reset_client = self.node.create_client(
            ResetEpisode, self._param(sim, "reset_service", "workcell/reset_episode")
        )

    def _on_status(self, msg) -> None:
        with self.lock:
            self.status = msg
            if msg.phase == msg.PHASE_RUNNING and msg.stage:
                self.stages.append((_seconds(msg.header.stamp), msg.stage))

    def _on_memory(self, msg) -> None:
        with self.lock:
            self.memories.append((msg.text.strip(), _seconds(msg.observation_stamp)))

    def _on_diagnostics(self, msg) -> None:
        for status in msg.status:
            if status.name.endswith("inference"):
                with self.lock:
                    self.diagnostics.append({kv.key: kv.value for kv in status.values})

    def _on_joints(self, msg) -> None:
        stamp = _seconds(msg.header.stamp)
        index = {n: i for i, n in enumerate(msg.name)}
        q = np.array([msg.position[index[n]] for n in self.joint_names if n in index])
        with self.lock:
            self.joints.append((stamp, q))

    def _on_chunk(self, msg) -> None:
        stamp = _seconds(msg.header.stamp)
        rows = np.asarray(msg.actions, dtype=np.float64).reshape(msg.horizon, -1)
        with self.lock:
            self.chunks.append((msg.chunk_id, stamp, msg.dt, rows))

    def _on_speech(self, msg) -> None:
        if not msg.final or msg.kind == msg.KIND_MEMORY or msg.status not in (1, 2):
            return
        with self.lock:
            self.spoken.append((msg.kind, msg.text.strip(), _seconds(msg.observation_stamp)))

    def _on_observation(self, msg) -> None:
        with self.lock:
            self.observations.append(msg)

    def _on_image(self, camera: str, msg) -> None:
        if not self.capture:
            return
        stamp = _seconds(msg.header.stamp)
        image = np.frombuffer(bytes(msg.data), np.uint8).reshape(msg.height, msg.width, -1)
        with self.lock:
            self.frames[camera].append((stamp, image[..., :3].copy()))

    # ------------------------------------------------------------------ episodes
    def wait_ready(self) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while self.status is None or not self.reset_client.service_is_ready():
            self._check_children()
            if time.monotonic() > deadline:
                raise RuntimeError("the workcell graph did not come up")
            time.sleep(0.1)
        if self.args.policy == "model":  # actions flow once the engine is warm
            while not self.chunks:
                self._check_children()
                if time.monotonic() > deadline:
                    raise RuntimeError("the inference node published no actions")
                time.sleep(0.2)

    def _check_children(self) -> None:
        for child in self.children:
            if child.popen.poll() is not None:
                raise RuntimeError(
                    f"{child.name} exited ({child.popen.returncode}); see {child.log_path}"
                )

    def run_episode(self, seed: int, capture: bool) -> EpisodeRecord:
        from oxygen_ros.srv import ResetEpisode

        request = ResetEpisode.Request(seed=seed, instruction=self.args.instruction)
        future = self.reset_client.call_async(request)
        deadline = time.monotonic() + 30.0
        while not future.done():
            if time.monotonic() > deadline:
                raise RuntimeError("ResetEpisode did not answer")
            time.sleep(0.01)
        reply = future.result()
        if not reply.success:
            raise RuntimeError(f"reset refused: {reply.message}")
        wall_start = time.monotonic()
        with self.lock:
            self.joints.clear()
            self.chunks.clear()
            self.spoken.clear()
            self.memories.clear()
            self.stages.clear()
            self.observations.clear()
            for frames in self.frames.values():
                frames.clear()
        self.capture = capture
        status = None
        while True:
            self._check_children()
            with self.lock:
                status = self.status
            if status is not None and status.episode_id == reply.episode_id:
                if status.phase not in (status.PHASE_IDLE, status.PHASE_RUNNING):
                    break
                limit_wall = status.time_limit_s / max(self.args.real_time_factor, 1e-3)
                if time.monotonic() - wall_start > 3 * limit_wall + 60:
                    raise RuntimeError(f"episode {seed} never ended")
            time.sleep(0.02)
        wall = time.monotonic() - wall_start
        self.capture = False
        with self.lock:
            joints = list(self.joints)
            chunks = list(self.chunks)
            spoken = list(self.spoken)
            memories = list(self.memories)
            stages = list(self.stages)
            observations = list(self.observations)
        # Joint states of this episode only (the reset teleports the robot to its rest pose),
        # in stamp order without repeats.
        reset_s = self.last_reset_s = _seconds(status.header.stamp) - status.elapsed_s
        joints = sorted({s: q for s, q in joints if s > reset_s}.items())
        arm = [i for i, n in enumerate(self.joint_names) if not n.endswith("gripper")]
        jerk = np.zeros((0, len(arm)))
        idle_move = float("nan")
        if joints:
            stamps = np.array([s for s, _ in joints])
            positions = np.array([q for _, q in joints])
            jerk = joint_jerk(stamps, positions[:, arm])
            from oxygen_ros.sim import tasks

            task_arm = tasks.sample_episode(seed, status.instruction).arm
            idle_move = idle_arm_start_move(self.joint_names, stamps, positions, task_arm)
        jumps = chunk_jumps(chunks)
        language = score_language(seed, status.instruction, reset_s, stages, spoken, memories)
        furthest, label = furthest_stage(seed, status.instruction, stages)
        if self.args.record_frames:
            save_frames(
                Path(self.args.record_frames) / f"seed_{seed}.npz",
                [m for m in observations if _seconds(m.header.stamp) > reset_s],
                reset_s=reset_s,
                instruction=status.instruction,
                spoken=spoken,
                memories=memories,
            )
        return EpisodeRecord(
            seed=seed,
            instruction=status.instruction,
            template=status.task_template,
            success=bool(status.success),
            time_to_success_s=status.time_to_success_s if status.success else float("nan"),
            elapsed_s=status.elapsed_s,
            wall_s=wall,
            realtime_factor=status.elapsed_s / wall if wall > 0 else float("nan"),
            starvation_events=int(status.starvation_events),
            jerk_mean=float(jerk.mean()) if jerk.size else float("nan"),
            jerk_max=float(jerk.max()) if jerk.size else float("nan"),
            chunk_jump_mean=float(np.mean(jumps)) if jumps else float("nan"),
            chunk_jump_max=float(np.max(jumps)) if jumps else float("nan"),
            chunks=len({c[0] for c in chunks}),
            furthest_stage=furthest,
            furthest_stage_label=label,
            idle_arm_start_move_rad=idle_move,
            **language,
        )

    def strip(self, path: Path, reset_stamp: float) -> bool:
        """Saves a PNG strip: one row per camera, one column per STRIP_TIMES_S entry."""
        from PIL import Image as PILImage

        with self.lock:
            frames = {c: list(f) for c, f in self.frames.items()}
        if not frames or not all(frames.values()):
            return False
        rows = []
        for camera in frames:
            stamps = np.array([s for s, _ in frames[camera]])
            picks = [int(np.argmin(np.abs(stamps - (reset_stamp + t)))) for t in STRIP_TIMES_S]
            rows.append(np.concatenate([frames[camera][k][1] for k in picks], axis=1))
        width = max(r.shape[1] for r in rows)
        rows = [np.pad(r, ((0, 0), (0, width - r.shape[1]), (0, 0))) for r in rows]
        PILImage.fromarray(np.concatenate(rows, axis=0)).save(path)
        return True

    def close(self) -> None:
        import rclpy

        from oxygen_ros import bringup

        bringup.stop_children(self.children, sys.stderr)
        self.executor.shutdown(timeout_sec=2.0)
        self.node.destroy_node()
        rclpy.try_shutdown()


def save_frames(
    path: Path,
    observations: list,
    reset_s: float,
    instruction: str,
    spoken: list[tuple[int, str, float]],
    memories: list[tuple[str, float]],
) -> None:
    """One episode's ObservationFrame messages as arrays (`--record-frames`): `stamps` [N]
    (observation time), `state_names`, `state` [N, D] (the joint_positions as published),
    `images` [N, slots, H, W, 3] with `image_valid` [N, slots], `image_names`, and what the
    model said (`speech`: kind, text, observation stamp; `memory`: text, observation stamp)."""
    from oxygen_ros.nodes.conversions import image_msg_to_rgb

    path.parent.mkdir(parents=True, exist_ok=True)
    first = observations[0] if observations else None
    np.savez_compressed(
        path,
        reset_s=reset_s,
        instruction=instruction,
        stamps=np.array([_seconds(m.header.stamp) for m in observations]),
        state_names=np.array(list(first.joint_names) if first else [], dtype=str),
        state=np.array([list(m.joint_positions) for m in observations], dtype=np.float64),
        image_names=np.array(list(first.image_names) if first else [], dtype=str),
        images=np.array(
            [[image_msg_to_rgb(i) for i in m.images] for m in observations], dtype=np.uint8
        ),
        image_valid=np.array([list(m.image_valid) for m in observations], dtype=bool),
        speech=np.array([json.dumps(s) for s in spoken], dtype=str),
        memory=np.array([json.dumps(m) for m in memories], dtype=str),
    )


def summarise(records: list[EpisodeRecord]) -> dict[str, float]:
    def finite(statistic):
        """`statistic` over the finite values (NaN when there are none)."""

        def of(values):
            values = [v for v in values if np.isfinite(v)]
            return float(statistic(values)) if values else float("nan")

        return of

    mean, median = finite(np.mean), finite(np.median)

    def ratio(hits: str, total: str) -> float:
        count = sum(getattr(r, total) for r in records)
        return sum(getattr(r, hits) for r in records) / count if count else float("nan")

    spoken = sum(r.subtasks_spoken for r in records)
    return {
        "episodes": len(records),
        "success_rate": mean([float(r.success) for r in records]),
        "time_to_success_s_mean": mean([r.time_to_success_s for r in records]),
        "realtime_factor_mean": mean([r.realtime_factor for r in records]),
        "starvation_events_total": int(sum(r.starvation_events for r in records)),
        "jerk_mean": mean([r.jerk_mean for r in records]),
        "jerk_max": float(
            max((r.jerk_max for r in records if np.isfinite(r.jerk_max)), default=float("nan"))
        ),
        "chunk_jump_mean": mean([r.chunk_jump_mean for r in records]),
        "idle_arm_start_move_rad_median": median([r.idle_arm_start_move_rad for r in records]),
        "chunk_jump_max": float(
            max(
                (r.chunk_jump_max for r in records if np.isfinite(r.chunk_jump_max)),
                default=float("nan"),
            )
        ),
        "subtasks_spoken": spoken,
        "subtask_accuracy": ratio("subtasks_correct", "subtasks_spoken"),
        "narrations_spoken": int(sum(r.narrations_spoken for r in records)),
        "narration_accuracy": ratio("narrations_correct", "narrations_spoken"),
        "memories_written": int(sum(r.memories_written for r in records)),
        "memory_accuracy": ratio("memories_correct", "memories_written"),
    }


def inference_figures(diagnostics: list[dict[str, str]]) -> dict[str, float]:
    """Frame time and token rate percentiles from the inference node's diagnostics."""

    def values(key: str) -> np.ndarray:
        out = []
        for d in diagnostics:
            try:
                out.append(float(d.get(key, "nan")))
            except ValueError:
                continue
        array = np.array(out, dtype=float)
        return array[np.isfinite(array)]

    frame, tokens = values("frame_time_s"), values("tokens_per_s")
    nan = float("nan")
    return {
        "frame_time_s_p50": float(np.percentile(frame, 50)) if frame.size else nan,
        "frame_time_s_p90": float(np.percentile(frame, 90)) if frame.size else nan,
        "tokens_per_s_mean": float(tokens.mean()) if tokens.size else nan,
        "diagnostics_samples": int(frame.size),
    }


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
