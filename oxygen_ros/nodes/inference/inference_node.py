"""Inference: owns the engine (and so the unified KV cache); publishes actions, speech, memory.

The node holds parameters, publishers, subscriptions, services and timers, and wires three
units together, one job each:
- `engine_loop.EngineLoop`, the engine thread: newest ObservationFrame (or, with
  `frame_pickup: on_arrival`, the next one to arrive when the newest has waited too long) +
  queued language requests -> `Engine.step`; its `on_actions` hands the chunk over the moment
  it is denoised;
- `action_publisher.ActionPublisher`, in a child process of its own (`action_process`: node
  `<name>_actions`, its thread SCHED_FIFO when `action_thread_priority` > 0 and permitted):
  a new chunk at once (`TRIGGER_NEW_CHUNK`), then ticks at `action_rate_hz` on absolute
  deadlines (`TRIGGER_TICK`, a late tick is skipped), and the watchdog. Not a ROS timer (a
  timer dispatched through the Python executor missed ticks next to the engine: 67 Hz instead
  of 70) and not a thread of this process (it would wait for this process's GIL at every
  tick: `action_process` has the measurements); the engine thread hands chunks over through
  `ActionLink`;
- `request_book.RequestBook`: every accepted language request ends with exactly one final
  SpeechToken (finished, aborted, refused or failed), also when the engine raises.
A single-threaded executor runs the node's callbacks (instruction, services, periodic requests,
diagnostics); none of them calls the engine. They are split by job over the node's mixins:
`node_inputs` (frames, instructions, the Instruct host, language requests, memory queries),
`node_outputs` (the action process's reports, speech, memory entries) and `node_diagnostics`;
this module holds the wiring, the lifecycle and the configuration. Observation bytes arrive
on a thread of their own (`frame_intake.FrameIntake`, helper node `<name>_frames`), so a frame
never waits behind those callbacks on its way to the engine.

Lifecycle (a managed node, `rclpy.lifecycle`; the standard `~/change_state` and `~/get_state`
services):
- unconfigured: parameters, memory store, inputs, services; no engine and no action process.
  Frames are dropped (`frames_unconfigured`), language requests refused; an instruction is
  kept as the prompt (while not active in general), its subtask requested at activate.
- configure: starts the action process (its stream closed: stop reason "inactive") and the
  engine thread, and returns only when the engine has loaded and compiled (`warmup`) and the
  action process runs; FAILURE (back to unconfigured, both stopped) when the engine fails to
  start or `configure_timeout_s` passes. It blocks the caller (the executor for a
  `change_state` request) meanwhile.
- inactive: the engine runs frames (the measured pose stays current and language requests in
  flight end), nothing is published on the action topics: its chunks are dropped at the gate.
  New language requests are refused and periodic ones paused.
- activate: opens the gate; the next fresh chunk starts from the measured pose.
- deactivate: closes the gate: one explicit hold of the measured pose, then silence; queued
  and in-flight language requests end (aborted, "node deactivated").
- cleanup / shutdown / error: stop the engine thread and the action process, end every
  request. After shutdown (finalized) the process exits.
- `autostart` (default true) drives the node to active from a thread of its own at start, as
  nav2's lifecycle manager does for its nodes; the executor keeps serving meanwhile. If that
  fails, the process exits with code 1.
- No random brain on a robot: without `checkpoint_dir`, outside simulation (`use_sim_time`
  false) and without `allow_random_weights`, activate fails with the reason (logged, the
  `/diagnostics` ERROR, Instruct goals refused with it) and the node stays inactive: nothing
  reaches the action topics. Autostart then stops at inactive and the process keeps running
  (no exit, so nothing restarts it into the same refusal).

Invariants (the units' docstrings hold the rest):
- A memory entry is committed to SQLite before it is published; the last
  `memory_republish_count` entries are republished (transient local) at start.
- Bad input (frames that break the message invariants, stale or future frames, empty /
  non-UTF-8 instructions) is counted and warned about (throttled), never passed to the engine.
- Instructions come from latched and volatile publishers alike (`instruction_intake`), each
  publication counted once; the one in use (after `default_instruction`, then every accepted
  one) is on `current_instruction_topic`, latched.
- The `Instruct` action (`instruct_server`, `instruct_action`): the node is its host. A goal's
  instruction is applied as a topic instruction is; cancel and the time limit engage a stop
  reason of their own in the action gate ("canceled", "time_limit": a hold of the measured
  pose, then silence) that the next instruction (goal or topic) releases, also across
  cleanup/configure. Finished subtasks and narrations are its feedback; `task_status_topic`'s
  `EpisodeStatus.success` rising ends a goal SUCCEEDED; deactivate and shutdown end it FAILED.
- Test only: `fault_injection` (off by default) makes every frame raise after `Engine.step` or
  poisons its chunk with NaN, to exercise the fault paths over ROS.
"""

