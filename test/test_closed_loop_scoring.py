"""The closed-loop benchmark's language scoring (benchmarks/closed_loop_metrics.py): what was
said against the sim's stage at the observation the request started from; the idle arm's start;
and `--record-frames` (benchmarks/closed_loop_evaluator.py: save_frames)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from benchmark_module import load_benchmark
from std_msgs.msg import Header

from oxygen_ros.sim import language, tasks


@pytest.fixture(scope="module")
def metrics():
    return load_benchmark("closed_loop_metrics")


@pytest.fixture(scope="module")
def evaluator():
    return load_benchmark("closed_loop_evaluator")


def test_stage_at_takes_the_last_report_not_after_the_stamp(metrics) -> None:
    stages = [(10.0, "a"), (11.0, "b"), (12.5, "c")]
    assert metrics.stage_at(stages, 9.0) == ""
    assert metrics.stage_at(stages, 10.0) == "a"
    assert metrics.stage_at(stages, 12.49) == "b"
    assert metrics.stage_at(stages, 99.0) == "c"


def test_language_is_scored_at_the_request_observation(metrics) -> None:
    from oxygen_ros.msg import SpeechToken

    seed, instruction = 7, "pick up the red cube with the left arm"
    spec = tasks.sample_episode(seed, instruction)
    labels = tasks.subtask_labels(spec)
    stages = [(10.0, labels[0]), (12.0, labels[1]), (13.0, labels[2])]
    subtask, narration = SpeechToken.KIND_SUBTASK, SpeechToken.KIND_NARRATION
    spoken = [
        (subtask, labels[0], 9.5),  # before the reset: another episode's frame
        (subtask, labels[0], 11.9),  # right: still reaching at 11.9
        (subtask, labels[1], 11.5),  # wrong at 11.5, although right by the time it was said
        (subtask, labels[2], 13.2),  # right
        (narration, "step 2 of 4 with the left arm", 12.2),  # right
        (narration, "step 2 of 4 with the right arm", 12.3),  # wrong arm
        (narration, "step two of four with the left arm", 12.4),  # right, numbers as words
        (narration, "step three of four with the left arm", 12.6),  # wrong step
    ]
    memories = [
        ("the red cube is on the table", 11.0),
        ("the left gripper holds the red cube", 12.5),  # not yet lifted at 12.5: wrong
        ("the left gripper holds the red cube", 13.5),
    ]
    got = metrics.score_language(seed, instruction, 9.8, stages, spoken, memories)
    assert (got["subtasks_spoken"], got["subtasks_correct"]) == (3, 2)
    assert (got["narrations_spoken"], got["narrations_correct"]) == (4, 2)
    assert (got["memories_written"], got["memories_correct"]) == (3, 2)
    assert language.memory_text(spec, 1) == "the red cube is on the table"
    assert any("step 2 of 4 with the right arm" in line for line in got["spoken_examples"])


def test_furthest_stage_is_the_latest_phase_reported(metrics) -> None:
    instruction = "move the red cube to the left"
    labels = tasks.subtask_labels(tasks.sample_episode(3, instruction))
    stages = [(1.0, labels[0]), (2.0, labels[2]), (3.0, labels[1])]
    assert metrics.furthest_stage(3, instruction, stages) == (2, labels[2])
    assert metrics.furthest_stage(3, instruction, []) == (-1, "")


def test_recorded_frames_keep_what_perception_published(evaluator, tmp_path) -> None:
    """`--record-frames`: each ObservationFrame's stamp, state (names and values), images and
    their validity come back from the .npz as published, with what the model said."""
    from oxygen_ros.msg import ObservationFrame
    from oxygen_ros.nodes.common.conversions import rgb_image_msg, seconds_to_time

    rng = np.random.default_rng(0)
    names = ["left_waist", "target.x"]
    messages, images = [], []
    for k in range(3):
        pixels = rng.integers(0, 256, (2, 4, 4, 3), dtype=np.uint8)
        images.append(pixels)
        stamp = seconds_to_time(10.0 + 0.1 * k)
        messages.append(
            ObservationFrame(
                header=Header(stamp=stamp),
                image_names=["base_0_rgb", "left_wrist_0_rgb"],
                images=[rgb_image_msg(p, stamp, "world") for p in pixels],
                image_valid=[True, k != 1],
                joint_names=names,
                joint_positions=[0.1 * k, -0.2 * k],
            )
        )
    spoken = [(1, "reach the red cube", 10.1)]
    path = tmp_path / "frames" / "seed_3.npz"
    evaluator.save_frames(path, messages, 9.5, "pick up the red cube", spoken, [])
    z = np.load(path)
    np.testing.assert_allclose(z["stamps"], [10.0, 10.1, 10.2])
    assert list(z["state_names"]) == names and float(z["reset_s"]) == 9.5
    np.testing.assert_allclose(z["state"], [[0.1 * k, -0.2 * k] for k in range(3)])
    np.testing.assert_array_equal(z["images"], np.stack(images))
    assert z["image_valid"].tolist() == [[True, True], [True, False], [True, True]]
    assert [json.loads(s) for s in z["speech"]] == [list(spoken[0])]
    assert str(z["instruction"]) == "pick up the red cube" and len(z["memory"]) == 0


def test_replay_reads_the_words_closed_loop_recorded(evaluator, tmp_path) -> None:
    """benchmarks/replay_frames.py takes back what `save_frames` wrote: subtasks and
    narrations by kind with their observation stamps, and the memory entries."""
    replay = load_benchmark("replay_frames")
    spoken = [(0, "reach the red cube", 10.1), (1, "step 1 of 4 with the left arm", 10.2)]
    memories = [("the red cube is on the table", 10.3)]
    out = tmp_path / "seed_1.npz"
    evaluator.save_frames(out, [], 9.5, "pick up the red cube", spoken, memories)
    assert replay.recorded_outputs(np.load(out)) == [
        ("subtask", "reach the red cube", 10.1),
        ("narration", "step 1 of 4 with the left arm", 10.2),
        ("memory", "the red cube is on the table", 10.3),
    ]


def test_idle_arm_start_move_is_the_other_arms_largest_early_move(metrics) -> None:
    names = ["left_waist", "left_gripper", "right_waist", "right_gripper"]
    stamps = np.array([10.0, 10.2, 10.5, 10.7])
    positions = np.array(
        [[0.0, 0.0, 0.0, 0.0], [0.1, 0.9, 0.0, 0.9], [-0.3, 0.9, 0.05, 0.9], [2.0, 0.0, 2.0, 0.0]]
    )
    # Task arm right: the left arm's waist, 0.3 by 10.5 (the 2.0 at 10.7 is after the window,
    # grippers never count).
    assert metrics.idle_arm_start_move(names, stamps, positions, "right") == pytest.approx(0.3)
    assert metrics.idle_arm_start_move(names, stamps, positions, "left") == pytest.approx(0.05)
    assert np.isnan(metrics.idle_arm_start_move(names, stamps[:0], positions[:0], "left"))
