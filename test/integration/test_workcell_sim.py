"""workcell_sim_node as a real process over DDS, with perception (and, last, inference) following
its /clock: camera slots, joint order, rows executed at their stamps, hold on expiry, episodes,
bad commands and sim time.

One simulator (with the camera test pattern) and one perception node serve the module; every
test starts from a reset episode (robot at rest, commands dropped). Times in these tests are sim
seconds from the simulator's /clock unless named wall.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from diagnostic_msgs.msg import DiagnosticArray
from harness import ProcessLauncher, SpinningNode, call_service, wait_for
from rcl_interfaces.srv import SetParameters
from rclpy.parameter import Parameter
from rclpy.qos import QoSProfile, QoSReliabilityPolicy
from rosgraph_msgs.msg import Clock
from sensor_msgs.msg import Image, JointState
from std_msgs.msg import String
from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

from oxygen_ros.msg import ActionChunk, EpisodeStatus, ObservationFrame
from oxygen_ros.nodes.common.conversions import (
    diagnostic_values,
    image_msg_to_rgb,
    seconds_to_duration,
    seconds_to_time,
    time_to_seconds,
)
from oxygen_ros.nodes.common.runtime import LATCHED_QOS, OBSERVATION_QOS, RELIABLE_QOS, SENSOR_QOS
from oxygen_ros.sim import robot, tasks
from oxygen_ros.srv import ResetEpisode

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
PARAMS = ROOT / "config" / "workcell.yaml"
ENGINE_START_TIMEOUT_S = 240.0  # JAX import + model init + first compiles on 2 busy cores
OVERRIDES = """
workcell_sim:
  ros__parameters:
    test_pattern: true
    initial_seed: -1
    diagnostics_period_s: 0.5
    real_time_factor: 0.5
