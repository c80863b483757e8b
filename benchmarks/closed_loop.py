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
- with `--policy model`: subtask accuracy, the spoken subtask (final SpeechToken text of each
  subtask request) against the stage the simulator state was in when it was spoken.

Writes JSON + a PNG strip of camera frames from the first episode to benchmarks/results/ and
prints a table; the last line is `success_rate=<x> episodes=<n> realtime_factor=<r>`
(plus ` subtask_accuracy=<y>` when the policy speaks).

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
STARTUP_TIMEOUT_S = 300.0  # the inference node compiles the model at start


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
    parser.add_argument("--out", default="", help="JSON path (default benchmarks/results/...)")
    parser.add_argument("--log-dir", default="", help="node logs (default: a temporary dir)")
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
        nodes = [
            dataclasses.replace(n, overrides={**n.overrides, **extra.get(n.spec.name, {})})
            for n in nodes
        ]
        self.children = bringup.start_children(nodes, log_dir)
        rclpy.init()
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
        from sensor_msgs.msg import Image, JointState

        from oxygen_ros.msg import ActionChunk, EpisodeStatus, SpeechToken
        from oxygen_ros.nodes.runtime import RELIABLE_QOS, SENSOR_QOS, SPEECH_QOS
        from oxygen_ros.srv import ResetEpisode

        self.status: EpisodeStatus | None = None
        self.joints: list[tuple[float, np.ndarray]] = []
        self.chunks: list[tuple[int, float, float, np.ndarray]] = []
        self.spoken: list[tuple[str, str]] = []  # (spoken subtask, stage when it was spoken)
        self.frames: dict[str, list[tuple[float, np.ndarray]]] = {}
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
        self.reset_client = self.node.create_client(
            ResetEpisode, self._param(sim, "reset_service", "workcell/reset_episode")
        )

    def _on_status(self, msg) -> None:
        with self.lock:
            self.status = msg

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
        if not msg.final or msg.kind != msg.KIND_SUBTASK or msg.status not in (1, 2):
            return
        with self.lock:
            stage = self.status.stage if self.status is not None else ""
            self.spoken.append((msg.text.strip(), stage))

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
        # Joint states of this episode only (the reset teleports the robot to its rest pose),
        # in stamp order without repeats.
        reset_s = self.last_reset_s = _seconds(status.header.stamp) - status.elapsed_s
        joints = sorted({s: q for s, q in joints if s > reset_s}.items())
        arm = [i for i, n in enumerate(self.joint_names) if not n.endswith("gripper")]
        jerk = np.zeros((0, len(arm)))
        if joints:
            stamps = np.array([s for s, _ in joints])
            jerk = joint_jerk(stamps, np.array([q for _, q in joints])[:, arm])
        jumps = chunk_jumps(chunks)
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
            subtasks_spoken=len(spoken),
            subtasks_correct=sum(1 for text, stage in spoken if text == stage),
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


def summarise(records: list[EpisodeRecord]) -> dict[str, float]:
    def mean(values):
        values = [v for v in values if np.isfinite(v)]
        return float(np.mean(values)) if values else float("nan")

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
        "chunk_jump_max": float(
            max(
                (r.chunk_jump_max for r in records if np.isfinite(r.chunk_jump_max)),
                default=float("nan"),
            )
        ),
        "subtasks_spoken": spoken,
        "subtask_accuracy": (sum(r.subtasks_correct for r in records) / spoken)
        if spoken
        else float("nan"),
    }


def print_table(records: list[EpisodeRecord], summary: dict[str, float]) -> None:
    header = (
        f"{'seed':>6} {'ok':>3} {'t_succ':>7} {'rtf':>5} {'starve':>6} {'jerk':>8} "
        f"{'jump':>6} {'chunks':>6}  instruction"
    )
    print(header)
    for r in records:
        print(
            f"{r.seed:>6} {'yes' if r.success else 'no':>3} {r.time_to_success_s:7.2f} "
            f"{r.realtime_factor:5.2f} {r.starvation_events:>6} {r.jerk_mean:8.1f} "
            f"{r.chunk_jump_mean:6.3f} {r.chunks:>6}  {r.instruction}"
        )
    print(
        f"success {summary['success_rate']:.2%} of {summary['episodes']}, time to success "
        f"{summary['time_to_success_s_mean']:.2f} s, real-time factor "
        f"{summary['realtime_factor_mean']:.2f}, starvation events "
        f"{summary['starvation_events_total']}, jerk mean {summary['jerk_mean']:.1f} "
        f"max {summary['jerk_max']:.1f} rad/s^3, chunk jump mean {summary['chunk_jump_mean']:.4f}"
        f" max {summary['chunk_jump_max']:.4f} rad"
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    RESULTS.mkdir(parents=True, exist_ok=True)
    tag = f"closed_loop_{args.policy}_rtf{args.real_time_factor:g}"
    out = Path(args.out) if args.out else RESULTS / f"{tag}.json"
    log_dir = Path(args.log_dir or tempfile.mkdtemp(prefix="oxygen_closed_loop_"))
    log_dir.mkdir(parents=True, exist_ok=True)
    evaluator = Evaluator(args, log_dir)
    records: list[EpisodeRecord] = []
    strip_path = out.with_suffix(".png")
    started = time.monotonic()
    try:
        evaluator.wait_ready()
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
    result = {
        "benchmark": "closed_loop",
        "policy": args.policy,
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
        line += f" subtask_accuracy={summary['subtask_accuracy']:.2f}"
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
