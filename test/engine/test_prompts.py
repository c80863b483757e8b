"""The pi0.5 action prompt equals openpi's PaligemmaTokenizer output; tails fit their budget."""

from __future__ import annotations

import numpy as np
import pytest
from engine_factories import use_bundled_tokenizer_for_openpi
from openpi.models import tokenizer as openpi_tokenizer

from oxygen_ros.engine import prompts
from oxygen_ros.engine.config import PromptConfig
from oxygen_ros.engine.tokenizer import BUNDLED_TOKENIZER_PATH, Tokenizer
from oxygen_ros.engine.types import RequestKind

CASES = [
    ("pick up the red block", np.array([0.0, -1.0, 1.0, 0.5, -0.999, 0.3], np.float32)),
    ("  open_the_drawer\nslowly ", np.array([-1.5, 1.2, 0.9999, -0.0039], np.float32)),
    ("wipe the table", np.linspace(-1, 1, 32, dtype=np.float32)),
    ("x " * 150, np.zeros(8, np.float32)),  # longer than max_len: truncated like openpi
]


@pytest.mark.parametrize(("instruction", "state"), CASES)
@pytest.mark.parametrize("max_len", [48, 200])
def test_action_prompt_tokens_equal_openpi(monkeypatch, tmp_path, instruction, state, max_len):
    use_bundled_tokenizer_for_openpi(monkeypatch, tmp_path)
    expected_tokens, expected_mask = openpi_tokenizer.PaligemmaTokenizer(max_len).tokenize(
        instruction, state
    )
    tokens, mask = prompts.tokenize_action_prompt(
        Tokenizer(BUNDLED_TOKENIZER_PATH), instruction, state, max_len
    )
    np.testing.assert_array_equal(tokens, expected_tokens)
    np.testing.assert_array_equal(mask, expected_mask)
    assert tokens.dtype == np.int32 and mask.dtype == bool


def test_state_discretisation_and_prompt_text() -> None:
    state = np.array([-2.0, -1.0, 0.0, 0.99, 1.0], np.float32)
    np.testing.assert_array_equal(prompts.discretize_state(state), [-1, 0, 128, 254, 255])
    text = prompts.format_action_prompt(" fold_the towel\n", state)
    assert text == "Task: fold the towel, State: -1 0 128 254 255;\nAction: "


def test_default_tails_fit_and_long_tails_are_refused() -> None:
    tokenizer = Tokenizer(BUNDLED_TOKENIZER_PATH)
    config = PromptConfig()
    for kind in RequestKind:
        tokens, mask = prompts.tokenize_tail(
            tokenizer, config.task(kind).tail, config.max_tail_len
        )
        assert mask.sum() == len(tokenizer.encode(config.task(kind).tail))
        assert tokens[0] != 2  # no BOS inside the shared sequence
        assert not mask[int(mask.sum()) :].any()
    with pytest.raises(ValueError, match="more than max_tail_len=4"):
        prompts.tokenize_tail(tokenizer, "a much longer tail than four tokens", 4)
