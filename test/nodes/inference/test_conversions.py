"""The inference node's message conversions (ObservationFrame in, as perception builds it;
ActionChunk, JointTrajectory, SpeechToken, MemoryEntry out), without spinning a node."""

import math

import numpy as np
import pytest
from builtin_interfaces.msg import Time

from oxygen_ros.engine.action_stream import Slice, TimedChunk
from oxygen_ros.engine.types import Observation, RequestKind, RequestOutput, RequestStatus
from oxygen_ros.msg import ActionChunk, ObservationFrame, SpeechToken
from oxygen_ros.nodes.common.conversions import RejectedFrameError, time_to_seconds
from oxygen_ros.nodes.inference.conversions import (
    action_chunk_msg,
    action_chunk_rows,
    joint_trajectory_msg,
    memory_entry_msg,
    observation_from_msg,
    speech_token_msg,
    trajectory_points,
)
from oxygen_ros.nodes.inference.memory_store import MemoryRecord
from oxygen_ros.nodes.inference.trajectory_groups import (
    all_joints_group,
    parse_groups,
    split_chunk,
    trajectory_problems,
)
from oxygen_ros.nodes.perception.conversions import observation_frame_msg
from oxygen_ros.nodes.perception.fusion import FusedFrame

SLOTS = ("base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb")
JOINTS = ("a", "b", "c")


def fused(valid=(True, False, True)) -> tuple[FusedFrame, list]:
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, (8, 8, 3), dtype=np.uint8) if v else None for v in valid]
    frame = FusedFrame(
        stamp=100.5,
        slots=SLOTS,
        payloads=tuple(object() if v else None for v in valid),
        valid=tuple(valid),
        image_stamps=(100.49, 0.0, 100.48),
        joint_names=JOINTS,
        positions=np.array([1.0, 2.0, 3.0]),
        velocities=np.zeros(0),
        max_skew=0.02,
    )
    return frame, images


def test_observation_frame_round_trip_to_engine_observation() -> None:
    frame, images = fused()
    msg = observation_frame_msg(
        frame, images, sequence=7, frame_id="base_link", image_height=8, image_width=8
    )
    assert msg.sequence == 7 and list(msg.image_valid) == [True, False, True]
    assert all(i.encoding == "rgb8" and i.step == 24 for i in msg.images)
    assert time_to_seconds(msg.header.stamp) == pytest.approx(100.5)
    assert len(msg.joint_velocities) == 0
    obs = observation_from_msg(msg, "pick", SLOTS, ("c", "a", "b"), (8, 8))
    assert isinstance(obs, Observation) and obs.prompt == "pick"
    np.testing.assert_array_equal(obs.state, np.array([3.0, 1.0, 2.0], np.float32))
    assert obs.state.dtype == np.float32
    np.testing.assert_array_equal(obs.images["base_0_rgb"], images[0])
    assert not obs.image_masks["left_wrist_0_rgb"]
    assert np.all(obs.images["left_wrist_0_rgb"] == 0)  # invalid slot: zero image
    assert obs.stamp == pytest.approx(100.5)


def _frame_msg() -> ObservationFrame:
    frame, images = fused()
    return observation_frame_msg(frame, images, 0, "b", 8, 8)


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda m: setattr(m, "image_valid", [True]), "bad_frame"),
        (lambda m: setattr(m, "joint_positions", [1.0]), "bad_frame"),
        (lambda m: setattr(m, "joint_names", ["a", "b", "x"]), "joint_mismatch"),
        (lambda m: setattr(m, "joint_positions", [1.0, math.nan, 2.0]), "non_finite"),
        (lambda m: m.images[0].__setattr__("encoding", "bgr8"), "bad_image"),
        (lambda m: m.images[0].__setattr__("data", bytes(10)), "bad_image"),
    ],
)
def test_bad_frames_rejected(mutate, reason) -> None:
    msg = _frame_msg()
    mutate(msg)
    with pytest.raises(RejectedFrameError) as info:
        observation_from_msg(msg, "p", SLOTS, JOINTS, (8, 8))
    assert info.value.reason == reason


def test_frame_with_wrong_resolution_rejected() -> None:
    with pytest.raises(RejectedFrameError) as info:
        observation_from_msg(_frame_msg(), "p", SLOTS, JOINTS, (224, 224))
    assert info.value.reason == "image_size"


def test_missing_slot_masked() -> None:
    msg = _frame_msg()
    obs = observation_from_msg(msg, "p", (*SLOTS, "extra_slot"), JOINTS, (8, 8))
    assert obs.image_masks["extra_slot"] is False