"""
# Half real time (the YAML above): at full speed on 2 loaded cores the simulator fell behind
# (ticks merged) and the probe lost commands; the checks here are in sim time.
REAL_TIME_FACTOR = 0.5
HOME = dict(zip(robot.JOINT_NAMES, robot.HOME, strict=True))
MAX_AGE_S = 1.5  # workcell.yaml's chunk_max_age_s
DEEP_QOS = QoSProfile(depth=1000, reliability=QoSReliabilityPolicy.RELIABLE)
DEEP_SENSOR_QOS = QoSProfile(depth=1000, reliability=QoSReliabilityPolicy.BEST_EFFORT)


class Probe:
    """The test process's view of the simulator: clock, joints, commands, status, diagnostics."""

    def __init__(self) -> None:
        self.spin = SpinningNode("test_workcell_sim")
        node = self.node = self.spin.node
        self._lock = threading.Lock()
        self.clocks: list[tuple[float, float]] = []  # (wall, sim)
        self.joints: list[JointState] = []
        self.commands: list[JointState] = []
        self.statuses: list[EpisodeStatus] = []
        self.instructions: list[str] = []
        self.diagnostics: list[dict[str, str]] = []
        self._collectors: list[SpinningNode] = []  # `collect`'s nodes
        node.create_subscription(Clock, "/clock", self._on_clock, 10)
        node.create_subscription(  # best effort as published; deep, so a busy spin drops none
            JointState, "joint_states", self.joints.append, DEEP_SENSOR_QOS
        )
        node.create_subscription(JointState, "joint_commands", self.commands.append, DEEP_QOS)
        node.create_subscription(
            EpisodeStatus, "workcell/episode_status", self.statuses.append, DEEP_QOS
        )
        node.create_subscription(  # volatile: only what is published while subscribed
            String, "oxygen/instruction", lambda m: self.instructions.append(m.data), RELIABLE_QOS
        )
        node.create_subscription(DiagnosticArray, "/diagnostics", self._on_diagnostics, 10)
        self.chunk_pub = node.create_publisher(ActionChunk, "oxygen/actions", RELIABLE_QOS)
        self.trajectory_pub = node.create_publisher(
            JointTrajectory, "oxygen/joint_trajectory", RELIABLE_QOS
        )
        self.reset_client = node.create_client(ResetEpisode, "workcell/reset_episode")
        self.param_client = node.create_client(SetParameters, "/workcell_sim/set_parameters")

    def _on_clock(self, msg: Clock) -> None:
        with self._lock:
            self.clocks.append((time.monotonic(), time_to_seconds(msg.clock)))

    def _on_diagnostics(self, msg: DiagnosticArray) -> None:
        for status in msg.status:
            if status.name == "oxygen_ros: workcell_sim":
                self.diagnostics.append(diagnostic_values(status))

    def collect(self, msg_type, topic: str, qos, wall_time: bool = False):
        """Subscribes on a node and executor of its own; returns the list and a function that
        closes them. (On the probe's node a subscription could not be destroyed while its
        executor spins, and camera frames received for the rest of the module starved the
        probe: later tests lost joint commands.)"""
        received: list = []
        spinner = SpinningNode(f"test_workcell_sim_collect_{len(self._collectors)}")
        self._collectors.append(spinner)

        def on_message(msg) -> None:
            received.append((time.monotonic(), msg) if wall_time else msg)

        spinner.node.create_subscription(msg_type, topic, on_message, qos)
        return received, spinner.close

    def now(self) -> float:
        with self._lock:
            return self.clocks[-1][1]

    def reset(self, seed: int, instruction: str = "") -> ResetEpisode.Response:
        return call_service(
            self.reset_client, ResetEpisode.Request(seed=seed, instruction=instruction)
        )

    def set_param(self, name: str, value) -> None:
        request = SetParameters.Request(
            parameters=[Parameter(name, value=value).to_parameter_msg()]
        )
        (result,) = call_service(self.param_client, request).results
        assert result.successful, result.reason

    def commands_between(self, start: float, end: float) -> list[tuple[float, dict[str, float]]]:
        out = []
        for msg in list(self.commands):
            stamp = time_to_seconds(msg.header.stamp)
            if start <= stamp <= end:
                out.append((stamp, dict(zip(msg.name, msg.position, strict=True))))
        return out

    def wait_for_commands_after(self, t: float, timeout_s: float = 20.0) -> None:
        wait_for(
            lambda: self.commands and time_to_seconds(self.commands[-1].header.stamp) > t,
            timeout_s,
            f"joint commands stamped after {t:.2f}",
        )

    def status_of(self, episode_id: int) -> list[EpisodeStatus]:
        return [s for s in list(self.statuses) if s.episode_id == episode_id]

    def close(self) -> None:
        for spinner in self._collectors:
            spinner.close()
        self.spin.close()


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("workcell")
    override = workdir / "override.yaml"
    override.write_text(OVERRIDES)
    env = dict(os.environ)  # conftest put this run's domain id and LOCALHOST discovery here
    launcher = ProcessLauncher(env=env, workdir=workdir)
    probe = Probe()
    files = ["--params-file", str(PARAMS), "--params-file", str(override)]
    try:
        simulator = launcher.start(
            "oxygen_ros.nodes.workcell.workcell_sim_node", [*files, "-r", "__node:=workcell_sim"]
        )
        perception = launcher.start(
            "oxygen_ros.nodes.perception.perception_node", [*files, "-r", "__node:=perception"]
        )
        wait_for(lambda: probe.clocks or not simulator.alive(), 60, "the simulator's /clock")
        assert simulator.alive(), simulator.log()
        probe.spin.wait_for_subscribers(probe.chunk_pub)
        probe.spin.wait_for_subscribers(probe.trajectory_pub)
        yield launcher, probe, simulator, perception
    finally:
        launcher.stop_all()
        probe.close()


def chunk(names, rows, start: float, dt: float) -> ActionChunk:
    rows = np.asarray(rows, dtype=np.float32)
    msg = ActionChunk(joint_names=list(names), dt=dt, horizon=len(rows))
    msg.header.stamp = seconds_to_time(start)
    msg.actions = rows.ravel().tolist()
    return msg


