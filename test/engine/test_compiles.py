"""The compile counter sees compilations (positive controls), and a warmed-up engine in a fresh
process serves every active count without compiling."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from oxygen_ros.engine import compiles

PROBE = Path(__file__).parent / "compile_probe.py"
PROBE_TIMEOUT_S = 400.0  # imports, model init and two rounds of compiles on 2 busy cores


def test_counter_moves_on_a_fresh_compilation_and_not_on_a_cache_hit() -> None:
    affine = jax.jit(lambda x: 2.0 * x + 1.0)  # a new function: nothing is cached for it
    x = np.arange(6, dtype=np.float32).reshape(2, 3)  # numpy inputs: no compilation to make
    before = compiles.num_compiles()
    np.testing.assert_array_equal(affine(x), 2.0 * x + 1.0)
    first = compiles.num_compiles()
    assert first >= before + 1
    affine(x + 1.0)  # same shape and dtype: a cache hit
    assert compiles.num_compiles() == first
    affine(x.reshape(3, 2))  # a new shape compiles again
    assert compiles.num_compiles() >= first + 1


CACHE_PROBE = """
import json, jax, numpy as np
from oxygen_ros.engine import compiles
hits = []
jax.monitoring.register_event_listener(
    lambda event, **_: hits.append(1) if event == "/jax/compilation_cache/cache_hits" else None
)
f = jax.jit(lambda x: jax.numpy.sin(x) * 3.0 + x)
x = np.arange(5, dtype=np.float32)
counts = [compiles.num_compiles()]
for _ in range(2):
    f(x).block_until_ready()
    counts.append(compiles.num_compiles())
    jax.clear_caches()  # the in-memory caches only: the next call asks for a compilation again
print(json.dumps({"counts": counts, "hits": len(hits)}))
"""


def persistent_cache_env(cache_dir: Path) -> dict[str, str]:
    """This process's environment with a persistent compilation cache in `cache_dir` that
    keeps every program, however fast it compiled and however small it is."""
    env = dict(os.environ, JAX_COMPILATION_CACHE_DIR=str(cache_dir))
    env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    env["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"
    return env


def run_cache_probe(cache_dir: Path) -> dict:
    env = persistent_cache_env(cache_dir)
    env["JAX_PLATFORMS"] = "cpu"
    proc = subprocess.run(
        [sys.executable, "-P", "-c", CACHE_PROBE],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_persistent_cache_load_counts_as_a_compilation(tmp_path: Path) -> None:
    """With a persistent compilation cache (what the node processes of the integration tests
    use), a jit cache miss may be served from disk without an XLA compilation: it still counts
    once. A fresh cache: the first call compiles, the second (after clear_caches) loads (the
    positive control: the cache event fires); a second process finds both in the cache: two
    loads, still two."""
    cold = run_cache_probe(tmp_path)
    assert cold["hits"] == 1, cold
    assert np.diff(cold["counts"]).tolist() == [1, 1], cold
    warm = run_cache_probe(tmp_path)
    assert warm["hits"] == 2, warm
    assert np.diff(warm["counts"]).tolist() == [1, 1], warm


@pytest.mark.slow
def test_a_warmed_up_engine_serves_every_active_count_without_compiling(tmp_path: Path) -> None:
    """compile_probe.py in a new process: warmup(), then 1..num_slots active requests and
    tail extends of every width.

    The probe runs with a fresh, empty persistent compilation cache, as the nodes run
    (bringup.py sets one): warmup() compiles (nothing is on disk yet) and writes what it
    compiled there; serving finds its programs in memory (a jit cache miss would count, be it
    an XLA compilation or a load from disk: test_a_persistent_cache_load_counts_as_a_
    compilation); the control after clear_caches() loads every program from disk, which counts
    once per program as a compilation does, instead of compiling it all a second time."""
    env = persistent_cache_env(tmp_path / "jax_cache")  # empty: warmup() compiles
    env.setdefault("JAX_PLATFORMS", "cpu")
    proc = subprocess.run(
        [sys.executable, "-P", str(PROBE)],
        env=env,
        capture_output=True,
        text=True,
        timeout=PROBE_TIMEOUT_S,
        check=False,
    )
    output = f"--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
    assert proc.returncode == 0, output
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["decode_sizes"] == [1, 1, 2, 2, 3, 3, 4, 4, 3, 3, 2, 2, 1, 1], output
    assert report["num_slots"] == 4, output
    assert report["extend_widths"] == [1, 1, 1, 1, 2, 4], output
    assert report["warmup"] > 0, output  # the warm-up compiled what a frame uses
    assert report["control"] > 0, output  # same process, same serving, after clear_caches()
    assert report["serve"] == 0, output
