"""Perception: configured cameras + joint states -> `ObservationFrame`s at observation_rate_hz.

Thin ROS shell around `fusion.Fuser` (which frame to build) and `camera_input.CameraInput`
(each camera's transport, raw `Image` or `CompressedImage` as image_transport names them, and
its pixels): subscriptions validate and hand samples to the fuser; a frame is built, converted
and published when a new joint-state snapshot completes (`frame_trigger: joint_state`, at most
`observation_rate_hz`: `fusion.SnapshotTrigger`) or on a timer at `observation_rate_hz`
(`frame_trigger: timer`).

Invariants:
- Bad input never reaches the model and never stops the node: every rejected message is
  counted by reason (diagnostics `rejected.<reason>`) and logged with a throttled warning.
- An image (raw, or compressed and decoded) is converted (to rgb8 at the model resolution,
  aspect-preserving with padding) when a frame uses it, or, with `convert_on_arrival`, as it
  arrives and before the fuser takes it (so building a frame costs no conversion when it uses
  each camera's newest image, and an image that fails to decode is never offered); the
  converted image of each camera's newest use is kept, so an image is converted once unless a
  frame goes back to an older one. Frames carry only converted images: one that fails to
  decode when its frame is built leaves its slot masked (counted once, `rejected.<reason>`).
- The model resolution is `model_preset`'s `image_resolution` (the parameter the inference
  node builds its engine from), never a size of its own: the only images inference accepts.
- Frames follow `Fuser.fuse`: no frame while the joint state or every camera is stale/absent;
  a frame with a configured camera masked counts `masked.<camera>`, a tick without a frame
  `skipped.<reason>`. With `frame_trigger: joint_state` the timer still ticks at
  `observation_rate_hz`, only to count and report `skipped.<reason>` when no snapshot came
  since the previous tick and no frame can be built; snapshots the trigger passes over count
  `trigger.<reason>`, and no two frames carry the same joint stamp.
- A sample stamped zero (an unstamped driver) is stamped with its arrival time (counted).
- An unexpected error while handling one input message drops that message (counted as
  `rejected.internal_error`, logged with its cause); it never ends the node.
- With `cube_state_camera`, every frame's state is the configured joints followed by the
  workcell cube detector's tracked cube positions (`perception.workcell_cubes.STATE_NAMES`),
  found in that camera's full-size image of the frame; a frame without that image keeps the
  last positions (`cube_state.unseen`). Their velocities are NaN (not measured). With
  `cube_state: poses` they are the cubes' poses instead (`POSE_STATE_NAMES`,
  `workcell_cubes.CubePoseState`: whole views, and a cube held in a gripper follows the
  hand's forward kinematics of the frame's joints); with `cube_state: reach` the poses and each
  cube's offset from each hand (`REACH_STATE_NAMES`, `workcell_cubes.CubeReachState`); with
  `cube_state: target` only the instructed cube's pose and offsets (`TARGET_STATE_NAMES`,
  `workcell_cubes.CubeTargetState`), the cube named by the newest instruction on
  `task_instruction_topic` (`cube_state: target_m`: the same with the offsets in metres,
  `TARGET_METRES_STATE_NAMES`, `workcell_cubes.CubeTargetMetresState`). Frames without a
  target (no instruction yet, or one that names no workcell cube: warned about, throttled)
  carry a cube resting at the table's centre and count `cube_state.no_target`.
- Each instruction published on `task_instruction_topic` (latched: the inference node's
  instruction in use; the same text again is a new task too) starts a new task for the cube
  state, as each training episode starts a fresh one: the tracker begins afresh (the poses'
  `moved_x`, `moved_y` count from the cubes' places in the task's first view), and no frame is
  built from a cube-camera image stamped at or before the task's start
  (`skipped.cube_image_before_task`), so a layout from before the task never enters it.
- With `episode_status_topic` (the workcell simulator's EpisodeStatus), each new episode's
  reset (its stamp minus elapsed_s) starts a task too, and a task starts no earlier than the
  newest reset (`perception.task_window`): the node's clock may lag the simulator's when the
  instruction arrives, and the last image before a reset carries the reset's own stamp. A
  reset the node learns of after its tracker saw an image from before it restarts the tracker
  (`cube_state.restarted_at_reset`); the instructed target is kept.
- The episode status and the episode's instruction (through the inference node) arrive in
  either order. With `cube_state: target` (or `target_m`), a status whose instruction names
  another cube than the current target holds every frame (`skipped.awaiting_instruction`)
  until an instruction arrives, so no frame of the new episode carries the previous task's
  target; after `reset_instruction_timeout_s` without one the frames go on with the current
  target (warned, `cube_state.instruction_timeouts`).
- No message order holds across topics: images of a new episode may arrive before its reset's
  status. The simulator publishes a status before each tick's images, so with
  `episode_status_wait_s` > 0 a frame whose cube image is newer than the newest status handled
  is skipped (`skipped.cube_image_ahead_of_status`) until a status at or after it arrives, for
  at most that long of image time (`perception.task_window.StatusGate`): no frame carries a
  layout of an episode whose reset the node has not heard of.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import sys
import time
from collections.abc import Sequence

import numpy as np
from diagnostic_msgs.msg import DiagnosticArray
from rclpy.node import Node
from sensor_msgs.msg import JointState
from std_msgs.msg import String

from oxygen_ros.engine.config import get_model_config
from oxygen_ros.msg import EpisodeStatus, ObservationFrame
from oxygen_ros.nodes.common.conversions import time_to_seconds
from oxygen_ros.nodes.common.image_conversion import ImageConversionError
from oxygen_ros.nodes.common.parameters import NodeParameters, ParameterError, camera_specs
from oxygen_ros.nodes.common.params import SHARED
from oxygen_ros.nodes.common.runtime import (
    LATCHED_QOS,
    OBSERVATION_QOS,
    SENSOR_QOS,
    ReasonThrottle,
    now_s,
    publish_status,
    run_node,
)
from oxygen_ros.nodes.common.sliding_window import SlidingWindow
from oxygen_ros.nodes.perception.camera_input import CameraInput
from oxygen_ros.nodes.perception.conversions import observation_frame_msg
from oxygen_ros.nodes.perception.fusion import (
    CameraSpec,
    Fuser,
    FusionConfig,
    RejectedInputError,
    SnapshotTrigger,
)
from oxygen_ros.nodes.perception.params import PERCEPTION, PERCEPTION_CAMERA, TARGET_CUBE_STATES
from oxygen_ros.perception.task_window import InstructionWait, StatusGate, TaskWindow

THROTTLE_S = 5.0  # at most one warning per call site per this many seconds
RATE_WINDOW_S = 2.0
STATS_WINDOW_S = 10.0  # frame age / build time percentiles in diagnostics


class PerceptionNode(Node):
    """Fuses cameras and joint states into observation frames."""

    def __init__(self) -> None:
        super().__init__("perception")
        self.params = NodeParameters(
            self,
            SHARED + PERCEPTION,
            dependent=lambda v: [
                s for c in v["camera_names"] for s in camera_specs(c, PERCEPTION_CAMERA)
            ],
        )
        p = self.params
        self._cameras = tuple(
            CameraSpec(
                name,
                p[f"cameras.{name}.slot"],
                p[f"cameras.{name}.topic"],
                p[f"cameras.{name}.encoding"],
            )
            for name in p["camera_names"]
        )
        try:
            self._fuser = Fuser(self._fusion_config())
        except ValueError as exc:
            raise ParameterError(str(exc)) from exc
        self._cube_camera = next(
            (c for c in self._cameras if c.name == p["cube_state_camera"]), None
        )
        if p["cube_state_camera"] and self._cube_camera is None:
            raise ParameterError(
                f"cube_state_camera {p['cube_state_camera']!r} is not one of camera_names"
            )
        self._cube_state = None
        self._cube_joints = None  # frame joint columns in the workcell's order (poses)
        if self._cube_camera is not None:
            from oxygen_ros.perception import workcell_cubes  # MuJoCo: only if used

            if p["cube_state"] != "positions":  # poses, reach: the joints are read too
                self._cube_joints = self._workcell_joint_columns(p["joint_names"], p["cube_state"])
            self._cube_state = workcell_cubes.object_state(p["cube_state"])
        self._window = TaskWindow()  # when the cube state's task began (sim time)
        self._episode_id = 0  # the newest episode the status reported (0: none)
        # Cube images newer than the newest status wait for it (a reset not heard of yet).
        self._status_gate = StatusGate(p["episode_status_wait_s"])
        # Frames held from a reset until its episode's instruction (cube_state: target[_m]).
        self._instruction_wait = InstructionWait(p["reset_instruction_timeout_s"])
        self._out_size = get_model_config(p["model_preset"]).image_resolution  # (rows, cols)
        self._inputs = {  # camera -> its transport, checks and decodes
            c.name: CameraInput(
                c,
                p[f"cameras.{c.name}.transport"],
                (p[f"cameras.{c.name}.height"], p[f"cameras.{c.name}.width"]),
                self._out_size,
                p["max_image_dim"],
            )
            for c in self._cameras
        }
        self.counters: collections.Counter[str] = collections.Counter()
        self._throttle = ReasonThrottle(THROTTLE_S)  # per rejection / skip reason
        self._sequence = 0
        self._publish_times: collections.deque[float] = collections.deque()
        self._last_skip_reason = ""
        self._trigger = SnapshotTrigger(p["observation_rate_hz"])
        self._snapshot_since_tick = False  # joint_state trigger: a snapshot since the last tick
        self._last_frame_stamp = -float("inf")
        self._age_at_publish = SlidingWindow(STATS_WINDOW_S)  # publish time - frame stamp
        self._build_time = SlidingWindow(STATS_WINDOW_S)  # fuse + convert + publish, wall

        self._frame_pub = self.create_publisher(
            ObservationFrame, p["observation_topic"], OBSERVATION_QOS
        )
        self._diag_pub = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
        # An executor that finds several subscriptions ready takes them in the order they were
        # created: the episode status before the sensors (a reset known before the images it
        # makes old), the instruction after them (an image published before it is received
        # first, `TaskWindow.received`).
        if self._cube_camera is not None and p["episode_status_topic"]:
            self.create_subscription(
                EpisodeStatus,
                p["episode_status_topic"],
                lambda msg: self._guarded(self._on_episode_status, msg),
                LATCHED_QOS,
            )
        for camera in self._cameras:
            source = self._inputs[camera.name]
            self.create_subscription(
                source.msg_type,
                source.topic,
                lambda msg, c=camera: self._guarded(self._on_image, c, msg),
                SENSOR_QOS,
            )
        self.create_subscription(
            JointState,
            p["joint_state_topic"],
            lambda msg: self._guarded(self._on_joints, msg),
            SENSOR_QOS,
        )
        if self._cube_camera is not None:
            self.create_subscription(
                String,
                p["task_instruction_topic"],
                lambda msg: self._guarded(self._on_instruction, msg),
                LATCHED_QOS,
            )
        self._frame_timer = self.create_timer(1.0 / p["observation_rate_hz"], self._on_frame_tick)
        self._diag_timer = self.create_timer(self._diag_period(), self._publish_diagnostics)
        self.params.add_listener(self._on_params)
        self.get_logger().info(
            f"fusing {[c.name for c in self._cameras]} + {len(self._fuser.config.joint_names)} "
            f"joints at {p['observation_rate_hz']:g} Hz ({p['frame_trigger']}) -> "
            f"{self._frame_pub.topic_name}"
        )

    @staticmethod
    def _workcell_joint_columns(joint_names: Sequence[str], kind: str) -> np.ndarray:
        """Where each of the workcell's joints (`robot.JOINT_NAMES`) is in `joint_names`."""
        from oxygen_ros.sim import robot

        missing = [n for n in robot.JOINT_NAMES if n not in joint_names]
        if missing:
            raise ParameterError(
                f"cube_state {kind} needs the workcell's joints in joint_names; missing {missing}"
            )
        return np.array([list(joint_names).index(n) for n in robot.JOINT_NAMES])

    def _fusion_config(self) -> FusionConfig:
        p = self.params
        return FusionConfig(
            slots=tuple(p["slot_names"]),
            cameras=self._cameras,
            joint_names=tuple(p["joint_names"]),
            max_skew_s=p["max_skew_s"],
            stale_after_s=p["stale_after_s"],
            future_tolerance_s=p["future_tolerance_s"],
        )

    def _diag_period(self) -> float:
        return self.params["diagnostics_period_s"] or 3600.0

    # ---------------------------------------------------------------- inputs
    def _stamp(self, header_stamp, now: float) -> float:
        stamp = time_to_seconds(header_stamp)
        if stamp == 0.0:
            self.counters["unstamped"] += 1
            return now
        return stamp

    def _reject(self, reason: str, message: str) -> None:
        self.counters[f"rejected.{reason}"] += 1
        self._throttle.warn(self, reason, f"rejected ({reason}): {message}")

    def _guarded(self, callback, *args) -> None:
        """Runs an input callback; an unexpected error drops that one message (counted as
        `rejected.internal_error`, logged with its cause) instead of ending the node."""
        try:
            callback(*args)
        except Exception as exc:
            self.counters["rejected.internal_error"] += 1
            self.get_logger().error(
                f"input dropped, unexpected {type(exc).__name__} in {callback.__name__}: {exc}",
                throttle_duration_sec=THROTTLE_S,
            )

    def _on_image(self, camera: CameraSpec, msg) -> None:
        """A raw `Image` or a `CompressedImage`, as the camera's transport subscribes."""
        now = now_s(self)
        try:
            self._inputs[camera.name].check(msg)  # headers only: no pixel decoded
            stamp = self._stamp(msg.header.stamp, now)
            if self.params["convert_on_arrival"] and self._convert(camera, msg) is None:
                return  # does not decode: counted, never offered to the fuser
            self._fuser.add_image(camera.name, stamp, msg, now)
        except (ImageConversionError, RejectedInputError) as exc:
            self._reject(exc.reason, f"{camera.name} image: {exc}")
            return
        if camera is self._cube_camera:
            self._window.received(stamp)  # taken before any instruction handled from now on
        self.counters[f"images.{camera.name}"] += 1

    def _on_joints(self, msg: JointState) -> None:
        now = now_s(self)
        before = self._fuser.newest_snapshot_stamp
        try:
            unknown = self._fuser.add_joint_state(
                self._stamp(msg.header.stamp, now),
                list(msg.name),
                msg.position,
                msg.velocity,
                now,
            )
        except RejectedInputError as exc:
            self._reject(exc.reason, f"joint state: {exc}")
            return
        self.counters["joint_states"] += 1
        if unknown:
            self.counters["joint_states.unknown_names"] += 1
            self.get_logger().warning(
                f"ignoring joints not configured: {unknown[:8]}", throttle_duration_sec=60.0
            )
        snapshot = self._fuser.newest_snapshot_stamp
        if self.params["frame_trigger"] == "joint_state" and snapshot != before:
            self._snapshot_since_tick = True
            declined = self._trigger.offer(snapshot, now)
            if declined:
                self.counters[f"trigger.{declined}"] += 1
            else:
                self._publish_frame(now, on_snapshot=True)

    # ---------------------------------------------------------------- frames
    def _on_frame_tick(self) -> None:
        now = now_s(self)
        if self.params["frame_trigger"] == "timer":
            self._publish_frame(now)
            return
        # joint_state trigger: the tick only reports why frames stopped.
        if self._snapshot_since_tick:
            self._snapshot_since_tick = False
            return
        frame, reason = self._fuser.fuse(now)
        if frame is None:
            self._skipped(reason, now)

    def _publish_frame(self, now: float, on_snapshot: bool = False) -> None:
        """Builds the frame for `now`, converts its images and publishes it (or counts why
        there is none). `on_snapshot`: for a new joint snapshot, never one of a stamp already
        published (fusion may prefer an older snapshot that covers more cameras)."""
        started = time.monotonic()
        frame, reason = self._fuser.fuse(now)
        if frame is None:
            self._skipped(reason, now)
            return
        if on_snapshot and frame.stamp <= self._last_frame_stamp:
            self.counters["trigger.not_newer"] += 1
            return
        if self._cube_state is not None and self._awaiting_instruction(now):
            self.counters["skipped.awaiting_instruction"] += 1  # a reset's first moments
            return
        cube_stamp = None if self._cube_state is None else self._cube_image_stamp(frame)
        if cube_stamp is not None and self._window.before_task(cube_stamp):
            self.counters["skipped.cube_image_before_task"] += 1  # a task's first moments
            return
        if cube_stamp is not None and self._status_gate.waits(cube_stamp):
            self.counters["skipped.cube_image_ahead_of_status"] += 1  # a status still to come
            return
        self._last_frame_stamp = frame.stamp
        self._last_skip_reason = ""
        if self._cube_state is not None:
            frame = self._with_cubes(frame)
        by_slot = {c.slot: c for c in self._cameras}
        images: list[np.ndarray | None] = []
        for slot, payload in zip(frame.slots, frame.payloads, strict=True):
            if payload is None and slot in by_slot:  # a configured camera absent or stale
                self.counters[f"masked.{by_slot[slot].name}"] += 1
            images.append(None if payload is None else self._convert(by_slot[slot], payload))
        msg = observation_frame_msg(
            frame, images, self._sequence, self.params["frame_id"], *self._out_size
        )
        self._frame_pub.publish(msg)
        published = now_s(self)  # node time: sim time follows /clock
        self._sequence += 1
        self.counters["frames"] += 1
        self._publish_times.append(published)
        self._age_at_publish.add(published - frame.stamp, published)
        self._build_time.add(time.monotonic() - started, published)

    def _skipped(self, reason: str, now: float) -> None:
        """A tick (or snapshot) without a frame: counted, and the cause warned about."""
        self.counters[f"skipped.{reason}"] += 1
        if reason != self._last_skip_reason:
            self._throttle.warn(self, f"skipped.{reason}", f"no observation frame: {reason}")
        self._last_skip_reason = reason
        missing = self._fuser.missing_joints()
        if reason == "no_joint_state" and missing and self.counters["joint_states"]:
            self.get_logger().warning(
                f"joints never received: {missing[:8]}", throttle_duration_sec=THROTTLE_S
            )
        stale = self._fuser.stale_joints(now) if reason == "joint_state_stale" else []
        if stale and len(stale) < len(self._fuser.config.joint_names):
            self.get_logger().warning(
                f"joints not updated for {self.params['stale_after_s']:g} s: {stale[:8]}",
                throttle_duration_sec=THROTTLE_S,
            )

    def _on_instruction(self, msg: String) -> None:
        """A new task: a fresh cube state, fed only images from now on; with `cube_state:
        target` the cube the instruction names is its target (one that names none leaves the
        frames without a target, warned, throttled)."""
        self._cube_state = self._task_cube_state(msg.data)
        self._window.on_instruction(now_s(self))
        self._instruction_wait.on_instruction()
        self.counters["cube_state.tasks"] += 1
        message = f"new task for the cube state ({msg.data[:80]!r})"
        if self._names_target:
            message += f", target {self._cube_state.target}"
        self.get_logger().info(message)

    def _on_episode_status(self, msg: EpisodeStatus) -> None:
        """Every status moves the status gate on; a new episode's first status also starts the
        cube state's task no later than its reset (the tracker afresh, same target, if it began
        before or saw the old world)."""
        self._status_gate.on_status(time_to_seconds(msg.header.stamp))
        if msg.phase == EpisodeStatus.PHASE_IDLE or msg.episode_id == self._episode_id:
            return  # before the first episode, or one already handled (latched again)
        self._episode_id = msg.episode_id
        self.counters["cube_state.resets"] += 1
        target = self._cube_state.target if self._names_target else None
        if self._window.on_reset(time_to_seconds(msg.header.stamp) - msg.elapsed_s):
            self._cube_state = self._fresh_cube_state(target)  # same target, new layout
            self.counters["cube_state.restarted_at_reset"] += 1
        if self._names_target:
            named, _ = self._named_cube(msg.instruction)
            self._instruction_wait.on_reset(named, target, now_s(self))

    def _awaiting_instruction(self, now: float) -> bool:
        """Whether frames wait for a new episode's instruction (warns once at a timeout)."""
        awaited = self._instruction_wait.awaited  # the hold forgets it when it times out
        holds, timed_out = self._instruction_wait.holds(now)
        if timed_out:
            self.counters["cube_state.instruction_timeouts"] += 1
            self.get_logger().warning(
                f"no instruction within {self._instruction_wait.timeout_s:g} s of episode "
                f"{self._episode_id}'s reset (its instruction names {awaited}); the frames go "
                f"on with target {self._cube_state.target}"
            )
        return holds

    @property
    def _names_target(self) -> bool:
        """Whether the cube state is a target state (`cube_state` in `TARGET_CUBE_STATES`): the
        instructions name its cube."""
        return self.params["cube_state"] in TARGET_CUBE_STATES

    @staticmethod
    def _named_cube(text: str) -> tuple[str | None, str]:
        """(the workcell cube an instruction names, "") or (None, why it names none)."""
        from oxygen_ros.sim import tasks

        try:
            return tasks.object_name(tasks.parse_instruction(text).colour), ""
        except ValueError as exc:
            return None, str(exc)

    def _task_cube_state(self, text: str):
        """A fresh cube state for the task `text`; the target state's target is the workcell
        cube `text` names (none, warned, when it names no colour or one without a cube)."""
        if not self._names_target:
            return self._fresh_cube_state(None)
        named, reason = self._named_cube(text)
        if named is None:
            self._throttle.warn(self, "no_target", f"no target cube for the state: {reason[:200]}")
        return self._fresh_cube_state(named)

    def _fresh_cube_state(self, target: str | None):
        """A fresh tracker of the configured kind (`cube_state`); `target` for the target
        states only."""
        from oxygen_ros.perception import workcell_cubes

        return workcell_cubes.object_state(self.params["cube_state"], target)

    def _cube_image_stamp(self, frame) -> float | None:
        """The stamp of the frame's cube-camera image (None: the frame has none). An image taken
        before the current task began, or newer than the newest episode status (which the
        simulator publishes before each tick's images, `episode_status_wait_s`), builds no
        frame."""
        index = frame.slots.index(self._cube_camera.slot)
        return None if frame.payloads[index] is None else frame.image_stamps[index]

    def _with_cubes(self, frame):
        """`frame` with the tracked cube positions appended to its state."""
        camera = self._cube_camera
        payload = frame.payloads[frame.slots.index(camera.slot)]
        image = None
        # A compressed image that does not decode: counted when the frame's slot is converted.
        with contextlib.suppress(ImageConversionError):
            image = None if payload is None else self._inputs[camera.name].rgb(payload)
        if image is None:
            self.counters["cube_state.unseen"] += 1
        else:
            self._window.fed(frame.image_stamps[frame.slots.index(camera.slot)])
        if self._names_target and self._cube_state.target is None:
            self.counters["cube_state.no_target"] += 1
        if self._cube_joints is None:
            cubes = self._cube_state.update(image)
        else:
            cubes = self._cube_state.update(image, frame.positions[self._cube_joints])
        velocities = frame.velocities
        if len(velocities):
            velocities = np.concatenate([velocities, np.full(len(cubes), np.nan)])
        return dataclasses.replace(
            frame,
            joint_names=(*frame.joint_names, *self._cube_state.names),
            positions=np.concatenate([frame.positions, cubes]),
            velocities=velocities,
        )

    def _convert(self, camera: CameraSpec, msg) -> np.ndarray | None:
        """The model image of `msg` (None: it does not decode, counted once)."""
        result = self._inputs[camera.name].model_image(msg)
        if result.error is not None:
            self._reject(result.error.reason, f"{camera.name} image: {result.error}")
        elif result.new:
            self.counters[f"converted.{camera.name}"] += 1
        return result.image

    # ---------------------------------------------------------------- params, diagnostics
    def _on_params(self, changed: dict) -> None:
        if "observation_rate_hz" in changed:
            self._frame_timer.timer_period_ns = int(1e9 / changed["observation_rate_hz"])
            self._trigger.rate_hz = changed["observation_rate_hz"]
        if "frame_trigger" in changed:
            self.get_logger().info(f"frame_trigger -> {changed['frame_trigger']}")
        if {"max_skew_s", "stale_after_s", "future_tolerance_s"} & set(changed):
            self._fuser.config = self._fusion_config()
        if "diagnostics_period_s" in changed:
            self._diag_timer.timer_period_ns = int(1e9 * self._diag_period())
        if "episode_status_wait_s" in changed:
            self._status_gate.wait_s = changed["episode_status_wait_s"]

    def frame_rate(self) -> float:
        """Frames per second of node time (simulated seconds under use_sim_time)."""
        now = now_s(self)
        while self._publish_times and self._publish_times[0] < now - RATE_WINDOW_S:
            self._publish_times.popleft()
        return len(self._publish_times) / RATE_WINDOW_S

    def _publish_diagnostics(self) -> None:
        if not self.params["diagnostics_period_s"]:
            return
        rate = self.frame_rate()
        target = self.params["observation_rate_hz"]
        if rate == 0.0:
            level, message = "ERROR", f"no frames: {self._last_skip_reason or 'starting'}"
        elif rate < 0.8 * target:
            level, message = "WARN", f"frame rate {rate:.1f} Hz below {target:g} Hz"
        else:
            level, message = "OK", f"{rate:.1f} Hz"
        t = now_s(self)
        age_p50, age_p99 = self._age_at_publish.percentiles((50, 99), t)
        build_p50, build_p99 = self._build_time.percentiles((50, 99), t)
        values: dict[str, object] = {
            "observation_rate_hz": rate,
            "target_rate_hz": target,
            "frame_trigger": self.params["frame_trigger"],
            "sequence": self._sequence,
            # Publish time - frame stamp (node clock), and fuse + convert + publish (wall).
            "frame.age_at_publish_p50_ms": 1e3 * age_p50,
            "frame.age_at_publish_p99_ms": 1e3 * age_p99,
            "frame.build_p50_ms": 1e3 * build_p50,
            "frame.build_p99_ms": 1e3 * build_p99,
        }
        values.update(sorted(self.counters.items()))
        publish_status(self, self._diag_pub, level, message, values)

    def close(self) -> None:
        self._frame_timer.cancel()
        self._diag_timer.cancel()


def main(args: Sequence[str] | None = None) -> int:
    return run_node(PerceptionNode, "perception", args, num_threads=1)


if __name__ == "__main__":
    sys.exit(main())
