"""closed_loop's evaluator: the workcell graph's processes plus a measuring node.

`Evaluator` starts the graph (`profile:=workcell use_sim:=true policy:=<policy>` with the
run's parameter overrides), subscribes to what it publishes, resets each seeded episode
through the sim's ResetEpisode service, waits for its end and turns what it collected into an
`EpisodeRecord` (closed_loop_metrics); `strip` saves the first episode's camera frames as a
PNG; `save_frames` writes one episode's observation frames (`--record-frames`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import threading
import time
from pathlib import Path

import numpy as np
import yaml
from closed_loop_metrics import (
    EpisodeRecord,
    chunk_jumps,
    furthest_stage,
    idle_arm_start_move,
    joint_jerk,
    score_language,
)

STRIP_TIMES_S = (0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0)  # sim seconds after the reset
STARTUP_TIMEOUT_S = 300.0  # the inference node compiles the model at start
# --scheduler name -> inference (scheduler_mode, scheduler_policy)
SCHEDULERS = {
    "isolated": ("isolated", "fixed"),
    "shared_kv": ("shared_kv", "fixed"),
    "continuous": ("continuous", "fixed"),
    "deadline": ("continuous", "deadline"),
}


def _seconds(stamp) -> float:
    return stamp.sec + 1e-9 * stamp.nanosec


class Evaluator:
    """The graph's processes plus a measuring node in this process."""

    def __init__(self, args: argparse.Namespace, log_dir: Path) -> None:
        import rclpy
        from rclpy.executors import SingleThreadedExecutor

        from oxygen_ros import graph, supervisor

        self.args = args
        self.lock = threading.Lock()
        launch = {
            "profile": "workcell",
            "use_sim": "true",
            "policy": args.policy,
            "real_time_factor": repr(args.real_time_factor),
            "view": "false",  # the evaluator is its own observer
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
        self.children = supervisor.start_children(nodes, log_dir)
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
        from oxygen_ros.nodes.common.runtime import RELIABLE_QOS, SENSOR_QOS, SPEECH_QOS
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
            from oxygen_ros.nodes.common.runtime import OBSERVATION_QOS

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

        from oxygen_ros import supervisor

        supervisor.stop_children(self.children, sys.stderr)
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
    from oxygen_ros.nodes.common.conversions import image_msg_to_rgb

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
