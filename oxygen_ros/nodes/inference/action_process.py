"""The inference node's action publisher in a process of its own (a child of the node).

Why a process: a Python thread, even one running SCHED_FIFO, must take the GIL to wake at a
tick deadline and to publish. In the inference process other threads hold the GIL often: the
executor's callbacks (frames, timers, diagnostics, services) and the engine thread between
device calls. When such a thread is preempted while it holds the GIL (the engine computes on
one core, other processes share the other), the tick waits until it runs again: measured with
`benchmarks/ros_quick` on 2 cores, ticks 1-5 ms late whenever the executor's diagnostics ran,
tick period jitter p99 2.6-4.4 ms (docs/NODES.md, "Tick timing"). In its own process the
`ActionPublisher` has its own interpreter: nothing else holds its GIL but its own short work.

Parent (the inference node): `ActionProcess.start` spawns `python -m
oxygen_ros.nodes.inference.action_process <fd>` with one end of a socket pair; `ActionLink`
(ROS-free) is the parent's end: `hand_off` and `set_hold_positions` (engine thread), `reconfigure`,
`set_params`, `diagnostics` (executor), `stop`. Child: `main` makes a node named
`<parent>_actions` in the parent's namespace, publishers on the parent's resolved topics, an
`ActionPublisher` whose thread is the process's main thread (SCHED_FIFO when the priority is
permitted), a reader thread (`serve`, ROS-free) that applies the parent's messages, and the
emergency stop inputs (`estop_topic`: std_msgs/Bool, latched or volatile publishers;
`estop_service`: std_srvs/SetBool) on an executor thread of its own: an e-stop reaches the
publisher without passing through the parent (whose GIL the engine thread shares).

Protocol (pickled tuples, `multiprocessing.connection.Connection` framing):
- parent -> child: the `ActionProcessConfig` first; then ("hand_off", actions, observation
  stamp, latency_s, handed_at, task), ("hold", positions), ("gate", stop reason, engaged) (the
  lifecycle's "inactive", a canceled task's "canceled": `ActionPublisher.set_stop`), ("stream",
  StreamConfig), ("params", {name: value}), ("diagnostics", request id), ("stop",).
- child -> parent: ("ready", why the priority was refused or ""), ("reject", reason, message)
  (a refused chunk, or a JointTrajectory not sent: reason `trajectory_invalid.<group>`),
  ("watchdog", transition), ("diagnostics", request id, values).

Invariants:
- The child never outlives the parent: it stops when the parent says so or when the
  connection closes (the parent exited, also by kill -9); SIGINT (a terminal's Ctrl-C reaches
  the whole process group) is left to the parent, which stops the child in its `close`.
- `handed_at` is the parent's `time.monotonic()` at the hand-off (CLOCK_MONOTONIC is one clock
  for every process), so `actions.handoff_to_publish_p99_ms` includes the trip to the child.
- Messages are applied in the order the parent sent them; a diagnostics request is answered
  after everything sent before it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from oxygen_ros.engine.action_stream import Slice, StreamConfig
from oxygen_ros.nodes.inference.action_publisher import ActionPublisher, raise_thread_priority
from oxygen_ros.nodes.inference.conversions import (
    action_chunk_msg,
    joint_trajectory_msg,
    trajectory_points,
)
from oxygen_ros.nodes.inference.trajectory_groups import (
    TrajectoryGroup,
    split_chunk,
    trajectory_problems,
)

DIAGNOSTICS_TIMEOUT_S = 1.0  # the parent's wait for the child's diagnostics
GIL_SWITCH_INTERVAL_S = 0.0005  # the child's own threads (reader, sim-time clock) yield soon


@dataclasses.dataclass(frozen=True)
class ActionProcessConfig:
    """What the child needs at start (the first message)."""

    node_name: str  # the child's node name
    namespace: str  # the parent's namespace
    actions_topic: str  # fully resolved (the parent's remappings applied)
    # One JointTrajectory per group (topics fully resolved) per new chunk; () = none.
    trajectory_groups: tuple[TrajectoryGroup, ...]
    frame_id: str
    joint_names: tuple[str, ...]
    horizon: int  # rows per model chunk
    stream: StreamConfig
    params: dict[str, Any]  # the ActionPublisher's live parameters at start
    priority: int  # SCHED_FIFO priority of the publisher thread (0: normal)
    use_sim_time: bool
    # Emergency stop inputs (fully resolved; "" = none): std_msgs/Bool topic, SetBool service.
    estop_topic: str = ""
    estop_service: str = ""


# ---------------------------------------------------------------------------------- parent
class ActionLink:
    """The parent's end of the connection (ROS-free): sends the engine's chunks and the node's
    settings and asks for the child's diagnostics (one caller at a time); a reader thread
    receives what the child reports. `on_reject(reason, message)` and `on_watchdog(transition)`
    run in that thread, `on_ready(refusal)` once when the child reports it started. Sending to
    a child that is gone does nothing (`closed` is set)."""

    def __init__(
        self,
        sock: socket.socket,
        *,
        on_reject: Callable[[str, str], None],
        on_watchdog: Callable[[str], None],
        on_ready: Callable[[str], None] = lambda refusal: None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._sock = sock  # shut down in `close`: that also wakes the reader thread
        self._conn = Connection(os.dup(sock.fileno()))
        self._on_reject = on_reject
        self._on_watchdog = on_watchdog
        self._on_ready = on_ready
        self._monotonic = monotonic
        self._send_lock = threading.Lock()
        self._cond = threading.Condition()  # guards the replies
        self._replies: dict[int, dict[str, object]] = {}
        self._next_request = 0
        self.ready = threading.Event()  # the child reported it started
        self.closed = threading.Event()  # the connection ended (the child exited)
        self._reader = threading.Thread(target=self._read, name="action_link", daemon=True)
        self._reader.start()

    def configure(self, config: ActionProcessConfig) -> None:
        """The child's configuration: the first message."""
        self._send(config)

    def hand_off(
        self, actions: np.ndarray, observation_stamp: float, latency_s: float, task: int = 0
    ) -> None:
        """Engine thread: the chunk the engine just denoised (see `ActionPublisher.hand_off`)."""
        actions = np.asarray(actions, dtype=np.float32)
        self._send(("hand_off", actions, observation_stamp, latency_s, self._monotonic(), task))

    def set_hold_positions(self, positions: np.ndarray) -> None:
        self._send(("hold", np.asarray(positions, dtype=np.float64)))

    def set_stop(self, reason: str, engaged: bool) -> None:
        """Engages or releases a stop reason of the child's publisher (`ActionPublisher.
        set_stop`: a hold of the measured pose at the first, then nothing until all are
        released)."""
        self._send(("gate", reason, bool(engaged)))

    def reconfigure(self, stream_config: StreamConfig) -> None:
        self._send(("stream", stream_config))

    def set_params(self, values: Mapping[str, Any]) -> None:
        """New values of the publisher's live parameters (`action_publisher.PARAMETERS`)."""
        if values:
            self._send(("params", dict(values)))

    def diagnostics(self, timeout_s: float = DIAGNOSTICS_TIMEOUT_S) -> dict[str, object] | None:
        """The child's `ActionPublisher.diagnostics()`; None if it does not answer in time."""
        with self._cond:
            self._next_request += 1
            request = self._next_request
        self._send(("diagnostics", request))
        with self._cond:
            self._cond.wait_for(
                lambda: request in self._replies or self.closed.is_set(), timeout=timeout_s
            )
            values = self._replies.pop(request, None)
            self._replies.clear()  # answers to requests that timed out are stale
            return values

    def stop(self) -> None:
        """Asks the child to stop publishing and exit."""
        self._send(("stop",))

    def close(self) -> None:
        """Closes the parent's end (the child sees the end of the connection and exits)."""
        with self._send_lock, contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._reader.join(timeout=1.0)
        with self._send_lock:
            self._conn.close()
            self._sock.close()

    def _send(self, message: object) -> None:
        with self._send_lock:
            if self._conn.closed or self.closed.is_set():
                return
            try:
                self._conn.send(message)
            except OSError:  # the child is gone; `closed` tells the node
                self.closed.set()

    def _read(self) -> None:
        try:
            while True:
                try:
                    message = self._conn.recv()
                except (EOFError, OSError):
                    return
                kind = message[0]
                if kind == "reject":
                    self._on_reject(message[1], message[2])
                elif kind == "watchdog":
                    self._on_watchdog(message[1])
                elif kind == "diagnostics":
                    with self._cond:
                        self._replies[message[1]] = message[2]
                        self._cond.notify_all()
                elif kind == "ready":
                    self.ready.set()
                    self._on_ready(message[1])
        finally:
            self.closed.set()
            with self._cond:
                self._cond.notify_all()


