"""oxygen_bench's pieces: the baseline shapes (benchmarks/oxygen_bench_protocol.py), the
speedup definitions, the steady state and the component bound
(benchmarks/oxygen_bench_metrics.py)."""

from __future__ import annotations

import argparse

import pytest
from benchmark_module import load_benchmark


@pytest.fixture(scope="module")
def oxygen_bench():
    """The entry: it puts its pieces on sys.path and imports them."""
    return load_benchmark("oxygen_bench")


@pytest.fixture(scope="module")
def protocol(oxygen_bench):
    return load_benchmark("oxygen_bench_protocol")


@pytest.fixture(scope="module")
def metrics(oxygen_bench):
    return load_benchmark("oxygen_bench_metrics")


def _args(**fields: object) -> argparse.Namespace:
    return argparse.Namespace(**{"slots": 8, "prefixes": 8, **fields})


def test_each_method_runs_at_the_shapes_a_user_would_give_it(protocol) -> None:
    setting = protocol.Setting
    schedule = [[30], [30, 30, 30], [], [30, 30]]
    shapes = {
        method: protocol.method_cache(
            "tiny", setting(method, 10, 30, "poisson"), _args(), schedule
        )
        for method in ("isolated", "shared_kv", "cb_k5", "deadline", "isolated_cb_shapes")
    }
    as_tuple = {m: (c.num_slots, c.num_prefixes) for m, c in shapes.items()}
    assert as_tuple == {
        "isolated": (1, 1),  # openpi's way: batch-1 shapes
        "shared_kv": (3, 1),  # the most requests one frame brings
        "cb_k5": (8, 8),
        "deadline": (8, 8),
        "isolated_cb_shapes": (8, 8),  # the old baseline, kept to show the difference
    }
    engine_default = shapes["cb_k5"].max_seq_len
    assert all(c.max_seq_len == engine_default for c in shapes.values())
    overrides = protocol.scheduler_overrides(setting("isolated_cb_shapes", 10, 30, "u1"), 1.0, 9)
    assert overrides == {"max_waiting": 9, "mode": "isolated"}


def test_the_headline_speedup_is_the_steady_state_with_wall_time_beside_it(metrics) -> None:
    def result(method: str, vocab: str, wall: float, steady: float) -> dict[str, object]:
        return {
            "method": method, "denoise_steps": 10, "max_tokens": 30, "arrival": "u1",
            "vocab": vocab, "e2e_wall_s": wall, "e2e_s": steady, "steady_s": steady,
            "action_hz": 10.0 / steady, "bound_e2e_s": steady / 2,
        }  # fmt: skip

    results = [
        result("isolated", "tokenizer", 4.0, 3.0),
        result("cb_k5", "tokenizer", 2.0, 1.0),
        result("cb_k5", "full", 1.0, 1.0),  # no isolated with the full head: no ratio
    ]
    metrics.add_speedups(results)
    cb, cb_full = results[1], results[2]
    assert cb["speedup"] == 2.0  # wall time: 4 / 2
    assert cb["speedup_steady"] == 3.0  # 3 / 1
    assert cb["act_speedup"] == pytest.approx(3.0)
    assert results[0]["speedup"] == 1.0
    assert cb_full["speedup"] is None and cb_full["speedup_steady"] is None
    assert "wall" in metrics.DEFINITIONS["speedup"]
    assert metrics.DEFINITIONS["speedup_steady"].startswith("headline, steady state")


def test_the_steady_state_stretches_a_window_that_falls_behind_and_never_shrinks(
    metrics,
) -> None:
    frames = [0.1] * 10
    assert metrics.steady_state_s(frames, 300, 300) == (pytest.approx(1.0), 1.0)
    behind, balance = metrics.steady_state_s(frames, 240, 300)  # pipeline not yet full
    assert balance == pytest.approx(0.8) and behind == pytest.approx(1.25)
    ahead, balance = metrics.steady_state_s(frames, 360, 300)  # warm-up tokens carried in
    assert balance == pytest.approx(1.2) and ahead == pytest.approx(1.0)
    assert metrics.steady_state_s(frames, 0, 300)[0] is None


def test_the_bound_charges_each_admission_the_extend_width_the_runner_uses(
    protocol, metrics
) -> None:
    components = {
        "prefill_s": 0.1,
        "denoise_s": 0.05,
        "extend_s": {1: 0.001, 2: 0.002, 4: 0.004, 8: 0.008},
        "decode_step_s": {1: 0.01, 8: 0.02},
    }

    def frame(num_admitted: int, num_extends: int, phase: str = "measured"):
        return protocol.FrameRecord(
            phase=phase, wall_s=1.0, has_actions=True, num_tokens=num_admitted,
            step_batches=[], num_prefills=1, num_extends=num_extends,
            num_admitted=num_admitted, num_decode_steps=0, num_compiles=0, rss_mb=0.0,
            timings={},
        )  # fmt: skip

    bound = metrics._bound_frame_s
    actions = 0.1 + 0.05
    assert bound(frame(0, 0), components) == pytest.approx(actions)
    assert bound(frame(3, 1), components) == pytest.approx(actions + 0.004)  # one 4-row extend
    assert bound(frame(10, 2), components) == pytest.approx(actions + 0.008 + 0.002)  # 8 + 2
    assert bound(frame(3, 3), components) == pytest.approx(actions + 3 * 0.001)  # one by one
    assert bound(frame(3, 1, "drain"), components) == pytest.approx(0.004)  # language only
