"""The simulated ALOHA workcell as a ROS node: physics, cameras, commands, episodes, /clock.

Thin ROS shell around `sim.workcell.Workcell` (physics + rendering), `sim.command_buffer`
(timed commands -> this tick's targets) and `sim.tasks` (episodes and their success test).

One simulation thread owns the Workcell (its renderers' GL contexts are bound to the thread that
made them) and runs the loop, per control tick of `1 / control_rate_hz` simulated seconds:
command buffer target at sim time t -> actuator targets -> physics step to t' -> `/clock` = t'
-> the commanded targets (stamp t) on `joint_command_topic` -> JointState (stamp t') at
`joint_rate_hz` -> the task's success test (every tick) -> EpisodeStatus at `status_rate_hz`,
on every phase change and on every camera tick -> at `camera_rate_hz` every camera rendered and
published with the stamp of the JointState of the same tick. The loop is paced on absolute
wall-clock deadlines scaled by `real_time_factor` (`workcell_timing.Pacer`).

Invariants:
- Every stamp is sim time (the clock starts at 0 and never goes back, also across resets). The
  node itself runs on wall time (never `use_sim_time`): its diagnostics timer and pacing must
  not depend on the clock it publishes.
- An image and the JointState of its tick carry the same stamp: a camera tick always publishes a
  JointState, and before its images an EpisodeStatus of the same stamp (no message order holds
  across topics, so a subscriber learns that it has heard of every reset up to an image only
  from a status at or after the image's stamp).
- Commands are mapped to joints by name; a command's rows run at their stamps and at most
  `chunk_max_age_s` after its first row, then the joints hold (the command buffer's rules).
- Bad commands are counted per reason (`rejected.<reason>`) with a throttled warning; an
  unexpected error in one callback or tick is counted and logged, never ends the node.
- With `next_episode_after_s` > 0, an episode that ended that many sim seconds ago is followed
  by the next seed's, once; a reset request in between wins (the bring-up's endless demo).
- A reset puts the robot at its rest pose and drops every command received before it; a chunk
  inferred from an observation older than the reset is refused (`rejected.before_reset`).
- Targets move at most `max_joint_speed` per second (a servo's profile velocity), so one far
  target never jumps an arm through its joint limits.
- Time never goes back: should the physics diverge, MuJoCo resets the state and `Workcell`
  keeps the time going; the event is counted (`physics_unstable`).
"""

from __future__ import annotations

import collections
import sys
import threading
from collections.abc import Sequence

import numpy as np
from diagnostic_msgs.msg import DiagnosticArray
from rclpy.node import Node
from rosgraph_msgs.msg import Clock
from sensor_msgs.msg import Image, JointState
from std_msgs.msg import String
from trajectory_msgs.msg import JointTrajectory

from oxygen_ros.msg import ActionChunk, EpisodeStatus
from oxygen_ros.nodes.common.conversions import rgb_image_msg, seconds_to_time, time_to_seconds
from oxygen_ros.nodes.common.parameters import NodeParameters, ParameterError, camera_specs
from oxygen_ros.nodes.common.params import SHARED
from oxygen_ros.nodes.common.runtime import (
    LATCHED_QOS,
    RELIABLE_QOS,
    SENSOR_QOS,
    SERVICE_QOS,
    STREAM_QOS,
    ReasonThrottle,
    publish_status,
    run_node,
)
from oxygen_ros.nodes.workcell import workcell_conversions as C
from oxygen_ros.nodes.workcell.params import WORKCELL_CAMERA, WORKCELL_SIM
from oxygen_ros.nodes.workcell.workcell_cameras import CameraRig
from oxygen_ros.nodes.workcell.workcell_episode import EpisodeTracker
from oxygen_ros.nodes.workcell.workcell_timing import Every, Pacer, RateMeter
from oxygen_ros.sim import robot, tasks
from oxygen_ros.sim.command_buffer import CommandBuffer, CommandBufferConfig, RejectedCommandError
from oxygen_ros.sim.scene import SceneConfig
from oxygen_ros.sim.workcell import Workcell, WorkcellConfig
from oxygen_ros.srv import ResetEpisode

