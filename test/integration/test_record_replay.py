"""Recording and replay over real DDS: the workcell simulator and perception run with the
recorder node while the test counts what it receives; the bag, read by the independent MCAP
reader (`mcap` + `mcap_ros2`), holds what the test received. Its sensor topics replayed
(`python -m oxygen_ros.replay --sensors`) into a fresh perception node give the recorded
ObservationFrames back.

One recording serves the module (the fixture `recorded`, ~12 s of the workcell at full rate:
three 224 px cameras at 10 Hz, frames at 10 Hz, joint states at 50 Hz, commands and /clock at
100 Hz). Perception runs without the cube detector (`cube_state_camera: ""`): the cube state
comes from a tracker whose history depends on every frame before, while the frames compared
here are built from the replayed inputs alone (images and joint state). Frames are matched by
their joint stamp and image stamps.

Counts are compared from the moment the recorder reported every topic. On two cores shared
with a busy-looping process, a starved reader (the recorder or the test) lost messages of
publishers that keep few (the simulator's /clock keeps 10, its latched status 1, cameras are
best effort) in about one run in three; on a quiet machine none in ten runs.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from pathlib import Path

import pytest
import yaml
from diagnostic_msgs.msg import DiagnosticArray
from harness import ProcessLauncher, SpinningNode, newest_status, wait_for
from mcap.reader import make_reader
from mcap_ros2.decoder import DecoderFactory
from rclpy.qos import QoSDurabilityPolicy, QoSProfile, QoSReliabilityPolicy
from rclpy.serialization import deserialize_message
from rosgraph_msgs.msg import Clock
from sensor_msgs.msg import Image, JointState
from std_msgs.msg import String

from oxygen_ros.msg import EpisodeStatus, ObservationFrame
from oxygen_ros.recording.bag_reader import BagReader
from oxygen_ros.srv import ResetEpisode

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
PARAMS = ROOT / "config" / "workcell.yaml"
OVERRIDES = """
workcell_sim:
  ros__parameters:
    initial_seed: 0
perception:
  ros__parameters:
    cube_state_camera: ""
recorder:
  ros__parameters:
    discovery_period_s: 0.5
    diagnostics_period_s: 0.5
"""
RECORD_FRAMES = 120  # ObservationFrames the test receives while recording (~12 s at 10 Hz)
START_TIMEOUT_S = 60.0
SENSOR = QoSProfile(depth=1000, reliability=QoSReliabilityPolicy.BEST_EFFORT)
RELIABLE = QoSProfile(depth=1000, reliability=QoSReliabilityPolicy.RELIABLE)
LATCHED = QoSProfile(
    depth=1000,
    reliability=QoSReliabilityPolicy.RELIABLE,
    durability=QoSDurabilityPolicy.TRANSIENT_LOCAL,
)
CAMERAS = (
    "/top_camera/image_raw",
    "/left_wrist_camera/image_raw",
    "/right_wrist_camera/image_raw",
)
COUNTED = {  # topic: (type, QoS as published)
    "/clock": (Clock, RELIABLE),
    "/joint_states": (JointState, SENSOR),
    "/joint_commands": (JointState, RELIABLE),
    **{camera: (Image, SENSOR) for camera in CAMERAS},
    "/oxygen/observation": (ObservationFrame, SENSOR),
    "/workcell/episode_status": (EpisodeStatus, LATCHED),
    "/oxygen/instruction": (String, LATCHED),
}
# A topic whose type the bag's typestore lacks (a service request type, published as a
# message): the recorder warns and goes on.
UNKNOWN_TOPIC = "/test/unknown_type"


def stamp_ns(msg) -> int | None:
    """The stamp a message is matched by (None: unstamped)."""
    t = msg.clock if hasattr(msg, "clock") else getattr(msg, "header", None)
    if t is None:
        return None
    t = getattr(t, "stamp", t)
    return t.sec * 1_000_000_000 + t.nanosec


def frame_key(frame) -> tuple:
    """What a frame is built from: its joint stamp and every slot's image stamp."""
    return (stamp_ns(frame), tuple((s.sec, s.nanosec) for s in frame.image_stamps))


