"""benchmarks/gpu_bench.py: the not-run path on a machine without an accelerator, and the same
code path on the CPU with the tiny preset (`--force-cpu-smoke`). Its full-vocabulary tokenizer
(benchmarks/full_vocab.py) is tested in test_benchmark_tools.py."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from benchmark_module import load_benchmark

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_bench.py"
NOT_RUN_LINE = "no accelerator (jax backend: cpu): benchmarks/gpu not run"
LAST_LINE = re.compile(
    r"^gpu_bench device=\S+ action_hz=[0-9.]+ tokens_per_s=[0-9]+ "
    r"speedup_vs_isolated=[0-9.]+ chunk_every_143ms=(yes|no)$"
)


@pytest.fixture(scope="module")
def gpu_bench():
    return load_benchmark("gpu_bench")


def _run(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    return subprocess.run(
        [sys.executable, "-P", str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env=env,
    )


def test_without_an_accelerator_it_says_so_and_exits_0(tmp_path: Path) -> None:
    out = tmp_path / "gpu.json"
    proc = _run("--out", str(out), timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == NOT_RUN_LINE
    document = json.loads(out.read_text())
    assert document["ran"] is False
    assert document["reason"] == "no accelerator (jax backend: cpu)"
    assert document["jax_backend"] == "cpu"


@pytest.mark.slow
def test_cpu_smoke_runs_the_comparison_and_ends_with_the_summary_line(tmp_path: Path) -> None:
    out = tmp_path / "smoke.json"
    proc = _run("--force-cpu-smoke", "--out", str(out), timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    last = proc.stdout.strip().splitlines()[-1]
    assert LAST_LINE.match(last), last
    assert "device=cpu " in last
    document = json.loads(out.read_text())
    assert document["ran"] is True and document["smoke"] is True
    assert document["device"] == "cpu"
    assert document["model"]["preset"] == "tiny"
    assert document["setting"]["denoise_steps"] == 10 and document["setting"]["k"] == 5
    methods = [r["method"] for r in document["results"]]
    assert methods == ["isolated", "shared_kv", "cb_k5", "deadline", "deadline_143ms"]
    for result in document["results"]:
        assert result["deterministic_lengths"], result["label"]  # every request decoded M
        assert result["compiles_after_warmup"] == 0, result["label"]
        assert result["action_path_ms_p99"] <= result["chunk_interval_ms_p99"] + 1e-6
    headline = document["headline"]
    assert headline["method"] == "cb_k5"
    assert headline["action_hz"] > 0 and headline["tokens_per_s"] > 0
    assert headline["speedup_vs_isolated"] > 0
    seventy = document["seventy_hz"]
    assert seventy["period_ms"] == pytest.approx(1e3 * 10 / 70)
    assert seventy["chunk_every_143ms"] == (seventy["chunk_interval_ms_p99"] <= 1e3 * 10 / 70)
    assert last.endswith(f"chunk_every_143ms={'yes' if seventy['chunk_every_143ms'] else 'no'}")
    assert out.with_suffix(".png").is_file()
