"""Fusion of camera payloads and joint states: skew windows, staleness, joint reordering."""

import numpy as np
import pytest

from oxygen_ros.nodes.perception.fusion import (
    CameraSpec,
    Fuser,
    FusionConfig,
    RejectedInputError,
    SnapshotTrigger,
)

SLOTS = ("base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb")
JOINTS = ("a", "b", "c")


def make_fuser(camera_names=("head", "left", "right"), **overrides) -> Fuser:
    specs = tuple(
        CameraSpec(name, slot, f"{name}/image")
        for name, slot in zip(camera_names, SLOTS, strict=False)
    )
    cfg = dict(
        slots=SLOTS,
        cameras=specs,
        joint_names=JOINTS,
        max_skew_s=0.05,
        stale_after_s=0.5,
        future_tolerance_s=0.2,
    )
    cfg.update(overrides)
    return Fuser(FusionConfig(**cfg))


def joints(fuser: Fuser, stamp: float, now: float, values=(1.0, 2.0, 3.0)) -> None:
    fuser.add_joint_state(stamp, ["a", "b", "c"], list(values), [], now)


def test_frame_uses_newest_images_within_skew_and_joint_stamp() -> None:
    f = make_fuser()
    for t in (0.0, 0.033, 0.066, 0.1):
        for cam in ("head", "left", "right"):
            f.add_image(cam, t + 0.001, f"{cam}@{t}", now=t + 0.002)
    joints(f, 0.1, now=0.1)
    frame, reason = f.fuse(now=0.11)
    assert reason == ""
    assert frame.stamp == 0.1
    assert frame.payloads == ("head@0.1", "left@0.1", "right@0.1")
    assert frame.valid == (True, True, True)
    assert frame.max_skew == pytest.approx(0.001)


def test_joint_values_reordered_and_merged_across_messages() -> None:
    f = make_fuser(camera_names=())
    f.add_joint_state(1.0, ["c", "a"], [30.0, 10.0], [3.0, 1.0], now=1.0)
    assert f.fuse(now=1.0) == (None, "no_joint_state")  # b still unknown
    assert f.missing_joints() == ["b"]
    unknown = f.add_joint_state(1.0, ["extra", "b"], [99.0, 20.0], [0.0, 2.0], now=1.0)
    assert unknown == ["extra"]
    frame, _ = f.fuse(now=1.0)
    np.testing.assert_array_equal(frame.positions, [10.0, 20.0, 30.0])
    np.testing.assert_array_equal(frame.velocities, [1.0, 2.0, 3.0])
    assert frame.joint_names == JOINTS


def test_velocities_empty_when_a_source_lacks_them() -> None:
    f = make_fuser(camera_names=())
    f.add_joint_state(1.0, ["a", "b", "c"], [1.0, 2.0, 3.0], [], now=1.0)
    frame, _ = f.fuse(now=1.0)
    assert frame.velocities.size == 0


def test_stale_camera_marked_invalid_without_blocking() -> None:
    f = make_fuser()
    f.add_image("head", 0.0, "old-head", now=0.0)
    f.add_image("left", 0.95, "left", now=0.95)
    joints(f, 1.0, now=1.0)
    frame, reason = f.fuse(now=1.0)
    assert reason == ""
    assert frame.valid == (False, True, False)
    assert frame.payloads == (None, "left", None)
    assert frame.image_stamps == (0.0, 0.95, 0.0)  # newest known stamp, 0 when never seen


def test_camera_comes_back_when_it_resumes() -> None:
    f = make_fuser(camera_names=("head",))
    f.add_image("head", 0.0, "h0", now=0.0)
    joints(f, 1.0, now=1.0)
    assert f.fuse(now=1.0) == (None, "no_valid_camera")
    f.add_image("head", 1.01, "h1", now=1.01)
    joints(f, 1.02, now=1.02)
    frame, _ = f.fuse(now=1.02)
    assert frame.valid == (True, False, False) and frame.payloads[0] == "h1"


def test_images_outside_skew_of_joint_state_are_not_used() -> None:
    f = make_fuser(camera_names=("head", "left"))
    f.add_image("head", 0.90, "head-early", now=0.9)
    f.add_image("left", 0.99, "left", now=0.99)
    joints(f, 1.0, now=1.0)
    frame, _ = f.fuse(now=1.0)
    assert frame.valid == (False, True, False)


