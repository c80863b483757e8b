"""Scripted expert: acts in the simulated workcell THROUGH ROS, exactly as the inference node
does (ActionChunks on `actions_topic`), and optionally records demonstrations.

Thin ROS shell around `sim.expert.ScriptedExpert` (what to do) and
`expert_recording.EpisodeRecorder` (stamp pairing, episode files, the HDF5 writer thread):
- On an `EpisodeStatus` with a new `episode_id` in RUNNING it rebuilds the episode's spec from
  the seed and instruction (`tasks.sample_episode`), takes the object poses from the status's
  ground truth and the joints from the first JointState stamped after the reset, and plans
  (plan start = the node clock then, never before that joint state's stamp).
- A timer at `publish_rate_hz` (node clock: sim time under `use_sim_time`) publishes the plan's
  next `horizon` rows `action_dt_s` apart from now: `header.stamp` = now, `observation_stamp`
  = the plan's start (the state it was planned from), `chunk_id` +1 per plan. The plan's
  subtask label is published on `subtask_topic` (latched) when it changes, and at the start
  of every plan.
- When the episode leaves RUNNING the expert stops publishing and the robot holds the last
  row of the last chunk (the plan's target one horizon after the end) until the next episode;
  nothing is published between a new episode's status and its plan either. It does not keep
  republishing the old plan after the end: such a chunk that reached the sim after the next
  reset (before the expert heard of it) drove the freshly reset arm towards the old final
  pose; measured, 2 of 30 episodes failed that way, an arm jammed past its elbow limit. (The
  sim now also refuses chunks observed before its last reset, and rate-limits targets.)
- Recording (`record_dir` not empty): one `episode_<index>.hdf5` per episode, indices after
  the files already there. A step is one image of every camera plus a JointState, all with the
  SAME stamp (the sim renders them in one tick); anything else is counted (`record.sync.*`)
  and skipped, never paired with a neighbour. Steps after the reset up to the first status
  that is no longer RUNNING are written, then the file closes (success = SUCCEEDED; see
  `EpisodeRecorder` for interrupted and empty episodes). A step's action is the plan's target
  at the step's stamp (before the plan starts: its start pose, which the sim holds after the
  reset), its label the plan's subtask there. An episode still open at shutdown is discarded.

Threads: every callback runs on one single-threaded executor (cheap work only: planning takes
10-30 ms once per episode); the writer thread converts, compresses and writes the HDF5 files.
Measured over 6 recorded episodes at real time, against rclpy's two-thread executor with a
callback group for the images: 11.7 s instead of 37.4 s of CPU, the longest publish callback
3.7 ms instead of 38 ms, the longest gap between joint state callbacks 49 ms instead of 255 ms.
`_lock` guards the plan state (so a multi-threaded executor would stay safe); the recorder has its
own lock.
"""

from __future__ import annotations

import array
import collections
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from diagnostic_msgs.msg import DiagnosticArray
from rclpy.node import Node
from rclpy.qos import QoSDurabilityPolicy, QoSHistoryPolicy, QoSProfile, QoSReliabilityPolicy
from sensor_msgs.msg import Image, JointState
from std_msgs.msg import String

from oxygen_ros.msg import ActionChunk, EpisodeStatus
from oxygen_ros.nodes.common.conversions import image_msg_to_rgb, seconds_to_time
from oxygen_ros.nodes.common.parameters import NodeParameters, camera_specs
from oxygen_ros.nodes.common.runtime import (
    LATCHED_QOS,
    RELIABLE_QOS,
    ReasonThrottle,
    latched_qos,
    now_s,
    publish_status,
    run_node,
)
from oxygen_ros.nodes.workcell.expert_recording import (
    NS_PER_S,
    EpisodeRecorder,
    RecorderConfig,
    RecordingWorker,
    reorder,
    stamp_ns,
)
from oxygen_ros.nodes.workcell.params import EXPERT, EXPERT_CAMERA, EXPERT_SHARED
from oxygen_ros.sim import robot, tasks
from oxygen_ros.sim.expert import PlanningError, ScriptedExpert
from oxygen_ros.sim.scene import SceneConfig, build_model
from oxygen_ros.sim.workcell import ObjectPose