def test_cameras_arrive_in_their_model_slots(sim) -> None:
    _launcher, probe, simulator, _perception = sim
    probe.reset(seed=0)
    frames, stop = probe.collect(ObservationFrame, "oxygen/observation", OBSERVATION_QOS)
    try:
        wait_for(lambda: any(all(f.image_valid) for f in frames), 30, "a complete frame")
    finally:
        stop()
    frame = next(f for f in frames if all(f.image_valid))
    expected = {"base_0_rgb": 0, "left_wrist_0_rgb": 1, "right_wrist_0_rgb": 2}  # R, G, B
    assert list(frame.image_names) == list(expected)
    for name, image in zip(frame.image_names, frame.images, strict=True):
        centre = image_msg_to_rgb(image)[80:144, 80:144].reshape(-1, 3).mean(axis=0)
        channel = expected[name]
        assert centre[channel] > 150, (name, centre)
        assert all(centre[c] < 110 for c in range(3) if c != channel), (name, centre)
    assert frame.max_skew <= 0.05  # perception's max_skew_s
    assert simulator.alive()


def test_every_image_has_the_stamp_of_a_joint_state(sim) -> None:
    _launcher, probe, _simulator, _perception = sim
    images, stop = probe.collect(Image, "left_wrist_camera/image_raw", SENSOR_QOS)
    try:
        wait_for(lambda: len(images) >= 5, 10, "5 images")
    finally:
        stop()
    image_stamps = [time_to_seconds(m.header.stamp) for m in images[:5]]
    wait_for(
        lambda: time_to_seconds(probe.joints[-1].header.stamp) > image_stamps[-1],
        5,
        "joint states after the images",
    )
    joint_stamps = {time_to_seconds(j.header.stamp) for j in list(probe.joints)}
    assert set(image_stamps) <= joint_stamps
    assert (images[0].encoding, images[0].width, images[0].height) == ("rgb8", 224, 224)


@pytest.mark.parametrize(("seed", "joint"), [(1, "left_elbow"), (2, "right_wrist_angle")])
def test_chunk_columns_are_joints_by_name(sim, seed: int, joint: str) -> None:
    _launcher, probe, _simulator, _perception = sim
    probe.reset(seed=seed)
    names = list(np.random.default_rng(seed).permutation(robot.JOINT_NAMES))
    assert names != list(robot.JOINT_NAMES)
    target = {n: HOME[n] + (0.3 if n == joint else 0.0) for n in names}
    rows = [[target[n] for n in names]] * 10
    probe.chunk_pub.publish(chunk(names, rows, start=0.0, dt=0.1))  # zero stamp: now

    def reached() -> bool:
        msg = probe.joints[-1] if probe.joints else None
        if msg is None:
            return False
        at = abs(dict(zip(msg.name, msg.position, strict=True))[joint] - target[joint]) < 0.01
        return at and max(abs(v) for v in msg.velocity) < 0.01  # and settled

    wait_for(reached, 15, f"{joint} at its commanded position, settled")
    positions = dict(zip(probe.joints[-1].name, probe.joints[-1].position, strict=True))
    moved = {
        n: round(positions[n] - HOME[n], 4) for n in names if abs(positions[n] - HOME[n]) > 0.01
    }
    assert list(moved) == [joint], moved


