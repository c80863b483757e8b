"""soak's measuring side: the observer node, the sensor relay it injects faults through, and the
process sampler.

`Observer` (one rclpy node on its own executor thread, in the soak's process) records what the
graph publishes, compactly enough for hours:
- every new action chunk (chunk id, wall time received, observation stamp), every message's
  rows checked for NaN and for rows stamped after the message's `valid_until`;
- every language request's stream (request id -> kind, first and final wall times, finals);
- every memory entry (id, text, request id; the topic is latched: republished entries count
  once), and whether new ids kept increasing;
- every episode's end (EpisodeStatus leaving RUNNING), the sim clock.
It also sends the language load (RequestLanguage) and the malformed instructions.

`Relay` carries the top camera and the joint states from the simulator to perception (the graph
remaps perception's inputs onto `soak/...`), so that the soak can freeze the camera (the same
message, same stamp, at the camera rate) or stop the joint states, as a stuck driver would.

`Sampler` reads RSS, open file descriptors and threads of every graph process and its children
(the inference node's action process) with psutil.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time

import numpy as np
import psutil

RELAY_PREFIX = "soak/"
KINDS = {0: "subtask", 1: "narration", 2: "memory"}


def _seconds(stamp) -> float:
    return stamp.sec + 1e-9 * stamp.nanosec


@dataclasses.dataclass
class Request:
    """One language request as the observer saw it."""

    kind: str
    source: str  # "service" (sent by the soak) or "node" (the inference node's periodic ones)
    first_wall: float
    finals: int = 0
    final_wall: float = math.nan
    status: int = -1
    tokens: int = 0  # messages seen (the final included)
    last_wall: float = math.nan  # the newest message's


@dataclasses.dataclass
class Episode:
    episode_id: int
    seed: int
    instruction: str
    success: bool
    start_wall: float
    end_wall: float


class Observer:
    """The soak's node: subscriptions, the relay, the language load."""

    def __init__(self, topics: dict[str, str], relay_topics: dict[str, str]) -> None:
        import rclpy
        from rcl_interfaces.srv import SetParameters
        from rclpy.executors import MultiThreadedExecutor
        from rosgraph_msgs.msg import Clock
        from std_msgs.msg import String

        from oxygen_ros.msg import ActionChunk, EpisodeStatus, MemoryEntry, SpeechToken
        from oxygen_ros.nodes.common.runtime import (
            RELIABLE_QOS,
            SPEECH_QOS,
            latched_qos,
        )
        from oxygen_ros.srv import RequestLanguage

        rclpy.init(args=[])
        self.node = rclpy.create_node("soak_observer")
        self.lock = threading.Lock()
        self.chunks: list[tuple[int, float, float]] = []  # (chunk id, wall, observation stamp)
        # A chunk is its id and observation: a restarted node numbers its chunks from 1 again.
        self.chunk_keys: set[tuple[int, float]] = set()
        self.messages = 0
        self.nan_messages = 0
        self.rows_after_valid_until = 0
        self.requests: dict[str, Request] = {}
        self.sent: list[tuple[float, str, bool, str]] = []  # (wall, kind, accepted, id/reason)
        self.memory: dict[int, tuple[str, str]] = {}  # entry id -> (text, request id)
        self.memory_order_broken = 0  # new ids not above every id seen before them
        self._max_entry_id = -1
        self.episodes: list[Episode] = []
        self._running: dict[int, tuple[float, int, str]] = {}  # episode id -> start
        self.sim_now = 0.0
        self.node.create_subscription(Clock, "/clock", self._on_clock, 10)
        self.node.create_subscription(ActionChunk, topics["actions"], self._on_chunk, RELIABLE_QOS)
        self.node.create_subscription(SpeechToken, topics["speech"], self._on_speech, SPEECH_QOS)
        self.node.create_subscription(
            MemoryEntry, topics["memory"], self._on_memory, latched_qos(50)
        )
        self.node.create_subscription(EpisodeStatus, topics["episode_status"], self._on_status, 10)
        self.request_client = self.node.create_client(RequestLanguage, topics["request_language"])
        self.param_client = self.node.create_client(SetParameters, "/workcell_sim/set_parameters")
        self.instruction_pub = self.node.create_publisher(
            String,
            topics["instruction"],
            RELIABLE_QOS,  # volatile: nothing malformed latches
        )
        self.relay = Relay(self.node, relay_topics)
        self.executor = MultiThreadedExecutor(num_threads=2)
        self.executor.add_node(self.node)
        self._thread = threading.Thread(target=self.executor.spin, daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ callbacks
    def _on_clock(self, msg) -> None:
        self.sim_now = _seconds(msg.clock)

    def _on_chunk(self, msg) -> None:
        now = time.monotonic()
        rows = np.asarray(msg.actions, dtype=np.float32)
        nan = not bool(np.isfinite(rows).all())
        late = 0
        valid_until = _seconds(msg.valid_until)
        if valid_until > 0 and msg.horizon:
            start = _seconds(msg.header.stamp)
            times = start + msg.dt * np.arange(msg.horizon)
            late = int(np.count_nonzero(times > valid_until + 1e-6))
        with self.lock:
            self.messages += 1
            self.nan_messages += nan
            self.rows_after_valid_until += late
            key = (int(msg.chunk_id), _seconds(msg.observation_stamp))
            if key not in self.chunk_keys:
                self.chunk_keys.add(key)
                self.chunks.append((key[0], now, key[1]))

    def _on_speech(self, msg) -> None:
        now = time.monotonic()
        with self.lock:
            request = self.requests.get(msg.request_id)
            if request is None:
                request = self.requests[msg.request_id] = Request(
                    KINDS.get(msg.kind, str(msg.kind)), "node", now
                )
            request.tokens += 1
            request.last_wall = now
            if msg.final:
                request.finals += 1
                request.final_wall = now
                request.status = int(msg.status)

    def _on_memory(self, msg) -> None:
        entry_id = int(msg.entry_id)
        with self.lock:
            if entry_id in self.memory:
                return  # republished (latched, or on a restart)
            if entry_id < self._max_entry_id:
                self.memory_order_broken += 1
            self._max_entry_id = max(self._max_entry_id, entry_id)
            self.memory[entry_id] = (msg.text, msg.request_id)

    def _on_status(self, msg) -> None:
        now = time.monotonic()
        with self.lock:
            if msg.phase == msg.PHASE_RUNNING:
                self._running.setdefault(msg.episode_id, (now, msg.seed, msg.instruction))
            elif msg.episode_id in self._running and msg.phase != msg.PHASE_IDLE:
                start, seed, instruction = self._running.pop(msg.episode_id)
                self.episodes.append(
                    Episode(msg.episode_id, seed, instruction, bool(msg.success), start, now)
                )

    # ------------------------------------------------------------------ load and faults
    def request_language(self, kind: int, max_tokens: int = 0) -> None:
        """Sends one RequestLanguage without waiting; the answer is recorded when it comes."""
        from oxygen_ros.srv import RequestLanguage

        if not self.request_client.service_is_ready():
            with self.lock:
                self.sent.append((time.monotonic(), KINDS[kind], False, "service not ready"))
            return
        future = self.request_client.call_async(
            RequestLanguage.Request(kind=kind, max_tokens=max_tokens)
        )
        sent = time.monotonic()
        future.add_done_callback(lambda f, k=kind, t=sent: self._answered(f, k, t))

    def _answered(self, future, kind: int, sent: float) -> None:
        try:
            reply = future.result()
        except Exception as exc:  # the node died while answering: not accepted
            reply = None
            reason = repr(exc)
        with self.lock:
            if reply is None:
                self.sent.append((sent, KINDS[kind], False, reason))
                return
            self.sent.append(
                (sent, KINDS[kind], bool(reply.accepted), reply.request_id or reply.reason)
            )
            if reply.accepted:
                request = self.requests.setdefault(
                    reply.request_id, Request(KINDS[kind], "service", sent)
                )
                request.source = "service"

    def set_sim_param(self, name: str, value) -> None:
        """Sets one of the simulator's parameters (without waiting for the answer)."""
        from rcl_interfaces.srv import SetParameters
        from rclpy.parameter import Parameter

        parameter = Parameter(name, value=value).to_parameter_msg()
        self.param_client.call_async(SetParameters.Request(parameters=[parameter]))

    def publish_malformed_instructions(self, count: int) -> None:
        """Empty, blank and non-UTF-8 instructions (each is refused and counted by inference;
        the instruction in force stays)."""
        from rclpy.serialization import serialize_message
        from std_msgs.msg import String

        placeholder = "\x01" * 12
        raw = serialize_message(String(data=placeholder))
        non_utf8 = raw.replace(placeholder.encode(), b"\xff\xfe\xc3\x28 put it")
        for i in range(count):
            kind = i % 3
            if kind == 2:
                self.instruction_pub.publish(non_utf8)
            else:
                self.instruction_pub.publish(String(data="" if kind == 0 else " \n\t "))

    def snapshot(self) -> dict:
        with self.lock:
            return {
                "chunks": list(self.chunks),
                "messages": self.messages,
                "nan_messages": self.nan_messages,
                "rows_after_valid_until": self.rows_after_valid_until,
                "requests": {k: dataclasses.replace(v) for k, v in self.requests.items()},
                "sent": list(self.sent),
                "memory": dict(self.memory),
                "memory_order_broken": self.memory_order_broken,
                "episodes": list(self.episodes),
                "relay": dict(self.relay.relayed),
            }

    def close(self) -> None:
        import rclpy

        self.executor.shutdown(timeout_sec=2.0)
        self.node.destroy_node()
        rclpy.try_shutdown()


class Relay:
    """Sim -> perception for the top camera and the joint states, with a freeze and a stop."""

    def __init__(self, node, topics: dict[str, str]) -> None:
        from sensor_msgs.msg import Image, JointState

        from oxygen_ros.nodes.common.runtime import SENSOR_QOS

        self.lock = threading.Lock()
        self.frozen_until = 0.0
        self.stopped_until = 0.0
        self.last_image = None
        self.relayed = {"image": 0, "joint_states": 0, "frozen_repeats": 0, "dropped": 0}
        self.image_pub = node.create_publisher(Image, RELAY_PREFIX + topics["camera"], SENSOR_QOS)
        self.joint_pub = node.create_publisher(
            JointState, RELAY_PREFIX + topics["joint_states"], SENSOR_QOS
        )
        node.create_subscription(Image, topics["camera"], self._on_image, SENSOR_QOS)
        node.create_subscription(JointState, topics["joint_states"], self._on_joints, SENSOR_QOS)

    def _on_image(self, msg) -> None:
        with self.lock:
            if time.monotonic() < self.frozen_until and self.last_image is not None:
                msg = self.last_image  # stuck driver: the old frame, its old stamp
                self.relayed["frozen_repeats"] += 1
            else:
                self.last_image = msg
                self.relayed["image"] += 1
        self.image_pub.publish(msg)

    def _on_joints(self, msg) -> None:
        with self.lock:
            if time.monotonic() < self.stopped_until:
                self.relayed["dropped"] += 1
                return
            self.relayed["joint_states"] += 1
        self.joint_pub.publish(msg)

    def freeze_camera(self, seconds: float) -> None:
        with self.lock:
            self.frozen_until = time.monotonic() + seconds

    def stop_joint_states(self, seconds: float) -> None:
        with self.lock:
            self.stopped_until = time.monotonic() + seconds


class Sampler:
    """RSS (MB), open file descriptors and threads of each named process and its children."""

    def __init__(self) -> None:
        self.samples: dict[str, list[tuple[float, int, float, int, int]]] = {}

    def sample(self, processes: dict[str, int], alone: tuple[str, ...] = ()) -> None:
        """One sample of each process (with its children, unless its name is in `alone`)."""
        now = time.monotonic()
        for name, pid in processes.items():
            try:
                root = psutil.Process(pid)
                family = [root] if name in alone else [root, *root.children(recursive=True)]
                rss = fds = threads = 0
                for proc in family:
                    with proc.oneshot():
                        rss += proc.memory_info().rss
                        fds += proc.num_fds()
                        threads += proc.num_threads()
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue  # between a kill and the restart
            self.samples.setdefault(name, []).append((now, pid, rss / 1e6, fds, threads))