class ActionProcess:
    """The child process and the parent's `ActionLink` to it."""

    def __init__(self, popen: subprocess.Popen, link: ActionLink) -> None:
        self.popen = popen
        self.link = link

    @classmethod
    def start(cls, config: ActionProcessConfig, **callbacks: Any) -> ActionProcess:
        """Spawns the child (this interpreter, `-P`: never the source tree's package) and sends
        it `config`; `callbacks` go to `ActionLink`."""
        parent_end, child_end = socket.socketpair()
        try:
            popen = subprocess.Popen(
                [sys.executable, "-P", "-m", __name__, str(child_end.fileno())],
                pass_fds=(child_end.fileno(),),
            )
        finally:
            child_end.close()
        link = ActionLink(parent_end, **callbacks)
        link.configure(config)
        return cls(popen, link)

    def alive(self) -> bool:
        return self.popen.poll() is None and not self.link.closed.is_set()

    def stop(self, timeout_s: float) -> int | None:
        """Stops the child: asks, waits up to `timeout_s`, then kills. Returns its exit code."""
        self.link.stop()
        try:
            code = self.popen.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            code = self.popen.wait()
        self.link.close()
        return code


# ----------------------------------------------------------------------------------- child
def serve(
    conn: Connection,
    publisher: ActionPublisher,
    params: dict[str, Any],
    send: Callable[[tuple], None],
) -> None:
    """The child's reader thread (ROS-free): applies the parent's messages to `publisher` in
    order until ("stop",) or the end of the connection, then stops the publisher."""
    try:
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):
                return
            kind = message[0]
            if kind == "hand_off":
                _, actions, stamp, latency, handed_at, task = message
                publisher.hand_off(actions, stamp, latency, handed_at=handed_at, task=task)
            elif kind == "hold":
                publisher.set_hold_positions(message[1])
            elif kind == "gate":
                publisher.set_stop(message[1], message[2])
            elif kind == "stream":
                publisher.reconfigure(message[1])
            elif kind == "params":
                params.update(message[1])  # read live by the publisher
            elif kind == "diagnostics":
                send(("diagnostics", message[1], publisher.diagnostics()))
            elif kind == "stop":
                return
    finally:
        publisher.stop()