def test_images_within_skew_of_each_other_not_only_of_the_joint() -> None:
    # head at -0.04 and left at +0.04 of the joint stamp: each within 0.05 of the joint state,
    # but 0.08 apart. The window keeps the joint plus the newer image.
    f = make_fuser(camera_names=("head", "left"))
    f.add_image("head", 0.96, "head", now=0.96)
    f.add_image("left", 1.04, "left", now=1.04)
    joints(f, 1.0, now=1.04)
    frame, _ = f.fuse(now=1.05)
    used = [s for s, v in zip(frame.image_stamps, frame.valid, strict=True) if v]
    assert len(used) == 1
    assert max([*used, frame.stamp]) - min([*used, frame.stamp]) <= 0.05 + 1e-9


def test_older_joint_snapshot_chosen_when_it_covers_more_cameras() -> None:
    f = make_fuser(camera_names=("head", "left"), max_skew_s=0.03)
    f.add_image("head", 1.00, "head", now=1.0)
    f.add_image("left", 1.00, "left", now=1.0)
    joints(f, 1.005, now=1.005, values=(1, 1, 1))
    joints(f, 1.032, now=1.032, values=(2, 2, 2))  # newest, but only within 0.032 of images
    frame, _ = f.fuse(now=1.04)
    assert frame.stamp == 1.005 and frame.valid[:2] == (True, True)
    np.testing.assert_array_equal(frame.positions, [1, 1, 1])


def test_no_frame_when_joint_state_stale_or_absent() -> None:
    f = make_fuser()
    assert f.fuse(now=0.0) == (None, "no_joint_state")
    f.add_image("head", 0.0, "h", now=0.0)
    joints(f, 0.0, now=0.0)
    assert f.fuse(now=0.6) == (None, "joint_state_stale")


def test_no_frame_when_one_merged_joint_source_stops() -> None:
    """Arm (a, b) and gripper (c) publish separately; the gripper stops: its frozen value must
    not keep riding on fresh arm messages."""
    f = make_fuser(camera_names=())
    f.add_joint_state(0.0, ["a", "b"], [1.0, 2.0], [], now=0.0)
    f.add_joint_state(0.0, ["c"], [3.0], [], now=0.0)
    assert f.fuse(now=0.0)[0] is not None
    for t in (0.2, 0.4, 0.5):  # gripper still fresh enough (<= stale_after_s)
        f.add_joint_state(t, ["a", "b"], [1.0, 2.0], [], now=t)
        assert f.fuse(now=t)[0].stamp == t
    for t in (0.6, 0.8, 1.2):
        f.add_joint_state(t, ["a", "b"], [1.0, 2.0], [], now=t)
    assert f.stale_joints(1.2) == ["c"]
    assert f.fuse(now=1.2) == (None, "joint_state_stale")
    f.add_joint_state(1.25, ["c"], [4.0], [], now=1.25)  # the gripper resumes
    frame, reason = f.fuse(now=1.25)
    assert reason == "" and frame.stamp == 1.25
    np.testing.assert_array_equal(frame.positions, [1.0, 2.0, 4.0])
    assert f.stale_joints(1.25) == []


def test_no_frame_when_all_cameras_gone() -> None:
    f = make_fuser()
    f.add_image("head", 0.0, "h", now=0.0)
    joints(f, 0.0, now=0.0)
    assert f.fuse(now=0.0)[0] is not None
    joints(f, 0.6, now=0.6)
    assert f.fuse(now=0.6) == (None, "no_valid_camera")


@pytest.mark.parametrize(
    ("names", "positions", "velocities", "reason"),
    [
        (["a", "b"], [1.0], [], "length_mismatch"),
        (["a", "b"], [1.0, 2.0], [1.0], "length_mismatch"),
        (["a", "a"], [1.0, 2.0], [], "duplicate_names"),
        (["a", "b"], [1.0, float("nan")], [], "non_finite"),
        (["a", "b"], [1.0, 2.0], [float("inf"), 0.0], "non_finite"),
        (["x", "y"], [1.0, 2.0], [], "unknown_names"),
    ],
)
def test_bad_joint_states_rejected_without_changing_state(
    names, positions, velocities, reason
) -> None:
    f = make_fuser(camera_names=())
    joints(f, 1.0, now=1.0)
    with pytest.raises(RejectedInputError) as info:
        f.add_joint_state(1.01, names, positions, velocities, now=1.01)
    assert info.value.reason == reason
    frame, _ = f.fuse(now=1.01)
    np.testing.assert_array_equal(frame.positions, [1.0, 2.0, 3.0])
    assert frame.stamp == 1.0