def test_rows_run_at_their_stamps_then_hold(sim) -> None:
    _launcher, probe, _simulator, _perception = sim
    reply = probe.reset(seed=3)
    start = round(probe.now() + 0.3, 2)  # on a tick: every other row falls on a tick exactly
    dt, horizon = 0.025, 24
    names = ["right_elbow", "left_waist", "left_gripper"]
    k = np.arange(horizon)
    rows = np.stack(
        [
            HOME["right_elbow"] + 0.2 * np.sin(k / 3),
            HOME["left_waist"] + 0.3 * np.sin(k / 5),
            HOME["left_gripper"] + 0.8 * k / horizon,
        ],
        axis=1,
    ).astype(np.float32)
    probe.chunk_pub.publish(chunk(names, rows, start, dt))
    end = start + (horizon - 1) * dt
    probe.wait_for_commands_after(end + 0.3)
    times = start + dt * k
    executed = probe.commands_between(start - 1e-6, end + 1e-6)
    assert len(executed) >= 0.9 * (end - start) / 0.01, len(executed)
    on_rows = 0
    for stamp, command in executed:
        for col, name in enumerate(names):
            expected = np.interp(stamp, times, rows[:, col].astype(np.float64))
            assert command[name] == pytest.approx(expected, abs=1e-6), (stamp, name)
        on_rows += bool(np.any(np.abs(times - stamp) < 1e-6))
        for name in set(robot.JOINT_NAMES) - set(names):
            assert command[name] == pytest.approx(HOME[name], abs=1e-9)
    assert on_rows >= horizon // 2 - 1  # rows on ticks ran exactly
    before = probe.commands_between(start - 0.25, start - 0.005)
    assert before and all(c["left_waist"] == pytest.approx(HOME["left_waist"]) for _, c in before)
    held = probe.commands_between(end + 0.005, end + 0.3)
    assert len(held) >= 20
    for _, command in held:  # rows ran out: the last row holds
        for col, name in enumerate(names):
            assert command[name] == pytest.approx(float(rows[-1, col]), abs=1e-6)
    wait_for(
        lambda: any(s.starvation_events == 1 for s in probe.status_of(reply.episode_id)),
        5,
        "a starvation event in the episode status",
    )


@pytest.mark.parametrize("valid_for_s", [None, 0.6])
def test_expired_command_holds_its_value_at_the_deadline(sim, valid_for_s) -> None:
    """The deadline is the simulator's own age limit or, when the chunk's `valid_until` (the
    sender's expiry) comes first, that."""
    _launcher, probe, _simulator, _perception = sim
    reply = probe.reset(seed=4)
    start = round(probe.now() + 0.2, 2)
    dt, horizon = 0.05, 60  # 3 s of rows, longer than chunk_max_age_s
    rows = HOME["right_waist"] + 0.2 * np.arange(horizon, dtype=np.float32)[:, None] * dt
    msg = chunk(["right_waist"], rows, start, dt)
    deadline = start + MAX_AGE_S
    if valid_for_s is not None:
        deadline = start + valid_for_s
        msg.valid_until = seconds_to_time(deadline)
    probe.chunk_pub.publish(msg)
    probe.wait_for_commands_after(deadline + 0.5)
    times = start + dt * np.arange(horizon)
    for stamp, command in probe.commands_between(start, deadline):
        assert command["right_waist"] == pytest.approx(
            np.interp(stamp, times, rows[:, 0]), abs=1e-6
        )
    held_value = np.interp(deadline, times, rows[:, 0].astype(np.float64))
    held = probe.commands_between(deadline + 0.005, deadline + 0.5)
    # Under CI load one run received 20 of the nominal 50 commands of this window (merged ticks
    # or samples the probe lost), so the check asks for the window to be covered, not a count.
    assert len(held) >= 10 and held[-1][0] - held[0][0] >= 0.4, [t for t, _ in held]
    assert all(c["right_waist"] == pytest.approx(held_value, abs=1e-6) for _, c in held)
    wait_for(
        lambda: any(s.starvation_events == 1 for s in probe.status_of(reply.episode_id)),
        5,
        "a starvation event after expiry",
    )


def test_joint_trajectory_subset_runs_at_stamp_plus_time_from_start(sim) -> None:
    _launcher, probe, _simulator, _perception = sim
    probe.reset(seed=5)
    start = round(probe.now() + 0.2, 2)
    msg = JointTrajectory(joint_names=["left_wrist_rotate"])
    msg.header.stamp = seconds_to_time(start)
    msg.points = [
        JointTrajectoryPoint(positions=[0.0], time_from_start=seconds_to_duration(0.0)),
        JointTrajectoryPoint(positions=[0.5], time_from_start=seconds_to_duration(0.5)),
    ]
    probe.trajectory_pub.publish(msg)
    probe.wait_for_commands_after(start + 0.6)
    executed = probe.commands_between(start, start + 0.5)
    assert len(executed) >= 45
    for stamp, command in executed:
        assert command["left_wrist_rotate"] == pytest.approx(stamp - start, abs=1e-6)