class ActionMessages:
    """The child's `publish`: one ActionChunk per message and, once per chunk, one
    JointTrajectory per trajectory group, each checked (`trajectory_problems`) first: one a
    controller would refuse is not sent, and `on_invalid(reason, message)` hears of it."""

    def __init__(
        self,
        action_pub,
        joint_names: Sequence[str],
        frame_id: str,
        trajectory_pubs: Sequence[tuple[TrajectoryGroup, Any]] = (),
        on_invalid: Callable[[str, str], None] = lambda reason, message: None,
    ) -> None:
        self._action_pub = action_pub
        self._joint_names = tuple(joint_names)
        self._frame_id = frame_id
        self._groups = tuple(group for group, _ in trajectory_pubs)
        self._trajectory_pubs = {group.name: pub for group, pub in trajectory_pubs}
        self._on_invalid = on_invalid
        self._trajectory_chunk: int | None = None  # chunk_id of the last JointTrajectory

    def __call__(self, piece: Slice, sequence: int, trigger: int) -> None:
        self._action_pub.publish(
            action_chunk_msg(piece, sequence, self._joint_names, self._frame_id, trigger)
        )
        if self._groups and piece.chunk.chunk_id != self._trajectory_chunk:
            # Once per chunk: JointTrajectoryController interpolates along time_from_start
            # itself, and a 50-point trajectory costs ~2 ms to build and send.
            self._trajectory_chunk = piece.chunk.chunk_id
            self._publish_trajectories(piece)

    def _publish_trajectories(self, piece: Slice) -> None:
        times = np.arange(len(piece.rows)) * piece.chunk.dt  # from the slice's stamp
        for trajectory in split_chunk(self._groups, piece.rows, times):
            group = trajectory.group
            msg = joint_trajectory_msg(trajectory, piece.stamp, self._frame_id)
            problems = trajectory_problems(*trajectory_points(msg), group.joint_names)
            if problems:
                self._on_invalid(
                    f"trajectory_invalid.{group.name}",
                    f"JointTrajectory for {group.topic} not sent: {'; '.join(problems)}",
                )
                continue
            self._trajectory_pubs[group.name].publish(msg)


