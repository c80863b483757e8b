"""perception_node with `cube_state_camera` as a real process over DDS: the test publishes the
workcell's rendered cameras and joint states, and the frames' state is the joints followed by
the cubes' table positions that the detector finds in the top image, held while it is gone."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
from diagnostic_msgs.msg import DiagnosticArray
from harness import newest_status, wait_for
from sensor_msgs.msg import Image, JointState

from oxygen_ros.msg import ObservationFrame
from oxygen_ros.nodes.common.image_conversion import encode_image
from oxygen_ros.nodes.common.runtime import OBSERVATION_QOS, SENSOR_QOS
from oxygen_ros.perception import workcell_cubes
from oxygen_ros.sim import robot, tasks
from oxygen_ros.sim.workcell import Workcell, WorkcellConfig

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
PARAMS = ROOT / "config" / "workcell.yaml"
CAMERAS = {"top": "c_top", "left_wrist": "c_left", "right_wrist": "c_right"}
OVERRIDES = """
/**:
  ros__parameters:
    joint_state_topic: c_joints
    observation_topic: c_observation
    diagnostics_period_s: 0.2
    cameras:
      top: {topic: c_top}
      left_wrist: {topic: c_left}
      right_wrist: {topic: c_right}
perception:
  ros__parameters:
    use_sim_time: false
    cube_state_camera: top
"""
TOLERANCE_M = 0.005  # the detector's measured worst case is 1.7 mm (test_cube_detector.py)


class WorkcellSensors:
    """Publishes rendered workcell cameras (rgb8) and the home joint state at 10 Hz."""

    def __init__(self, ros_node) -> None:
        node = ros_node.node
        self.node = node
        self.pubs = {c: node.create_publisher(Image, t, SENSOR_QOS) for c, t in CAMERAS.items()}
        self.joint_pub = node.create_publisher(JointState, "c_joints", SENSOR_QOS)
        self.images: dict[str, tuple[int, bytes]] = {}
        self.joints = robot.HOME.copy()
        self.top_enabled = True
        # With `publish_statuses`: the episode's status, before each tick's images as the
        # simulator sends it ((episode id, reset s, instruction); None: none published).
        self.status_pub = None
        self.episode: tuple[int, float, str] | None = None
        self._lock = threading.Lock()  # a tick stamps and publishes under it
        self._paused = False
        self.timer = node.create_timer(0.1, self.tick)

    def show(self, cell: Workcell, objects: dict, joints: np.ndarray = robot.HOME) -> None:
        """Renders the cameras with the objects and the arms at `joints`, then publishes
        those images and joints."""
        cell.reset(joints, objects)
        self.images = {c: encode_image(cell.render(c), "rgb8") for c in CAMERAS}
        self.joints = np.asarray(joints, np.float64).copy()

    def pause(self) -> None:
        """Stops publishing; every message published so far carries a stamp from before
        this returns (a tick takes its stamp and publishes under the same lock)."""
        with self._lock:
            self._paused = True

    def resume(self) -> None:
        with self._lock:
            self._paused = False

    def tick(self) -> None:
        with self._lock:
            if not self._paused:
                self._publish()

    def publish_statuses(self, topic: str) -> None:
        """Publishes `episode`'s status at each tick, before the images (latched)."""
        from oxygen_ros.msg import EpisodeStatus
        from oxygen_ros.nodes.common.runtime import LATCHED_QOS

        self.status_pub = self.node.create_publisher(EpisodeStatus, topic, LATCHED_QOS)

    def publish_status(self, stamp) -> None:
        """`episode`'s status stamped `stamp` (a builtin Time), if there is one."""
        from oxygen_ros.msg import EpisodeStatus
        from oxygen_ros.nodes.common.conversions import time_to_seconds

        if self.status_pub is None or self.episode is None:
            return
        episode_id, reset_s, text = self.episode
        msg = EpisodeStatus(episode_id=episode_id, phase=EpisodeStatus.PHASE_RUNNING)
        msg.header.stamp = stamp
        msg.instruction, msg.elapsed_s = text, time_to_seconds(stamp) - reset_s
        self.status_pub.publish(msg)

    def _publish(self) -> None:
        stamp = self.node.get_clock().now().to_msg()
        self.publish_status(stamp)
        for camera, (step, data) in dict(self.images).items():
            if camera == "top" and not self.top_enabled:
                continue
            msg = Image(height=224, width=224, encoding="rgb8", step=step, data=data)
            msg.header.stamp = stamp
            self.pubs[camera].publish(msg)
        joints = JointState(name=list(robot.JOINT_NAMES), position=list(map(float, self.joints)))
        joints.header.stamp = stamp
        self.joint_pub.publish(joints)

    def close(self) -> None:
        self.timer.cancel()
        self.node.destroy_timer(self.timer)
        if self.status_pub is not None:
            self.node.destroy_publisher(self.status_pub)


def start_perception(launcher, override: Path):
    """perception_node with the workcell YAML and `override` on top."""
    return launcher.start(
        "oxygen_ros.nodes.perception.perception_node",
        ros_args=[
            *("--params-file", str(PARAMS), "--params-file", str(override)),
            *("-r", "__node:=perception"),
        ],
    )


def first_frames(launcher, ros_node, override: Path):
    """Starts perception with `override` while the sensors publish, and waits for its first
    frame: (frames, diagnostics, process), the lists filling as messages arrive."""
    frames = ros_node.collect(ObservationFrame, "c_observation", OBSERVATION_QOS)
    diags = ros_node.collect(DiagnosticArray, "/diagnostics", 10)
    proc = start_perception(launcher, override)
    wait_for(lambda: frames or not proc.alive(), 60, "a first observation frame")
    assert proc.alive(), proc.log()
    return frames, diags, proc


def cubes_of(frame: ObservationFrame) -> np.ndarray:
    return np.asarray(frame.joint_positions[len(robot.JOINT_NAMES) :])


def truth(spec: tasks.EpisodeSpec) -> np.ndarray:
    return np.concatenate([spec.objects[name][:2] for name in workcell_cubes.CUBE_NAMES])


def counter(diags, name: str) -> int:
    """Perception's newest diagnostics value `name` (0 before it is counted)."""
    return int(newest_status(diags, "perception").get(name, 0))


def unseen(diags) -> int:
    return counter(diags, "cube_state.unseen")


def test_frames_carry_the_detected_cubes_and_hold_them_while_unseen(
    launcher, ros_node, tmp_path
) -> None:
    override = tmp_path / "override.yaml"
    override.write_text(OVERRIDES + "    cube_state: positions\n")  # the profile's is target
    cell = Workcell(WorkcellConfig())
    sensors = WorkcellSensors(ros_node)
    try:
        first, second = tasks.sample_episode(4), tasks.sample_episode(9)
        sensors.show(cell, first.objects)
        frames, diags, proc = first_frames(launcher, ros_node, override)
        names = [*robot.JOINT_NAMES, *workcell_cubes.STATE_NAMES]
        assert list(frames[-1].joint_names) == names
        assert len(frames[-1].joint_velocities) == 0  # the joint states carry none

        def near(expected: np.ndarray):
            return lambda: frames and np.allclose(cubes_of(frames[-1]), expected, atol=TOLERANCE_M)

        wait_for(near(truth(first)), 10, f"the cubes of seed 4 at {truth(first)}")
        np.testing.assert_allclose(frames[-1].joint_positions[:14], robot.HOME)

        # The first cube leaves the top camera's view: it is held where it was last seen.
        hidden = workcell_cubes.CUBE_NAMES[0]
        moved = {k: v for k, v in second.objects.items() if k != hidden}
        sensors.show(cell, moved)
        held = np.concatenate([truth(first)[:2], truth(second)[2:]])
        wait_for(near(held), 10, f"the other cubes moved, {hidden} held: {held}")
        # Positive control: shown again, it is found at its new place by the same check.
        sensors.show(cell, second.objects)
        wait_for(near(truth(second)), 10, f"the cubes of seed 9 at {truth(second)}")

        # No top image at all: frames go on (the camera is masked) with the cubes held.
        before = unseen(diags)
        sensors.top_enabled = False
        wait_for(lambda: unseen(diags) > before, 10, "cube_state.unseen counted")
        count = len(frames)
        wait_for(lambda: len(frames) > count + 3, 10, "frames without the top camera")
        assert not frames[-1].image_valid[0]
        np.testing.assert_allclose(cubes_of(frames[-1]), truth(second), atol=TOLERANCE_M)
        assert proc.alive(), proc.log()
    finally:
        sensors.close()
        cell.close()


@pytest.mark.parametrize("kind", ["poses", "reach"])
def test_cube_poses_follow_a_gripper_that_holds_the_cube(
    launcher, ros_node, tmp_path, kind
) -> None:
    """`cube_state: poses`: the frames carry each cube's pose; with the joint state putting a
    pinch point at a cube and its gripper stopped on it, that cube is under the pinch point, on
    the table, and rises with the hand (the joints reach the perception); let go, it is seen on
    the table again. `reach` adds each cube's offset from each hand: the held cube's from its
    hand is the pinch point's height above the cube's centre, where it was more than 5 cm with
    the arm at home."""
    from oxygen_ros.sim.expert import DOWN, ScriptedExpert
    from oxygen_ros.sim.kinematics import ArmKinematics, gripper_rotation

    # Without the right arm's joints the node refuses to start, with the reason; the same
    # node with all 14 (below) is the positive control.
    bad = tmp_path / "bad.yaml"
    left = ", ".join(robot.JOINT_NAMES[: robot.JOINTS_PER_ARM])
    bad.write_text(OVERRIDES + f"    cube_state: {kind}\n    joint_names: [{left}]\n")
    refused = start_perception(launcher, bad)
    wait_for(lambda: not refused.alive(), 60, "perception to refuse joint_names without an arm")
    assert "needs the workcell's joints in joint_names" in refused.log(), refused.log()
    override = tmp_path / "override.yaml"
    override.write_text(OVERRIDES + f"    cube_state: {kind}\n")
    cell = Workcell(WorkcellConfig())
    sensors = WorkcellSensors(ros_node)
    width = len(workcell_cubes.POSE_FIELDS)
    try:
        spec = tasks.sample_episode(4)
        sensors.show(cell, spec.objects)
        frames = ros_node.collect(ObservationFrame, "c_observation", OBSERVATION_QOS)
        proc = start_perception(launcher, override)
        wait_for(lambda: frames or not proc.alive(), 60, "a first observation frame")
        assert proc.alive(), proc.log()
        names = [*robot.JOINT_NAMES, *workcell_cubes.object_state(kind).names]
        assert list(frames[-1].joint_names) == names
        pose_width = len(workcell_cubes.POSE_STATE_NAMES)

        def poses() -> np.ndarray:
            return cubes_of(frames[-1])[:pose_width].reshape(-1, width)

        def hand_offset(cube: int, arm: str) -> float:
            """The cube's distance from the arm's pinch point in the reach block (m)."""
            reach = cubes_of(frames[-1])[pose_width:].reshape(-1, len(robot.ARMS), 3)
            r = reach[cube, robot.ARMS.index(arm)].astype(np.float64)
            return float(np.linalg.norm(np.sign(r) * r**2))

        on_table = np.array([[*spec.objects[n][:2], 0.02] for n in workcell_cubes.CUBE_NAMES])
        wait_for(
            lambda: np.allclose(poses()[:, :3], on_table, atol=TOLERANCE_M),
            10,
            f"the cubes of seed 4 at {on_table}",
        )
        # The episode's arm with its pinch point at the target cube, the gripper stopped on it.
        k = workcell_cubes.CUBE_NAMES.index(spec.target)
        if kind == "reach":
            assert hand_offset(k, spec.arm) > 0.05
        kin = ArmKinematics(cell.model, spec.arm)
        cell.reset(robot.HOME, spec.objects)
        axis = ScriptedExpert.finger_axis(kin, cell.object_pose(spec.target))
        rotation = gripper_rotation(DOWN, axis)
        seed = np.array(robot.HOME_ARM)
        seed[0] = kin.waist_towards(on_table[k])
        result = kin.solve(on_table[k] + [0.0, 0.0, 0.005], rotation, seed)
        assert result.converged
        joints = robot.HOME.copy()
        joints[robot.arm_columns(spec.arm)] = result.q
        joints[robot.gripper_index(spec.arm)] = 0.6
        pinch, _ = kin.forward(result.q)
        sensors.show(cell, spec.objects, joints)
        # held: under the pinch point, on the table until the hand rises from where it closed
        held_at = np.array([*pinch[:2], on_table[k, 2]])
        wait_for(
            lambda: np.allclose(poses()[k, :3], held_at, atol=1e-4),
            10,
            lambda: (
                f"{spec.target} held under the pinch point at {held_at}, not {poses()[k]} "
                f"(joints {np.asarray(frames[-1].joint_positions[:14]).round(3)})"
            ),
        )
        if kind == "reach":
            assert abs(hand_offset(k, spec.arm) - (pinch[2] - held_at[2])) < 1e-4
        # The hand 3 cm up, the gripper still stopped: the cube rises with it.
        raised = kin.solve(on_table[k] + [0.0, 0.0, 0.035], rotation, result.q)
        assert raised.converged
        joints[robot.arm_columns(spec.arm)] = raised.q
        up, _ = kin.forward(raised.q)
        sensors.show(cell, spec.objects, joints)
        lifted = np.array([*up[:2], on_table[k, 2] + up[2] - pinch[2]])
        wait_for(
            lambda: np.allclose(poses()[k, :3], lifted, atol=1e-4),
            10,
            lambda: f"{spec.target} lifted with the hand to {lifted}, not {poses()[k]}",
        )
        # The arm back home, its gripper closed on nothing: let go, and the next whole view
        # puts the cube on the table (the positive control of the same check).
        sensors.show(cell, spec.objects)
        wait_for(
            lambda: np.allclose(poses()[k, :3], on_table[k], atol=TOLERANCE_M),
            10,
            f"{spec.target} on the table again",
        )
        assert proc.alive(), proc.log()
    finally:
        sensors.close()
        cell.close()


def no_target(diags) -> int:
    return counter(diags, "cube_state.no_target")


def test_the_target_state_follows_the_instructed_cube(launcher, ros_node, tmp_path) -> None:
    """`cube_state: target`: the frames carry only the cube the newest instruction (latched,
    on `task_instruction_topic`) names, pose then offsets from each hand, at the same places
    whichever cube it is. Before any instruction, and after one that names no cube (warned,
    counted), they carry a cube at the table's centre; a new instruction switches the cube."""
    from std_msgs.msg import String

    from oxygen_ros.nodes.common.runtime import LATCHED_QOS

    override = tmp_path / "override.yaml"
    override.write_text(
        OVERRIDES + "    cube_state: target\n    task_instruction_topic: c_instruction\n"
    )
    cell = Workcell(WorkcellConfig())
    sensors = WorkcellSensors(ros_node)
    instruction = ros_node.node.create_publisher(String, "c_instruction", LATCHED_QOS)
    width = len(workcell_cubes.POSE_FIELDS)
    try:
        spec = tasks.sample_episode(4)
        sensors.show(cell, spec.objects)
        frames, diags, proc = first_frames(launcher, ros_node, override)
        assert list(frames[-1].joint_names) == [
            *robot.JOINT_NAMES,
            *workcell_cubes.TARGET_STATE_NAMES,
        ]

        def target_xy() -> np.ndarray:
            return cubes_of(frames[-1])[:2]

        def at(xy) -> bool:
            return np.allclose(target_xy(), xy, atol=TOLERANCE_M)

        centre = np.array(workcell_cubes.TABLE_CENTRE_XY)
        wait_for(lambda: no_target(diags) > 0, 10, "cube_state.no_target counted")
        assert at(centre), target_xy()
        for name in workcell_cubes.CUBE_NAMES:  # every cube at its own place (seed 4)
            assert not np.allclose(spec.objects[name][:2], centre, atol=TOLERANCE_M)
        # Each cube named in turn: its table position, and its offsets from the hands are the
        # reach state's for that cube (computed here from the same pose and the home joints).
        for name in (spec.target, *[n for n in workcell_cubes.CUBE_NAMES if n != spec.target]):
            colour = name.removesuffix("_cube")
            instruction.publish(String(data=f"pick up the {colour} cube"))
            xy = np.array(spec.objects[name][:2])
            wait_for(lambda xy=xy: at(xy), 10, lambda n=name: f"{n} as target, {target_xy()}")
            state = cubes_of(frames[-1])
            expected = workcell_cubes.reach_offsets(state[:width], robot.HOME)
            np.testing.assert_allclose(state[width:], expected, atol=1e-5)
        # A new layout within the same task: the cube is found at its new place and has moved
        # from where the task first saw it (the positive control of the reset below).
        text = f"pick up the {colour} cube"
        second = tasks.sample_episode(9)
        xy = np.array(second.objects[name][:2])
        shift = xy - np.array(spec.objects[name][:2])
        assert np.linalg.norm(shift) > 0.02
        sensors.show(cell, second.objects)

        def moved() -> np.ndarray:
            return cubes_of(frames[-1])[5:7]

        wait_for(lambda: at(xy), 10, f"{name} at its new place {xy}")
        wait_for(lambda: np.allclose(moved(), shift, atol=TOLERANCE_M), 10, "the shift")
        # The same instruction again is a new task: it starts from this layout, unmoved.
        tasks_before = counter(diags, "cube_state.tasks")
        instruction.publish(String(data=text))
        wait_for(
            lambda: (
                counter(diags, "cube_state.tasks") > tasks_before
                and at(xy)
                and np.allclose(moved(), 0.0, atol=1e-6)
            ),
            10,
            lambda: f"a new task at the new layout, unmoved: {moved()}",
        )
        # An instruction that names no cube: no target again, counted, the node alive.
        before = no_target(diags)
        instruction.publish(String(data="wave at the camera"))
        wait_for(lambda: at(centre), 10, "the table centre after an instruction with no cube")
        wait_for(lambda: no_target(diags) > before, 10, "cube_state.no_target counted again")
        assert "no target cube for the state" in proc.log(), proc.log()
        assert proc.alive(), proc.log()
    finally:
        ros_node.node.destroy_publisher(instruction)
        sensors.close()
        cell.close()


def status_override(tmp_path: Path, cube_state: str, extra: str) -> Path:
    """An override file for the target states with the instruction and the episode status on
    the test's topics, plus the perception parameter line `extra`."""
    override = tmp_path / "override.yaml"
    override.write_text(
        OVERRIDES
        + f"    cube_state: {cube_state}\n    task_instruction_topic: c_instruction\n"
        + f"    episode_status_topic: c_status\n    {extra}\n"
    )
    return override


def test_a_reset_holds_frames_until_its_instruction_arrives(launcher, ros_node, tmp_path) -> None:
    """The simulator's episode status reaches perception before the episode's instruction
    (which comes through the inference node): no frame between them carries the previous
    task's target. Frames wait (counted) until the instruction; a reset whose instruction never
    comes releases them after `reset_instruction_timeout_s` with the current target (warned):
    the positive control of the check that no frame after a reset has the old target. Run with
    `cube_state: target_m` (the target state with its offsets in metres; the node holds and
    names the target as for `target`): its frames carry those names and offsets."""
    from std_msgs.msg import String

    from oxygen_ros.msg import EpisodeStatus
    from oxygen_ros.nodes.common.conversions import time_to_seconds
    from oxygen_ros.nodes.common.runtime import LATCHED_QOS

    timeout_s = 2.0
    override = status_override(tmp_path, "target_m", f"reset_instruction_timeout_s: {timeout_s}")
    node = ros_node.node
    cell = Workcell(WorkcellConfig())
    sensors = WorkcellSensors(ros_node)
    instruction = node.create_publisher(String, "c_instruction", LATCHED_QOS)
    status = node.create_publisher(EpisodeStatus, "c_status", LATCHED_QOS)

    def reset(episode_id: int, text: str) -> float:
        """Publishes episode `episode_id`'s first status (its reset now) and returns the reset.
        The sensors pause from before the reset until perception has counted it: DDS orders no
        messages across topics, so sensor messages stamped after the reset could otherwise be
        fused before the status arrives, and no node can hold a frame for a reset it has not
        heard of (a frame with the old target seen so under load, 2026-11-30)."""
        resets = counter(diags, "cube_state.resets")
        sensors.pause()
        try:
            msg = EpisodeStatus(episode_id=episode_id, phase=EpisodeStatus.PHASE_RUNNING)
            msg.header.stamp = node.get_clock().now().to_msg()
            msg.instruction, msg.elapsed_s = text, 0.0
            status.publish(msg)
            wait_for(
                lambda: counter(diags, "cube_state.resets") > resets,
                10,
                f"episode {episode_id}'s reset counted",
            )
        finally:
            sensors.resume()
        return time_to_seconds(msg.header.stamp)

    try:
        spec = tasks.sample_episode(4)
        sensors.show(cell, spec.objects)
        frames, diags, proc = first_frames(launcher, ros_node, override)
        xy = {name: np.array(spec.objects[name][:2]) for name in workcell_cubes.CUBE_NAMES}

        def after(t: float) -> list[ObservationFrame]:
            return [f for f in list(frames) if time_to_seconds(f.header.stamp) > t]

        def at(frame: ObservationFrame, name: str) -> bool:
            return np.allclose(cubes_of(frame)[:2], xy[name], atol=TOLERANCE_M)

        instruction.publish(String(data="pick up the red cube"))
        wait_for(lambda: at(frames[-1], "red_cube"), 10, "the red cube as target")
        names = [*robot.JOINT_NAMES, *workcell_cubes.TARGET_METRES_STATE_NAMES]
        assert list(frames[-1].joint_names) == names
        width = len(workcell_cubes.POSE_FIELDS)
        state = cubes_of(frames[-1])
        metres = workcell_cubes.reach_offsets(state[:width], robot.HOME, metres=True)
        np.testing.assert_allclose(state[width:], metres, atol=1e-5)
        # The reset first (its episode names the blue cube), then the instruction.
        held = counter(diags, "skipped.awaiting_instruction")
        first_reset = reset(1, "pick up the blue cube")
        wait_for(
            lambda: counter(diags, "skipped.awaiting_instruction") > held,
            10,
            "frames held after the reset",
        )
        instruction.publish(String(data="pick up the blue cube"))
        wait_for(lambda: after(first_reset) and at(frames[-1], "blue_cube"), 10, "blue target")
        wrong = [f for f in after(first_reset) if not at(f, "blue_cube")]
        assert not wrong, [cubes_of(f)[:2] for f in wrong]
        # A reset naming the green cube whose instruction never comes: frames wait for
        # timeout_s, then go on with the blue target, warned.
        second_reset = reset(2, "pick up the green cube")
        wait_for(
            lambda: counter(diags, "cube_state.instruction_timeouts") == 1,
            timeout_s + 10,
            "the timeout counted",
        )
        wait_for(lambda: after(second_reset + timeout_s / 2), 10, "frames after the timeout")
        late = after(second_reset)
        assert all(at(f, "blue_cube") for f in late), [cubes_of(f)[:2] for f in late]
        assert time_to_seconds(late[0].header.stamp) > second_reset + timeout_s / 2
        warned = "no instruction within 2 s of episode 2's reset (its instruction names green"
        assert warned in proc.log(), proc.log()
        assert proc.alive(), proc.log()
    finally:
        ros_node.node.destroy_publisher(instruction)
        ros_node.node.destroy_publisher(status)
        sensors.close()
        cell.close()


@pytest.mark.parametrize("wait_s", [10.0, 0.0], ids=["gate", "control_without_gate"])
def test_images_of_a_reset_not_heard_of_wait_for_its_status(
    launcher, ros_node, tmp_path, wait_s: float
) -> None:
    """No message order holds across topics: under load the images of a new episode reached
    perception before its reset's status (a clean-clone CI run of test_observation_parity,
    2026-12-04: the previous task's tracker fed the new layout). The sensors here publish a
    status before each tick's images, as the simulator does; then a new layout's images flow
    while the statuses are held back, as a delayed status stream. With
    `episode_status_wait_s` no frame stamped after the reset carries the old tracker (the
    cube read as moved); the frames wait (counted) and go on unmoved once the reset's status
    comes. The control, the gate off, publishes such frames: the check sees them."""
    from std_msgs.msg import String

    from oxygen_ros.nodes.common.conversions import time_to_seconds
    from oxygen_ros.nodes.common.runtime import LATCHED_QOS

    override = status_override(tmp_path, "target", f"episode_status_wait_s: {wait_s}")
    node = ros_node.node
    cell = Workcell(WorkcellConfig())
    sensors = WorkcellSensors(ros_node)
    sensors.publish_statuses("c_status")
    instruction = node.create_publisher(String, "c_instruction", LATCHED_QOS)
    text = "pick up the red cube"
    first, second = tasks.sample_episode(4), tasks.sample_episode(9)
    name = "red_cube"
    xy_first, xy_second = (np.array(spec.objects[name][:2]) for spec in (first, second))
    assert np.linalg.norm(xy_second - xy_first) > 0.02
    try:
        sensors.episode = (1, time_to_seconds(node.get_clock().now().to_msg()), text)
        sensors.show(cell, first.objects)
        frames, diags, proc = first_frames(launcher, ros_node, override)
        instruction.publish(String(data=text))

        def at(frame: ObservationFrame, xy) -> bool:
            return np.allclose(cubes_of(frame)[:2], xy, atol=TOLERANCE_M)

        def moved(frame: ObservationFrame) -> np.ndarray:
            return cubes_of(frame)[5:7]

        wait_for(lambda: at(frames[-1], xy_first), 10, "the red cube at its first place")
        # The reset: the new layout's images flow, its status held back until perception has
        # received at least five of them (eight counted: the diagnostics lag by a period).
        waited = counter(diags, "skipped.cube_image_ahead_of_status")
        sensors.pause()
        received = counter(diags, "images.top")
        reset_s = time_to_seconds(node.get_clock().now().to_msg())
        held_episode, sensors.episode = (2, reset_s, text), None
        sensors.show(cell, second.objects)
        sensors.resume()
        wait_for(
            lambda: counter(diags, "images.top") >= received + 8,
            8,  # less than the gate's wait: the images must not outlast it
            "five images of the new layout received without a status",
        )
        sensors.pause()
        sensors.episode = held_episode
        sensors.publish_status(node.get_clock().now().to_msg())
        sensors.resume()

        def after_reset() -> list[ObservationFrame]:
            return [f for f in list(frames) if time_to_seconds(f.header.stamp) > reset_s]

        def settled() -> bool:
            late = after_reset()
            unmoved = bool(late) and np.allclose(moved(late[-1]), 0.0, atol=1e-6)
            return unmoved and at(late[-1], xy_second)

        wait_for(settled, 10, lambda: f"the new layout unmoved, {[moved(f) for f in frames[-3:]]}")
        old_tracker = [f for f in after_reset() if not np.allclose(moved(f), 0.0, atol=1e-6)]
        if wait_s > 0:
            assert not old_tracker, [moved(f) for f in old_tracker]
            wait_for(
                lambda: counter(diags, "skipped.cube_image_ahead_of_status") > waited,
                10,
                "frames counted as waiting for a status",
            )
        else:  # the check sees the old tracker's frames when nothing waits
            shift = xy_second - xy_first
            assert any(np.allclose(moved(f), shift, atol=TOLERANCE_M) for f in old_tracker), [
                moved(f) for f in old_tracker
            ]
        assert proc.alive(), proc.log()
    finally:
        node.destroy_publisher(instruction)
        sensors.close()
        cell.close()