THROTTLE_S = 5.0
START_TIMEOUT_S = 60.0  # scene compile + EGL context on a busy machine
PAUSE_POLL_S = 0.02  # while paused: how often the loop looks at the flag


class WorkcellSimNode(Node):
    """Simulates the workcell and publishes its sensors, clock and episode status."""

    def __init__(self) -> None:
        super().__init__("workcell_sim")
        self.params = NodeParameters(
            self,
            SHARED + WORKCELL_SIM,
            dependent=lambda v: [
                s for c in v["camera_names"] for s in camera_specs(c, WORKCELL_CAMERA)
            ],
        )
        p = self.params
        self._names = list(p["joint_names"])
        if sorted(self._names) != sorted(robot.JOINT_NAMES):
            raise ParameterError(
                f"joint_names must be the workcell's 14 joints in any order: {robot.JOINT_NAMES}"
            )
        self._order = [robot.JOINT_NAMES.index(n) for n in self._names]  # entry -> robot joint
        self._index = {n: robot.JOINT_NAMES.index(n) for n in self._names}
        self._camera_sizes = {
            c: (p[f"cameras.{c}.width"], p[f"cameras.{c}.height"]) for c in p["camera_names"]
        }
        self._lock = threading.Lock()  # workcell, buffer, episode, rig
        self.counters: collections.Counter[str] = collections.Counter()
        self._throttle = ReasonThrottle(THROTTLE_S)
        self._episode = EpisodeTracker()
        self._buffer = CommandBuffer(
            CommandBufferConfig(robot.NUM_JOINTS, p["chunk_max_age_s"]), robot.HOME
        )
        speed = p["max_joint_speed"]
        if speed and len(speed) != len(self._names):
            raise ParameterError(f"max_joint_speed needs {len(self._names)} values or none")
        # Per robot joint (command buffer order): the largest target change in one tick.
        self._max_step = (
            np.array([speed[self._names.index(n)] for n in robot.JOINT_NAMES])
            / p["control_rate_hz"]
            if speed
            else None
        )
        self._applied = robot.HOME.copy()  # the targets of the last tick
        self._pacer = Pacer(p["real_time_factor"])
        self._pending_factor: float | None = None
        self._paused = threading.Event()
        if p["paused"]:
            self._paused.set()
        self._meter = RateMeter()
        self._joint_every = Every(p["joint_rate_hz"])
        self._camera_every = Every(p["camera_rate_hz"])
        self._status_every = Every(p["status_rate_hz"])
        self._lateness = [0.0, 0.0, 0]  # since the last diagnostics: max s, sum s, ticks
        self._sim_now = 0.0
        self._workcell: Workcell | None = None
        self._rig: CameraRig | None = None
        self._failure = ""

        self._clock_pub = self.create_publisher(Clock, "/clock", RELIABLE_QOS)
        self._joint_pub = self.create_publisher(JointState, p["joint_state_topic"], SENSOR_QOS)
        self._command_pub = self.create_publisher(JointState, p["joint_command_topic"], STREAM_QOS)
        self._image_pubs = {
            c: self.create_publisher(Image, p[f"cameras.{c}.topic"], SENSOR_QOS)
            for c in self._camera_sizes
        }
        self._status_pub = self.create_publisher(
            EpisodeStatus, p["episode_status_topic"], LATCHED_QOS
        )
        # Transient local: reaches the inference node's transient-local subscription (a
        # volatile publisher would not match it), also when it starts after the reset.
        self._instruction_pub = self.create_publisher(String, p["instruction_topic"], LATCHED_QOS)
        self._diag_pub = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
        self.create_subscription(ActionChunk, p["actions_topic"], self._on_chunk, RELIABLE_QOS)
        self.create_subscription(
            JointTrajectory, p["joint_trajectory_topic"], self._on_trajectory, RELIABLE_QOS
        )
        self.create_service(
            ResetEpisode, p["reset_service"], self._on_reset, qos_profile=SERVICE_QOS
        )
        self._diag_timer = self.create_timer(self._diag_period(), self._publish_diagnostics)
        self.params.add_listener(self._on_params)

        self._stop = threading.Event()
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ready,), daemon=True)
        self._thread.start()
        if not ready.wait(START_TIMEOUT_S) or self._workcell is None:
            self._stop.set()
            raise ValueError(f"workcell did not start: {self._failure or 'timeout'}")
        if p["initial_seed"] >= 0:
            ok, message, _, _ = self.reset_episode(p["initial_seed"], "")
            if not ok:
                self.get_logger().error(f"initial episode refused: {message}")
        self.get_logger().info(
            f"simulating at {p['control_rate_hz']:g} Hz, real-time factor "
            f"{p['real_time_factor']:g}; cameras {list(self._camera_sizes)} at "
            f"{p['camera_rate_hz']:g} Hz; joints at {p['joint_rate_hz']:g} Hz"
        )

    def _diag_period(self) -> float:
        return self.params["diagnostics_period_s"] or 3600.0

    # ---------------------------------------------------------------- simulation thread
    def _run(self, ready: threading.Event) -> None:
        p = self.params
        try:
            first = next(iter(self._camera_sizes.values()), (224, 224))
            self._workcell = Workcell(
                WorkcellConfig(
                    scene=SceneConfig(test_pattern=p["test_pattern"]),
                    image_width=first[0],
                    image_height=first[1],
                    cameras=tuple(self._camera_sizes),
                    render=bool(self._camera_sizes),
                )
            )
            self._rig = CameraRig(self._workcell, self._camera_sizes)
        except Exception as exc:  # reported by __init__, which waits for `ready`
            self._failure = f"{type(exc).__name__}: {exc}"
            ready.set()
            return
        self._sim_now = self._workcell.time
        ready.set()
        try:
            while not self._stop.is_set():
                if self._paused.is_set():  # sim time stands still; paced anew after
                    self._stop.wait(PAUSE_POLL_S)
                    continue
                try:
                    t = self._tick(1.0 / p["control_rate_hz"])
                    self._maybe_next_episode(t)
                except Exception as exc:  # one bad tick must not end the simulation
                    with self._lock:
                        self.counters["tick_errors"] += 1
                    self._throttle.warn(self, "tick_error", f"tick failed: {exc!r}")
                    self._stop.wait(1.0 / p["control_rate_hz"])  # never a busy loop
                    continue
                self._pace(t)
        finally:
            self._rig.close()
            self._workcell.close()

    def _tick(self, dt: float) -> float:
        """One control tick; returns the new sim time."""
        wc = self._workcell
        with self._lock:
            t0 = wc.time
            starved = self._buffer.counters.starvation_events
            target, _status = self._buffer.target(t0)
            self._episode.add_starvation(self._buffer.counters.starvation_events - starved)
            if self._max_step is not None:  # servo speed: the target moves at most this far
                target = np.clip(
                    target, self._applied - self._max_step, self._applied + self._max_step
                )
            applied = self._applied = wc.set_targets(target)
            diverged = wc.instabilities
            wc.step(dt)
            if wc.instabilities != diverged:  # MuJoCo reset the state (the clock went on)
                self._unstable(t0)
            t1 = self._sim_now = wc.time
            self._clock_pub.publish(C.clock_msg(t1))
            self._command_pub.publish(
                C.joint_state_msg(t0, self.params["frame_id"], self._names, self._order, applied)
            )
            cameras_due = bool(self._camera_sizes) and self._camera_every.due(t1)
            if self._joint_every.due(t1) or cameras_due:
                self._joint_pub.publish(
                    C.joint_state_msg(
                        t1,
                        self.params["frame_id"],
                        self._names,
                        self._order,
                        wc.joint_positions(),
                        wc.joint_velocities(),
                    )
                )
            changed = False
            if self._episode.phase != "idle":
                changed = self._episode.update(t1, tasks.evaluate(wc, self._episode.spec))
            # A status before each tick's images: a node that has one at or after an image's
            # stamp knows every reset up to that image (perception's episode_status_wait_s).
            if self._status_every.due(t1) or changed or cameras_due:
                self._publish_status(t1)
            if cameras_due:
                stamp = seconds_to_time(t1)
                for camera, pub in self._image_pubs.items():
                    pub.publish(rgb_image_msg(self._rig.render(camera), stamp, camera))
        return t1

    def _unstable(self, t0: float) -> None:
        """The physics diverged and MuJoCo reset the state (Workcell kept the time going)."""
        self.counters["physics_unstable"] += 1
        self._throttle.warn(
            self, "physics_unstable", f"physics unstable at {t0:.3f} s: MuJoCo reset the state"
        )

    def _pace(self, t: float) -> None:
        self._meter.add(t)
        if self._pending_factor is not None:
            self._pacer.set_factor(self._pending_factor, t)
            self._pending_factor = None
        sleep_s, late_s = self._pacer.wait_s(t)
        stats = self._lateness
        stats[0], stats[1], stats[2] = max(stats[0], late_s), stats[1] + late_s, stats[2] + 1
        if sleep_s > 0:
            self._stop.wait(sleep_s)

    def _publish_status(self, now: float) -> None:
        """Under the lock."""
        wc = self._workcell
        objects = [
            (name, pose.position, pose.quaternion)
            for name in wc.object_names()
            for pose in (wc.object_pose(name),)
        ]
        self._status_pub.publish(
            C.episode_status_msg(
                self._episode, now, self._meter.factor(), objects, self.params["frame_id"]
            )
        )

    # ---------------------------------------------------------------- episodes
    def reset_episode(
        self, seed: int, instruction: str, after_episode: int | None = None
    ) -> tuple[bool, str, int, str]:
        """Starts a new episode; returns (accepted, message, episode id, instruction).
        `after_episode`: start it only while that episode is still the current one (the next
        episode of `next_episode_after_s`, which a reset request may have overtaken)."""
        try:
            spec = tasks.sample_episode(seed, instruction)
        except ValueError as exc:
            self.counters["resets_refused"] += 1
            return False, str(exc), self._episode.episode_id, ""
        limit = self.params["episode_time_limit_s"] or spec.time_limit_s
        with self._lock:
            if after_episode is not None and self._episode.episode_id != after_episode:
                return False, "overtaken by a reset", self._episode.episode_id, ""
            self._workcell.reset(robot.HOME, spec.objects)
            self._buffer.reset(robot.HOME)
            self._applied = robot.HOME.copy()
            episode_id = self._episode.start(spec, self._workcell.time, limit)
            # The status (the reset's exact time) before the instruction: a node that handles
            # them in the order sent never starts the task on its own lagging clock alone.
            self._publish_status(self._workcell.time)
            if self.params["publish_instruction"]:
                self._instruction_pub.publish(String(data=spec.instruction))
        self.counters["resets"] += 1
        self.get_logger().info(f"episode {episode_id} (seed {seed}): {spec.instruction!r}")
        return True, f"episode {episode_id}: {spec.instruction}", episode_id, spec.instruction

    def _maybe_next_episode(self, now: float) -> None:
        """`next_episode_after_s` > 0: the episode that ended that long ago is followed by the
        next seed's (simulation thread)."""
        delay = self.params["next_episode_after_s"]
        if delay <= 0:  # every tick: no lock while it is off
            return
        with self._lock:
            ended = self._episode
            if ended.end_s < 0 or now - ended.end_s < delay:  # idle or running: end_s < 0
                return
            episode_id, seed, phase = ended.episode_id, ended.spec.seed + 1, ended.phase
        self.get_logger().info(f"episode {episode_id} {phase}; next: seed {seed}")
        ok, message, _, _ = self.reset_episode(seed, "", after_episode=episode_id)
        if not ok and message != "overtaken by a reset":
            self._throttle.warn(self, "next_episode", f"next episode refused: {message}")

    def _on_reset(self, request, response):
        ok, message, episode_id, instruction = self.reset_episode(
            request.seed, request.instruction
        )
        response.success, response.message = ok, message
        response.episode_id, response.instruction = episode_id, instruction
        return response

    # ---------------------------------------------------------------- commands
    def _on_chunk(self, msg: ActionChunk) -> None:
        self._submit("chunk", lambda now: self._fresh(C.chunk_targets(msg, self._index, now), msg))

    def _fresh(self, targets, msg: ActionChunk):
        """Refuses a chunk inferred from an observation older than the current episode: the
        world it was planned for is gone (the reset moved the robot and the objects)."""
        observed = time_to_seconds(msg.observation_stamp)
        if observed > 0 and self._episode.phase != "idle" and observed < self._episode.start_s:
            raise RejectedCommandError(
                "before_reset",
                f"chunk from an observation at {observed:.3f} s, before the reset at "
                f"{self._episode.start_s:.3f} s",
            )
        return targets

    def _on_trajectory(self, msg: JointTrajectory) -> None:
        number = self.counters["trajectory"]
        self._submit("trajectory", lambda now: C.trajectory_targets(msg, self._index, now, number))

    def _submit(self, kind: str, build) -> None:
        try:
            now = self._sim_now
            targets = build(now)
            with self._lock:
                self._buffer.submit(targets, now)
        except RejectedCommandError as exc:
            self.counters[f"rejected.{exc.reason}"] += 1
            self._throttle.warn(self, exc.reason, f"{kind} rejected ({exc.reason}): {exc}")
            return
        except Exception as exc:  # malformed beyond the checks: drop it, keep running
            self.counters["rejected.internal_error"] += 1
            self._throttle.warn(self, "internal_error", f"{kind} dropped: {exc!r}")
            return
        self.counters[kind] += 1

    # ---------------------------------------------------------------- params, diagnostics
    def _on_params(self, changed: dict) -> None:
        if "real_time_factor" in changed:
            self._pending_factor = changed["real_time_factor"]
        if "paused" in changed:
            if changed["paused"]:
                self._paused.set()
            else:  # re-anchor the pacer at the next tick: no burst to catch up the pause
                self._pending_factor = self.params["real_time_factor"]
                self._paused.clear()
        for name, every in (
            ("joint_rate_hz", self._joint_every),
            ("camera_rate_hz", self._camera_every),
            ("status_rate_hz", self._status_every),
        ):
            if name in changed:
                every.set_rate(changed[name])
        if "diagnostics_period_s" in changed:
            self._diag_timer.timer_period_ns = int(1e9 * self._diag_period())

    def _publish_diagnostics(self) -> None:
        if not self.params["diagnostics_period_s"]:
            return
        with self._lock:
            render_ms = self._rig.take_render_ms() if self._rig else {}
            (late_max, late_sum, ticks), self._lateness = self._lateness, [0.0, 0.0, 0]
            buffer = self._buffer.counters
            values: dict[str, object] = {
                "real_time_factor": self._meter.factor(),
                "real_time_factor_target": self.params["real_time_factor"],
                "sim_time_s": self._sim_now,
                "tick_lateness_max_ms": 1e3 * late_max,
                "tick_lateness_mean_ms": 1e3 * late_sum / max(ticks, 1),
                "resyncs": self._pacer.resyncs,
                "episode_id": self._episode.episode_id,
                "phase": self._episode.phase,
                "commands_accepted": buffer.commands_accepted,
                "ticks_active": buffer.ticks_active,
                "ticks_hold": buffer.ticks_hold_exhausted + buffer.ticks_hold_expired,
                "starvation_events": buffer.starvation_events,
            }
            counters = sorted(self.counters.items())  # the sim thread adds keys under the lock
        values.update({f"render_ms.{c}": ms for c, ms in sorted(render_ms.items())})
        values.update(counters)
        values["paused"] = self._paused.is_set()
        rtf, target = values["real_time_factor"], self.params["real_time_factor"]
        if not self._thread.is_alive():
            level, message = "ERROR", "simulation stopped"
        elif self._paused.is_set():
            level, message = "OK", f"paused at {values['sim_time_s']:.3f} s (parameter paused)"
        elif rtf < 0.8 * target:
            level, message = "WARN", f"real-time factor {rtf:.2f} below {target:g}"
        else:
            level, message = "OK", f"real-time factor {rtf:.2f}"
        publish_status(self, self._diag_pub, level, message, values)

    def close(self) -> None:
        self._diag_timer.cancel()
        self._stop.set()
        self._thread.join(5.0)


def main(args: Sequence[str] | None = None) -> int:
    return run_node(WorkcellSimNode, "workcell_sim", args, num_threads=1)


if __name__ == "__main__":
    sys.exit(main())