THROTTLE_S = 5.0
JOINTS_SOURCE = "joints"  # the recorder's name for the JointState stream
# The sim resets between ticks without advancing time: the tick published just before a reset
# carries the reset time itself. Later stamps (by more than float rounding) are the episode's.
RESET_MARGIN_NS = 1000
STOP_TIMEOUT_S = 30.0  # writer thread: finishing queued steps at shutdown
# Best effort like the sim's sensor topics, but a deeper reader queue (about 1 s of samples) so
# a callback delayed by planning or a GIL-holding HDF5 write loses no sample a step needs.
JOINTS_QOS = QoSProfile(
    history=QoSHistoryPolicy.KEEP_LAST,
    depth=50,
    reliability=QoSReliabilityPolicy.BEST_EFFORT,
    durability=QoSDurabilityPolicy.VOLATILE,
)
IMAGES_QOS = QoSProfile(
    history=QoSHistoryPolicy.KEEP_LAST,
    depth=10,
    reliability=QoSReliabilityPolicy.BEST_EFFORT,
    durability=QoSDurabilityPolicy.VOLATILE,
)


class ExpertNode(Node):
    """Publishes the scripted expert's action chunks; records demonstrations."""

    def __init__(self) -> None:
        super().__init__("expert")
        self.params = NodeParameters(
            self,
            EXPERT_SHARED + EXPERT,
            dependent=lambda v: [
                s for c in v["camera_names"] for s in camera_specs(c, EXPERT_CAMERA)
            ],
        )
        p = self.params
        self.joint_names = robot.JOINT_NAMES
        self.camera_names = tuple(p["camera_names"])
        self.counters: collections.Counter[str] = collections.Counter()
        self._throttle = ReasonThrottle(THROTTLE_S)
        # Inverse kinematics on the workcell's model (its own MjData: no simulation state).
        self._expert = ScriptedExpert(build_model(SceneConfig()))
        self._lock = threading.Lock()  # plan state below
        self._episode_id = 0  # last episode seen RUNNING (0: none yet)
        self._episode_start_ns = 0  # first stamp that belongs to it
        self._pending_spec = None  # (spec, object poses) waiting for a post-reset joint state
        self._plan = None
        self._publishing = False  # the plan's episode is RUNNING: its chunks are published
        self._chunk_id = 0
        self._sequence = 0
        self._subtask = ""
        self._joints: tuple[int, np.ndarray] | None = None  # latest (stamp, positions)
        self._tick_gaps = GapMeter()  # publish ticks, node time
        self._joint_gaps = GapMeter()  # joint state callbacks, wall time
        self._tick_s_max = 0.0  # longest publish callback, wall time

        self._recorder: EpisodeRecorder | None = None
        if p["record_dir"]:
            directory = Path(p["record_dir"]).expanduser()
            directory.mkdir(parents=True, exist_ok=True)
            self._recorder = EpisodeRecorder(
                RecorderConfig(
                    directory,
                    self.joint_names,
                    self.camera_names,
                    fps=p["camera_rate_hz"],
                    joints_source=JOINTS_SOURCE,
                ),
                RecordingWorker(on_error=self._on_record_error, on_closed=self._on_closed),
                image_of=image_msg_to_rgb,
                shape_of=lambda msg: (int(msg.height), int(msg.width)),
                on_warning=self.get_logger().warning,
            )

        self._action_pub = self.create_publisher(ActionChunk, p["actions_topic"], RELIABLE_QOS)
        self._subtask_pub = self.create_publisher(String, p["subtask_topic"], LATCHED_QOS)
        self._diag_pub = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
        self.create_subscription(
            EpisodeStatus,
            p["episode_status_topic"],
            lambda msg: self._guarded(self._on_status, msg),
            latched_qos(10),  # the sim latches its last status: a late start still plans
        )
        self.create_subscription(
            JointState,
            p["joint_state_topic"],
            lambda msg: self._guarded(self._on_joints, msg),
            JOINTS_QOS,
        )
        if self._recorder is not None:
            for camera in self.camera_names:
                self.create_subscription(
                    Image,
                    p[f"cameras.{camera}.topic"],
                    lambda msg, c=camera: self._guarded(self._on_image, c, msg),
                    IMAGES_QOS,
                )
        self._publish_timer = self.create_timer(1.0 / p["publish_rate_hz"], self._on_publish_tick)
        self._diag_timer = self.create_timer(self._diag_period(), self._publish_diagnostics)
        self.params.add_listener(self._on_params)
        recording = "off"
        if self._recorder is not None:
            recording = (
                f"{list(self.camera_names)} to {self._recorder.config.directory} "
                f"(next index {self._recorder.next_index})"
            )
        self.get_logger().info(
            f"expert: {p['horizon']} rows x {p['action_dt_s']:g} s at "
            f"{p['publish_rate_hz']:g} Hz -> {self._action_pub.topic_name}; recording {recording}"
        )

    def _diag_period(self) -> float:
        return self.params["diagnostics_period_s"] or 3600.0

    def _guarded(self, callback, *args) -> None:
        """Runs a callback; an unexpected error drops that one message (counted, logged)."""
        try:
            callback(*args)
        except Exception as exc:
            self.counters["internal_error"] += 1
            self.get_logger().error(
                f"unexpected {type(exc).__name__} in {callback.__name__}: {exc}",
                throttle_duration_sec=THROTTLE_S,
            )

    # ---------------------------------------------------------------- episodes and planning
    def _on_status(self, msg: EpisodeStatus) -> None:
        stamp = stamp_ns(msg.header.stamp.sec, msg.header.stamp.nanosec)
        running = msg.phase == EpisodeStatus.PHASE_RUNNING
        if msg.episode_id != self._episode_id and running:
            self._start_episode(msg, stamp)
        elif msg.episode_id == self._episode_id and not running:
            with self._lock:
                ending = self._publishing
                self._publishing = False  # the last chunk holds the robot (see the docstring)
            if ending:
                self.get_logger().info(
                    f"episode {msg.episode_id} "
                    f"{'succeeded' if msg.phase == EpisodeStatus.PHASE_SUCCEEDED else 'failed'}"
                    f" after {msg.elapsed_s:.2f} s"
                )
            if self._recorder is not None:
                self._recorder.end(
                    msg.episode_id, stamp, msg.phase == EpisodeStatus.PHASE_SUCCEEDED
                )

    def _start_episode(self, msg: EpisodeStatus, stamp: int) -> None:
        start_ns = stamp - round(msg.elapsed_s * NS_PER_S) + RESET_MARGIN_NS
        try:
            spec = tasks.sample_episode(int(msg.seed), msg.instruction)
        except ValueError as exc:
            self.counters["episodes.bad_spec"] += 1
            self.get_logger().error(f"episode {msg.episode_id}: cannot rebuild the task: {exc}")
            return
        poses = {
            name: object_pose(pose)
            for name, pose in zip(msg.object_names, msg.object_poses, strict=True)
        }
        with self._lock:
            self._episode_id = msg.episode_id
            self._episode_start_ns = start_ns
            self._plan = None  # the old plan must not drive the reset robot
            self._publishing = False
            self._pending_spec = (spec, poses)
        self.counters["episodes"] += 1
        self.get_logger().info(f"episode {msg.episode_id} (seed {msg.seed}): {msg.instruction!r}")
        if self._recorder is not None:
            self._recorder.start(
                msg.episode_id, start_ns, int(msg.seed), msg.instruction, msg.task_template
            )
        self._try_plan()

    def _try_plan(self) -> None:
        """Plans once a joint state from after the reset is there."""
        with self._lock:
            if self._pending_spec is None or self._joints is None:
                return
            joints_stamp, q = self._joints
            if joints_stamp < self._episode_start_ns:
                return
            spec, poses = self._pending_spec
            self._pending_spec = None
            episode_id = self._episode_id
        t0 = max(now_s(self), joints_stamp / NS_PER_S)
        started = time.perf_counter()
        try:
            plan = self._expert.plan(spec, q, poses, t0)
        except PlanningError as exc:
            self.counters["episodes.plan_failed"] += 1
            self.get_logger().error(f"episode {episode_id}: no plan: {exc}")
            return
        self.counters["plans"] += 1
        self.get_logger().info(
            f"episode {episode_id}: planned in {time.perf_counter() - started:.3f} s, "
            f"{plan.end_time - plan.start_time:.2f} s long"
        )
        with self._lock:
            if episode_id != self._episode_id:
                return  # a newer episode started meanwhile
            self._plan = plan
            self._publishing = True
            self._chunk_id += 1
            self._subtask = ""  # every plan publishes its first label
        if self._recorder is not None:
            self._recorder.set_plan(episode_id, plan)
        self._publish_chunk()

    def _on_joints(self, msg: JointState) -> None:
        self._joint_gaps.add(time.monotonic())
        stamp = stamp_ns(msg.header.stamp.sec, msg.header.stamp.nanosec)
        try:
            q = reorder(msg.name, msg.position, self.joint_names)
            qd = (
                reorder(msg.name, msg.velocity, self.joint_names)
                if len(msg.velocity)
                else np.zeros(len(self.joint_names))
            )
        except ValueError as exc:
            self.counters["rejected.joint_state"] += 1
            self._throttle.warn(self, "joint_state", f"joint state refused: {exc}")
            return
        if not (np.all(np.isfinite(q)) and np.all(np.isfinite(qd))):
            self.counters["rejected.non_finite"] += 1
            return
        if not len(msg.velocity):
            self.counters["joint_states.no_velocity"] += 1
        with self._lock:
            self._joints = (stamp, q)
            pending = self._pending_spec is not None
        if pending:
            self._try_plan()
        if self._recorder is not None:
            self._recorder.add(JOINTS_SOURCE, stamp, (q, qd))

    # ---------------------------------------------------------------- actions
    def _on_publish_tick(self) -> None:
        started = time.perf_counter()
        self._publish_chunk()
        self._tick_gaps.add(now_s(self))
        self._tick_s_max = max(self._tick_s_max, time.perf_counter() - started)
        if self._recorder is not None:
            self._recorder.close_timed_out()

    def _publish_chunk(self) -> None:
        with self._lock:
            plan, chunk_id = self._plan, self._chunk_id
            if plan is None or not self._publishing:
                return
        p = self.params
        # Never before the plan's start: a new episode's chunks are then stamped after the
        # post-reset joint state it was planned from, even if /clock lags that topic.
        t = max(now_s(self), plan.start_time)
        stamp = seconds_to_time(t)
        rows = np.asarray(plan.rows(t, p["action_dt_s"], p["horizon"]), dtype=np.float32)
        msg = ActionChunk()
        msg.header.stamp = stamp
        msg.header.frame_id = p["frame_id"]
        msg.sequence = self._sequence
        msg.chunk_id = chunk_id
        msg.dt = float(p["action_dt_s"])
        msg.joint_names = list(self.joint_names)
        msg.horizon = int(rows.shape[0])
        msg.actions = array.array("f", np.ascontiguousarray(rows).tobytes())
        # The "observation" a chunk comes from is the state the plan was made from: the sim
        # refuses chunks observed before its last reset (a plan of a finished episode).
        msg.observation_stamp = seconds_to_time(plan.start_time)
        msg.inference_latency = t - plan.start_time
        self._action_pub.publish(msg)
        self._sequence += 1
        self.counters["chunks"] += 1
        label = plan.subtask(t)
        if label != self._subtask:
            self._subtask = label
            self._subtask_pub.publish(String(data=label))
            self.counters["subtasks"] += 1

    # ---------------------------------------------------------------- recording
    def _on_image(self, camera: str, msg: Image) -> None:
        if msg.encoding != "rgb8" or msg.step != msg.width * 3 or not msg.height:
            self.counters["record.bad_image"] += 1
            self._throttle.warn(self, "bad_image", f"{camera}: not unpadded rgb8, not recorded")
            return
        self._recorder.add(camera, stamp_ns(msg.header.stamp.sec, msg.header.stamp.nanosec), msg)

    def _on_record_error(self, message: str) -> None:
        self.counters["record.errors"] += 1
        self.get_logger().error(f"recording: {message}")

    def _on_closed(self, path: Path, success: bool, steps: int) -> None:
        self.get_logger().info(
            f"recorded {path.name}: {steps} steps, {'success' if success else 'unsuccessful'}"
        )

    # ---------------------------------------------------------------- params, diagnostics
    def _on_params(self, changed: dict) -> None:
        if "publish_rate_hz" in changed:
            self._publish_timer.timer_period_ns = int(1e9 / changed["publish_rate_hz"])
            self._tick_gaps = GapMeter()
        if "diagnostics_period_s" in changed:
            self._diag_timer.timer_period_ns = int(1e9 * self._diag_period())

    def stats(self) -> dict[str, object]:
        """Counters and timings (diagnostics values; logged at shutdown)."""
        values: dict[str, object] = {
            "subtask": self._subtask,
            "cpu_s": round(time.process_time(), 3),
            "tick_ms_max": round(1e3 * self._tick_s_max, 3),
            **self._tick_gaps.values("tick_interval_s"),
            **self._joint_gaps.values("joint_callback_gap_s"),
        }
        if self._recorder is not None:
            worker = self._recorder.worker
            stats = worker.stats()
            values.update(
                {
                    "record.queue": worker.queue_length(),
                    "record.queue_max": stats.max_queue,
                    "record.written": stats.steps_written,
                    "record.episodes_closed": stats.episodes_closed,
                    "record.write_ms_mean": round(
                        1e3 * stats.write_s_total / max(stats.steps_written, 1), 3
                    ),
                    "record.write_ms_max": round(1e3 * stats.write_s_max, 3),
                }
            )
            values.update({f"record.{k}": v for k, v in sorted(self._recorder.counters.items())})
            sync = dict(self._recorder.sync.counters)
            values.update({f"record.sync.{k}": v for k, v in sorted(sync.items())})
        values.update(sorted(self.counters.items()))
        return values

    def _publish_diagnostics(self) -> None:
        if not self.params["diagnostics_period_s"]:
            return
        with self._lock:
            planned = self._plan is not None
            episode_id = self._episode_id
        level, message = "OK", f"episode {episode_id}: {self._subtask or '-'}"
        if episode_id and not planned:
            level, message = "WARN", f"episode {episode_id}: waiting for a plan"
        values = {"episode_id": episode_id, **self.stats()}
        publish_status(self, self._diag_pub, level, message, values)

    def close(self) -> None:
        self._publish_timer.cancel()
        self._diag_timer.cancel()
        if self._recorder is not None:
            unfinished = self._recorder.open_episode_ids()
            if unfinished:
                self.get_logger().warning(
                    f"shutting down: episode(s) {unfinished} not finished, not saved"
                )
            if not self._recorder.stop(STOP_TIMEOUT_S):
                self.get_logger().error("the episode writer did not stop")
        self.get_logger().info(f"stats: {self.stats()}")


def object_pose(pose) -> ObjectPose:
    """`geometry_msgs/Pose` -> the workcell's `ObjectPose` (quaternion w, x, y, z)."""
    p, q = pose.position, pose.orientation
    return ObjectPose(np.array([p.x, p.y, p.z]), np.array([q.w, q.x, q.y, q.z]))


class GapMeter:
    """Largest and mean interval between calls of one callback (over the last `WINDOW`)."""

    WINDOW = 1000

    def __init__(self) -> None:
        self._last: float | None = None
        self.intervals: collections.deque[float] = collections.deque(maxlen=self.WINDOW)

    def add(self, t: float) -> None:
        if self._last is not None:
            self.intervals.append(t - self._last)
        self._last = t

    def values(self, prefix: str) -> dict[str, float]:
        if not self.intervals:
            return {}
        return {
            f"{prefix}_mean": float(np.mean(self.intervals)),
            f"{prefix}_max": float(max(self.intervals)),
        }


def main(args: Sequence[str] | None = None) -> int:
    return run_node(ExpertNode, "expert", args, num_threads=1)


if __name__ == "__main__":
    sys.exit(main())
