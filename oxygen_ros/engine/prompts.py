"""Prompt text and token layout: openpi's pi0.5 action prompt and the language task tails.

The action prompt reproduces openpi's pi0.5 format (`PaligemmaTokenizer.tokenize` with a
state): the instruction is stripped, "_" and newlines become spaces, the normalised state is
discretised into 256 bins over [-1, 1] and written as integers inside the text:

    "Task: {instruction}, State: {b0 b1 ...};\\nAction: "

tokenised with BOS, right-padded with pad id 0 (mask False) or truncated to `max_len`.

Language tails (`PromptConfig`) are appended after the prefix without BOS; they are the only
per-task text, so every task reads the same prefix.

Invariants:
- `tokenize_action_prompt` returns exactly openpi's token ids and mask for the same tokenizer
  model (a test compares them with openpi's own class).
- Out-of-range states discretise as openpi does (below -1 -> -1, at or above 1 -> 255).
- A tail never exceeds `max_tail_len` tokens: too long is an error, not a silent cut.
"""

from __future__ import annotations

import logging

import numpy as np

from oxygen_ros.engine.tokenizer import PAD_ID, Tokenizer

logger = logging.getLogger("oxygen_ros.engine")

NUM_STATE_BINS = 256
# Every number `discretize_state` writes: -1 for a normalised value below -1 (openpi's
# digitize; quantile normalisation puts about 1 % of each dimension there), then the bins.
STATE_VALUES = tuple(range(-1, NUM_STATE_BINS))


def discretize_state(state: np.ndarray) -> np.ndarray:
    """Maps a normalised state [n] to bin indices [n] of 256 uniform bins over [-1, 1]."""
    edges = np.linspace(-1.0, 1.0, NUM_STATE_BINS + 1)[:-1]
    return np.digitize(np.asarray(state), bins=edges) - 1


def format_action_prompt(instruction: str, state: np.ndarray) -> str:
    """The pi0.5 action prompt text for an instruction and a normalised state [n]."""
    cleaned = instruction.strip().replace("_", " ").replace("\n", " ")
    state_text = " ".join(str(int(b)) for b in discretize_state(state))
    return f"Task: {cleaned}, State: {state_text};\nAction: "


def pad_tokens(ids: list[int], length: int) -> tuple[np.ndarray, np.ndarray]:
    """Right-pads ids with PAD_ID to `length`; returns (tokens int32 [length], mask bool)."""
    tokens = np.full((length,), PAD_ID, dtype=np.int32)
    mask = np.zeros((length,), dtype=bool)
    tokens[: len(ids)] = ids
    mask[: len(ids)] = True
    return tokens, mask


def tokenize_action_prompt(
    tokenizer: Tokenizer,
    instruction: str,
    state: np.ndarray,
    max_len: int,
    truncate: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """Tokenises the pi0.5 action prompt; returns (tokens int32 [max_len], mask bool [max_len]).
    A prompt longer than `max_len` is cut (with a warning, as openpi does) or, with
    `truncate=False`, refused with a ValueError (training must not learn from a cut state)."""
    ids = tokenizer.encode(format_action_prompt(instruction, state), add_bos=True)
    if len(ids) > max_len:
        if not truncate:
            raise ValueError(
                f"prompt has {len(ids)} tokens, more than max_token_len={max_len}: the preset's "
                "prompt budget does not hold this instruction and state with this tokenizer"
            )
        logger.warning(
            "prompt has %d tokens, more than max_token_len=%d; truncating (as openpi does)",
            len(ids),
            max_len,
        )
        ids = ids[:max_len]
    return pad_tokens(ids, max_len)


def tokenize_tail(
    tokenizer: Tokenizer, tail: str, max_tail_len: int
) -> tuple[np.ndarray, np.ndarray]:
    """Tokenises a language tail (no BOS); returns (tokens int32 [max_tail_len], mask bool)."""
    ids = tokenizer.encode(tail)
    if not ids:
        raise ValueError("a language tail must have at least one token")
    if len(ids) > max_tail_len:
        raise ValueError(
            f"tail {tail!r} has {len(ids)} tokens, more than max_tail_len={max_tail_len}"
        )
    return pad_tokens(ids, max_tail_len)