def main(argv: Sequence[str] | None = None) -> int:
    """The child: `python -m oxygen_ros.nodes.inference.action_process <fd of its socket end>`."""
    import rclpy
    from rclpy.executors import ExternalShutdownException, SingleThreadedExecutor
    from rclpy.parameter import Parameter
    from rclpy.signals import SignalHandlerOptions
    from std_msgs.msg import Bool
    from std_srvs.srv import SetBool
    from trajectory_msgs.msg import JointTrajectory

    from oxygen_ros.msg import ActionChunk
    from oxygen_ros.nodes.common.runtime import (
        RELIABLE_QOS,
        SERVICE_QOS,
        now_s,
        subscribe_latched_and_volatile,
    )

    argv = sys.argv if argv is None else argv
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops this process (docstring)
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    conn = Connection(int(argv[1]))
    try:
        config: ActionProcessConfig = conn.recv()
    except (EOFError, OSError):
        return 1
    context = rclpy.Context()
    rclpy.init(args=[], context=context, signal_handler_options=SignalHandlerOptions.NO)
    node = rclpy.create_node(
        config.node_name,
        namespace=config.namespace,
        context=context,
        parameter_overrides=[Parameter("use_sim_time", value=config.use_sim_time)],
    )
    action_pub = node.create_publisher(ActionChunk, config.actions_topic, RELIABLE_QOS)
    trajectory_pubs = [
        (group, node.create_publisher(JointTrajectory, group.topic, RELIABLE_QOS))
        for group in config.trajectory_groups
    ]
    send_lock = threading.Lock()

    def send(message: tuple) -> None:
        # OSError: the parent is gone; the reader sees the end and stops the publisher.
        with send_lock, contextlib.suppress(OSError):
            conn.send(message)

    params = dict(config.params)

    def reject(reason: str, message: str) -> None:  # counted and warned about by the parent
        send(("reject", reason, message))

    publisher = ActionPublisher(
        config.stream,
        config.horizon,
        params,
        ActionMessages(
            action_pub, config.joint_names, config.frame_id, trajectory_pubs, on_invalid=reject
        ),
        lambda: now_s(node),  # ROS time: sim time follows /clock (spun below)
        on_reject=reject,
        on_watchdog=lambda transition: send(("watchdog", transition)),
    )
    # The priority first: the threads started below inherit it (the middleware's threads,
    # made with the node above, keep normal scheduling).
    refusal = raise_thread_priority(config.priority)
    signal.signal(signal.SIGTERM, lambda *_: publisher.stop())
    threading.Thread(
        target=serve, args=(conn, publisher, params, send), name="reader", daemon=True
    ).start()
    # Emergency stop here, not in the parent: its path never waits behind the engine's process.
    # Latched publishers (an e-stop engaged before this started) and volatile ones both match;
    # `set_estop` is idempotent, so a latched message arriving twice is harmless.
    if config.estop_topic:
        subscribe_latched_and_volatile(
            node, Bool, config.estop_topic, lambda msg: publisher.set_estop(msg.data)
        )
    if config.estop_service:

        def on_estop(request, response):
            publisher.set_estop(request.data)
            response.success = True
            response.message = "emergency stop " + ("engaged" if request.data else "released")
            return response

        node.create_service(SetBool, config.estop_service, on_estop, qos_profile=SERVICE_QOS)
    executor = spinner = None
    if config.use_sim_time or config.estop_topic or config.estop_service:
        # /clock callbacks update the node's clock; e-stop callbacks.
        executor = SingleThreadedExecutor(context=context)
        executor.add_node(node)

        def spin() -> None:
            with contextlib.suppress(ExternalShutdownException):
                executor.spin()

        spinner = threading.Thread(target=spin, name="spin", daemon=True)
        spinner.start()
    send(("ready", refusal))
    try:
        publisher.run()
    finally:
        # The context first: it wakes the spin thread's wait, which then returns; only after
        # that thread has left the wait set may the node go (destroying it under a waiting
        # executor aborts the process).
        rclpy.try_shutdown(context=context)
        if executor is not None:
            executor.shutdown(timeout_sec=1.0)
        if spinner is not None:
            spinner.join(timeout=2.0)
        node.destroy_node()
        conn.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