def test_far_targets_move_at_the_servo_speed(sim) -> None:
    _launcher, probe, _simulator, _perception = sim
    probe.reset(seed=7)
    start = round(probe.now() + 0.1, 2)
    target = HOME["left_waist"] + 1.0  # a jump of 1 rad: the servo takes 1 / pi s
    probe.chunk_pub.publish(chunk(["left_waist"], [[target]] * 20, start, 0.1))
    probe.wait_for_commands_after(start + 0.6)
    executed = probe.commands_between(start - 0.05, start + 0.6)
    values = np.array([c["left_waist"] for _, c in executed])
    # A probe stalled past the sim's command history misses commands (one CI run missed 21 in
    # a row): a step is the change per control tick between the commands received.
    ticks = np.round(np.diff([t for t, _ in executed]) * 100.0)  # workcell.yaml control_rate_hz
    assert np.all(ticks >= 1)
    steps = np.abs(np.diff(values)) / ticks
    max_step = 3.14 / 100.0  # workcell.yaml's max_joint_speed / control_rate_hz
    assert steps.max() == pytest.approx(max_step, rel=1e-6)  # the limit was what moved it
    assert np.all(steps <= max_step * (1 + 1e-9))
    assert values[-1] == pytest.approx(target, abs=1e-6)  # and it got there
    assert ticks[steps > 0.5 * max_step].sum() >= 30  # 1 rad at 0.0314 per tick


def test_chunks_observed_before_the_reset_are_refused(sim) -> None:
    _launcher, probe, _simulator, _perception = sim
    # A stamp before the reset must be positive (a zero stamp means "now"), run alone or not.
    wait_for(lambda: probe.clocks and probe.now() > 1.0, 10, "simulator time past 1 s")
    reply = probe.reset(seed=8)
    # The new episode's own status: right after the reply, the newest status received may
    # still be the previous episode's, whose start would make the "fresh" chunk too old.
    wait_for(lambda: probe.status_of(reply.episode_id), 10, "the new episode's status")
    reset_at = probe.status_of(reply.episode_id)[0]
    reset_s = time_to_seconds(reset_at.header.stamp) - reset_at.elapsed_s

    def counter(name: str) -> int:
        return int(probe.diagnostics[-1].get(name, 0)) if probe.diagnostics else 0

    def moved(start: float, end: float) -> list:
        return [
            t
            for t, c in probe.commands_between(start, end)
            if c["right_waist"] == pytest.approx(HOME["right_waist"] + 0.3)
        ]

    # The probe's clock view may lag the simulator under load, so rows start 0.3 s after it and
    # each chunk is judged over its whole span (1 s), not a window that may predate its arrival.
    start = round(probe.now() + 0.3, 2)
    old = chunk(["right_waist"], [[HOME["right_waist"] + 0.3]] * 10, start, 0.1)
    old.observation_stamp = seconds_to_time(reset_s - 0.5)  # planned in the last episode
    probe.chunk_pub.publish(old)
    wait_for(
        lambda: counter("rejected.before_reset") >= 1,
        10,
        lambda: f"rejected.before_reset; last diagnostics {probe.diagnostics[-1:]}",
    )
    probe.wait_for_commands_after(start + 1.0)
    assert probe.commands_between(start, start + 1.0) and not moved(start, start + 1.0)
    # Positive control: the same chunk observed after the reset moves the joint, seen by the
    # same check.
    accepted = counter("chunk")
    start = round(probe.now() + 0.3, 2)
    fresh = chunk(["right_waist"], [[HOME["right_waist"] + 0.3]] * 10, start, 0.1)
    fresh.observation_stamp = seconds_to_time(reset_s + 0.01)
    probe.chunk_pub.publish(fresh)
    wait_for(
        lambda: counter("chunk") > accepted,
        10,
        lambda: f"the fresh chunk accepted; last diagnostics {probe.diagnostics[-1:]}",
    )
    wait_for(lambda: moved(start, start + 1.0), 20, "right_waist at the fresh chunk's target")


