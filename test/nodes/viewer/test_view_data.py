"""The live view's conversions (view_data): frames, joints, actions, speech, memory, episode,
texts, rate gates; messages built directly, no node spun."""

import math

import numpy as np
import pytest
from sensor_msgs.msg import Image, JointState

from oxygen_ros.msg import ActionChunk, EpisodeStatus, MemoryEntry, ObservationFrame, SpeechToken
from oxygen_ros.nodes.common.image_conversion import encode_image
from oxygen_ros.nodes.viewer import view_data as vd


def image_msg(rgb: np.ndarray, encoding: str = "rgb8", padding: int = 0) -> Image:
    step, data = encode_image(rgb, encoding, row_padding=padding)
    return Image(height=rgb.shape[0], width=rgb.shape[1], encoding=encoding, step=step, data=data)


def frame(images, valid, names=None) -> ObservationFrame:
    names = names or [f"slot{i}" for i in range(len(images))]
    return ObservationFrame(image_names=names, images=images, image_valid=valid)


def solid(colour, h=8, w=10) -> np.ndarray:
    rgb = np.zeros((h, w, 3), np.uint8)
    rgb[:] = colour
    return rgb


# ------------------------------------------------------------------------------ images
def test_frame_images_as_the_model_receives_them() -> None:
    red, masked_source = solid((255, 0, 0)), solid((0, 0, 0))
    bgr = solid((0, 200, 30), 6, 4)
    msg = frame(
        [image_msg(red), image_msg(masked_source), image_msg(bgr, "bgr8", padding=3)],
        [True, False, True],
        ["base_0_rgb", "left_wrist_0_rgb", "right/../wrist"],
    )
    slots, problems = vd.frame_images(msg)
    assert problems == []
    assert [s.slot for s in slots] == ["base_0_rgb", "left_wrist_0_rgb", "right____wrist"]
    assert [s.valid for s in slots] == [True, False, True]
    np.testing.assert_array_equal(slots[0].rgb, red)
    np.testing.assert_array_equal(slots[2].rgb, bgr)  # decoded to RGB, padding dropped
    masked = slots[1].rgb
    assert masked.shape == (8, 10, 3) and masked.dtype == np.uint8


def test_masked_image_is_marked_not_a_camera_image() -> None:
    masked = vd.masked_image(96, 96)
    assert masked.shape == (96, 96, 3)
    assert len(np.unique(masked.reshape(-1, 3), axis=0)) >= 3  # stripes and the lettering
    assert (masked == 255).all(axis=2).sum() > 20  # white letters
    # grey: no colour in it (a camera image of the scene always has some)
    assert (masked.max(axis=2) - masked.min(axis=2)).max() <= 10


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda m: setattr(m, "encoding", "yuv9000"), "image_encoding"),
        (lambda m: setattr(m, "data", bytes(m.data)[:-5]), "image_data_length"),
        (lambda m: setattr(m, "step", 3), "image_step"),
        (lambda m: setattr(m, "height", 0), "image_size"),
    ],
)
def test_a_malformed_slot_is_a_problem_and_the_others_still_show(mutate, reason) -> None:
    bad = image_msg(solid((1, 2, 3)))
    mutate(bad)
    slots, problems = vd.frame_images(frame([bad, image_msg(solid((9, 9, 9)))], [True, True]))
    assert [p.reason for p in problems] == [reason]
    assert [s.slot for s in slots] == ["slot1"]


def test_a_masked_slot_with_an_unusable_size_is_drawn_at_the_default_size() -> None:
    msg = frame([Image(height=0, width=100000)], [False])
    (slot,), problems = vd.frame_images(msg)
    assert problems == [] and slot.rgb.shape == (*vd.MASKED_SIZE, 3)


def test_frame_layout_mismatch_is_refused() -> None:
    with pytest.raises(vd.ViewInputError) as err:
        vd.frame_images(frame([image_msg(solid((1, 1, 1)))], [True, False]))
    assert err.value.reason == "frame_layout"