from __future__ import annotations

import collections
import os
import sys
import threading
import time
from collections.abc import Sequence

from diagnostic_msgs.msg import DiagnosticArray
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.lifecycle import LifecycleNode, LifecycleState, TransitionCallbackReturn
from std_msgs.msg import String

from oxygen_ros.engine.action_stream import StreamConfig
from oxygen_ros.engine.types import RequestKind
from oxygen_ros.msg import EpisodeStatus, MemoryEntry, ObservationFrame, SpeechToken
from oxygen_ros.nodes.common.deduplicator import Deduplicator
from oxygen_ros.nodes.common.parameters import NodeParameters, ParameterError
from oxygen_ros.nodes.common.params import SHARED
from oxygen_ros.nodes.common.runtime import (
    LATCHED_QOS,
    OBSERVATION_QOS,
    SERVICE_QOS,
    SPEECH_QOS,
    ReasonThrottle,
    latched_qos,
    now_s,
    run_node,
    subscribe_latched_and_volatile,
)
from oxygen_ros.nodes.inference.action_process import ActionProcess, ActionProcessConfig
from oxygen_ros.nodes.inference.action_publisher import PARAMETERS as ACTION_PARAMETERS
from oxygen_ros.nodes.inference.engine_bridge import (
    LanguageQueue,
    RateMeter,
    build_engine_config,
    random_weights_refusal,
    state_extra_names,
)
from oxygen_ros.nodes.inference.engine_loop import EngineLoop, FrameFormat
from oxygen_ros.nodes.inference.frame_inbox import FrameInbox
from oxygen_ros.nodes.inference.frame_intake import FrameIntake
from oxygen_ros.nodes.inference.instruct_server import InstructServer
from oxygen_ros.nodes.inference.instruction_intake import HISTORY as INSTRUCTION_HISTORY
from oxygen_ros.nodes.inference.memory_store import MemoryStore
from oxygen_ros.nodes.inference.node_diagnostics import InferenceDiagnostics
from oxygen_ros.nodes.inference.node_inputs import InferenceInputs
from oxygen_ros.nodes.inference.node_outputs import THROTTLE_S, InferenceOutputs
from oxygen_ros.nodes.inference.params import INFERENCE, trajectory_group_specs
from oxygen_ros.nodes.inference.request_book import RequestBook
from oxygen_ros.nodes.inference.trajectory_groups import (
    TrajectoryGroup,
    all_joints_group,
    parse_groups,
)
from oxygen_ros.srv import QueryMemory, RequestLanguage

ENGINE_JOIN_S = 3.0  # at shutdown, how long to wait for a frame in progress
ACTIONS_JOIN_S = 2.0  # at shutdown, how long the action process may take to exit
GIL_SWITCH_INTERVAL_S = 0.0005
INACTIVE = "inactive"  # the action gate's stop reason while the node is not active
CONFIGURE_POLL_S = 0.1  # how often a waiting configure looks at the shutdown flag
FLUSH_S = 1.0  # at shutdown, how long Instruct results may take to reach their clients