def test_bad_commands_are_counted_by_reason_and_never_crash(sim) -> None:
    _launcher, probe, simulator, _perception = sim
    now = probe.now()
    probe.chunk_pub.publish(chunk(["left_waist", "nose"], [[0.0, 0.0]], now, 0.1))
    bad_shape = chunk(["left_waist"], [[0.0], [0.1]], now, 0.1)
    bad_shape.horizon = 5
    probe.chunk_pub.publish(bad_shape)
    probe.chunk_pub.publish(chunk(["left_waist"], [[float("nan")]], now, 0.1))
    probe.chunk_pub.publish(chunk(["left_waist"], [[0.0]], 1.0, 0.1))  # long expired
    probe.trajectory_pub.publish(JointTrajectory(joint_names=["left_waist"]))  # no points
    reasons = ("unknown_joint", "bad_shape", "non_finite", "stale")

    def counted() -> bool:
        values = probe.diagnostics[-1] if probe.diagnostics else {}
        return all(int(values.get(f"rejected.{r}", 0)) >= 1 for r in reasons) and (
            int(values.get("rejected.bad_shape", 0)) >= 2
        )

    wait_for(counted, 10, f"rejections {reasons} in diagnostics")
    assert simulator.alive()
    assert "rejected (unknown_joint)" in simulator.log() or "unknown_joint" in simulator.log()


def test_reset_refuses_unknown_instructions_and_episodes_fail_at_their_limit(sim) -> None:
    _launcher, probe, _simulator, _perception = sim
    refused = probe.reset(seed=6, instruction="dance on the table")
    assert not refused.success and "template" in refused.message
    before = refused.episode_id
    probe.set_param("episode_time_limit_s", 2.0)
    try:
        instruction = "pick up the blue cube"
        reply = probe.reset(seed=7, instruction="  Pick up the BLUE cube. ")
        assert reply.success, reply.message
        assert reply.episode_id == before + 1 and reply.instruction == instruction
        wait_for(lambda: instruction in probe.instructions, 5, "the instruction (volatile)")
        # Like the inference node: transient local, subscribed after the reset.
        latched, _ = probe.collect(String, "oxygen/instruction", LATCHED_QOS)
        wait_for(lambda: latched and latched[-1].data == instruction, 10, "latched instruction")
        wait_for(lambda: probe.status_of(reply.episode_id), 5, "status of the new episode")
        first = probe.status_of(reply.episode_id)[0]
        assert first.phase == EpisodeStatus.PHASE_RUNNING and first.instruction == instruction
        assert first.time_limit_s == 2.0 and first.seed == 7 and not first.success
        spec = tasks.sample_episode(7, instruction)
        assert first.task_template == spec.template
        poses = dict(zip(first.object_names, first.object_poses, strict=True))
        for name, (x, y, _yaw) in spec.objects.items():
            assert (poses[name].position.x, poses[name].position.y) == pytest.approx(
                (x, y), abs=1e-3
            )
        rows = [[HOME[n] for n in robot.JOINT_NAMES]] * 10  # stays at rest: lifts nothing
        probe.chunk_pub.publish(chunk(robot.JOINT_NAMES, rows, 0.0, 0.1))
        wait_for(
            lambda: any(
                s.phase == EpisodeStatus.PHASE_FAILED for s in probe.status_of(reply.episode_id)
            ),
            15,
            "the episode to fail at its time limit",
        )
        failed = next(
            s for s in probe.status_of(reply.episode_id) if s.phase == EpisodeStatus.PHASE_FAILED
        )
        assert 2.0 <= failed.elapsed_s < 2.02 and not failed.success
        assert failed.time_to_success_s < 0
        running = [
            s for s in probe.status_of(reply.episode_id) if s.phase == EpisodeStatus.PHASE_RUNNING
        ]
        assert all(s.elapsed_s < 2.0 for s in running)
    finally:
        probe.set_param("episode_time_limit_s", 0.0)


