"""Fault injection (issue 6): every reliability behaviour of the nodes, with real node processes
over DDS.

One perception and one inference process (tiny preset) are started per module and shared by the
tests, in file order; the test process plays the sensors (`FakeSensors`: three cameras and the
joint states at 30 Hz) so it can break them. The inference node is killed and restarted by the
durability tests near the end. (A kill -9 of inference during a run with memory entries, and
perception and inference on two "hosts" (network namespaces), are in test_soak.py.)
Every test ends by checking that the nodes it touched are alive and still publishing
(`Rig.assert_serving`) and that the diagnostics counters of what it injected moved
(/diagnostics key/values, published every 0.1 s here).

Figures (inputs tried, faults survived, entries lost, shutdown times) are printed as
`FIGURE ...` lines (`pytest -s` shows them).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import re
import signal
import sqlite3
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from builtin_interfaces.msg import Time
from diagnostic_msgs.msg import DiagnosticArray
from harness import NodeProcess, ProcessLauncher, SpinningNode, call_service, wait_for
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st
from rcl_interfaces.srv import SetParameters
from rclpy.parameter import Parameter
from rclpy.serialization import serialize_message
from sensor_msgs.msg import Image, JointState
from std_msgs.msg import String

from oxygen_ros import graph
from oxygen_ros.msg import ActionChunk, MemoryEntry, ObservationFrame, SpeechToken
from oxygen_ros.nodes.common.conversions import rgb_image_msg, seconds_to_time
from oxygen_ros.nodes.common.image_conversion import (
    BYTES_PER_PIXEL,
    ENCODING_CHANNELS,
    check_image,
    encode_image,
)
from oxygen_ros.nodes.common.runtime import (
    LATCHED_QOS,
    OBSERVATION_QOS,
    SENSOR_QOS,
    SERVICE_QOS,
    SPEECH_QOS,
    latched_qos,
)
from oxygen_ros.srv import RequestLanguage

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
PARAMS = ROOT / "config" / "humanoid.yaml"
_YAML = yaml.safe_load(PARAMS.read_text())
JOINTS: list[str] = _YAML["/**"]["ros__parameters"]["joint_names"]
_CAMS = _YAML["/**"]["ros__parameters"]["cameras"]
ENGINE_START_TIMEOUT_S = 240.0  # JAX import + model init + compiles (cached: ~15 s)
SHUTDOWN_LIMIT_S = 5.0  # "exits 0 within a few seconds"
DIAG_PERIOD_S = 0.1

# The sensors the test process plays: per camera (encoding it publishes, width, height, colour).
# head and left_wrist accept any encoding (so check_image sees unknown ones); right_wrist keeps
# humanoid.yaml's "bgr8" (so a different encoding is an encoding_mismatch).
SENSORS = {
    "head": ("rgba8", 64, 48, (255, 0, 0)),
    "left_wrist": ("mono8", 48, 64, (90, 90, 90)),
    "right_wrist": ("bgr8", 64, 48, (0, 0, 255)),
}
CONFIGURED_ENCODING = {"head": "", "left_wrist": "", "right_wrist": "bgr8"}
TOPICS = {name: _CAMS[name]["topic"] for name in SENSORS}
SLOT_OF = {name: _CAMS[name]["slot"] for name in SENSORS}
SLOTS = ["base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb"]
CENTRE = {SLOT_OF[name]: spec[3] for name, spec in SENSORS.items()}
# Joint 0 is measured outside its limits: the watchdog's hold chunk must clamp it.
GOOD_POSITIONS = [0.9] + [round(0.02 * i - 0.18, 4) for i in range(1, len(JOINTS))]
LIMIT = 0.5  # joint_position_lower/upper = -/+ LIMIT for every joint
MAX_VELOCITY = 2.0  # joint_max_velocity for every joint, units per second
ACTION_DT = float(graph.node_parameters(_YAML, "inference")["action_dt_s"])
MAX_STEP = MAX_VELOCITY * ACTION_DT
HOLD_CHUNK_ID = 2**63
MAX_PENDING = 4
FUTURE_TOLERANCE_S = 0.5  # perception future_tolerance_s (humanoid.yaml)
FUZZ_FRAME_ID = "fault_injection_test"
# Perception's diagnostics keys a failed wait reports (what it received, built and skipped).
PERCEPTION_KEYS = (
    "frames",
    "joint_states",
    "images.",
    "skipped.",
    "trigger.",
    "observation_rate",
    "sequence",
)

HYPOTHESIS = settings(
    max_examples=40,
    deadline=None,
    database=None,  # nothing written into the repository
    phases=(Phase.explicit, Phase.generate),  # a failure is reported as found, not shrunk
    suppress_health_check=list(HealthCheck),
)
FIGURES: dict[str, object] = {}


def figure(name: str, value: object) -> None:
    FIGURES[name] = value
    print(f"FIGURE {name}: {value}")


def override_yaml(db_path: Path) -> str:
    n = len(JOINTS)
    return yaml.safe_dump(
        {
            "/**": {
                "ros__parameters": {
                    "diagnostics_period_s": DIAG_PERIOD_S,
                    "cameras": {c: {"encoding": e} for c, e in CONFIGURED_ENCODING.items()},
                }
            },
            "inference": {
                "ros__parameters": {
                    "memory_db_path": str(db_path),
                    "allow_random_weights": True,  # no checkpoint, no sim time: a stand
                    "narration_period_s": 0.0,  # requests only when a test asks
                    "memory_period_s": 0.0,
                    "max_pending_requests": MAX_PENDING,
                    "joint_position_lower": [-LIMIT] * n,
                    "joint_position_upper": [LIMIT] * n,
                    "joint_max_velocity": [MAX_VELOCITY] * n,
                }
            },
        }
    )


# ============================================================================ the rig
@dataclasses.dataclass
class ActionRecord:
    t: float  # monotonic receive time
    sent: float  # DDS source (publish) time, system clock seconds
    sequence: int
    chunk_id: int
    first_row: np.ndarray
    constant: bool  # every row equals the first


@dataclasses.dataclass
class Diag:
    t: float
    level: int
    message: str
    values: dict[str, str]


class FakeSensors:
    """Cameras and joint states at 30 Hz from the test process; each can be switched off."""

    def __init__(self, view: SpinningNode) -> None:
        node = view.node
        self.node = node
        self.cameras_on = {name: True for name in SENSORS}
        self.joints = "all"  # all | none | partial (the first half of the joints only)
        self.image_pubs = {n: node.create_publisher(Image, TOPICS[n], SENSOR_QOS) for n in SENSORS}
        self.joint_pub = node.create_publisher(JointState, "joint_states", SENSOR_QOS)
        self.buffers = {}
        for name, (encoding, width, height, colour) in SENSORS.items():
            rgb = np.zeros((height, width, 3), dtype=np.uint8)
            rgb[:] = colour
            self.buffers[name] = encode_image(rgb, encoding, row_padding=2)
        self.ticks = 0  # ticks run (the executor thread's own liveness, for failure reports)
        self.timer = node.create_timer(1 / 30, self.tick)

    def all_on(self) -> None:
        self.cameras_on = {name: True for name in SENSORS}
        self.joints = "all"

    def all_off(self) -> None:
        self.cameras_on = {name: False for name in SENSORS}
        self.joints = "none"

    def tick(self) -> None:
        self.ticks += 1
        stamp = self.node.get_clock().now().to_msg()
        for name, (encoding, width, height, _c) in SENSORS.items():
            if self.cameras_on[name]:
                step, data = self.buffers[name]
                msg = Image(height=height, width=width, encoding=encoding, step=step, data=data)
                msg.header.stamp = stamp
                self.image_pubs[name].publish(msg)
        if self.joints != "none":
            count = len(JOINTS) if self.joints == "all" else len(JOINTS) // 2
            msg = JointState(name=JOINTS[:count], position=GOOD_POSITIONS[:count])
            msg.header.stamp = stamp
            self.joint_pub.publish(msg)

    def close(self) -> None:
        self.timer.cancel()
        self.node.destroy_timer(self.timer)


class Rig:
    """The node processes, the test's spinning node and what it collected."""

    def __init__(self, workdir: Path, env: dict[str, str]) -> None:
        self.workdir = workdir
        self.launcher = ProcessLauncher(env=env, workdir=workdir)
        self.view = SpinningNode("test_fault_injection")
        self.db_path = workdir / "memory.sqlite3"
        self.override = workdir / "override.yaml"
        self.override.write_text(override_yaml(self.db_path))
        node = self.view.node
        self.lock = threading.Lock()
        self.diag: dict[str, Diag] = {}
        # (receive time, sequence, only the good sensors' data, image_valid) per frame.
        self.frames: list[tuple[float, int, bool, tuple[bool, ...]]] = []
        self.bad_frames = 0  # frames carrying anything but the good sensors' pixels / joints
        self.actions: list[ActionRecord] = []
        self.action_violations: list[str] = []
        self.speech: list[SpeechToken] = []
        self.memory: list[MemoryEntry] = []
        node.create_subscription(DiagnosticArray, "/diagnostics", self._on_diag, 50)
        node.create_subscription(
            ObservationFrame, "oxygen/observation", self._on_frame, OBSERVATION_QOS
        )
        node.create_subscription(ActionChunk, "oxygen/actions", self._on_action, 500)
        node.create_subscription(SpeechToken, "oxygen/speech", self.speech.append, SPEECH_QOS)
        node.create_subscription(MemoryEntry, "oxygen/memory", self.memory.append, latched_qos(50))
        self.instruction_pub = node.create_publisher(String, "oxygen/instruction", LATCHED_QOS)
        self.frame_pub = node.create_publisher(ObservationFrame, "oxygen/observation", 5)
        self.fuzz_image_pubs = {
            n: node.create_publisher(Image, TOPICS[n], SENSOR_QOS) for n in SENSORS
        }
        self.fuzz_joint_pub = node.create_publisher(JointState, "joint_states", SENSOR_QOS)
        self.request_client = node.create_client(
            RequestLanguage, "oxygen/request_language", qos_profile=SERVICE_QOS
        )
        self.set_client = node.create_client(SetParameters, "/inference/set_parameters")
        self.sensors = FakeSensors(self.view)
        self.perception: NodeProcess | None = None
        self.inference: NodeProcess | None = None

    # ------------------------------------------------------------------ processes
    def start_perception(self) -> None:
        self.perception = self.launcher.start(
            "oxygen_ros.nodes.perception.perception_node",
            ros_args=self._param_args("perception"),
            name="perception",
        )

    def start_inference(self) -> NodeProcess:
        """(Re)starts the inference node; request ids restart with it, so the speech and memory
        collected from the previous run are dropped."""
        with self.lock:
            self.diag.pop("oxygen_ros: inference", None)
        self.speech.clear()
        self.memory.clear()
        self.inference = self.launcher.start(
            "oxygen_ros.nodes.inference.inference_node",
            ros_args=self._param_args("inference"),
            name="inference",
        )
        return self.inference

    def _param_args(self, node: str) -> list[str]:
        return [
            "--params-file",
            str(PARAMS),
            "--params-file",
            str(self.override),
            "-r",
            f"__node:={node}",
        ]

    def close(self) -> None:
        self.sensors.close()
        self.launcher.stop_all()
        self.view.close()

    # ------------------------------------------------------------------ collectors
    def _on_diag(self, msg: DiagnosticArray) -> None:
        now = time.monotonic()
        with self.lock:
            for status in msg.status:
                level = status.level[0] if isinstance(status.level, bytes) else int(status.level)
                values = {kv.key: kv.value for kv in status.values}
                self.diag[status.name] = Diag(now, level, status.message, values)

    def _on_frame(self, msg: ObservationFrame) -> None:
        if msg.header.frame_id == FUZZ_FRAME_ID:
            return  # the test's own malformed frames (sent to the inference node)
        good = list(msg.joint_positions) == GOOD_POSITIONS and list(msg.joint_names) == JOINTS
        for slot, image, valid in zip(msg.image_names, msg.images, msg.image_valid, strict=True):
            if valid:
                offset = ((image.height // 2) * image.width + image.width // 2) * 3
                good = good and tuple(image.data[offset : offset + 3]) == CENTRE[slot]
        with self.lock:
            self.frames.append((time.monotonic(), msg.sequence, good, tuple(msg.image_valid)))
            self.bad_frames += not good

    def _on_action(self, msg: ActionChunk, info) -> None:
        rows = np.asarray(msg.actions, dtype=np.float32).reshape(msg.horizon, len(msg.joint_names))
        problems = []
        if not np.all(np.isfinite(rows)):
            problems.append(f"non-finite action in message {msg.sequence}")
        elif rows.max() > LIMIT or rows.min() < -LIMIT:
            problems.append(
                f"message {msg.sequence} outside +/-{LIMIT}: {rows.min()}..{rows.max()}"
            )
        elif len(rows) > 1 and np.abs(np.diff(rows, axis=0)).max() > MAX_STEP * (1 + 1e-4):
            step = float(np.abs(np.diff(rows, axis=0)).max())
            problems.append(f"message {msg.sequence} steps {step:.4f} > {MAX_STEP:.4f} per row")
        record = ActionRecord(
            time.monotonic(),
            info["source_timestamp"] * 1e-9,
            msg.sequence,
            msg.chunk_id,
            rows[0].copy(),
            bool(np.all(rows == rows[0])),
        )
        with self.lock:
            self.actions.append(record)
            self.action_violations += problems

    # ------------------------------------------------------------------ diagnostics
    def status(self, node: str) -> Diag | None:
        with self.lock:
            return self.diag.get(f"oxygen_ros: {node}")

    def value(self, node: str, key: str, default: str = "0") -> str:
        status = self.status(node)
        return status.values.get(key, default) if status else default

    def count(self, node: str, key: str) -> float:
        return float(self.value(node, key))

    def counts(self, node: str, prefix: str) -> dict[str, float]:
        status = self.status(node)
        if status is None:
            return {}
        return {k: float(v) for k, v in status.values.items() if k.startswith(prefix)}

    def wait_count(self, node: str, key: str, above: float, timeout_s: float = 10.0) -> float:
        wait_for(
            lambda: self.count(node, key) > above,
            timeout_s,
            f"{node} diagnostics {key} > {above} (now {self.count(node, key)})",
        )
        return self.count(node, key)

    def fresh_diag(self, node: str, timeout_s: float = 5.0) -> Diag:
        """The first diagnostics message of `node` published after now."""
        since = time.monotonic()
        wait_for(
            lambda: (s := self.status(node)) is not None and s.t > since + 0.01,
            timeout_s,
            f"fresh diagnostics of {node}",
        )
        return self.status(node)

    # ------------------------------------------------------------------ services
    def call(self, client, request, timeout_s: float = 15.0):
        return call_service(client, request, timeout_s)

    def set_param(self, name: str, value) -> None:
        request = SetParameters.Request(
            parameters=[Parameter(name, value=value).to_parameter_msg()]
        )
        result = self.call(self.set_client, request).results[0]
        assert result.successful, result.reason

    def request(self, kind: int, max_tokens: int = 0):
        return self.call(
            self.request_client, RequestLanguage.Request(kind=kind, max_tokens=max_tokens)
        )

    def finals(self, request_id: str) -> list[SpeechToken]:
        return [m for m in list(self.speech) if m.request_id == request_id and m.final]

    def wait_final(self, request_id: str, timeout_s: float = 30.0) -> SpeechToken:
        wait_for(lambda: self.finals(request_id), timeout_s, f"final speech of {request_id}")
        return self.finals(request_id)[0]

    def wait_idle(self, timeout_s: float = 60.0) -> None:
        """No language request queued or in flight (the queue has room for a test)."""
        self.fresh_diag("inference")
        wait_for(
            lambda: (
                self.count("inference", "active_requests") == 0
                and self.count("inference", "queued_requests") == 0
            ),
            timeout_s,
            "the inference node's language requests to drain",
        )

    # ------------------------------------------------------------------ liveness
    def assert_serving(self, timeout_s: float = 30.0) -> None:
        """Both nodes alive, and new frames and new action messages arrive."""
        for proc in (self.perception, self.inference):
            assert proc is not None and proc.alive(), proc.log()[-3000:] if proc else "not started"
        frames, actions = len(self.frames), len(self.actions)
        wait_for(lambda: len(self.frames) >= frames + 5, timeout_s, "new observation frames")
        wait_for(lambda: len(self.actions) >= actions + 20, timeout_s, "new action messages")
        assert self.perception.alive() and self.inference.alive()

    def wait_actions_since(self, started: float, count: int = 30) -> None:
        """Waits for more than `count` action messages after monotonic time `started` (a
        restarted node: JAX import, model init, compiles); on timeout the message names the
        node's state and the end of its log."""

        ticks = self.sensors.ticks

        def state() -> str:
            # Everything that tells where the chain stopped: the test's sensors (ticks since
            # the start), frames reaching the test and perception's own counts (the perception
            # side), the inference node's own view (frames received and run, the action
            # process), and both logs' ends.
            node, perception = self.inference, self.perception
            alive = node is not None and node.alive()
            tail = node.log()[-3000:] if node is not None else "not started"
            got = len(self.actions_since(started))
            with self.lock:
                frames = sum(1 for f in self.frames if f[0] > started)
            diag = self.status("inference")
            seen = (
                f"{diag.message!r} {time.monotonic() - diag.t:.1f} s ago: {diag.values}"
                if diag is not None and diag.t > started
                else "none since the start"
            )
            p_diag = self.status("perception")
            p_seen = (
                f"{time.monotonic() - p_diag.t:.1f} s ago: "
                + str({k: v for k, v in p_diag.values.items() if k.startswith(PERCEPTION_KEYS)})
                if p_diag is not None
                else "none"
            )
            p_alive = perception is not None and perception.alive()
            p_tail = perception.log()[-1500:] if perception is not None else "not started"
            return (
                f"{count + 1} actions ({got} came; inference alive={alive}; {frames} frames "
                f"seen since; {self.sensors.ticks - ticks} sensor ticks since; inference "
                f"diagnostics {seen}); log:\n{tail}\n"
                f"perception alive={p_alive}, diagnostics {p_seen}, log:\n{p_tail}"
            )

        wait_for(lambda: len(self.actions_since(started)) > count, ENGINE_START_TIMEOUT_S, state)

    def actions_since(self, t: float) -> list[ActionRecord]:
        """Action messages received after monotonic time `t`."""
        with self.lock:
            return [a for a in self.actions if a.t > t]

    def actions_sent_after(self, t: float) -> list[ActionRecord]:
        """Action messages the node published after system time `t` (the test process may
        take them from its queue much later)."""
        with self.lock:
            return [a for a in self.actions if a.sent > t]

    def now_s(self) -> float:
        return self.view.node.get_clock().now().nanoseconds * 1e-9


@pytest.fixture(scope="module")
def rig(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("faults")
    # This rig kill -9s a node. Fast DDS's shared-memory transport can leave the processes that
    # outlive such a kill unable to reach a restarted participant (eProsima/Fast-DDS#5469,
    # #5053); one CI run here timed out after 240 s waiting for a restarted node that never got
    # a frame or the latched instruction. The rig's processes and its own participant (created
    # in Rig()) talk over UDP only, the workaround docs/NODES.md gives users who kill nodes.
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FASTDDS_BUILTIN_TRANSPORTS", "UDPv4")
        env = dict(os.environ)  # conftest put this run's domain id and LOCALHOST discovery here
        r = Rig(workdir, env)
    try:
        r.start_perception()
        r.start_inference()
        wait_for(
            lambda: len(r.actions) > 30 or not r.inference.alive(),
            ENGINE_START_TIMEOUT_S,
            "actions from the inference node",
            poll_s=0.2,
        )
        r.assert_serving()
        yield r
    finally:
        r.close()
        print("FIGURES " + json.dumps(FIGURES, default=str))


# ============================================================ 1. malformed input (perception)
IMAGE_DEFECTS = ("encoding", "size", "step", "data_length", "future_stamp", "out_of_order")


@st.composite
def bad_images(draw) -> tuple[str, str, Image, float]:
    """(camera, expected rejection counter, image, stamp offset from now): always invalid."""
    camera = draw(st.sampled_from(list(SENSORS)))
    defect = draw(st.sampled_from(IMAGE_DEFECTS))
    encoding = draw(st.sampled_from(list(ENCODING_CHANNELS)))
    if CONFIGURED_ENCODING[camera]:
        encoding = draw(st.sampled_from([CONFIGURED_ENCODING[camera], encoding]))
    height, width = draw(st.integers(1, 40)), draw(st.integers(1, 40))
    step = width * ENCODING_CHANNELS[encoding] + draw(st.integers(0, 6))
    length = step * height
    offset = 0.0
    if defect == "encoding":
        encoding = draw(
            st.sampled_from(["nv21", "16UC1", "bayer_rggb8", "RGB8", "jpeg", "", "rgb16"])
            | st.text(st.characters(exclude_categories=("Cs", "Cc")), max_size=12)
        )
        if encoding in BYTES_PER_PIXEL:  # a supported encoding drawn as text
            encoding += "?"
    elif defect == "size":
        kind = draw(st.sampled_from(["zero_h", "zero_w", "huge", "sliver"]))
        if kind == "zero_h":
            height = 0
        elif kind == "zero_w":
            width = 0
        elif kind == "huge":
            height = draw(st.integers(8193, 2**32 - 1))
        else:  # one row, wider than the model image: cannot be resized without vanishing
            height, width = 1, draw(st.integers(225, 8192))
        step = draw(st.integers(0, 2**32 - 1))
        length = draw(st.integers(0, 4096))
    elif defect == "step":
        step = draw(st.integers(0, width * ENCODING_CHANNELS[encoding] - 1))
        length = draw(
            st.sampled_from([step * height, width * ENCODING_CHANNELS[encoding] * height])
        )
    elif defect == "data_length":
        length = draw(st.integers(0, step * height + 512).filter(lambda n: n != step * height))
    elif defect == "future_stamp":
        offset = draw(st.floats(FUTURE_TOLERANCE_S + 0.5, 1e8))
    else:  # older than the camera's previous image (negative stamps included)
        offset = -draw(st.floats(1.0, 3e9))
    image = Image(
        height=height,
        width=width,
        encoding=encoding,
        is_bigendian=draw(st.integers(0, 1)),
        step=step,
        data=bytes(length),
    )
    return camera, expected_image_reason(camera, image, defect), image, offset


def expected_image_reason(camera: str, image: Image, defect: str) -> str:
    """The counter the perception node must move: its checks, in its order."""
    configured = CONFIGURED_ENCODING[camera]
    if configured and image.encoding != configured:
        return "encoding_mismatch"
    try:
        check_image(
            image.height, image.width, image.encoding, image.step, len(image.data), 8192, 224, 224
        )
    except Exception as exc:
        return exc.reason
    assert defect in ("future_stamp", "out_of_order"), defect
    return defect


def _img(encoding: str, height: int, width: int, step: int, length: int) -> Image:
    return Image(height=height, width=width, encoding=encoding, step=step, data=bytes(length))


# One of each defect, always tried first (hypothesis explicit examples), then random ones.
IMAGE_EXAMPLES = [
    ("head", "encoding", _img("nv21", 4, 4, 8, 32), 0.0),
    ("left_wrist", "encoding", _img("", 4, 4, 12, 48), 0.0),
    ("right_wrist", "encoding_mismatch", _img("rgb8", 4, 4, 12, 48), 0.0),
    ("head", "size", _img("rgb8", 0, 4, 12, 0), 0.0),
    ("left_wrist", "size", _img("mono8", 100_000, 4, 4, 16), 0.0),
    ("head", "size", _img("rgb8", 1, 2000, 6000, 6000), 0.0),  # sliver: cannot be resized
    ("head", "step", _img("rgb8", 4, 4, 11, 44), 0.0),
    ("left_wrist", "data_length", _img("mono8", 4, 4, 4, 15), 0.0),
    ("right_wrist", "data_length", _img("bgr8", 4, 4, 12, 4800), 0.0),
    ("head", "future_stamp", _img("rgb8", 4, 4, 12, 48), 3600.0),
    ("head", "out_of_order", _img("rgb8", 4, 4, 12, 48), -3600.0),
]


def with_examples(examples):
    def decorate(test):
        for case in reversed(examples):
            test = example(case=case)(test)
        return test

    return decorate


def stamp_at(seconds: float):
    """`builtin_interfaces/Time` for any float seconds, negative ones as negative sec."""
    sec = math.floor(seconds)
    nanosec = min(int((seconds - sec) * 1e9), 999_999_999)
    return Time(sec=max(min(sec, 2**31 - 1), -(2**31)), nanosec=nanosec)


def publish_until_counted(rig: Rig, node: str, key: str, publish) -> None:
    """Publishes (best effort) until `key` moves; once more if the first sample got lost."""
    before = rig.count(node, key)
    for attempt in range(3):
        publish()
        try:
            rig.wait_count(node, key, before, timeout_s=2.0 + 2.0 * attempt)
            return
        except AssertionError:
            if attempt == 2:
                raise


def test_malformed_images_fuzzed_are_counted_and_never_fused(rig: Rig) -> None:
    start = time.monotonic()
    rejected_before = rig.counts("perception", "rejected.")
    bad_frames_before = rig.bad_frames
    tried: list[str] = []

    @HYPOTHESIS
    @with_examples(IMAGE_EXAMPLES)
    @given(case=bad_images())
    def fuzz(case) -> None:
        camera, reason, image, offset = case
        assert reason == expected_image_reason(camera, image, reason)  # examples too

        def publish() -> None:
            image.header.stamp = stamp_at(rig.now_s() + offset)
            rig.fuzz_image_pubs[camera].publish(image)

        publish_until_counted(rig, "perception", f"rejected.{reason}", publish)
        tried.append(reason)
        assert rig.perception.alive(), rig.perception.log()[-3000:]

    fuzz()
    # Garbage that is not even a message (the middleware drops it; the node must survive).
    good = serialize_message(Image(height=2, width=2, encoding="rgb8", step=6, data=bytes(12)))
    rng = np.random.default_rng(0)
    for i in range(20):
        noise = rng.integers(0, 256, size=int(rng.integers(0, 80)), dtype=np.uint8).tobytes()
        rig.fuzz_image_pubs["head"].publish(noise if i % 2 else good[: len(noise) % len(good)])
    rig.assert_serving()
    rejected = rig.counts("perception", "rejected.")
    moved = {k: v - rejected_before.get(k, 0) for k, v in rejected.items()}
    for reason in set(tried):
        assert moved.get(f"rejected.{reason}", 0) >= tried.count(reason), (reason, moved)
    assert rig.bad_frames == bad_frames_before, "a malformed image reached an observation frame"
    assert set(tried) == {r for _, r, _, _ in IMAGE_EXAMPLES}, tried
    figure(
        "1a images",
        f"{len(tried)} malformed images tried ({ {r: tried.count(r) for r in set(tried)} }) "
        f"+ 20 undecodable buffers; all counted, 0 in frames, {time.monotonic() - start:.1f} s",
    )


JOINT_DEFECTS = (
    "non_finite",
    "length_mismatch",
    "duplicate_names",
    "unknown_names",
    "future_stamp",
    "out_of_order",
)
FINITE = st.floats(-10.0, 10.0, allow_nan=False)


@st.composite
def bad_joint_states(draw) -> tuple[str, JointState, float]:
    """(expected rejection counter, joint state, stamp offset from now): always invalid."""
    defect = draw(st.sampled_from(JOINT_DEFECTS))
    names = draw(st.permutations(JOINTS))[: draw(st.integers(1, len(JOINTS)))]
    positions = draw(st.lists(FINITE, min_size=len(names), max_size=len(names)))
    velocities = draw(st.just([]) | st.lists(FINITE, min_size=len(names), max_size=len(names)))
    # Ahead of the good sensors' newest stamp, within the future tolerance: no stamp check
    # fires by accident for the field defects.
    offset = 0.2
    if defect == "non_finite":
        value = draw(st.sampled_from([math.nan, math.inf, -math.inf]))
        target = positions if not velocities or draw(st.booleans()) else velocities
        target[draw(st.integers(0, len(target) - 1))] = value
    elif defect == "length_mismatch":
        if velocities and draw(st.booleans()):
            size = draw(st.integers(1, len(names) + 3).filter(lambda n: n != len(names)))
            velocities = (velocities * 2 + [0.0] * 3)[:size]
        else:
            size = draw(st.integers(0, len(names) + 3).filter(lambda n: n != len(names)))
            positions = (positions * 2 + [0.0] * 3)[:size]
    elif defect == "duplicate_names":
        names = [*names, draw(st.sampled_from(names))]
        positions = [*positions, 0.0]
        velocities = [*velocities, 0.0] if velocities else []
    elif defect == "unknown_names":
        names = draw(
            st.lists(
                st.text(st.characters(exclude_categories=("Cs", "Cc")), max_size=20).filter(
                    lambda s: s not in JOINTS
                ),
                min_size=1,
                max_size=6,
                unique=True,
            )
        )
        positions = draw(st.lists(FINITE, min_size=len(names), max_size=len(names)))
        velocities = []
    elif defect == "future_stamp":
        offset = draw(st.floats(FUTURE_TOLERANCE_S + 0.5, 1e8))
    else:
        offset = -draw(st.floats(1.0, 3e9))
    msg = JointState(name=list(names), position=positions, velocity=velocities)
    return defect, msg, offset


def _js(names: list[str], positions: list[float], velocities: list[float] = ()) -> JointState:
    return JointState(name=names, position=positions, velocity=list(velocities))


_FULL = list(GOOD_POSITIONS)
JOINT_EXAMPLES = [
    ("non_finite", _js(JOINTS, [*_FULL[:-1], math.nan]), 0.2),
    ("non_finite", _js(JOINTS[:3], [0.0, 0.0, 0.0], [0.0, math.inf, 0.0]), 0.2),
    ("length_mismatch", _js(JOINTS, _FULL[:-1]), 0.2),
    ("length_mismatch", _js(JOINTS[:2], [0.0, 0.0], [0.0]), 0.2),
    ("duplicate_names", _js([JOINTS[0], JOINTS[0]], [0.0, 0.0]), 0.2),
    ("unknown_names", _js(["tail", "antenna"], [0.0, 0.0]), 0.2),
    ("future_stamp", _js(JOINTS, _FULL), 3600.0),
    ("out_of_order", _js(JOINTS, _FULL), -3600.0),
]


def test_malformed_joint_states_fuzzed_are_counted_and_never_fused(rig: Rig) -> None:
    start = time.monotonic()
    bad_frames_before = rig.bad_frames
    frames_before = len(rig.frames)
    tried: list[str] = []

    @HYPOTHESIS
    @with_examples(JOINT_EXAMPLES)
    @given(case=bad_joint_states())
    def fuzz(case) -> None:
        reason, msg, offset = case

        def publish() -> None:
            msg.header.stamp = stamp_at(rig.now_s() + offset)
            rig.fuzz_joint_pub.publish(msg)

        publish_until_counted(rig, "perception", f"rejected.{reason}", publish)
        tried.append(reason)
        assert rig.perception.alive(), rig.perception.log()[-3000:]

    fuzz()
    rig.assert_serving()
    assert set(tried) == set(JOINT_DEFECTS), tried
    # No frame carried anything but the good sensors' joint values (a NaN, an unknown joint's
    # value, a shifted array would show here), and frames kept coming meanwhile.
    assert rig.bad_frames == bad_frames_before, "a malformed joint state reached a frame"
    assert len(rig.frames) > frames_before + 10
    figure(
        "1b joint states",
        f"{len(tried)} malformed joint states tried ({ {r: tried.count(r) for r in set(tried)} });"
        f" all counted, 0 in frames, {time.monotonic() - start:.1f} s",
    )


# ============================================================ 1. malformed input (inference)
def raw_string(data: bytes) -> bytes:
    """A serialized std_msgs/String whose payload is `data` (possibly not UTF-8)."""
    placeholder = b"\x01" * len(data)
    raw = serialize_message(String(data=placeholder.decode()))
    return raw.replace(placeholder, data)


def instruction_total(rig: Rig) -> float:
    return sum(
        rig.count("inference", k)
        for k in ("instructions", "rejected.instruction_empty", "rejected.instruction_non_utf8")
    )


def test_malformed_instructions_counted_truncated_and_fuzzed(rig: Rig) -> None:
    start = time.monotonic()
    rig.instruction_pub.publish(String(data="pick up the red cup"))
    wait_for(lambda: rig.value("inference", "prompt", "") == "pick up the red cup", 10, "prompt")
    for data, key in (
        ("", "rejected.instruction_empty"),
        ("  \n\t ", "rejected.instruction_empty"),
        (b"\xff\xfe\xc3\x28 put it down", "rejected.instruction_non_utf8"),
    ):
        before = rig.count("inference", key)
        rig.instruction_pub.publish(
            raw_string(data) if isinstance(data, bytes) else String(data=data)
        )
        rig.wait_count("inference", key, before)
        assert rig.value("inference", "prompt", "") == "pick up the red cup"  # kept
    log = rig.inference.log()
    assert "empty instruction ignored" in log and "instruction is not valid UTF-8" in log
    limit = int(graph.node_parameters(_YAML, "inference")["instruction_max_chars"])
    before = rig.count("inference", "instruction_truncated")
    long_text = "stack the blocks " * 100
    rig.instruction_pub.publish(String(data=long_text))
    rig.wait_count("inference", "instruction_truncated", before)
    wait_for(
        lambda: rig.value("inference", "prompt", "") == long_text.strip()[:limit],
        5,
        f"the instruction truncated to {limit} characters",
    )
    assert f"truncated to {limit}" in rig.inference.log()
    tried = 4

    @settings(HYPOTHESIS, max_examples=20)
    @given(text=st.text(st.characters(exclude_characters="\x00", exclude_categories=("Cs",))))
    def fuzz(text: str) -> None:
        nonlocal tried
        before = instruction_total(rig)
        rig.instruction_pub.publish(String(data=text))
        wait_for(lambda: instruction_total(rig) > before, 5, f"instruction {text[:40]!r} counted")
        tried += 1

    fuzz()
    rig.instruction_pub.publish(String(data="pick up the red cup"))
    wait_for(lambda: rig.value("inference", "prompt", "") == "pick up the red cup", 10, "prompt")
    rig.wait_idle()
    rig.assert_serving()
    figure(
        "1c instructions",
        f"{tried} tried (empty, blank, non-UTF-8, 1700 chars, 20 fuzzed)"
        f"; {time.monotonic() - start:.1f} s",
    )


def valid_frame(stamp: float) -> ObservationFrame:
    msg = ObservationFrame()
    msg.header.stamp = seconds_to_time(stamp)
    msg.header.frame_id = FUZZ_FRAME_ID
    msg.image_names = list(SLOTS)
    msg.images = [
        rgb_image_msg(np.zeros((224, 224, 3), np.uint8), msg.header.stamp, "") for _ in SLOTS
    ]
    msg.image_valid = [True] * 3
    msg.image_stamps = [msg.header.stamp] * 3
    msg.joint_names = list(JOINTS)
    msg.joint_positions = [0.0] * len(JOINTS)
    return msg


def bad_frames(now: float) -> list[tuple[str, object]]:
    """(expected counter, frame or raw bytes) sent straight to the inference node."""
    cases: list[tuple[str, object]] = [("frame_undecodable", bytes(range(256)) * 4)]
    f = valid_frame(now)
    f.image_valid = [True, True]
    cases.append(("frame_bad_frame", f))
    f = valid_frame(now)
    f.joint_positions = [0.0] * (len(JOINTS) - 1)
    cases.append(("frame_bad_frame", f))
    f = valid_frame(now)
    f.joint_names = [*JOINTS[1:], "tail_wag"]
    cases.append(("frame_joint_mismatch", f))
    for value in (math.nan, math.inf):
        f = valid_frame(now)
        f.joint_positions = [0.0] * 3 + [value] + [0.0] * (len(JOINTS) - 4)
        cases.append(("frame_non_finite", f))
    f = valid_frame(now)
    f.images[1] = rgb_image_msg(np.zeros((100, 120, 3), np.uint8), f.header.stamp, "")
    cases.append(("frame_image_size", f))
    f = valid_frame(now)
    f.images[0].encoding = "bgr8"
    cases.append(("frame_bad_image", f))
    f = valid_frame(now)
    f.images[2].data = bytes(1000)
    cases.append(("frame_bad_image", f))
    cases.append(("frame_future_stamp", valid_frame(now + 30.0)))
    cases.append(("frame_stale", valid_frame(now - 30.0)))
    return cases


def test_malformed_frames_never_reach_the_engine(rig: Rig) -> None:
    """Frames straight onto the observation topic while perception is quiet (sensors off):
    each is counted, and the engine's frame counter does not move."""
    rig.sensors.all_off()
    try:
        before = rig.count("perception", "skipped.joint_state_stale")
        rig.wait_count("perception", "skipped.joint_state_stale", before)
        wait_for(  # the engine has nothing fresh to work on any more
            lambda: rig.value("inference", "watchdog", "") == "tripped", 10, "watchdog trip"
        )
        engine_frames = rig.fresh_diag("inference").values["engine.num_frames"]
        cases = bad_frames(rig.now_s())
        for key, frame in cases:
            before = rig.count("inference", f"rejected.{key}")
            rig.frame_pub.publish(frame)
            rig.wait_count("inference", f"rejected.{key}", before)
        assert rig.fresh_diag("inference").values["engine.num_frames"] == engine_frames
    finally:
        rig.sensors.all_on()
    rig.assert_serving()
    figure("1d frames", f"{len(cases)} malformed frames sent to inference, all counted, 0 run")


# ============================================================================ 2. dropout
def valid_pattern(rig: Rig) -> tuple[bool, ...] | None:
    with rig.lock:
        return rig.frames[-1][3] if rig.frames else None


def wait_no_frames(rig: Rig, reason: str) -> float:
    """Waits for `skipped.<reason>` to count ticks, then checks that perception published no
    frame over ten more ticks (its own `frames` counter: frames received late by this process
    were published before) and that frames resume once every sensor is back on (the positive
    control of the same counter). Returns the seconds from the call until perception stopped
    producing frames."""
    started = time.monotonic()
    key = f"skipped.{reason}"
    first = rig.wait_count("perception", key, rig.count("perception", key), timeout_s=10)
    stopped = time.monotonic() - started
    frames = rig.count("perception", "frames")
    rig.wait_count("perception", key, first + 9)  # ten more ticks without a frame
    assert rig.count("perception", "frames") == frames, f"frames published although {reason}"
    rig.sensors.all_on()
    rig.wait_count("perception", "frames", frames)
    return stopped


def test_camera_dropout_masked_then_restored_and_no_frames_without_inputs(rig: Rig) -> None:
    stale_after = float(graph.node_parameters(_YAML, "perception")["stale_after_s"])
    masked_before = rig.count("perception", "masked.left_wrist")
    rig.sensors.cameras_on["left_wrist"] = False
    stopped = time.monotonic()
    wait_for(lambda: valid_pattern(rig) == (True, False, True), 5, "left wrist masked")
    masked_after_s = time.monotonic() - stopped
    rig.wait_count("perception", "masked.left_wrist", masked_before)
    rig.sensors.cameras_on["left_wrist"] = True
    resumed = time.monotonic()
    wait_for(lambda: valid_pattern(rig) == (True, True, True), 5, "left wrist back")
    back_after_s = time.monotonic() - resumed
    # Masked at the latest after stale_after_s; in practice as soon as its newest image no
    # longer fits the max_skew_s window of the fresh joint states.
    assert masked_after_s <= stale_after + 0.5, masked_after_s

    rig.sensors.cameras_on = {name: False for name in SENSORS}
    no_camera_s = wait_no_frames(rig, "no_valid_camera")
    wait_for(lambda: valid_pattern(rig) == (True, True, True), 5, "cameras back")

    rig.sensors.joints = "none"
    no_joints_s = wait_no_frames(rig, "joint_state_stale")
    rig.assert_serving()

    # Half of the joints stop (their source died): the other half must not keep frames going
    # with the frozen values.
    rig.sensors.joints = "partial"
    partial_s = wait_no_frames(rig, "joint_state_stale")
    assert "joints not updated for" in rig.perception.log()
    rig.assert_serving()
    figure(
        "2 dropout",
        f"camera masked after {masked_after_s:.2f} s (stale_after_s {stale_after}), back after "
        f"{back_after_s:.2f} s; frames stop after {no_camera_s:.2f} s (no camera), "
        f"{no_joints_s:.2f} s (no joints), {partial_s:.2f} s (half the joints)",
    )


# ============================================================================ 3. watchdog
def trip_and_recover(rig: Rig, policy: str) -> tuple[float, float, list[ActionRecord]]:
    """Sensors off until the watchdog trips and `policy` shows, then on again until it
    recovers. Returns (seconds to trip, seconds to recover, actions while tripped)."""
    try:
        return _trip_and_recover(rig, policy)
    except AssertionError as exc:  # the node's side of the story
        raise AssertionError(
            f"{exc}\n--- inference log (tail) ---\n{rig.inference.log()[-4000:]}\n"
            f"--- last diagnostics ---\n{rig.status('inference')}"
        ) from exc


def _trip_and_recover(rig: Rig, policy: str) -> tuple[float, float, list[ActionRecord]]:
    # An earlier test's sensor outage may have tripped it: start from a recovered watchdog.
    wait_for(lambda: rig.value("inference", "watchdog", "") == "ok", 20, "watchdog ok first")
    trips = rig.count("inference", "watchdog_trips")
    rig.sensors.all_off()
    off = time.monotonic()
    try:
        wait_for(lambda: rig.value("inference", "watchdog", "") == "tripped", 15, "watchdog trip")
        tripped_at = time.monotonic()
        # A frame already running when the sensors stopped may still finish with an observation
        # younger than the timeout; that feeds the watchdog again (as it should) and its chunk
        # is published. On a loaded machine such a frame takes ~1 s. Judge the policy from the
        # moment the engine has finished every frame: two diagnostics (2 s) without a new frame.
        last = [rig.count("inference", "frames_run"), rig.status("inference").t]

        def settled() -> bool:
            status = rig.status("inference")
            frames = float(status.values.get("frames_run", 0))
            if frames != last[0] or status.values.get("watchdog") != "tripped":
                last[0], last[1] = frames, status.t
                return False
            return status.t > last[1] + 1.5

        wait_for(settled, 15, "tripped with no frame finishing for two diagnostics")
        tripped_wall = time.time()  # tripped, and no frame is in flight
        status = rig.status("inference")
        assert status.level == 2 and policy in status.message, status  # ERROR
        assert float(status.values["watchdog_trips"]) > trips
        if policy == "stop":  # 0.5 s of ticks that published nothing
            empty = lambda: sum(rig.counts("inference", "action_ticks_empty.").values())  # noqa: E731
            ticks = empty()
            wait_for(lambda: empty() > ticks + 35, 10, "0.5 s of empty action ticks")
        else:
            wait_for(lambda: len(rig.actions_sent_after(tripped_wall)) >= 35, 10, "hold actions")
        during = rig.actions_sent_after(tripped_wall)
    finally:
        rig.sensors.all_on()
    on = time.monotonic()
    wait_for(  # one diagnostics message says both: recovered, and no longer ERROR
        lambda: (s := rig.status("inference")).values.get("watchdog") == "ok" and s.level != 2,
        20,
        "watchdog recovery",
    )
    recovered = time.monotonic()
    rig.assert_serving()
    return tripped_at - off, recovered - on, during


def test_watchdog_stop_policy_holds_once_then_silences_actions_and_recovers(rig: Rig) -> None:
    """At the trip one explicit hold of the measured joint state (clamped) supersedes the
    model rows a consumer may have buffered; then nothing until recovery. The first model
    chunk after the gap starts from that pose (velocity limits), not from the model's rows."""
    rig.set_param("watchdog_policy", "stop")
    off_wall = time.time()
    trip_s, recover_s, during = trip_and_recover(rig, "stop")
    assert during == [], f"{len(during)} action messages while the watchdog was tripped"
    after_off = rig.actions_sent_after(off_wall)
    held = np.clip(np.asarray(GOOD_POSITIONS, np.float32), -LIMIT, LIMIT)
    holds = [i for i, a in enumerate(after_off) if a.chunk_id == HOLD_CHUNK_ID]
    assert holds, "no explicit hold at the trip"
    for i in holds:
        assert after_off[i].constant
        np.testing.assert_allclose(after_off[i].first_row, held, atol=1e-6)
    resumed = [a for a in after_off[holds[-1] + 1 :] if a.chunk_id != HOLD_CHUNK_ID]
    assert resumed, "no model chunk after the hold"
    step = MAX_VELOCITY * ACTION_DT
    assert np.all(np.abs(resumed[0].first_row - held) <= step + 1e-5), resumed[0].first_row
    figure(
        "3a watchdog stop",
        f"tripped {trip_s:.2f} s after the sensors stopped, 0 actions "
        f"while tripped, recovered {recover_s:.2f} s after they resumed",
    )


def test_watchdog_hold_policy_holds_last_joint_state_and_recovers(rig: Rig) -> None:
    rig.set_param("watchdog_policy", "hold")
    try:
        trip_s, recover_s, during = trip_and_recover(rig, "hold")
    finally:
        rig.set_param("watchdog_policy", "stop")
    assert len(during) >= 30
    expected = np.clip(np.asarray(GOOD_POSITIONS, np.float32), -LIMIT, LIMIT)
    for record in during:
        assert record.chunk_id == HOLD_CHUNK_ID and record.constant, record
        np.testing.assert_array_equal(record.first_row, expected)  # joint 0 clamped 0.9 -> 0.5
    # Diagnostics said "ok" before now: whatever the node publishes from now on is the model's
    # (judged by publish time: a loaded test process may still be taking older hold messages).
    recovered_wall = time.time()
    wait_for(lambda: len(rig.actions_sent_after(recovered_wall)) >= 10, 5, "actions after")
    after = rig.actions_sent_after(recovered_wall)
    assert all(a.chunk_id != HOLD_CHUNK_ID for a in after), [a.chunk_id for a in after]
    figure(
        "3b watchdog hold",
        f"tripped after {trip_s:.2f} s, {len(during)} hold messages "
        f"(last joint state, clamped), recovered {recover_s:.2f} s after resume",
    )


# ============================================================================ 4. safe actions
def test_actions_clamped_and_nan_chunks_discarded(rig: Rig) -> None:
    status = rig.fresh_diag("inference")
    assert float(status.values["actions.chunks_position_clamped"]) > 0, status.values
    assert float(status.values["actions.chunks_velocity_clamped"]) > 0, status.values
    nan_before = rig.count("inference", "rejected.chunk_non_finite")
    accepted = rig.count("inference", "actions.chunks_accepted")
    rig.set_param("fault_injection", "nan_chunk")
    try:
        rig.wait_count("inference", "rejected.chunk_non_finite", nan_before + 2)
        # The action process counts the chunk, then tells the node, which counts the
        # rejection; one diagnostics message can carry the node's count with an older
        # snapshot of the process's, so wait for that one too.
        rig.wait_count("inference", "actions.chunks_non_finite", 2)
        assert rig.status("inference").values["fault_injection"] == "nan_chunk"
    finally:
        rig.set_param("fault_injection", "")
    discarded = rig.count("inference", "rejected.chunk_non_finite") - nan_before
    accepted_during = rig.count("inference", "actions.chunks_accepted") - accepted
    cleared = time.monotonic()
    rig.wait_count(
        "inference", "actions.chunks_accepted", rig.count("inference", "actions.chunks_accepted")
    )
    rig.assert_serving()
    assert rig.actions_since(cleared)
    # Over every action message of the module so far: finite, inside the limits, and no step
    # between consecutive rows above max velocity * dt.
    assert rig.action_violations == [], rig.action_violations[:5]
    figure(
        "4 safe actions",
        f"{len(rig.actions)} action messages checked: 0 non-finite, 0 outside +/-{LIMIT}, "
        f"0 steps > {MAX_STEP:.3f}; clamped chunks: position "
        f"{rig.count('inference', 'actions.chunks_position_clamped'):.0f}, velocity "
        f"{rig.count('inference', 'actions.chunks_velocity_clamped'):.0f}; {discarded:.0f} NaN "
        f"chunks discarded ({accepted_during:.0f} accepted meanwhile)",
    )


# ============================================================================ 5. engine faults
def test_engine_fault_ends_requests_with_error_and_node_keeps_serving(rig: Rig) -> None:
    rig.wait_idle()
    faults = rig.count("inference", "engine_faults")
    rig.set_param("fault_injection", "engine_exception")
    try:
        ids = []
        for _ in range(2):
            reply = rig.request(RequestLanguage.Request.KIND_NARRATION, max_tokens=4)
            assert reply.accepted, reply.reason
            ids.append(reply.request_id)
        finals = [rig.wait_final(i) for i in ids]
        rig.wait_count("inference", "engine_faults", faults + 1)
    finally:
        rig.set_param("fault_injection", "")
    for final in finals:
        assert final.status == SpeechToken.STATUS_ERROR, final
        assert "engine fault: InjectedFaultError" in final.error, final.error
    assert all(len(rig.finals(i)) == 1 for i in ids)  # exactly one final each
    log = rig.inference.log()
    assert "frame failed: InjectedFaultError" in log and "engine_loop.py:" in log
    # Keeps serving: the next request finishes normally, actions flow.
    reply = rig.request(RequestLanguage.Request.KIND_NARRATION, max_tokens=4)
    assert reply.accepted, reply.reason
    final = rig.wait_final(reply.request_id)
    assert final.status in (SpeechToken.STATUS_STOPPED, SpeechToken.STATUS_LENGTH), final
    rig.assert_serving()
    figure(
        "5a engine faults",
        f"{rig.count('inference', 'engine_faults') - faults:.0f} faulted "
        f"frames survived; {len(ids)} requests ended STATUS_ERROR; next request finished",
    )


def test_overload_refused_with_reason_never_unbounded(rig: Rig) -> None:
    rig.wait_idle()
    refused_before = rig.count("inference", "requests_refused")
    wait_for(rig.request_client.service_is_ready, 10, "request_language service")
    futures = [
        rig.request_client.call_async(
            RequestLanguage.Request(kind=RequestLanguage.Request.KIND_NARRATION, max_tokens=4)
        )
        for _ in range(3 * MAX_PENDING)
    ]
    wait_for(lambda: all(f.done() for f in futures), 20, "replies to the burst")
    replies = [f.result() for f in futures]
    accepted = [r.request_id for r in replies if r.accepted]
    refused = [r.reason for r in replies if not r.accepted]
    assert len(accepted) <= MAX_PENDING and len(refused) >= 2 * MAX_PENDING, (accepted, refused)
    assert all(f"queue full ({MAX_PENDING} pending requests)" in r for r in refused), refused
    rig.wait_count("inference", "requests_refused", refused_before + len(refused) - 1)
    for request_id in accepted:  # every accepted request still ends, exactly once
        final = rig.wait_final(request_id)
        assert final.status in (SpeechToken.STATUS_STOPPED, SpeechToken.STATUS_LENGTH), final
        assert len(rig.finals(request_id)) == 1
    # A request the engine cannot fit is refused by the engine: an error final with the reason.
    reply = rig.request(RequestLanguage.Request.KIND_NARRATION, max_tokens=100_000)
    assert reply.accepted, reply.reason
    final = rig.wait_final(reply.request_id)
    assert final.status == SpeechToken.STATUS_ERROR and "max_seq_len" in final.error, final
    rig.assert_serving()
    figure(
        "5b overload",
        f"{len(replies)} concurrent requests: {len(accepted)} accepted and "
        f"finished, {len(refused)} refused ('{refused[0]}'); oversized request refused by "
        f"the engine with an error final",
    )


# ============================================================================ 6. durability
def stored_entries(db_path: Path) -> dict[int, tuple[str, str]]:
    with contextlib.closing(sqlite3.connect(db_path)) as conn:
        rows = conn.execute("SELECT entry_id, text, request_id FROM memory").fetchall()
    return {r[0]: (r[1], r[2]) for r in rows}


def memory_batch(rig: Rig, count: int = 3) -> list[str]:
    ids = []
    for _ in range(count):
        reply = rig.request(RequestLanguage.Request.KIND_MEMORY, max_tokens=3)
        assert reply.accepted, reply.reason
        ids.append(reply.request_id)
    return ids


def test_action_process_killed_ends_the_node_with_code_1_then_restart_serves(rig: Rig) -> None:
    """The action publisher is a child process of the inference node: if it dies, the node
    must not go on without actions. It exits 1 with the reason; a restart serves again."""
    rig.assert_serving()
    match = re.search(r"\(process (\d+)\)", rig.inference.log())
    assert match, rig.inference.log()[-3000:]
    os.kill(int(match.group(1)), signal.SIGKILL)
    assert rig.inference.popen.wait(30) == 1, rig.inference.log()[-3000:]
    assert "the action process exited" in rig.inference.log()
    started = time.monotonic()
    rig.start_inference()
    rig.wait_actions_since(started)
    rig.assert_serving()


def stop_and_measure(proc: NodeProcess, sig: int) -> tuple[int, float]:
    started = time.monotonic()
    code = proc.stop(sig, timeout_s=20.0)
    return code, time.monotonic() - started


def assert_db_closed_cleanly(db_path: Path) -> int:
    """The node's connection was the last one: closing it checkpointed and removed the WAL."""
    leftovers = [p.name for p in db_path.parent.glob(db_path.name + "-*")]
    assert leftovers == [], f"left after shutdown: {leftovers}"
    with contextlib.closing(sqlite3.connect(db_path)) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        return conn.execute("SELECT COUNT(*) FROM memory").fetchone()[0]


def test_sigint_with_requests_in_flight_exits_0_and_closes_db(rig: Rig) -> None:
    rig.wait_idle()
    reply = rig.request(RequestLanguage.Request.KIND_NARRATION, max_tokens=30)
    assert reply.accepted, reply.reason
    wait_for(  # in flight: tokens streamed, not finished
        lambda: any(m.request_id == reply.request_id for m in list(rig.speech)),
        30,
        "the request to start streaming",
    )
    code, stop_s = stop_and_measure(rig.inference, signal.SIGINT)
    assert code == 0, rig.inference.log()[-3000:]
    assert stop_s < SHUTDOWN_LIMIT_S, stop_s
    final = rig.wait_final(reply.request_id, timeout_s=5)
    assert final.status in (
        SpeechToken.STATUS_ABORTED,
        SpeechToken.STATUS_STOPPED,
        SpeechToken.STATUS_LENGTH,
    ), final
    rows = assert_db_closed_cleanly(rig.db_path)
    figure(
        "7a SIGINT",
        f"exit 0 after {stop_s:.2f} s; request in flight ended "
        f"status {final.status} ({final.error or 'finished'}); WAL checkpointed and removed, "
        f"{rows} rows intact",
    )


def test_corrupt_db_moved_aside_new_one_created_then_sigterm_exits_0(rig: Rig) -> None:
    garbage = b"SQLite format 3\x00" + np.random.default_rng(6).bytes(3 * 4096)
    rig.db_path.write_bytes(garbage)
    started = time.monotonic()
    rig.start_inference()
    rig.wait_actions_since(started)
    log = rig.inference.log()
    assert "moved aside" in log and "[ERROR]" in log, log[-3000:]
    aside = sorted(rig.db_path.parent.glob(rig.db_path.name + ".corrupt-*"))
    assert [p.read_bytes() for p in aside if not p.name.endswith(("-wal", "-shm"))] == [garbage]
    (request_id,) = memory_batch(rig, 1)
    wait_for(lambda: any(e.request_id == request_id for e in rig.memory), 60, "an entry")
    assert stored_entries(rig.db_path) and min(stored_entries(rig.db_path)) == 1  # new file
    rig.assert_serving()
    code, stop_s = stop_and_measure(rig.inference, signal.SIGTERM)
    assert code == 0, rig.inference.log()[-3000:]
    assert stop_s < SHUTDOWN_LIMIT_S, stop_s
    rows = assert_db_closed_cleanly(rig.db_path)
    code_p, stop_p = stop_and_measure(rig.perception, signal.SIGINT)
    assert code_p == 0 and stop_p < SHUTDOWN_LIMIT_S, rig.perception.log()[-3000:]
    figure(
        "6b corrupt db", f"moved aside to {aside[0].name}, new database (first id 1, {rows} rows)"
    )
    figure(
        "7b SIGTERM",
        f"inference exit 0 after {stop_s:.2f} s, DB clean; perception "
        f"SIGINT exit 0 after {stop_p:.2f} s",
    )
