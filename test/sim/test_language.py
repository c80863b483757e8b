"""Narration and memory targets: defined per phase, speakable by the bundled tokenizer."""

from __future__ import annotations

import pytest

from oxygen_ros.engine import checkpoint_assets
from oxygen_ros.engine.config import PromptConfig
from oxygen_ros.engine.tokenizer import (
    BUNDLED_TOKENIZER_PATH,
    STATE_BINS_TOKENIZER_PATH,
    UNK_ID,
    Tokenizer,
)
from oxygen_ros.engine.types import RequestKind
from oxygen_ros.sim import language, tasks
from oxygen_ros.training import bin_embeddings

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


@pytest.mark.parametrize("path", [BUNDLED_TOKENIZER_PATH, STATE_BINS_TOKENIZER_PATH])
@pytest.mark.parametrize("numbers", ["digits", "words"])
def test_every_target_tokenises_without_unknown_pieces_and_fits_its_kind(path, numbers) -> None:
    tokenizer = Tokenizer(path)
    prompt = PromptConfig()
    for spec in SPECS:
        for stage in range(len(tasks.subtask_labels(spec))):
            for kind, text in language.targets(spec, stage, numbers).items():
                ids = tokenizer.encode(text)
                assert UNK_ID not in ids, text
                assert tokenizer.decode(ids) == text
                assert len(ids) + 1 <= prompt.task(RequestKind(kind)).max_tokens  # + EOS


def test_narration_in_words_shares_no_piece_with_the_state_bins() -> None:
    """What the words are for: frozen state-bin rows cannot tell " 2" from " 3" at the tied
    output. The control: the digits' narration does use bin pieces."""
    tokenizer = Tokenizer(STATE_BINS_TOKENIZER_PATH)
    bins = set(bin_embeddings.bin_token_ids(tokenizer).tolist())
    for spec in SPECS:
        for stage in range(len(tasks.subtask_labels(spec))):
            words = tokenizer.encode(language.narration_text(spec, stage, "words"))
            digits = tokenizer.encode(language.narration_text(spec, stage, "digits"))
            assert not bins & set(words), language.narration_text(spec, stage, "words")
            assert len(bins & set(digits)) >= 1


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
    assert language.narration_text(SPECS[2], 0, "words") == "step one of four with the right arm"
    assert language.targets(SPECS[3], 5, "words")["narration"] == (
        f"step six of six with the {SPECS[3].arm} arm"
    )
    with pytest.raises(ValueError, match="numbers must be one of"):
        language.narration_text(SPECS[2], 0, "roman")
    # what a checkpoint may record is what the texts can say
    assert language.NARRATION_NUMBERS == checkpoint_assets.NARRATION_NUMBERS


def test_same_text_takes_either_spelling_of_the_narrations_numbers_only() -> None:
    for spec in SPECS:
        for stage in range(len(tasks.subtask_labels(spec))):
            words, digits = (language.targets(spec, stage, n) for n in ("words", "digits"))
            for kind in words:
                assert language.same_text(words[kind], digits[kind])
                assert language.same_text(digits[kind], words[kind])
                assert language.same_text(digits[kind], digits[kind])
    said = "step two of four with the left arm"
    assert not language.same_text(said, "step 3 of 4 with the left arm")  # another number
    assert not language.same_text(said, "step 2 of 4 with the right arm")  # another arm
    assert not language.same_text("step two of four", "step 2 of 4 with the left arm")
    # only a narration's two numbers have two spellings
    assert not language.same_text(
        "the left gripper holds two cubes", "the left gripper holds 2 cubes"
    )
    assert not language.same_text("grasp the red cube", "grasp the blue cube")


def test_stage_index_and_bad_stages() -> None:
    spec = SPECS[0]
    labels = tasks.subtask_labels(spec)
    assert [language.stage_index(spec, label) for label in labels] == list(range(len(labels)))
    with pytest.raises(ValueError, match="is not a phase"):
        language.stage_index(spec, "dance")
    with pytest.raises(ValueError, match=r"outside 0\.\.3"):
        language.narration_text(spec, 4)
