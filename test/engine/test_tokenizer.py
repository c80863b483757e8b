"""Tokenizer loading: bundled small model, PaliGemma special ids, path resolution errors."""

from __future__ import annotations

import importlib.util
import logging
import pathlib

import numpy as np
import pytest
from engine_factories import make_engine_config

from oxygen_ros.engine.prompts import discretize_state, tokenize_action_prompt
from oxygen_ros.engine.tokenizer import (
    BUNDLED_TOKENIZER_PATH,
    STATE_BINS_TOKENIZER_PATH,
    Tokenizer,
    resolve_tokenizer_path,
)

REPO = pathlib.Path(__file__).resolve().parents[2]


def _build_script():
    spec = importlib.util.spec_from_file_location(
        "build_tokenizer", REPO / "scripts" / "build_tokenizer.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bundled_tokenizer_keeps_paligemma_special_ids_and_round_trips() -> None:
    tokenizer = Tokenizer(BUNDLED_TOKENIZER_PATH)
    assert tokenizer.vocab_size == _build_script().VOCAB_SIZE
    ids = tokenizer.encode("Task: wipe the table, State: 3 127 255;\nAction: ", add_bos=True)
    assert ids[0] == 2  # bos
    assert tokenizer.eos_id == 1
    # Byte fallback: text never seen in training still round-trips exactly.
    for text in ["Stack the cubes.\nDone!", "déjà vu ✓ 日本 ", "  two  spaces\t"]:
        assert tokenizer.decode(tokenizer.encode(text)) == text
        assert 3 not in tokenizer.encode(text)  # no unk


def test_build_script_reproduces_the_bundled_model(tmp_path) -> None:
    output = tmp_path / "rebuilt.model"
    _build_script().build(REPO / "oxygen_ros/engine/assets/tokenizer_corpus.txt", output)
    assert output.read_bytes() == BUNDLED_TOKENIZER_PATH.read_bytes()


def test_build_script_reproduces_the_state_bins_model(tmp_path) -> None:
    output = tmp_path / "rebuilt.model"
    script = _build_script()
    script.build(REPO / "oxygen_ros/engine/assets/tokenizer_corpus.txt", output, state_bins=True)
    assert output.read_bytes() == STATE_BINS_TOKENIZER_PATH.read_bytes()
    tokenizer = Tokenizer(output)
    assert tokenizer.vocab_size == script.VOCAB_SIZE + 257  # -1 .. 255
    for text in ["Stack the cubes.\nDone!", "déjà vu ✓ 日本 ", "  two  spaces\t", " 2560 007 -12"]:
        assert tokenizer.decode(tokenizer.encode(text)) == text
        assert 3 not in tokenizer.encode(text)


def _state_tail(tokenizer: Tokenizer, instruction: str, state: np.ndarray) -> list[int]:
    """The prompt's valid tokens after "State:" (the state, then ";\nAction: ")."""
    tokens, mask = tokenize_action_prompt(tokenizer, instruction, state, 200)
    ids = tokens[mask].tolist()
    marker = tokenizer.encode(", State:")
    start = next(i for i in range(len(ids)) if ids[i : i + len(marker)] == marker)
    return ids[start + len(marker) :]


def test_state_bins_put_every_state_value_at_a_fixed_distance_from_the_prompt_end() -> None:
    """The prompt's text is openpi's either way; with the bins model each of the 35 values is
    one token, so value i is always the same number of tokens before the end, also where a
    value below -1 is written as -1. Control: with the bundled model (one token per digit)
    the same states give tails of other lengths."""
    rng = np.random.default_rng(0)
    states = [rng.uniform(-1, 1, 35) for _ in range(3)] + [np.full(35, -1.0), np.full(35, 0.99)]
    states += [rng.uniform(-1.3, 1.3, 35), np.full(35, -1.5)]  # -1 (below the range) and 255
    assert (discretize_state(states[-1]) == -1).all()
    instructions = ["pick up the red cube", "move the blue cube to the right of the green cube"]
    bins, digits = Tokenizer(STATE_BINS_TOKENIZER_PATH), Tokenizer(BUNDLED_TOKENIZER_PATH)
    end = bins.encode(";\nAction: ")
    digit_lengths = set()
    for state in states:
        for instruction in instructions:
            tail = _state_tail(bins, instruction, state)
            assert tail[len(state) :] == end
            expected = [bins.encode(f" {b}")[0] for b in discretize_state(state)]
            assert tail[: len(state)] == expected
            digit_lengths.add(len(_state_tail(digits, instruction, state)))
    assert len(digit_lengths) > 1


def test_explicit_tokenizer_path_must_exist(tmp_path) -> None:
    missing = tmp_path / "tok.model"
    with pytest.raises(FileNotFoundError, match=f"tokenizer_path does not exist: {missing}"):
        resolve_tokenizer_path(make_engine_config(tokenizer_path=str(missing)))


def test_checkpoint_without_paligemma_tokenizer_is_an_error(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("OPENPI_DATA_HOME", str(tmp_path))
    config = make_engine_config(tokenizer_path=None, checkpoint_dir=str(tmp_path / "ckpt"))
    expected = tmp_path / "big_vision" / "paligemma_tokenizer.model"
    with pytest.raises(FileNotFoundError, match=f"not found at {expected}"):
        resolve_tokenizer_path(config)


def test_random_init_falls_back_to_bundled_tokenizer(monkeypatch, tmp_path, caplog) -> None:
    monkeypatch.setenv("OPENPI_DATA_HOME", str(tmp_path))
    with caplog.at_level(logging.WARNING, logger="oxygen_ros.engine"):
        path = resolve_tokenizer_path(make_engine_config(tokenizer_path=None))
    assert path == BUNDLED_TOKENIZER_PATH
    assert "using the bundled small tokenizer" in caplog.text
    cached = tmp_path / "big_vision" / "paligemma_tokenizer.model"
    cached.parent.mkdir(parents=True)
    cached.write_bytes(BUNDLED_TOKENIZER_PATH.read_bytes())
    assert resolve_tokenizer_path(make_engine_config(tokenizer_path=None)) == cached


def test_tokenizer_with_other_special_ids_is_rejected(tmp_path) -> None:
    import sentencepiece

    model = tmp_path / "other.model"
    sentencepiece.SentencePieceTrainer.train(
        input=str(REPO / "oxygen_ros/engine/assets/tokenizer_corpus.txt"),
        model_prefix=str(model.with_suffix("")),
        vocab_size=300,
        minloglevel=2,
    )  # sentencepiece defaults: unk=0, bos=1, eos=2, no pad
    with pytest.raises(ValueError, match=r"special ids \(pad, eos, bos, unk\)=\(-1, 2, 1, 0\)"):
        Tokenizer(model)