def test_stamps_in_future_or_out_of_order_rejected() -> None:
    f = make_fuser()
    with pytest.raises(RejectedInputError) as info:
        f.add_image("head", 10.0, "h", now=1.0)
    assert info.value.reason == "future_stamp"
    f.add_image("head", 1.0, "h", now=1.0)
    with pytest.raises(RejectedInputError) as info:
        f.add_image("head", 0.9, "older", now=1.0)
    assert info.value.reason == "out_of_order"
    joints(f, 1.0, now=1.0)
    with pytest.raises(RejectedInputError) as info:
        joints(f, 0.5, now=1.0)
    assert info.value.reason == "out_of_order"
    with pytest.raises(RejectedInputError) as info:
        f.add_image("nope", 1.0, "x", now=1.0)
    assert info.value.reason == "unknown_camera"


def test_history_is_bounded() -> None:
    f = make_fuser()
    for i in range(1000):
        t = i * 0.01
        f.add_image("head", t, i, now=t)
        joints(f, t, now=t)
    assert len(f._image_stamps["head"]) <= 70
    assert len(f._snapshots) <= 70


@pytest.mark.parametrize(
    "overrides",
    [
        dict(joint_names=()),
        dict(joint_names=("a", "a")),
        dict(stale_after_s=0.0),
        dict(cameras=(CameraSpec("x", "nope", "t"),)),
        dict(cameras=(CameraSpec("x", "base_0_rgb", "t"), CameraSpec("y", "base_0_rgb", "u"))),
    ],
)
def test_invalid_config_rejected(overrides) -> None:
    with pytest.raises(ValueError):
        make_fuser(**overrides)


# ------------------------------------------------------------------ frame_trigger: joint_state
def test_newest_snapshot_stamp_changes_only_when_a_snapshot_completes() -> None:
    f = make_fuser(camera_names=())
    assert f.newest_snapshot_stamp is None
    f.add_joint_state(1.0, ["a", "b"], [1.0, 2.0], [], now=1.0)
    assert f.newest_snapshot_stamp is None  # c still unknown
    f.add_joint_state(1.01, ["c"], [3.0], [], now=1.01)
    assert f.newest_snapshot_stamp == 1.01
    with pytest.raises(RejectedInputError):
        f.add_joint_state(1.02, ["c"], [float("nan")], [], now=1.02)
    assert f.newest_snapshot_stamp == 1.01


def offers(trigger: SnapshotTrigger, times) -> list[str]:
    return [trigger.offer(t, t) for t in times]


def test_trigger_passes_every_snapshot_of_a_source_at_the_same_rate_despite_jitter() -> None:
    period = 1 / 30
    # The worst case: each arrival 0.48 period late, then 0.48 period early, in turn.
    offsets = np.where(np.arange(300) % 2 == 1, 0.48, -0.48)
    offsets[0] = 0.0
    times = (np.arange(300) + offsets) * period
    assert offers(SnapshotTrigger(30.0), times) == [""] * 300


def test_trigger_refuses_a_third_snapshot_within_a_period() -> None:
    """Positive control of the jitter tolerance: the bucket holds two frames, no more."""
    period = 1 / 30
    times = [0.0, period, 2 * period, 2.05 * period, 2.1 * period]
    assert offers(SnapshotTrigger(30.0), times) == ["", "", "", "", "rate_limited"]


def test_trigger_thins_a_faster_source_to_the_rate() -> None:
    times = np.arange(1000) / 100.0  # 10 s at 100 Hz
    passed = [t for t, r in zip(times, offers(SnapshotTrigger(30.0), times), strict=True) if not r]
    assert 29.0 * 10 <= len(passed) <= 30.0 * 10 + 2
    assert min(np.diff(passed)) >= 0.01  # never two in one source period


def test_trigger_passes_each_stamp_once_and_only_newer_ones() -> None:
    trigger = SnapshotTrigger(30.0)
    assert trigger.offer(1.0, 1.0) == ""
    assert trigger.offer(1.0, 1.1) == "not_newer"
    assert trigger.offer(0.99, 1.2) == "not_newer"
    assert trigger.offer(1.2, 1.2) == ""


def test_trigger_follows_a_rate_change() -> None:
    trigger = SnapshotTrigger(30.0)
    times = np.arange(300) / 30.0
    assert offers(trigger, times[:150]) == [""] * 150
    trigger.rate_hz = 10.0
    passed = sum(r == "" for r in offers(trigger, times[150:]))
    assert 49 <= passed <= 51  # 5 s at 10 Hz
