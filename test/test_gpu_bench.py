"""benchmarks/gpu_bench.py: the not-run path on a machine without an accelerator, its budget (the
trimming rules of gpu_bench_budget.py, and a budget that runs out on the CPU smoke path), its
report (gpu_bench_report.py: the last line, no matplotlib) and the openpi equality's negative
control (benchmarks/openpi_equality.py). The whole CPU smoke run (`--force-cpu-smoke`) and
`--plot-from` are tested on the run through the offline bundle (test_gpu_bundle.py): the
same files, as a GPU host runs them. Its full-vocabulary tokenizer
(benchmarks/full_vocab.py) is tested in test_benchmark_tools.py."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from benchmark_module import load_benchmark

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_bench.py"
NOT_RUN_LINE = "no accelerator (jax backend: cpu): benchmarks/gpu not run"
LAST_LINE = re.compile(
    r"^gpu_bench device=\S+ action_hz=(?P<hz>[0-9.]+|nan) tokens_per_s=([0-9]+|nan) "
    r"speedup_vs_isolated=(?P<speedup>[0-9.]+|nan) chunk_every_143ms=(yes|no) "
    r"openpi_equal=(?P<equal>yes|no|skipped) complete=(?P<complete>yes|no)$"
)


@pytest.fixture(scope="module")
def budget():
    """benchmarks/gpu_bench_budget.py: the setting, stage times and the trimming rules."""
    return load_benchmark("gpu_bench_budget")


@pytest.fixture(scope="module")
def report(budget):
    """benchmarks/gpu_bench_report.py: the JSON, the printed summary, the plot."""
    return load_benchmark("gpu_bench_report")


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
def test_a_budget_that_runs_out_still_writes_the_json_in_time(tmp_path: Path) -> None:
    """10 s cannot hold the smoke (about 30 s here): the watchdog writes what ran."""
    out = tmp_path / "short.json"
    proc = _run("--force-cpu-smoke", "--budget-s", "10", "--out", str(out), timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    last = proc.stdout.strip().splitlines()[-1]
    assert (match := LAST_LINE.match(last)), last
    assert match["complete"] == "no" and match["hz"] == "nan"
    document = json.loads(out.read_text())
    assert document["complete"] is False and "budget" in document["incomplete_reason"]
    assert document["wall_s"] <= 10.0
    assert document["results"] == [] and document["headline"] is None
    stages = document["stages"]
    assert stages["imports"]["wall_s"] > 0
    assert [s for s in stages.values() if s.get("interrupted")]  # it stopped mid-stage
    assert isinstance(document["trimmed"], list)
    assert "INCOMPLETE: the budget (10.0 s) ran out" in proc.stdout


def test_frames_are_trimmed_before_the_deadline_143ms_run(budget) -> None:
    costs = {"isolated": (0.0, 1.0), "cb_k5": (2.0, 1.0), "deadline_143ms": (0.0, 2.0)}
    safety = budget.SAFETY
    # Plenty of time: everything requested.
    assert budget.choose_frames(1e6, costs, 100, 20) == (100, True)
    assert budget.choose_frames(float("inf"), costs, 100, 20) == (100, True)
    # Time for 30 frames of all three: fewer frames, the deadline_143ms run kept.
    assert budget.choose_frames(safety * (2 + 30 * 4) + 1e-6, costs, 100, 20) == (30, True)
    # 15 frames with it, 30 without: it goes, and the frames the others fit are run.
    assert budget.choose_frames(safety * (2 + 30 * 2) + 1e-6, costs, 100, 20) == (30, False)
    # Not even the minimum without it: what fits (the caller marks the run incomplete).
    assert budget.choose_frames(safety * (2 + 5 * 2) + 1e-6, costs, 100, 20) == (5, False)
    assert budget.choose_frames(1.0, costs, 100, 20) == (0, False)


def _runner(wall_s: list[float], tokens: list[int]) -> SimpleNamespace:
    frames = [
        SimpleNamespace(phase="warmup", wall_s=w, num_tokens=t)
        for w, t in zip(wall_s, tokens, strict=True)
    ]
    frames.append(SimpleNamespace(phase="measured", wall_s=100.0, num_tokens=0))
    return SimpleNamespace(frames=frames)


def test_method_costs_come_from_the_warmup_frames(budget) -> None:
    runners = [
        _runner([9.0, 1.0, 3.0], [30, 30, 30]),  # first frame dropped: mean 2 s
        _runner([9.0, 1.0, 1.0], [5, 30, 30]),  # serves M per frame: drains M / 30 = 1 frame
        _runner([9.0, 2.0, 2.0], [1, 10, 10]),  # serves 10 of 30: 2 drain frames per frame
    ]
    costs = budget.method_costs(runners, ["isolated", "cb_k5", "deadline_143ms"], 30, 3)
    assert costs["isolated"] == pytest.approx((0.0, 2.0))
    assert costs["cb_k5"] == pytest.approx((1.0, 1.0))
    # 3 frames to drain one request's 30 tokens, plus 2 per warm-up frame's backlog.
    assert costs["deadline_143ms"] == pytest.approx(((3 + 2 * 3) * 2.0, 3 * 2.0))


def test_rest_estimate_scales_with_compile_and_frame_time(budget) -> None:
    fast = {"ours_first_s": 1.0, "ours_second_s": 0.01}
    slow_compile = {"ours_first_s": 11.0, "ours_second_s": 0.01}
    slow_frames = {"ours_first_s": 1.09, "ours_second_s": 0.1}
    base = budget.rest_estimate(fast, 30, 3)
    assert budget.rest_estimate(slow_compile, 30, 3) == pytest.approx(
        base + budget.SAFETY * budget.COMPILE_FACTOR * 10.0
    )
    assert budget.rest_estimate(slow_frames, 30, 3) > 4 * base
    assert budget.rest_estimate(fast, 60, 3) > base
    assert budget.rest_estimate(fast, 30, 10) > base


def test_last_line_of_a_run_that_stopped_early(report) -> None:
    document = {"device": "NVIDIA H100 80GB HBM3", "openpi_equal": False, "complete": False}
    line = report.last_line({**document, "headline": None, "seventy_hz": None})
    assert LAST_LINE.match(line), line
    assert line == (
        "gpu_bench device=NVIDIA_H100_80GB_HBM3 action_hz=nan tokens_per_s=nan "
        "speedup_vs_isolated=nan chunk_every_143ms=no openpi_equal=no complete=no"
    )


def test_without_matplotlib_there_is_no_png_and_a_line_says_so(
    report, monkeypatch, tmp_path: Path, capsys
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    png = tmp_path / "r.png"
    assert report.plot({"device": "cpu", "results": []}, png) is False
    assert not png.exists()
    assert "matplotlib not importable: no r.png" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:`flax.nnx.State` will be deprecated:DeprecationWarning")
def test_the_equality_fails_when_openpi_holds_other_parameters() -> None:
    """Negative control: openpi's Pi0 with other perturbed leaves than the engine's model."""
    equality = load_benchmark("openpi_equality")
    from oxygen_ros.engine.config import get_model_config
    from oxygen_ros.engine.model import create_model

    model = create_model(get_model_config("tiny"), seed=0)
    ours, replaced = equality.perturb_zero_params(model, seed=1)
    other, _ = equality.perturb_zero_params(model, seed=2)
    assert replaced > 0
    record = equality.compare(other, equality.equality_engine(ours))
    assert record["openpi_equal"] is False
    assert record["max_abs_diff"] > 100 * record["tolerance"]