def read_bag(bag_dir: Path, topics=None) -> dict[str, list]:
    """{topic: [decoded message]} by the independent reader, in log-time order."""
    out: dict[str, list] = {}
    (path,) = bag_dir.glob("*.mcap")
    with path.open("rb") as stream:
        reader = make_reader(stream, decoder_factories=[DecoderFactory()])
        for _schema, channel, _message, msg in reader.iter_decoded_messages(topics=topics):
            out.setdefault(channel.topic, []).append(msg)
    return out


def log_span_s(bag_dir: Path, topics) -> float:
    """Seconds between the first and the last message of `topics` (bag log times)."""
    (path,) = bag_dir.glob("*.mcap")
    with path.open("rb") as stream:
        times = [m.log_time for _s, _c, m in make_reader(stream).iter_messages(topics=topics)]
    return (max(times) - min(times)) * 1e-9


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a running process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Counter:
    """Receives the counted topics raw (cheap in the callback; decoded afterwards)."""

    def __init__(self) -> None:
        self.spin = SpinningNode("test_record_counter")
        self._lock = threading.Lock()
        self.raw: dict[str, list[bytes]] = {topic: [] for topic in COUNTED}
        for topic, (msg_type, qos) in COUNTED.items():
            self.spin.node.create_subscription(
                msg_type, topic, lambda data, t=topic: self._on(t, data), qos, raw=True
            )
        self.diagnostics = self.spin.collect(DiagnosticArray, "/diagnostics", 100)
        self.unknown_pub = self.spin.node.create_publisher(ResetEpisode.Request, UNKNOWN_TOPIC, 10)

    def _on(self, topic: str, data: bytes) -> None:
        with self._lock:
            self.raw[topic].append(data)

    def newest(self, topic: str):
        with self._lock:
            return deserialize_message(self.raw[topic][-1], COUNTED[topic][0])

    def count(self, topic: str) -> int:
        with self._lock:
            return len(self.raw[topic])

    def decoded(self) -> dict[str, list]:
        with self._lock:
            return {
                t: [deserialize_message(d, COUNTED[t][0]) for d in raw]
                for t, raw in self.raw.items()
            }


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """Records ~12 s of the workcell; yields (bag dir, what the counter received decoded,
    the workdir, the recorder's CPU share)."""
    workdir = tmp_path_factory.mktemp("record")
    override = workdir / "override.yaml"
    override.write_text(OVERRIDES + f"    output_dir: {workdir / 'bag'}\n")
    files = ["--params-file", str(PARAMS), "--params-file", str(override)]
    launcher = ProcessLauncher(env=dict(os.environ), workdir=workdir)
    counter = Counter()
    try:
        sim = launcher.start(
            "oxygen_ros.nodes.workcell.workcell_sim_node", [*files, "-r", "__node:=workcell_sim"]
        )
        perception = launcher.start(
            "oxygen_ros.nodes.perception.perception_node", [*files, "-r", "__node:=perception"]
        )
        recorder = launcher.start(
            "oxygen_ros.nodes.recorder.recorder_node", ["--params-file", str(override)]
        )

        def recording_all() -> bool:
            status = newest_status(counter.diagnostics, "recorder")
            return (
                counter.count("/clock") > 0
                and all(f"messages.{t}" in status for t in COUNTED)
                and (f"not_recorded.{UNKNOWN_TOPIC}" in status)
            )

        wait_for(
            lambda: recording_all() or not (sim.alive() and recorder.alive()),
            START_TIMEOUT_S,
            lambda: (
                f"the recorder on every topic; {newest_status(counter.diagnostics, 'recorder')}"
            ),
        )
        assert sim.alive() and perception.alive(), sim.log() + perception.log()
        assert recorder.alive(), recorder.log()
        # compared from here on: while the graph starts (JAX imports, the simulator's first
        # renders) a starved process can lose messages for a moment, the recorder as others
        ready_ns = stamp_ns(counter.newest("/clock"))
        start_cpu, start_wall = cpu_s(recorder.popen.pid), time.monotonic()
        frames_before = counter.count("/oxygen/observation")
        wait_for(
            lambda: counter.count("/oxygen/observation") >= frames_before + RECORD_FRAMES,
            60.0,
            f"{RECORD_FRAMES} observation frames",
        )
        cpu_share = (cpu_s(recorder.popen.pid) - start_cpu) / (time.monotonic() - start_wall)
        status = newest_status(counter.diagnostics, "recorder")
        assert status[f"not_recorded.{UNKNOWN_TOPIC}"] == "unknown_type", status
        assert status["write_errors"] == "0", status
        assert recorder.stop() == 0, recorder.log()
        received = counter.decoded()
        counter.spin.close()
        sim.stop()
        perception.stop()
        yield workdir / "bag", received, workdir, cpu_share, ready_ns
    finally:
        launcher.stop_all()
        counter.spin.close()


