"""Narration and memory targets: defined per phase, speakable by the bundled tokenizer."""

from __future__ import annotations

import pytest

from oxygen_ros.engine.config import PromptConfig
from oxygen_ros.engine.tokenizer import BUNDLED_TOKENIZER_PATH, UNK_ID, Tokenizer
from oxygen_ros.engine.types import RequestKind
from oxygen_ros.sim import language, tasks

SPECS = [
    tasks.sample_episode(0, text)
    for text in (
        "pick up the red cube",
        "pick up the green cube with the left arm",
        "pick up the blue cube with the right arm",
        "move the red cube to the left",
        "move the blue cube to the right",
    )
]


def test_every_target_tokenises_without_unknown_pieces_and_fits_its_kind() -> None:
    tokenizer = Tokenizer(BUNDLED_TOKENIZER_PATH)
    prompt = PromptConfig()
    for spec in SPECS:
        for stage in range(len(tasks.subtask_labels(spec))):
            for kind, text in language.targets(spec, stage).items():
                ids = tokenizer.encode(text)
                assert UNK_ID not in ids, text
                assert tokenizer.decode(ids) == text
                assert len(ids) + 1 <= prompt.task(RequestKind(kind)).max_tokens  # + EOS


def test_memory_follows_the_episodes_events() -> None:
    pick, move = SPECS[1], SPECS[4]
    assert language.memory_text(pick, 0) == "the green cube is on the table"
    assert language.memory_text(pick, 1) == "the green cube is on the table"  # grasping
    assert language.memory_text(pick, 2) == "the left gripper holds the green cube"
    assert language.memory_text(pick, 3) == "the left gripper holds the green cube"
    assert language.memory_text(move, 4) == f"the {move.arm} gripper holds the blue cube"
    assert language.memory_text(move, 5) == "the blue cube is on the right"


def test_narration_counts_phases_and_names_the_arm() -> None:
    assert language.narration_text(SPECS[2], 0) == "step 1 of 4 with the right arm"
    assert language.narration_text(SPECS[3], 5) == f"step 6 of 6 with the {SPECS[3].arm} arm"


def test_stage_index_and_bad_stages() -> None:
    spec = SPECS[0]
    labels = tasks.subtask_labels(spec)
    assert [language.stage_index(spec, label) for label in labels] == list(range(len(labels)))
    with pytest.raises(ValueError, match="is not a phase"):
        language.stage_index(spec, "dance")
    with pytest.raises(ValueError, match=r"outside 0\.\.3"):
        language.narration_text(spec, 4)