def test_action_chunk_and_trajectory() -> None:
    rows = np.arange(12, dtype=np.float32).reshape(4, 3)
    chunk = TimedChunk(5, 10.0, 0.1, rows, 9.8, 0.3)
    piece = Slice(chunk, 1, 10.1, rows[1:], valid_until=11.8)
    msg = action_chunk_msg(piece, 42, JOINTS, "base_link")
    assert time_to_seconds(msg.valid_until) == pytest.approx(11.8)
    unbounded = action_chunk_msg(Slice(chunk, 1, 10.1, rows[1:]), 1, JOINTS, "base_link")
    assert time_to_seconds(unbounded.valid_until) == 0.0  # zero: no bound
    assert (msg.sequence, msg.chunk_id, msg.horizon) == (42, 5, 3)
    assert msg.trigger == ActionChunk.TRIGGER_TICK
    new = action_chunk_msg(piece, 43, JOINTS, "base_link", ActionChunk.TRIGGER_NEW_CHUNK)
    assert (new.sequence, new.trigger) == (43, ActionChunk.TRIGGER_NEW_CHUNK)
    assert time_to_seconds(msg.header.stamp) == pytest.approx(10.1)
    assert time_to_seconds(msg.observation_stamp) == pytest.approx(9.8)
    assert msg.inference_latency == pytest.approx(0.3) and msg.dt == pytest.approx(0.1)
    np.testing.assert_array_equal(action_chunk_rows(msg), rows[1:])
    (trajectory,) = split_chunk(
        [all_joints_group(JOINTS, "jt")], piece.rows, np.arange(3) * chunk.dt
    )
    traj = joint_trajectory_msg(trajectory, piece.stamp, "base_link")
    assert traj.joint_names == list(JOINTS) and len(traj.points) == 3
    assert time_to_seconds(traj.header.stamp) == pytest.approx(10.1)
    assert traj.header.frame_id == "base_link"
    assert list(traj.points[2].positions) == [9.0, 10.0, 11.0]
    assert traj.points[2].time_from_start.nanosec == 200_000_000
    names, points = trajectory_points(traj)  # back, as a controller reads it
    assert names == list(JOINTS) and points == list(trajectory.points())


def test_group_trajectory_message_has_the_groups_joints_only() -> None:
    rows = np.arange(12, dtype=np.float32).reshape(4, 3)
    groups = parse_groups(JOINTS, {"ca": ("ca/jt", ["c", "a"]), "b": ("b/jt", ["b"])})
    ca, _b = split_chunk(groups, rows, np.array([-0.1, 0.0, 0.1, 0.2]))
    msg = joint_trajectory_msg(ca, 7.0, "base_link")
    assert msg.joint_names == ["c", "a"]
    assert [list(p.positions) for p in msg.points] == [[5.0, 3.0], [8.0, 6.0], [11.0, 9.0]]
    names, points = trajectory_points(msg)
    assert trajectory_problems(names, points, ["a", "c"]) == []
    assert trajectory_problems(names, points, ["b"]) != []  # another controller refuses it


@pytest.mark.parametrize(
    ("status", "expected", "final"),
    [
        (RequestStatus.RUNNING, SpeechToken.STATUS_RUNNING, False),
        (RequestStatus.FINISHED_STOPPED, SpeechToken.STATUS_STOPPED, True),
        (RequestStatus.FINISHED_LENGTH, SpeechToken.STATUS_LENGTH, True),
        (RequestStatus.FINISHED_ABORTED, SpeechToken.STATUS_ABORTED, True),
        (RequestStatus.FINISHED_ERROR, SpeechToken.STATUS_ERROR, True),
        (RequestStatus.REFUSED, SpeechToken.STATUS_ERROR, True),
    ],
)
def test_speech_token(status, expected, final) -> None:
    out = RequestOutput(
        "narration-3",
        RequestKind.NARRATION,
        (5, 6),
        " hi",
        4,
        status,
        "full hi" if final else None,
        "boom" if status >= 4 else None,
    )
    msg = speech_token_msg(out, Time(sec=3))
    assert msg.request_id == "narration-3" and msg.kind == SpeechToken.KIND_NARRATION
    assert (msg.token_index, list(msg.token_ids), msg.text_delta) == (4, [5, 6], " hi")
    assert msg.final is final and msg.status == expected
    assert msg.text == ("full hi" if final else "")
    assert msg.error == ("boom" if status >= RequestStatus.FINISHED_ABORTED else "")


def test_memory_entry() -> None:
    rec = MemoryRecord(9, 20.5, 20.25, "on_demand", "cup left", ("kitchen",), "memory-2")
    msg = memory_entry_msg(rec, "base_link")
    assert (msg.entry_id, msg.text, msg.kind, list(msg.tags), msg.request_id) == (
        9,
        "cup left",
        "on_demand",
        ["kitchen"],
        "memory-2",
    )
    assert time_to_seconds(msg.observation_stamp) == pytest.approx(20.25)


def test_speech_token_names_the_observation_its_request_started_from() -> None:
    from oxygen_ros.engine.types import RequestKind, RequestOutput, RequestStatus
    from oxygen_ros.nodes.common.conversions import seconds_to_time, time_to_seconds
    from oxygen_ros.nodes.inference.conversions import speech_token_msg

    output = RequestOutput(
        "subtask-1", RequestKind.SUBTASK, (5, 6), "ab", 0, RequestStatus.RUNNING, None
    )
    msg = speech_token_msg(output, seconds_to_time(12.5), 12.25)
    assert time_to_seconds(msg.observation_stamp) == 12.25
    assert time_to_seconds(msg.header.stamp) == 12.5
    unknown = speech_token_msg(output, seconds_to_time(12.5))
    assert time_to_seconds(unknown.observation_stamp) == 0.0