def test_bag_holds_what_a_subscriber_received(recorded) -> None:
    bag_dir, received, _workdir, cpu_share, ready_ns = recorded
    print(f"recorder CPU while recording: {cpu_share:.1%} of one core")
    info = yaml.safe_load((bag_dir / "metadata.yaml").read_text())["rosbag2_bagfile_information"]
    meta_counts = {
        t["topic_metadata"]["name"]: t["message_count"] for t in info["topics_with_message_count"]
    }
    bag = read_bag(bag_dir)
    assert {t: len(m) for t, m in bag.items()} == {t: n for t, n in meta_counts.items() if n}
    assert set(COUNTED) | {"/diagnostics", "/rosout"} <= set(bag)
    assert UNKNOWN_TOPIC not in meta_counts  # refused (warned), the rest recorded
    qos = {
        t["topic_metadata"]["name"]: t["topic_metadata"] for t in info["topics_with_message_count"]
    }
    assert qos["/oxygen/instruction"]["offered_qos_profiles"][0]["durability"] == "transient_local"
    assert qos["/top_camera/image_raw"]["offered_qos_profiles"][0]["reliability"] == "best_effort"

    # latched, unstamped: the episode's one instruction, whole
    assert [m.data for m in bag["/oxygen/instruction"]] == [
        m.data for m in received["/oxygen/instruction"]
    ]
    assert len(bag["/oxygen/instruction"]) == 1
    for topic in sorted(set(COUNTED) - {"/oxygen/instruction"}):
        got = {stamp_ns(m): m for m in received[topic]}
        kept = {stamp_ns(m): m for m in bag[topic]}
        # the window both saw: the recorder subscribed later and stopped first
        lo, hi = max(min(got), min(kept), ready_ns), min(max(got), max(kept))
        in_got = {s for s in got if lo <= s <= hi}
        in_kept = {s for s in kept if lo <= s <= hi}
        # 1 % or one message where the publisher keeps 100 (the commands). Where its QoS lets
        # a reader of a starved process lose messages (best effort; the latched status keeps
        # 1; /clock keeps 10), 4 % or two: beside a busy-looping core the recorder or this
        # test lost up to 1.9 % of /clock and 3 % of a camera's images in about one run in
        # three (none in ten quiet runs); a recorder that falls behind loses far more.
        strict = topic == "/joint_commands"
        tolerance = (
            max(1, round(0.01 * len(in_got))) if strict else max(2, round(0.04 * len(in_got)))
        )
        assert len(in_got) > 20 or topic == "/workcell/episode_status", topic
        missing = sorted(in_got - in_kept)
        assert abs(len(in_kept) - len(in_got)) <= tolerance, (
            f"{topic}: {len(in_kept)} in the bag, {len(in_got)} received between {lo} and {hi};"
            f" not in the bag: {missing[:3]} .. {missing[-3:]}"
        )
        assert len(in_got ^ in_kept) <= tolerance, (topic, sorted(in_got ^ in_kept)[:5])
        for stamp in sorted(in_got & in_kept)[::7]:  # a sample of payloads
            assert_same(topic, got[stamp], kept[stamp])