# ------------------------------------------------------------------------------ joints
def test_joint_groups_follow_the_name_prefix() -> None:
    names = ["left_waist", "right_waist", "waist_yaw", "left_gripper", "right/elbow"]
    assert vd.group_joints(names) == {
        "left": ("left_waist", "left_gripper"),
        "right": ("right_waist", "right/elbow"),
        "body": ("waist_yaw",),
    }


def test_group_values_in_group_order_with_nan_for_missing() -> None:
    groups = {"left": ("a", "b"), "right": ("c",)}
    out = vd.group_values({"b": 2.0, "x": 9.0}, groups)
    assert list(out) == ["left"]
    np.testing.assert_array_equal(out["left"], [math.nan, 2.0])


def test_measured_positions_drop_non_finite_and_count_them() -> None:
    msg = JointState(name=["a", "b", "c"], position=[1.0, math.nan, -math.inf])
    assert vd.measured_positions(msg) == ({"a": 1.0}, 2)
    with pytest.raises(vd.ViewInputError) as err:
        vd.measured_positions(JointState(name=["a", "b"], position=[1.0]))
    assert err.value.reason == "joint_layout"


def chunk(actions, names=("a", "b"), horizon=2) -> ActionChunk:
    return ActionChunk(joint_names=list(names), horizon=horizon, actions=actions)


def test_commanded_row_is_the_first_row() -> None:
    assert vd.commanded_row(chunk([1.0, 2.0, 3.0, 4.0])) == {"a": 1.0, "b": 2.0}


@pytest.mark.parametrize(
    ("msg", "reason"),
    [
        (chunk([1.0, 2.0, 3.0]), "action_shape"),
        (chunk([], horizon=0), "action_shape"),
        (chunk([], names=()), "action_shape"),
        (chunk([1.0, 2.0, 3.0, math.nan]), "action_nonfinite"),  # a later row: still refused
        (chunk([math.inf, 2.0, 3.0, 4.0]), "action_nonfinite"),
    ],
)
def test_bad_chunks_are_refused(msg, reason) -> None:
    with pytest.raises(vd.ViewInputError) as err:
        vd.commanded_row(msg)
    assert err.value.reason == reason


# ------------------------------------------------------------------------------ speech
def token(request_id, index, delta, ids=1, final=False, text="", status=0, kind=0, error=""):
    return SpeechToken(
        request_id=request_id,
        kind=kind,
        token_index=index,
        text_delta=delta,
        token_ids=list(range(ids)),
        final=final,
        text=text,
        status=status,
        error=error,
    )


def test_speech_accumulates_per_request_and_marks_the_final() -> None:
    book = vd.SpeechBook(max_requests=4, max_chars=100)
    request, issues = book.add(token("s-1", 0, "lift the", ids=2))
    assert (request.text, request.final, issues) == ("lift the", False, [])
    book.add(token("n-1", 0, "I see", kind=1))
    request, issues = book.add(token("s-1", 2, " red cube"))
    assert (request.text, issues) == ("lift the red cube", [])
    request, issues = book.add(
        token("s-1", 3, "", ids=0, final=True, text="lift the red cube", status=1)
    )
    assert (request.final, request.status, request.kind, issues) == (
        True,
        "stopped",
        "subtask",
        [],
    )
    assert [r.request_id for r in book.newest(5)] == ["s-1", "n-1"]
    book.add(token("s-2", 0, "place", kind=0))
    assert [r.request_id for r in book.newest_per_kind()] == ["s-2", "n-1"]
    markdown = vd.speech_markdown(book.newest(5))
    assert "lift the red cube" in markdown and "*streaming*" in markdown  # n-1 streams still


def test_speech_final_status_error_and_irregularities() -> None:
    book = vd.SpeechBook(max_requests=2, max_chars=100)
    book.add(token("a", 0, "x"))
    request, issues = book.add(token("a", 5, "y", final=True, status=4, error="engine fault"))
    assert issues == ["speech.gap"]
    assert (request.status, request.error) == ("error", "engine fault")
    assert vd.speech_line(request) == "subtask [error] xy (engine fault)"
    _, issues = book.add(token("a", 6, "z"))
    assert issues == ["speech.after_final"]
    _, issues = book.add(token("b", 0, "bad\x00\x1b[31m"))
    assert issues == ["speech.text_cleaned"]


