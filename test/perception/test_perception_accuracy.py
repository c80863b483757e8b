"""benchmarks/perception_accuracy.py on a freshly generated demonstration: it restores the
simulator's pose from each recorded physics state and scores both grasp windows against it."""

from __future__ import annotations

import json

from benchmark_module import load_benchmark

from oxygen_ros.sim import generate_demos, tasks


def test_the_benchmark_scores_a_carried_cube_against_the_simulator(tmp_path) -> None:
    """A move the expert carries: the current window keeps the cube's height within 1 cm of
    the simulator's on every lifted frame, and both windows are scored on the same frames."""
    seed = next(s for s in range(4000, 4100) if tasks.sample_episode(s).action == "move")
    generate_demos.generate(tmp_path / "demos", 1, seed, workers=1, expert="reactive")
    bench = load_benchmark("perception_accuracy")
    out = tmp_path / "accuracy.json"
    assert bench.main(["--data", str(tmp_path / "demos"), "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["episodes"] == 1
    current, before = result["summary"]["current"], result["summary"]["before"]
    assert current["lifted"]["frames"] >= 5  # the carry was seen as lifted by the simulator
    assert current["lifted"]["frames"] == before["lifted"]["frames"]
    assert current["lifted"]["z_off_share"] == 0.0
    assert current["lifted"]["z_err_p90_mm"] < 6.0
    assert current["free"]["xy_err_p50_mm"] < 5.0  # resting cubes are where the camera sees them