def assert_same(topic: str, sent, kept) -> None:
    if isinstance(sent, Image):
        assert (kept.height, kept.width, kept.encoding) == (sent.height, sent.width, sent.encoding)
        assert bytes(kept.data) == bytes(sent.data), topic
    elif isinstance(sent, JointState):
        assert list(kept.name) == list(sent.name)
        assert list(kept.position) == list(sent.position), topic
        assert list(kept.velocity) == list(sent.velocity), topic
    elif isinstance(sent, ObservationFrame):
        assert kept.sequence == sent.sequence
        assert [bytes(i.data) for i in kept.images] == [bytes(i.data) for i in sent.images]
        assert list(kept.joint_positions) == list(sent.joint_positions)
        assert frame_key(kept) == frame_key(sent)
    elif isinstance(sent, EpisodeStatus):
        assert (kept.episode_id, kept.seed, kept.phase, kept.instruction) == (
            sent.episode_id,
            sent.seed,
            sent.phase,
            sent.instruction,
        )
        assert kept.elapsed_s == sent.elapsed_s
    else:  # Clock: the stamp is the payload
        assert stamp_ns(kept) == stamp_ns(sent)


def test_replayed_sensors_reproduce_the_recorded_frames(recorded) -> None:
    bag_dir, _received, workdir, _cpu, _ready = recorded
    replay_dir = workdir / "replay"
    replay_dir.mkdir()
    launcher = ProcessLauncher(env=dict(os.environ), workdir=replay_dir)
    probe = SpinningNode("test_replay_probe")
    try:
        frames = probe.collect(ObservationFrame, "oxygen/observation", SENSOR)
        files = ["--params-file", str(PARAMS), "--params-file", str(workdir / "override.yaml")]
        perception = launcher.start(
            "oxygen_ros.nodes.perception.perception_node", [*files, "-r", "__node:=perception"]
        )
        # spinning once its constructor logged (its subscriptions made before); the replay
        # then waits for them to match its publishers
        wait_for(
            lambda: "fusing" in perception.log() or not perception.alive(),
            START_TIMEOUT_S,
            "perception's start",
        )
        replay = launcher.start(
            "oxygen_ros.replay", args=[str(bag_dir), "--sensors", "--wait-for-subscribers", "30"]
        )
        wait_for(lambda: not replay.alive(), 90.0, "the replay's end")
        assert replay.popen.returncode == 0, replay.log()
        summary = replay.log().strip().splitlines()[-1]
        assert summary.startswith("replay done:"), replay.log()
        print(summary)
        elapsed_s = float(summary.split(" in ")[1].split(" s ")[0])
        sensors = [*CAMERAS, "/joint_states", "/clock"]
        assert elapsed_s == pytest.approx(log_span_s(bag_dir, sensors), abs=1.0)  # timing kept
        recorded_frames = read_bag(bag_dir, ["/oxygen/observation"])["/oxygen/observation"]
        wait_for(
            lambda: frames and stamp_ns(frames[-1]) >= stamp_ns(recorded_frames[-1]) - 200_000_000,
            10.0,
            "the replayed run's last frames",
        )
        assert perception.alive(), perception.log()
    finally:
        launcher.stop_all()
        probe.close()

    replayed = {frame_key(f): f for f in frames}
    matched, unmatched = 0, []
    for frame in recorded_frames:
        again = replayed.get(frame_key(frame))
        if again is None:
            unmatched.append(frame)
            continue
        matched += 1
        assert list(again.image_valid) == list(frame.image_valid)
        assert [bytes(i.data) for i in again.images] == [bytes(i.data) for i in frame.images]
        assert list(again.joint_names) == list(frame.joint_names)
        assert list(again.joint_positions) == list(frame.joint_positions)
        assert list(again.joint_velocities) == list(frame.joint_velocities)
        assert again.max_skew == frame.max_skew
    # Why a recorded frame has no twin: it lies before the replayed perception's first frame
    # (not all its inputs were replayed yet) or after its last; or no replayed frame has its
    # joint stamp, or one does with other images. The latter two are perception's frame timer
    # (frame_trigger: timer, on /clock): a tick falls on a joint-state and camera tick of the
    # simulator, so which snapshot is newest when the timer callback runs is a race between
    # the /clock and the sensor callbacks, in the live run and the replay alike. Measured here:
    # 97-100 % of frames reproduced on an idle machine, 52-87 % beside a busy-looping core.
    first, last = min(k[0] for k in replayed), max(k[0] for k in replayed)
    joint_stamps = {k[0] for k in replayed}
    reasons = collections.Counter(
        "before the replay's first frame"
        if stamp_ns(f) < first
        else "after the replay's last frame"
        if stamp_ns(f) > last
        else "other images at the same joint stamp"
        if stamp_ns(f) in joint_stamps
        else "no frame at that joint stamp"
        for f in unmatched
    )
    print(
        f"{matched} of {len(recorded_frames)} recorded frames reproduced byte-equal; "
        f"not reproduced: {dict(reasons) or 'none'}"
    )
    # The replayed run is built from the bag's inputs only, at the recorded pace.
    recorded_joints = {stamp_ns(m) for m in read_bag(bag_dir, ["/joint_states"])["/joint_states"]}
    assert {k[0] for k in replayed} <= recorded_joints
    assert len(frames) == pytest.approx(len(recorded_frames), rel=0.1)
    assert matched >= 0.4 * len(recorded_frames), reasons