def test_next_episode_after_s_starts_the_next_seed_once_each_episode_ends(sim) -> None:
    """0 (the YAML's): an ended episode is followed by nothing; > 0: by the next seed's,
    that many sim seconds after its end, episode after episode (the bring-up's demo)."""
    _launcher, probe, _simulator, _perception = sim

    def ended(episode_id: int) -> EpisodeStatus | None:
        return next(
            (
                s
                for s in probe.status_of(episode_id)
                if s.phase in (EpisodeStatus.PHASE_FAILED, EpisodeStatus.PHASE_SUCCEEDED)
            ),
            None,
        )

    probe.set_param("episode_time_limit_s", 0.5)
    try:
        reply = probe.reset(seed=40)
        assert reply.success, reply.message
        first = reply.episode_id
        wait_for(lambda: ended(first), 15, "the first episode to end")
        end_s = time_to_seconds(ended(first).header.stamp)
        wait_for(lambda: probe.now() > end_s + 1.5, 15, "1.5 sim s after the end")
        assert not [s for s in list(probe.statuses) if s.episode_id > first]  # nothing followed
        probe.set_param("next_episode_after_s", 0.4)
        for episode_id in (first + 1, first + 2):  # the one ended long ago, then one in turn
            wait_for(lambda i=episode_id: probe.status_of(i), 15, f"episode {episode_id}")
            status = probe.status_of(episode_id)[0]
            assert status.seed == 40 + episode_id - first
            assert status.phase == EpisodeStatus.PHASE_RUNNING and status.elapsed_s == 0.0
            wait_for(lambda i=episode_id: ended(i), 15, f"episode {episode_id} to end")
        started_s = time_to_seconds(probe.status_of(first + 2)[0].header.stamp)
        previous_end_s = time_to_seconds(ended(first + 1).header.stamp)
        assert 0.39 < started_s - previous_end_s < 0.42  # within a tick (0.01 s)
    finally:
        probe.set_param("next_episode_after_s", 0.0)
        probe.set_param("episode_time_limit_s", 0.0)
    last = max(s.episode_id for s in list(probe.statuses))
    wait_for(lambda: ended(last), 15, "the last episode to end")
    end_s = time_to_seconds(ended(last).header.stamp)
    wait_for(lambda: probe.now() > end_s + 1.0, 15, "1 sim s after the last end")
    assert max(s.episode_id for s in list(probe.statuses)) == last  # off again


def test_stamps_are_sim_time_at_the_real_time_factor(sim) -> None:
    _launcher, probe, simulator, _perception = sim
    frames, stop = probe.collect(
        ObservationFrame, "oxygen/observation", OBSERVATION_QOS, wall_time=True
    )
    probe.set_param("real_time_factor", 0.3)
    try:
        wall_start = time.monotonic() + 0.5  # the new factor is in force
        wait_for(lambda: time.monotonic() > wall_start + 4.0 and len(frames) > 5, 20, "4 s")
        clocks = [(w, s) for w, s in list(probe.clocks) if w >= wall_start]
        (w0, s0), (w1, s1) = clocks[0], clocks[-1]
        assert (s1 - s0) / (w1 - w0) == pytest.approx(0.3, abs=0.05)
        # Everything is stamped in sim time (the clock started at 0, far from wall time).
        assert s1 < 1e5 < time.time()
        joint_stamps = [time_to_seconds(j.header.stamp) for j in list(probe.joints)[-20:]]
        assert all(s0 - 1.0 <= t <= s1 + 1.0 for t in joint_stamps)
        recent = [(w, time_to_seconds(f.header.stamp)) for w, f in frames if w >= wall_start]
        assert len(recent) >= 5 and all(s0 - 1.0 <= t <= s1 + 1.0 for _, t in recent)
        (fw0, fs0), (fw1, fs1) = recent[0], recent[-1]
        assert (fs1 - fs0) / (fw1 - fw0) == pytest.approx(0.3, abs=0.08)
        # The status reports the achieved factor (over the last wall second: a busy machine
        # can stall one, so the median of the window).
        reported = [st.real_time_factor for st in list(probe.statuses)[-8:]]
        assert float(np.median(reported)) == pytest.approx(0.3, abs=0.06), reported
        wait_for(
            lambda: float(probe.diagnostics[-1]["real_time_factor_target"]) == 0.3, 5, "diags"
        )
    finally:
        stop()
        probe.set_param("real_time_factor", REAL_TIME_FACTOR)
    assert simulator.alive()


