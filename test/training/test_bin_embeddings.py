"""Ordered starting rows for the state-bin pieces (training/bin_embeddings.py)."""

from __future__ import annotations

import numpy as np

from oxygen_ros.engine.tokenizer import (
    BUNDLED_TOKENIZER_PATH,
    STATE_BINS_TOKENIZER_PATH,
    Tokenizer,
)
from oxygen_ros.training import bin_embeddings


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def test_bin_ids_exist_only_when_every_bin_is_one_piece() -> None:
    tokenizer = Tokenizer(STATE_BINS_TOKENIZER_PATH)
    ids = bin_embeddings.bin_token_ids(tokenizer)
    assert ids is not None and len(set(ids.tolist())) == 257
    assert [tokenizer.decode([i]) for i in ids[[0, 1, 8, 256]]] == [" -1", " 0", " 7", " 255"]
    assert bin_embeddings.bin_token_ids(Tokenizer(BUNDLED_TOKENIZER_PATH)) is None


def test_smooth_rows_keep_the_bins_order() -> None:
    rows = bin_embeddings.smooth_bin_rows(64, 0.08, seed=0)
    assert rows.shape == (257, 64) and rows.dtype == np.float32  # values -1 .. 255
    np.testing.assert_allclose(np.linalg.norm(rows, axis=1), 0.08, rtol=1e-5)
    # Neighbours almost equal; the likeness falls with the distance between bins.
    assert min(_cosine(rows[b], rows[b + 1]) for b in range(256)) > 0.95
    for b in (20, 128, 230):
        near = [_cosine(rows[b], rows[b + d]) for d in (1, 4, 16)]
        assert near[0] > near[1] > near[2], near
    # A random table's rows have no such order (control for the check above).
    random = np.random.default_rng(0).standard_normal((257, 64))
    assert min(_cosine(random[b], random[b + 1]) for b in range(256)) < 0.5
    np.testing.assert_array_equal(rows, bin_embeddings.smooth_bin_rows(64, 0.08, seed=0))
    assert not np.array_equal(rows, bin_embeddings.smooth_bin_rows(64, 0.08, seed=1))


def test_only_the_bin_rows_change_and_take_the_tables_norm() -> None:
    tokenizer = Tokenizer(STATE_BINS_TOKENIZER_PATH)
    ids = bin_embeddings.bin_token_ids(tokenizer)
    table = np.random.default_rng(1).normal(0.0, 0.01, (tokenizer.vocab_size, 64))
    table = table.astype(np.float32)
    out = bin_embeddings.with_smooth_bins(table, ids, seed=3)
    others = np.setdiff1d(np.arange(len(table)), ids)
    np.testing.assert_array_equal(out[others], table[others])
    norm = np.mean(np.linalg.norm(table[others], axis=1))
    np.testing.assert_allclose(out[ids], bin_embeddings.smooth_bin_rows(64, norm, seed=3))
    assert out.dtype == table.dtype