def test_replay_remaps_keeps_latching_and_publishes_the_bag_clock(recorded) -> None:
    """`--clock` publishes the bag time (the bag's own /clock is not replayed), `--remap`
    renames a topic, a latched topic stays latched and a reliable one loses nothing."""
    bag_dir, _received, workdir, _cpu, _ready = recorded
    launcher = ProcessLauncher(env=dict(os.environ), workdir=workdir)
    probe = SpinningNode("test_replay_clock")
    try:
        clocks = probe.collect(Clock, "/clock", RELIABLE)
        instructions = probe.collect(String, "/test/instruction", LATCHED)
        statuses = probe.collect(EpisodeStatus, "/workcell/episode_status", LATCHED)
        args = [
            str(bag_dir),
            "--topics",
            "/oxygen/instruction",
            "/workcell/episode_status",
            "--remap",
            "/oxygen/instruction:=/test/instruction",
            "--clock",
            "50",
            "--rate",
            "10",
            "--wait-for-subscribers",
            "15",
        ]
        replay = launcher.start("oxygen_ros.replay", args=args)
        wait_for(lambda: not replay.alive(), 30.0, "the replay's end")
        assert replay.popen.returncode == 0, replay.log()
        bag = read_bag(bag_dir, ["/oxygen/instruction", "/workcell/episode_status"])
        wait_for(
            lambda: len(statuses) >= len(bag["/workcell/episode_status"]),
            5.0,
            lambda: f"{len(bag['/workcell/episode_status'])} statuses, got {len(statuses)}",
        )
    finally:
        launcher.stop_all()
        probe.close()
    assert [m.data for m in instructions] == [m.data for m in bag["/oxygen/instruction"]]
    assert [stamp_ns(m) for m in statuses] == [
        stamp_ns(m) for m in bag["/workcell/episode_status"]
    ]
    # the bag time: the recorder's reception times (wall clock here), increasing, in the bag
    with BagReader(bag_dir) as reader:
        replayed = ["/oxygen/instruction", "/workcell/episode_status"]
        times = [t for _topic, t, _data in reader.messages(replayed)]
    ticks = [stamp_ns(m) for m in clocks]
    assert len(ticks) >= 10, len(ticks)
    assert ticks == sorted(ticks)
    assert times[0] <= ticks[0] and ticks[-1] <= times[-1]
