"""Benchmark tools that are not benchmarks themselves: the full-vocabulary tokenizer
(benchmarks/full_vocab.py) and the roofline (benchmarks/roofline.py). oxygen_bench's pieces
are tested in test_oxygen_bench.py."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from benchmark_module import load_benchmark


@pytest.fixture(scope="module")
def full_vocab():
    return load_benchmark("full_vocab")


@pytest.fixture(scope="module")
def roofline():
    return load_benchmark("roofline")


# ------------------------------------------------------------------------------------------
# full_vocab


def test_padded_tokenizer_keeps_encoding_and_reaches_the_full_vocabulary(
    full_vocab, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from oxygen_ros.engine.config import PALIGEMMA_VOCAB_SIZE, default_tokenizer_path
    from oxygen_ros.engine.tokenizer import BUNDLED_TOKENIZER_PATH, Tokenizer

    monkeypatch.setenv("OPENPI_DATA_HOME", str(tmp_path / "no_openpi_cache"))
    path, kind = full_vocab.full_vocab_tokenizer(tmp_path / "work")
    assert kind == "bundled_padded"
    assert default_tokenizer_path() == path
    padded, bundled = Tokenizer(path), Tokenizer(BUNDLED_TOKENIZER_PATH)
    assert padded.vocab_size == PALIGEMMA_VOCAB_SIZE
    text = "Task: pick up the red block, State: 3 127 255;\nAction: \nNarration: "
    assert padded.encode(text, add_bos=True) == bundled.encode(text, add_bos=True)
    assert padded.decode([PALIGEMMA_VOCAB_SIZE - 1]).startswith("<oxygen_pad_")


def test_a_cached_paligemma_tokenizer_wins_over_the_padded_one(
    full_vocab, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = tmp_path / "openpi" / "big_vision" / "paligemma_tokenizer.model"
    real.parent.mkdir(parents=True)
    real.write_bytes(b"stand-in")
    monkeypatch.setenv("OPENPI_DATA_HOME", str(tmp_path / "openpi"))
    path, kind = full_vocab.full_vocab_tokenizer(tmp_path / "work")
    assert (path, kind) == (real, "paligemma")
    assert os.environ["OPENPI_DATA_HOME"] == str(tmp_path / "openpi")
    assert not (tmp_path / "work").exists()


@pytest.mark.slow
def test_an_engine_on_the_padded_tokenizer_samples_the_whole_head(
    full_vocab, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from oxygen_ros.engine.config import PALIGEMMA_VOCAB_SIZE, get_engine_config
    from oxygen_ros.engine.engine import Engine
    from oxygen_ros.engine.types import LanguageRequest, Observation, RequestKind

    monkeypatch.setenv("OPENPI_DATA_HOME", str(tmp_path / "no_openpi_cache"))
    path, _ = full_vocab.full_vocab_tokenizer(tmp_path / "work")
    engine = Engine(get_engine_config("tiny"))  # no tokenizer_path: as oxygen_bench's pi05
    assert engine.tokenizer.path == path
    assert engine.model.vocab_size == PALIGEMMA_VOCAB_SIZE  # the head is not cut
    model = engine.config.model
    observation = Observation(
        images={k: np.zeros((*model.image_resolution, 3), np.uint8) for k in model.image_keys},
        image_masks={k: True for k in model.image_keys},
        state=np.zeros((8,), np.float32),
        prompt="pick up the red block",
        stamp=0.0,
    )
    request = LanguageRequest(RequestKind.NARRATION, max_tokens=4, ignore_eos=True)
    outputs = []
    result = engine.step(observation, [request])
    outputs.extend(result.outputs)
    for _ in range(3):
        outputs.extend(engine.step(observation).outputs)
    ids = [i for output in outputs for i in output.new_token_ids]
    texts = [output.text for output in outputs if output.text is not None]
    assert len(ids) == 4 and texts
    assert max(ids) >= 640  # beyond the bundled model: the whole head was sampled from


# ------------------------------------------------------------------------------------------
# roofline


def test_xla_counts_a_gathers_whole_table_and_the_overcount_removes_it(roofline) -> None:
    import jax
    import jax.numpy as jnp
    import openpi.models.gemma as gemma

    from oxygen_ros.engine.config import PALIGEMMA_VOCAB_SIZE, get_model_config

    config = get_model_config("tiny")
    width = gemma.get_config(config.paligemma_variant).width
    table = jnp.zeros((PALIGEMMA_VOCAB_SIZE, width), jnp.float32)
    ids = jnp.arange(8, dtype=jnp.int32)
    lowered = jax.jit(lambda t, i: t[i]).lower(table, ids)
    counted = roofline.cost(lowered)["bytes"]
    table_bytes = PALIGEMMA_VOCAB_SIZE * width * 4
    assert counted >= table_bytes  # the whole table, for 8 rows: why the correction exists
    overcount = roofline.embedding_overcount(config, rows_read=8)
    assert overcount == (PALIGEMMA_VOCAB_SIZE - 8) * width * 4
    row = roofline.entry(
        lowered, 1.0, {"peak_flops_per_s": 1e9, "peak_bytes_per_s": 1e9}, overcount
    )
    assert row["bytes_xla"] == counted
    assert row["bytes"] == counted - overcount
    assert row["bytes"] < 0.01 * table_bytes  # what 8 rows, ids and output really move


def test_roofline_entry_is_the_slower_of_compute_and_memory(roofline) -> None:
    import jax
    import jax.numpy as jnp

    a = jnp.ones((64, 64), jnp.float32)
    lowered = jax.jit(lambda x, y: x @ y).lower(a, a)
    counted = roofline.cost(lowered)
    assert counted["flops"] == 2 * 64**3  # XLA's count of a matmul
    compute_bound = {"peak_flops_per_s": 1e6, "peak_bytes_per_s": 1e12}
    row = roofline.entry(lowered, 2.0, compute_bound)
    assert row["bound"] == "compute"
    assert row["roofline_s"] == pytest.approx(2 * 64**3 / 1e6)
    assert row["roofline_fraction"] == pytest.approx(row["roofline_s"] / 2.0)
    memory_bound = {"peak_flops_per_s": 1e15, "peak_bytes_per_s": 1e3}
    row = roofline.entry(lowered, 2.0, memory_bound)
    assert row["bound"] == "memory"
    assert row["roofline_s"] == pytest.approx(counted["bytes"] / 1e3)
    # Two calls count as one component: their sums.
    both = roofline.entry([lowered, lowered], 2.0, compute_bound)
    assert both["flops"] == 2 * counted["flops"] and both["bytes"] == 2 * counted["bytes"]


def test_machine_peaks_are_the_best_probe(roofline) -> None:
    peaks = roofline.machine_peaks(runs=1)
    matmul = [p["flops_per_s"] for p in peaks["matmul_probe"]]
    memory = [p["bytes_per_s"] for p in peaks["memory_probe"]]
    assert len(matmul) == len(roofline.MATMUL_SIZES) and min(matmul) > 0
    assert peaks["peak_flops_per_s"] == max(matmul)
    assert peaks["peak_bytes_per_s"] == max(memory) > 0
    assert peaks["backend"] == "cpu"
