"""The closed-loop benchmark's language scoring: what was said against the sim's stage at the
observation the request started from."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from oxygen_ros.sim import language, tasks

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def closed_loop():
    path = ROOT / "benchmarks" / "closed_loop.py"
    spec = importlib.util.spec_from_file_location("closed_loop", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["closed_loop"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_stage_at_takes_the_last_report_not_after_the_stamp(closed_loop) -> None:
    stages = [(10.0, "a"), (11.0, "b"), (12.5, "c")]
    assert closed_loop.stage_at(stages, 9.0) == ""
    assert closed_loop.stage_at(stages, 10.0) == "a"
    assert closed_loop.stage_at(stages, 12.49) == "b"
    assert closed_loop.stage_at(stages, 99.0) == "c"


def test_language_is_scored_at_the_request_observation(closed_loop) -> None:
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
    ]
    memories = [
        ("the red cube is on the table", 11.0),
        ("the left gripper holds the red cube", 12.5),  # not yet lifted at 12.5: wrong
        ("the left gripper holds the red cube", 13.5),
    ]
    got = closed_loop.score_language(seed, instruction, 9.8, stages, spoken, memories)
    assert (got["subtasks_spoken"], got["subtasks_correct"]) == (3, 2)
    assert (got["narrations_spoken"], got["narrations_correct"]) == (2, 1)
    assert (got["memories_written"], got["memories_correct"]) == (3, 2)
    assert language.memory_text(spec, 1) == "the red cube is on the table"
    assert any("step 2 of 4 with the right arm" in line for line in got["spoken_examples"])


def test_furthest_stage_is_the_latest_phase_reported(closed_loop) -> None:
    instruction = "move the red cube to the left"
    labels = tasks.subtask_labels(tasks.sample_episode(3, instruction))
    stages = [(1.0, labels[0]), (2.0, labels[2]), (3.0, labels[1])]
    assert closed_loop.furthest_stage(3, instruction, stages) == (2, labels[2])
    assert closed_loop.furthest_stage(3, instruction, []) == (-1, "")
