"""The inference node's action process for real (spawned, publishing over DDS): a hand-off is
published at once and ticks follow at 70 Hz, SIGINT is left to the parent, `stop` ends it with
exit code 0, it publishes one valid JointTrajectory per controller group, and it exits when its
parent is killed (kill -9)."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from harness import call_service, wait_for
from integration.action_parent import config, rows
from trajectory_msgs.msg import JointTrajectory

from oxygen_ros.engine.action_stream import HOLD_CHUNK_ID, StreamConfig
from oxygen_ros.msg import ActionChunk
from oxygen_ros.nodes.common.runtime import RELIABLE_QOS
from oxygen_ros.nodes.inference.action_process import ActionProcess
from oxygen_ros.nodes.inference.conversions import trajectory_points
from oxygen_ros.nodes.inference.trajectory_groups import parse_groups, trajectory_problems

pytestmark = pytest.mark.integration

HERE = Path(__file__).resolve().parent
START_TIMEOUT_S = 30.0  # interpreter + rclpy + discovery on 2 busy cores


def exited(pid: int) -> bool:
    """The process is gone (or a zombie nobody reaped yet)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


def test_hand_off_published_at_once_then_ticks_sigint_ignored_stop_exits_0(ros_node) -> None:
    events: list[tuple] = []
    process = ActionProcess.start(
        # Rows 0.5 s apart: the chunk covers the whole test (8 s), ticks never run out.
        config(
            "/t_actions_a",
            stream=StreamConfig(dt=0.5, num_joints=2, blend_mode="replace", max_chunk_age_s=60.0),
        ),
        on_reject=lambda reason, message: events.append((reason, message)),
        on_watchdog=lambda transition: events.append((transition,)),
    )
    try:
        received = ros_node.collect(ActionChunk, "/t_actions_a", RELIABLE_QOS)
        assert process.link.ready.wait(START_TIMEOUT_S), "the action process never started"
        ros_node.wait_for_publishers("/t_actions_a")
        process.link.hand_off(rows(0.0), time.time() - 0.05, 0.05)
        wait_for(lambda: len(received) >= 5, 10, "ticks (the subscription is matched)")
        count = len(received)
        process.link.hand_off(rows(0.25), time.time() - 0.05, 0.05)
        wait_for(lambda: len(received) >= count + 40, 10, lambda: f"{len(received)} messages")
        new = [m for m in received if m.chunk_id == 1]
        assert new[0].trigger == ActionChunk.TRIGGER_NEW_CHUNK  # at once, then its ticks
        assert {m.trigger for m in new[1:]} == {ActionChunk.TRIGGER_TICK}
        assert list(new[0].joint_names) == ["a", "b"] and new[0].header.frame_id == "base"
        assert np.asarray(new[0].actions)[1] == pytest.approx(0.25)
        sequences = [m.sequence for m in received]
        assert sequences == list(range(sequences[0], sequences[0] + len(received)))
        values = process.link.diagnostics()
        assert values is not None and values["actions.chunks_accepted"] == 2
        os.kill(process.popen.pid, signal.SIGINT)  # a terminal's Ctrl-C reaches the group
        count = len(received)
        wait_for(lambda: len(received) >= count + 20, 10, "ticks after SIGINT")
        assert process.alive() and events == []
    finally:
        code = process.stop(timeout_s=10.0)
    assert code == 0
    wait_for(lambda: ros_node.node.count_publishers("/t_actions_a") == 0, 10, "no publisher")


def test_one_joint_trajectory_per_group_each_valid_for_its_controller(ros_node) -> None:
    joints = ("a", "b", "c", "d")
    groups = parse_groups(
        joints,
        {
            "arm": ("/t_jt_arm/joint_trajectory", ["b", "a"]),
            "gripper": ("/t_jt_gripper/joint_trajectory", ["c"]),
            "head": ("/t_jt_head/joint_trajectory", ["d"]),
        },
    )
    received = {g.name: ros_node.collect(JointTrajectory, g.topic, RELIABLE_QOS) for g in groups}
    process = ActionProcess.start(
        config(
            "/t_actions_c",
            joint_names=joints,
            stream=StreamConfig(dt=0.04, num_joints=4, blend_mode="replace", max_chunk_age_s=5.0),
            trajectory_groups=groups,
        ),
        on_reject=lambda reason, message: None,
        on_watchdog=lambda transition: None,
    )
    chunk = np.arange(64, dtype=np.float32).reshape(16, 4)  # row k, joint j: 4 k + j
    handed = [0.0]

    def handing_off_until_each_group_has_two() -> bool:
        # A trajectory goes once per chunk: hand over new ones (every 0.1 s) until both the
        # test's subscriptions and the child's writers have matched.
        if all(len(r) >= 2 for r in received.values()):
            return True
        if time.monotonic() - handed[0] > 0.1:
            process.link.hand_off(chunk, time.time() - 0.01, 0.01)
            handed[0] = time.monotonic()
        return False

    try:
        assert process.link.ready.wait(START_TIMEOUT_S), "the action process never started"
        for g in groups:
            ros_node.wait_for_publishers(g.topic)
        wait_for(
            handing_off_until_each_group_has_two,
            15,
            lambda: f"{ {name: len(r) for name, r in received.items()} } trajectories",
        )
        for g in groups:
            for msg in list(received[g.name]):
                assert list(msg.joint_names) == list(g.joint_names)
                assert trajectory_problems(*trajectory_points(msg), g.joint_names) == []
                # The group's columns of the chunk's rows not yet passed (its last rows).
                positions = [list(p.positions) for p in msg.points]
                np.testing.assert_array_equal(positions, chunk[-len(positions) :, g.columns])
    finally:
        code = process.stop(timeout_s=10.0)
    assert code == 0