class InferenceNode(InferenceInputs, InferenceOutputs, InferenceDiagnostics, LifecycleNode):
    """Runs the engine and publishes its actions, speech and memory (a managed node)."""

    def __init__(self) -> None:
        super().__init__("inference")
        self.params = NodeParameters(
            self,
            SHARED + INFERENCE,
            dependent=lambda v: [
                s for g in v["trajectory_groups"] for s in trajectory_group_specs(g)
            ],
        )
        p = self.params
        self._joint_names = tuple(p["joint_names"])
        try:
            # The model's state: the joints, then perceived entries of the frame (not
            # actions), named by the parameter or by the checkpoint.
            self._engine_config = build_engine_config(p.values(), len(self._joint_names))
            extra = state_extra_names(
                p["state_extra_names"], self._engine_config, self._joint_names
            )
            self._state_names = state_names = self._joint_names + extra
            if len(set(state_names)) != len(state_names):
                raise ValueError(f"state_extra_names repeat a joint: {list(extra)}")
            self._stream_config()  # checked here; built again at configure (runtime values)
            self._groups = self._trajectory_groups()
        except ValueError as exc:
            raise ParameterError(str(exc)) from exc
        if extra and not p["state_extra_names"]:
            self.get_logger().info(
                f"state after the joints, from the checkpoint's state layout: {list(extra)}"
            )
        model = self._engine_config.model
        self._refusal = random_weights_refusal(
            p["checkpoint_dir"],
            bool(self.get_parameter("use_sim_time").value),
            p["allow_random_weights"],
        )
        if self._refusal:
            self.get_logger().error(self._refusal)
        self._store = MemoryStore(p["memory_db_path"])
        if self._store.moved_aside is not None:
            self.get_logger().error(
                f"memory database {self._store.path} was unusable "
                f"({self._store.moved_aside_reason}); moved aside to {self._store.moved_aside}"
                " and started a new one"
            )
        self.counters: collections.Counter[str] = collections.Counter()
        self._throttle = ReasonThrottle(THROTTLE_S)  # per rejection reason
        self._token_rate = RateMeter()
        self._closing = False  # close() started: the action process is told to stop
        self._actions_failed = False  # the action process ended on its own
        self._autostart_failed = False  # autostart could not reach active: exit code 1
        self._finalized = False  # the shutdown transition ran: the spin ends
        self._active = False  # lifecycle active: the action gate is open
        self._subtask_due = False  # an instruction came while not active: ask at activate
        self._holds: set[str] = set()  # Instruct's engaged stop reasons (kept over cleanup)
        # The units run between configure and cleanup; the lock guards their assignment.
        self._units_lock = threading.Lock()
        self._actions: ActionProcess | None = None
        self._engine: EngineLoop | None = None

        # Publishers (actions and trajectories: the action process's).
        self._io_group = MutuallyExclusiveCallbackGroup()
        self._speech_pub = self.create_publisher(SpeechToken, p["speech_topic"], SPEECH_QOS)
        self._memory_pub = self.create_publisher(
            MemoryEntry, p["memory_topic"], latched_qos(p["memory_republish_count"])
        )
        self._diag_pub = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
        self._instruction_pub = self.create_publisher(
            String, p["current_instruction_topic"], LATCHED_QOS
        )

        # The units.
        # The node's ROS clock (observation stamps; sim time with use_sim_time).
        self._now = clock = lambda: now_s(self)
        # Request ids name this run (its start time, hex seconds): unique across restarts.
        self._queue = LanguageQueue(p["max_pending_requests"], run_id=f"{int(time.time()):x}")
        self._book = RequestBook(self._queue, self._send_speech, clock)
        self._inbox = FrameInbox(
            self._clean_instruction(p["default_instruction"]) or "", clock=clock
        )
        if self._inbox.prompt:
            self._instruction_pub.publish(String(data=self._inbox.prompt))

        # Inputs, services, timers. Frames arrive on a thread of their own (`frame_intake`),
        # raw: deserialized by the engine thread, only the frames it uses.
        self._frame_counts: collections.Counter[str] = collections.Counter()
        self._frame_counts_lock = threading.Lock()  # the intake's thread adds, diagnostics read
        self._frames = FrameIntake(
            self, ObservationFrame, p["observation_topic"], OBSERVATION_QOS, self._on_frame
        )
        # Instructions from latched and volatile publishers; a latched message reaches both
        # subscriptions and is counted once (`_on_instruction`).
        self._instructions_seen = Deduplicator(INSTRUCTION_HISTORY)
        self._status_episode = 0  # the newest episode task_status_topic reported (0: none)
        subscribe_latched_and_volatile(
            self,
            String,
            p["instruction_topic"],
            self._on_instruction,
            callback_group=self._io_group,
        )
        self.create_service(
            RequestLanguage,
            p["request_language_service"],
            self._on_request_language,
            qos_profile=SERVICE_QOS,
            callback_group=self._io_group,
        )
        self.create_service(
            QueryMemory,
            p["query_memory_service"],
            self._on_query_memory,
            qos_profile=SERVICE_QOS,
            callback_group=self._io_group,
        )
        self._subtask_timer = self.create_timer(
            self._period("subtask_period_s"),
            lambda: self._periodic(RequestKind.SUBTASK),
            callback_group=self._io_group,
        )
        self._narration_timer = self.create_timer(
            self._period("narration_period_s"),
            lambda: self._periodic(RequestKind.NARRATION),
            callback_group=self._io_group,
        )
        self._memory_timer = self.create_timer(
            self._period("memory_period_s"),
            lambda: self._periodic(RequestKind.MEMORY),
            callback_group=self._io_group,
        )
        self._diag_timer = self.create_timer(
            self._period("diagnostics_period_s"),
            self._publish_diagnostics,
            callback_group=self._io_group,
        )
        self._instruct = InstructServer(
            self,
            p["instruct_action"],
            self,
            callback_group=self._io_group,
            max_chars=p["instruction_max_chars"],
        )
        if p["task_status_topic"]:
            subscribe_latched_and_volatile(
                self,
                EpisodeStatus,
                p["task_status_topic"],
                self._on_task_status,
                callback_group=self._io_group,
            )
        self.params.add_listener(self._on_params)

        self._republish_memory()
        self.get_logger().info(
            f"unconfigured (engine {model.name}); memory in {self._store.path} (last id "
            f"{self._store.last_id()}); "
            + ("autostart: configuring" if p["autostart"] else "waiting for change_state")
        )
        if p["autostart"]:
            threading.Thread(target=self._autostart, name="autostart", daemon=True).start()

    @property
    def stop_requested(self) -> bool:
        """True when autostart failed, after the shutdown transition, or when the action
        process ended on its own: ends the spin (`run_node`)."""
        return self._autostart_failed or self._finalized or self._actions_lost()

    @property
    def exit_code(self) -> int:
        return 1 if self._autostart_failed or self._actions_failed else 0

    def _actions_lost(self) -> bool:
        """The action process ended without being told to (logged once)."""
        actions = self._actions
        if self._actions_failed or self._closing or actions is None or actions.alive():
            return self._actions_failed
        if actions is self._actions:  # not stopped meanwhile by cleanup
            self._actions_failed = True
            self.get_logger().fatal(
                f"the action process exited (code {actions.popen.poll()}); no actions are "
                "published, stopping"
            )
        return self._actions_failed

    # ================================================================ lifecycle
    def _autostart(self) -> None:
        """`autostart`: configure, then activate (in a thread: the executor keeps serving);
        with a refusal (`random_weights_refusal`) it stops at inactive."""
        ok = TransitionCallbackReturn.SUCCESS
        configured = self.trigger_configure() == ok
        if configured and self._refusal:
            return  # inactive, as refused: the diagnostics name the reason
        reached = configured and self.trigger_activate() == ok
        if not reached and not self._closing:
            self.get_logger().fatal("autostart failed to reach active; stopping")
            self._autostart_failed = True

    def on_configure(self, state: LifecycleState) -> TransitionCallbackReturn:
        with self._units_lock:
            if self._closing:
                return TransitionCallbackReturn.FAILURE
            self._start_units()
            engine, link = self._engine, self._actions.link
        deadline = time.monotonic() + self.params["configure_timeout_s"]
        while not (engine.started.is_set() and (link.ready.is_set() or link.closed.is_set())):
            if self._closing or time.monotonic() > deadline:
                break
            engine.started.wait(CONFIGURE_POLL_S)
        if engine.state == "ready" and link.ready.is_set() and not link.closed.is_set():
            self.get_logger().info("configured: engine ready, action stream closed (inactive)")
            return TransitionCallbackReturn.SUCCESS
        if self._closing:
            why = "the node is shutting down"
        elif engine.state == "failed":
            why = "the engine failed to start"
        elif link.closed.is_set():
            why = "the action process exited"
        else:
            why = f"not ready within configure_timeout_s={self.params['configure_timeout_s']:g}"
        self.get_logger().error(f"configure failed: {why}")
        self._stop_units("configure failed")
        return TransitionCallbackReturn.FAILURE

    def on_activate(self, state: LifecycleState) -> TransitionCallbackReturn:
        actions = self._actions
        if actions is None:
            return TransitionCallbackReturn.FAILURE
        if self._refusal:
            self.get_logger().error(f"activate refused: {self._refusal}")
            return TransitionCallbackReturn.FAILURE
        self._active = True
        actions.link.set_stop(INACTIVE, False)
        self.get_logger().info(
            f"active: actions at {self.params['action_rate_hz']:g} Hz on "
            f"{self.resolve_topic_name(self.params['actions_topic'])}"
        )
        if self._subtask_due and self._inbox.prompt:
            self.get_logger().info(
                f"subtask of the instruction given while inactive: {self._request_subtask()}"
            )
        return super().on_activate(state)

    def on_deactivate(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._active = False
        actions = self._actions
        if actions is not None:
            actions.link.set_stop(INACTIVE, True)  # the hold, then silence
        for kind in RequestKind:
            self._book.supersede(kind, "node deactivated")
        self._instruct.abort_all("node deactivated")
        self._inbox.wake()
        self.get_logger().info("inactive: action stream stopped with a hold")
        return super().on_deactivate(state)

    def on_cleanup(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._stop_units("engine cleaned up")
        self.get_logger().info("unconfigured: engine and action process stopped")
        return TransitionCallbackReturn.SUCCESS

    def on_shutdown(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._stop_units("node shut down")
        self._finalized = True
        return TransitionCallbackReturn.SUCCESS

    def on_error(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._stop_units("lifecycle error")
        return TransitionCallbackReturn.SUCCESS

    def _lifecycle_state(self) -> str:
        """The current state's label (unconfigured, inactive, active, configuring, ...)."""
        return self._state_machine.current_state[1]  # rclpy's LifecycleNodeMixin state machine

    def _start_units(self) -> None:
        """The action process (gate closed) and the engine thread (lock held)."""
        p = self.params
        model = self._engine_config.model
        self._actions = ActionProcess.start(
            ActionProcessConfig(
                node_name=f"{self.get_name()}_actions",
                namespace=self.get_namespace(),
                actions_topic=self.resolve_topic_name(p["actions_topic"]),
                estop_topic=self.resolve_topic_name(p["emergency_stop_topic"]),
                estop_service=self.resolve_service_name(p["emergency_stop_service"]),
                trajectory_groups=self._groups if p["publish_joint_trajectory"] else (),
                frame_id=p["frame_id"],
                joint_names=self._joint_names,
                horizon=model.action_horizon,
                stream=self._stream_config(),
                params={name: p[name] for name in ACTION_PARAMETERS},
                priority=p["action_thread_priority"],
                use_sim_time=bool(self.get_parameter("use_sim_time").value),
            ),
            on_reject=self._reject,
            on_watchdog=self._on_watchdog,
            on_ready=self._on_actions_ready,
        )
        self._actions.link.set_stop(INACTIVE, True)  # before any chunk can arrive
        for reason in self._holds:  # a canceled task still holds after cleanup/configure
            self._actions.link.set_stop(reason, True)
        clock = self._now

        def engine_factory():
            from oxygen_ros.engine.engine import Engine  # JAX import: seconds, not here

            return Engine(self._engine_config, clock=clock)

        self._engine = EngineLoop(
            engine_factory,
            FrameFormat(
                model.image_keys, self._state_names, len(self._joint_names), model.image_resolution
            ),
            self._inbox,
            self._book,
            self._actions.link,
            p,
            clock=clock,
            logger=self.get_logger(),
            reject=self._reject,
            on_finished=self._on_finished,
        )
        self._engine.start()
        self.get_logger().info(
            f"configuring: engine {model.name} loading, action publisher starting (process "
            f"{self._actions.popen.pid})"
        )

    def _stop_units(self, reason: str) -> None:
        """Stops the action process and the engine thread (idempotent), then ends every
        request with `reason`."""
        self._active = False
        with self._units_lock:
            actions, self._actions = self._actions, None
            engine, self._engine = self._engine, None
        if actions is not None:
            actions.stop(ACTIONS_JOIN_S)
        if engine is not None:
            engine.stop()
            if not engine.join(ENGINE_JOIN_S):
                doing = "inside a frame" if engine.state == "ready" else "loading"
                self.get_logger().warning(
                    f"engine still {doing} after {ENGINE_JOIN_S:g} s; not waiting for it"
                )
        self._book.abort_all(reason)

    # ================================================================ configuration
    def _stream_config(self) -> StreamConfig:
        p = self.params
        return StreamConfig(
            dt=p["action_dt_s"],
            num_joints=len(self._joint_names),
            blend_mode="blend" if p["chunk_transition"] == "blend" else "replace",
            blend_steps=p["blend_steps"],
            max_chunk_age_s=p["max_chunk_age_s"],
            time_offset_s=p["action_time_offset_s"],
            position_lower=tuple(p["joint_position_lower"]),
            position_upper=tuple(p["joint_position_upper"]),
            max_velocity=tuple(p["joint_max_velocity"]),
        )

    def _trajectory_groups(self) -> tuple[TrajectoryGroup, ...]:
        """The JointTrajectory groups (topics resolved); no groups: one of every joint."""
        p = self.params
        if not p["trajectory_groups"]:
            topic = self.resolve_topic_name(p["joint_trajectory_topic"])
            return (all_joints_group(self._joint_names, topic),)
        groups = {
            g: (
                self.resolve_topic_name(p[f"trajectory_group.{g}.topic"]),
                p[f"trajectory_group.{g}.joints"],
            )
            for g in p["trajectory_groups"]
        }
        return parse_groups(self._joint_names, groups)

    def _period(self, name: str) -> float:
        """Timer period for a period parameter; 0 (disabled) polls rarely and does nothing."""
        return self.params[name] or 1.0

    def _on_params(self, changed: dict) -> None:
        # action_rate_hz, watchdog_*, stats_window_s, max_chunk_age_s, frame_pickup* and
        # fault_injection are read live by the units.
        if "action_rate_hz" in changed:
            self.get_logger().info(f"action_rate_hz -> {changed['action_rate_hz']:g}")
        for name, timer in (
            ("subtask_period_s", self._subtask_timer),
            ("narration_period_s", self._narration_timer),
            ("memory_period_s", self._memory_timer),
            ("diagnostics_period_s", self._diag_timer),
        ):
            if name in changed:
                timer.timer_period_ns = int(1e9 * self._period(name))
        actions = self._actions  # unconfigured: the values are read at configure
        if actions is not None:
            actions.link.set_params(
                {name: changed[name] for name in ACTION_PARAMETERS if name in changed}
            )
            if {"blend_steps", "max_chunk_age_s"} & set(changed):
                actions.link.reconfigure(self._stream_config())
        if "fault_injection" in changed:
            fault = changed["fault_injection"]
            self.get_logger().warning(
                f"fault_injection={fault!r}: every frame fails that way (test only)"
                if fault
                else "fault_injection off"
            )

    # ================================================================ shutdown
    def close(self) -> None:
        """Stops timers and both units (in any lifecycle state, also while a configure waits),
        ends requests, closes the database."""
        timers = (self._subtask_timer, self._narration_timer, self._memory_timer, self._diag_timer)
        for timer in timers:
            timer.cancel()
        self._closing = True
        self._frames.close()  # no more frames for the engine
        self._instruct.abort_all("node shutting down")
        if not self._instruct.flush(FLUSH_S):  # after the spin loop: results still go out
            self.get_logger().warning("Instruct results not all sent before shutdown")
        self._stop_units("node shutting down")
        self._store.close()


def main(args: Sequence[str] | None = None) -> int:
    # The engine thread runs Python between device calls; a short switch interval bounds how
    # long the executor (frames, services) waits for the GIL meanwhile (the default is 5 ms).
    # The action publisher has its own process and GIL (`action_process`).
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    holder: list[InferenceNode] = []

    def factory() -> InferenceNode:
        holder.append(InferenceNode())
        return holder[-1]

    code = run_node(factory, "inference", args, num_threads=1)
    code = code or (holder[0].exit_code if holder else 0)
    if holder:
        # Everything durable is closed (database checkpointed, ROS logging finalised). Skip the
        # interpreter's finalisation: tearing down XLA's runtime takes ~2.5 s on 2 cores, and
        # with a thread still inside XLA (loading or compiling, not interruptible) it aborts.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