def test_paused_holds_sim_time_and_resumes_without_catching_up(sim) -> None:
    _launcher, probe, simulator, _perception = sim
    start = probe.now()
    wait_for(lambda: probe.now() > start + 0.2, 10, "the clock advancing (the control)")

    def paused() -> list[dict[str, str]]:
        return [d for d in list(probe.diagnostics) if d.get("paused") == "True"]

    probe.set_param("paused", True)
    try:
        wait_for(lambda: len(paused()) >= 1, 5, "a status saying paused")
        held = float(paused()[0]["sim_time_s"])
        # Two more statuses (0.5 s apart) while paused: the clock stood still all along.
        wait_for(lambda: len(paused()) >= 3, 5, "two more paused statuses")
        assert probe.now() <= held + 0.011, (held, probe.now())  # at most the tick under way
        assert {d["sim_time_s"] for d in paused()} == {paused()[0]["sim_time_s"]}
    finally:
        probe.set_param("paused", False)
    resumed_wall, resumed_sim = time.monotonic(), probe.now()
    wait_for(lambda: probe.now() > resumed_sim + 0.5, 10, "the clock running again")
    # Paced from where it stood: 0.5 sim s took about 1 wall s at 0.5x (a catch-up of the
    # paused seconds would have taken none).
    assert time.monotonic() - resumed_wall >= 0.8 * 0.5 / REAL_TIME_FACTOR
    assert simulator.alive()


def test_inference_follows_the_simulator_clock(sim) -> None:
    launcher, probe, simulator, _perception = sim
    probe.reset(seed=8)
    probe.set_param("real_time_factor", 0.3)
    chunks, _ = probe.collect(ActionChunk, "oxygen/actions", RELIABLE_QOS)
    wait_for(lambda: probe.diagnostics, 5, "diagnostics")
    before = probe.diagnostics[-1]
    inference = launcher.start(
        "oxygen_ros.nodes.inference.inference_node",
        [
            "--params-file",
            str(PARAMS),
            "-r",
            "__node:=inference",
            "-p",
            f"inference:memory_db_path:={launcher.workdir / 'memory.sqlite3'}",
            "-p",
            "inference:warmup:=false",
            "-p",
            "inference:narration_period_s:=0.0",
            "-p",
            "inference:memory_period_s:=0.0",
            "-p",
            "inference:action_thread_priority:=0",
        ],
    )
    try:
        wait_for(
            lambda: len(chunks) >= 20 or not inference.alive(),
            ENGINE_START_TIMEOUT_S,
            "action chunks from the inference node",
        )
        assert inference.alive(), inference.log()[-3000:]
        now = probe.now()
        for msg in chunks[-20:]:
            stamp = time_to_seconds(msg.header.stamp)
            observed = time_to_seconds(msg.observation_stamp)
            assert now - 5.0 < observed <= stamp <= now + 0.1, (observed, stamp, now)
            assert list(msg.joint_names) == list(robot.JOINT_NAMES)
        executed = int(before.get("chunk", 0)) + 10
        wait_for(
            lambda: int(probe.diagnostics[-1].get("chunk", 0)) >= executed, 10, "chunks in the sim"
        )
        after = probe.diagnostics[-1]
        assert after.get("rejected.stale", "0") == before.get("rejected.stale", "0")
        assert "physics_unstable" not in after  # the velocity limits keep random actions sane
    finally:
        inference.stop()
        probe.set_param("real_time_factor", REAL_TIME_FACTOR)
    assert simulator.alive()