def test_speech_book_is_bounded() -> None:
    book = vd.SpeechBook(max_requests=3, max_chars=10)
    for i in range(10):
        book.add(token(f"r{i}", 0, "abcdefghijklmnopqrstuvwxyz"))
    newest = book.newest(100)
    assert [r.request_id for r in newest] == ["r9", "r8", "r7"]
    assert all(len(r.text) == 10 for r in newest)
    request, _ = book.add(token("r9", 1, "more"))
    assert len(request.text) == 10


def test_speech_markdown_escapes_markup() -> None:
    book = vd.SpeechBook(max_requests=2, max_chars=100)
    book.add(token("a", 0, "*bold* <script>", final=True, status=1))
    markdown = vd.speech_markdown(book.newest(1))
    assert r"\*bold\* \<script\>" in markdown and "**stopped**" in markdown
    assert vd.speech_markdown([]) == "*no language requests yet*"


# ------------------------------------------------------------------------------ texts
def test_clean_text() -> None:
    assert vd.clean_text("pick up\tthe cube\n", 100) == ("pick up\tthe cube\n", False)
    assert vd.clean_text("a\x00b\x7f", 100) == ("a\ufffdb\ufffd", True)
    assert vd.clean_text("x" * 50, 10) == ("x" * 9 + "\u2026", True)


def test_entity_name() -> None:
    assert vd.entity_name("base_0_rgb", "s") == "base_0_rgb"
    assert vd.entity_name("", "slot_3") == "slot_3"
    assert vd.entity_name("a b/c", "s") == "a_b_c"


# ------------------------------------------------------------------------------ memory
def test_memory_lines_are_cleaned() -> None:
    line, cleaned = vd.memory_line(MemoryEntry(entry_id=7, kind="memory", text="red\x07"), 50)
    assert (line, cleaned) == ("#7 memory: red\ufffd", True)


# ------------------------------------------------------------------------------ episode
def status(episode_id=1, phase=1, elapsed=2.0, to_success=-1.0):
    return EpisodeStatus(
        episode_id=episode_id,
        phase=phase,
        elapsed_s=elapsed,
        time_to_success_s=to_success,
        time_limit_s=20.0,
        instruction="lift the red cube",
        stage="reach",
        seed=3,
    )


def test_episode_events_on_new_episode_and_phase_change_only() -> None:
    first = status()
    assert vd.episode_event(None, first) == "episode 1 RUNNING at 2.0 s"
    assert vd.episode_event(first, status(elapsed=3.0)) is None
    done = status(phase=2, elapsed=7.5, to_success=7.4)
    assert vd.episode_event(first, done) == "episode 1 SUCCEEDED at 7.5 s (success after 7.4 s)"
    assert vd.episode_event(done, status(episode_id=2, elapsed=0.0)).startswith("episode 2")
    assert vd.phase_name(9) == "phase 9"


def test_task_markdown() -> None:
    text, cleaned = vd.task_markdown("lift the *red* cube", "", None, 100)
    assert r"lift the \*red\* cube" in text and "*none yet*" in text and not cleaned
    text, _ = vd.task_markdown("a", "a", status(phase=2, to_success=6.0), 100)
    assert "SUCCEEDED \u2714 after 6.0 s" in text and "seed 3" in text and "reach" in text
    text, _ = vd.task_markdown("a", "a", status(phase=3), 100)
    assert "FAILED \u2718 time limit" in text
    _, cleaned = vd.task_markdown("a\x00", "", None, 100)
    assert cleaned


# ------------------------------------------------------------------------------ misc
def test_diagnostic_number() -> None:
    values = {"a": "0.25", "b": "nan", "c": "starting"}
    assert vd.diagnostic_number(values, "a") == 0.25
    assert [vd.diagnostic_number(values, k) for k in ("b", "c", "d")] == [None, None, None]


def test_rate_gate() -> None:
    gate = vd.RateGate(2.0)
    assert [gate.allow(t) for t in (10.0, 10.2, 10.49, 10.5, 10.9, 11.0)] == [
        True,
        False,
        False,
        True,
        False,
        True,
    ]
    assert gate.due(5.0)  # the clock went back: due at once
    gate.rate_hz = 100.0
    assert gate.due(11.011)
