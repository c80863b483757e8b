"""Ordered starting embeddings for a tokenizer's state-bin pieces.

openpi's pi0.5 prompt writes the normalised state as 256-bin integers inside the text, and
-1 for a value below the range (engine/prompts.py). With a tokenizer that has one piece per
value ("\u2581-1" .. "\u2581255", scripts/build_tokenizer.py --state-bins) every state value
is one token, but a randomly initialised embedding row says nothing about its value: bin 128
starts as far from bin 129 as from bin 3, and the model would have to learn the order of 257
rows from the actions alone. `smooth_bin_rows` starts them in order instead: row b is a fixed
random orthonormal projection of multi-scale Fourier features of b / 255 (-1 just below bin
0; neighbouring values almost equal, distant ones apart), scaled to the table's own row norm.
It only sets where training starts; the rows are trained like every other.

Invariants:
- Only the 257 rows of the state values change; every other row keeps its value.
- The rows depend only on (the values, width, norm, seed): the same run starts the same.
- A tokenizer without every value as a single piece has no bin ids (`bin_token_ids` is None),
  and training leaves the table as initialised.

Nothing here imports rclpy.
"""

from __future__ import annotations

import numpy as np

from oxygen_ros.engine.prompts import NUM_STATE_BINS, STATE_VALUES
from oxygen_ros.engine.tokenizer import Tokenizer

FREQUENCIES = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0)  # cycles over the bins' range, times 2


def bin_token_ids(tokenizer: Tokenizer) -> np.ndarray | None:
    """Ids [257] of the pieces the prompt's state numbers become, " -1" .. " 255"
    (`prompts.STATE_VALUES`), when each is one token; None when any is not (then the
    tokenizer splits numbers into digits)."""
    ids = []
    for b in STATE_VALUES:
        encoded = tokenizer.encode(f" {b}")
        if len(encoded) != 1:
            return None
        ids.append(encoded[0])
    return np.asarray(ids, np.int64)


def smooth_bin_rows(
    width: int, row_norm: float, seed: int, frequencies: tuple[float, ...] = FREQUENCIES
) -> np.ndarray:
    """[257, width] float32 rows (state values -1 .. 255), each of norm `row_norm`, in the
    order of their values (`frequencies`: of the Fourier features; (0.5,) alone is a quarter
    circle, nearly a linear code of the value)."""
    x = np.asarray(STATE_VALUES) / (NUM_STATE_BINS - 1)
    angles = np.pi * np.outer(x, frequencies)
    features = np.concatenate([np.cos(angles), np.sin(angles)], axis=1)  # [257, 2F]
    if features.shape[1] > width:
        raise ValueError(f"width {width} is below the {features.shape[1]} bin features")
    rng = np.random.default_rng(seed)
    basis, _ = np.linalg.qr(rng.standard_normal((width, features.shape[1])))  # orthonormal
    rows = features @ basis.T  # every feature row has norm sqrt(F)
    return (rows * (row_norm / np.sqrt(len(frequencies)))).astype(np.float32)


def with_smooth_bins(
    table: np.ndarray, ids: np.ndarray, seed: int, frequencies: tuple[float, ...] = FREQUENCIES
) -> np.ndarray:
    """A copy of the embedding table [V, width] whose bin rows are `smooth_bin_rows`, at the
    mean norm of the table's other rows."""
    table = np.array(table, copy=True)
    others = np.ones(len(table), bool)
    others[ids] = False
    norm = float(np.mean(np.linalg.norm(table[others], axis=1)))
    table[ids] = smooth_bin_rows(table.shape[1], norm, seed, frequencies).astype(table.dtype)
    return table