def test_emergency_stop_over_dds_holds_at_once_then_silence_until_released(ros_node) -> None:
    """A volatile Bool publisher engages it (one hold of the measured pose, then no message,
    while a model tick had been flowing: the positive control); SetBool(false) releases it:
    ticks hold until the next chunk, which is published at once."""
    from std_msgs.msg import Bool
    from std_srvs.srv import SetBool

    process = ActionProcess.start(
        config(
            "/t_actions_e",
            stream=StreamConfig(dt=0.5, num_joints=2, blend_mode="replace", max_chunk_age_s=60.0),
            estop_topic="/t_estop",
            estop_service="/t_set_estop",
        ),
        on_reject=lambda reason, message: None,
        on_watchdog=lambda transition: None,
    )
    received = ros_node.collect(ActionChunk, "/t_actions_e", RELIABLE_QOS)
    estop = ros_node.node.create_publisher(Bool, "/t_estop", 10)
    client = ros_node.node.create_client(SetBool, "/t_set_estop")
    try:
        assert process.link.ready.wait(START_TIMEOUT_S), "the action process never started"
        ros_node.wait_for_publishers("/t_actions_e")
        ros_node.wait_for_subscribers(estop)
        process.link.set_hold_positions(np.array([0.3, -0.1]))
        process.link.hand_off(rows(0.0), time.time() - 0.05, 0.05)
        wait_for(lambda: len(received) >= 10, 10, "model ticks")
        estop.publish(Bool(data=True))
        hold = HOLD_CHUNK_ID
        wait_for(lambda: any(m.chunk_id == hold for m in received), 5, "the e-stop hold")
        first_hold = next(i for i, m in enumerate(received) if m.chunk_id == hold)
        np.testing.assert_allclose(np.asarray(received[first_hold].actions)[:2], [0.3, -0.1])
        process.link.hand_off(rows(0.2), time.time() - 0.05, 0.05)  # dropped while engaged
        quiet_from = time.monotonic()
        wait_for(lambda: time.monotonic() - quiet_from > 0.5, 2, "half a second")
        assert len(received) == first_hold + 1, [m.chunk_id for m in received[first_hold:]]
        assert call_service(client, SetBool.Request(data=False)).success
        process.link.hand_off(rows(0.25), time.time() - 0.05, 0.05)
        # Released: ticks carry the hold again until the new chunk takes over.
        wait_for(
            lambda: any(m.chunk_id != hold for m in received[first_hold:]),
            5,
            "a chunk after the release",
        )
        after = next(m for m in received[first_hold:] if m.chunk_id != hold)
        assert after.trigger == ActionChunk.TRIGGER_NEW_CHUNK and after.chunk_id == 1
        values = process.link.diagnostics()
        assert values["estop"] == "released" and values["new_chunk_unpublished.estop"] == 1
    finally:
        code = process.stop(timeout_s=10.0)
    assert code == 0


def test_exits_when_its_parent_is_killed(launcher, ros_node) -> None:
    received = ros_node.collect(ActionChunk, "/t_actions_b", RELIABLE_QOS)
    parent = launcher.start(str(HERE / "action_parent.py"), args=["/t_actions_b"])
    wait_for(lambda: parent.log().strip() or not parent.alive(), START_TIMEOUT_S, "child pid")
    child = int(parent.log().split()[0])
    wait_for(lambda: len(received) >= 10, START_TIMEOUT_S, "actions from the child")
    assert not exited(child)  # positive control
    parent.popen.send_signal(signal.SIGKILL)
    parent.popen.wait(10)
    wait_for(lambda: exited(child), 10, f"the orphaned action process {child} to exit")
    wait_for(lambda: ros_node.node.count_publishers("/t_actions_b") == 0, 10, "no publisher")


if __name__ == "__main__":
    sys.exit(pytest.main([__file__]))
