"""Distance to the physical limit: this machine's peaks and each component's roofline.

- `machine_peaks()` measures what this JAX backend reaches here: the matmul peak (float32
  `a @ b`, square sizes in `MATMUL_SIZES`, FLOP/s) and the memory bandwidth (a 256 MiB
  float32 array scaled into a new one, and summed; bytes/s). Both probes count their work
  with XLA's own cost analysis, as the components do, and keep the best of `runs` timings.
- `cost(lowered)` reads XLA's cost analysis of a compiled function: FLOPs and bytes accessed
  (operands + results of every fused op, as XLA counts them; not DRAM traffic measured by
  counters).
- XLA:CPU counts a gather's whole operand as read: embedding 8 token ids from the
  257,152-row table counts 65.8 MB (tiny preset, float32) although 8 rows are read. Every
  component that embeds tokens (prefill's prompt, extend's tails, decode's ids) would then
  look memory-bound on a table it barely touches. `embedding_overcount` gives those bytes
  (table minus the rows read), and `entry` subtracts them (`bytes_xla` keeps XLA's figure).
- `entry(lowered, seconds, peaks, overcount)` is one component's row: its FLOPs and bytes,
  arithmetic intensity, the roofline time max(FLOPs / peak FLOP/s, bytes / peak bytes/s),
  which bound limits it (`compute` or `memory`), and `roofline_fraction` = roofline time /
  measured time (1.0 = at the limit).

The peaks are what this probe reached in this run on a shared machine (another process on
the same cores lowers them, which raises every fraction); numbers from one run belong
together. Loaded by path (benchmarks/ is not a package); never imports the engine.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp

MATMUL_SIZES = (512, 1024, 2048)  # square float32 matmuls of the compute probe
BANDWIDTH_BYTES = 256 * 2**20  # one float32 array of the memory probe
TABLE_ROWS = 257_152  # openpi's Gemma embedding table (every variant)


def cost(lowered: jax.stages.Lowered) -> dict[str, float]:
    """XLA's FLOP and byte counts of a lowered function, compiled (not run)."""
    analysis = lowered.compile().cost_analysis()
    if isinstance(analysis, list | tuple):  # older JAX: one dict per device program
        analysis = analysis[0]
    return {
        "flops": float(analysis.get("flops", 0.0)),
        "bytes": float(analysis.get("bytes accessed", 0.0)),
    }


def _best_s(fn: Callable[[], object], runs: int) -> float:
    jax.block_until_ready(fn())  # compile + first touch
    best = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        best = min(best, time.perf_counter() - start)
    return best


def machine_peaks(runs: int = 5) -> dict[str, object]:
    """Best matmul FLOP/s and memory bytes/s this backend reaches here (see module doc)."""
    matmul = []
    for n in MATMUL_SIZES:
        a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
        fn = jax.jit(lambda x, y: x @ y)
        flops = cost(fn.lower(a, a))["flops"]
        seconds = _best_s(lambda fn=fn, a=a: fn(a, a), runs)
        matmul.append({"n": n, "flops": flops, "seconds": seconds, "flops_per_s": flops / seconds})
    x = jnp.ones((BANDWIDTH_BYTES // 4,), jnp.float32)
    memory = []
    for name, fn in (
        ("scale", jax.jit(lambda v: v * 1.000001)),
        ("sum", jax.jit(lambda v: jnp.sum(v))),
    ):
        moved = cost(fn.lower(x))["bytes"]
        seconds = _best_s(lambda fn=fn: fn(x), runs)
        memory.append(
            {"probe": name, "bytes": moved, "seconds": seconds, "bytes_per_s": moved / seconds}
        )
    return {
        "backend": jax.default_backend(),
        "device": jax.devices()[0].device_kind,
        "peak_flops_per_s": max(m["flops_per_s"] for m in matmul),
        "peak_bytes_per_s": max(m["bytes_per_s"] for m in memory),
        "matmul_probe": matmul,
        "memory_probe": memory,
        "runs": runs,
    }


def embedding_overcount(model_config: object, rows_read: int) -> float:
    """Bytes XLA counts beyond what one embedding gather of `rows_read` ids reads, for an
    engine `ModelConfig` (openpi's Gemma table: 257,152 rows x width, in `param_dtype`)."""
    import numpy as np
    import openpi.models.gemma as gemma

    width = gemma.get_config(model_config.paligemma_variant).width  # type: ignore[attr-defined]
    itemsize = np.dtype(model_config.param_dtype).itemsize  # type: ignore[attr-defined]
    return float((TABLE_ROWS - rows_read) * width * itemsize)


def entry(
    lowered: jax.stages.Lowered | Sequence[jax.stages.Lowered],
    seconds: float,
    peaks: dict[str, object],
    overcount: float = 0.0,
) -> dict[str, object]:
    """One component's roofline row (see the module docstring); a component made of several
    jitted calls (e.g. extend, then sampling the first ids) counts their sum, less
    `overcount` bytes (`embedding_overcount`)."""
    parts = [lowered] if isinstance(lowered, jax.stages.Lowered) else list(lowered)
    counted = [cost(part) for part in parts]
    flops = sum(c["flops"] for c in counted)
    xla_bytes = sum(c["bytes"] for c in counted)
    moved = xla_bytes - overcount
    compute_s = flops / float(peaks["peak_flops_per_s"])  # type: ignore[arg-type]
    memory_s = moved / float(peaks["peak_bytes_per_s"])  # type: ignore[arg-type]
    roofline_s = max(compute_s, memory_s)
    return {
        "flops": flops,
        "bytes": moved,
        "bytes_xla": xla_bytes,
        "intensity_flops_per_byte": flops / moved if moved else None,
        "measured_s": seconds,
        "roofline_s": roofline_s,
        "bound": "compute" if compute_s >= memory_s else "memory",
        "roofline_fraction": roofline_s / seconds if seconds > 0 else None,
        "achieved_flops_per_s": flops / seconds if seconds > 0 else None,
        "achieved_bytes_per_s": moved / seconds if seconds > 0 else None,
    }


def format_table(rows: dict[str, dict[str, object]], peaks: dict[str, object]) -> str:
    """Component table: time, GFLOP, MB, roofline time, bound and fraction."""
    header = ("component", "ms", "GFLOP", "MB", "roof_ms", "bound", "fraction")
    lines = [header]
    for name, row in rows.items():
        lines.append(
            (
                name,
                f"{1e3 * float(row['measured_s']):.2f}",
                f"{float(row['flops']) / 1e9:.3f}",
                f"{float(row['bytes']) / 1e6:.1f}",
                f"{1e3 * float(row['roofline_s']):.3f}",
                str(row["bound"]),
                f"{float(row['roofline_fraction']):.3f}",
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    text = ["  ".join(c.rjust(w) for c, w in zip(line, widths, strict=True)) for line in lines]
    text.insert(1, "-" * len(text[0]))
    peak_flops = float(peaks["peak_flops_per_s"]) / 1e9  # type: ignore[arg-type]
    peak_bw = float(peaks["peak_bytes_per_s"]) / 1e9  # type: ignore[arg-type]
    text.append(
        f"machine ({peaks['backend']}, {peaks['device']}): matmul peak {peak_flops:.1f} GFLOP/s, "
        f"memory {peak_bw:.1f} GB/s (this run's probe)"
    )
    return "\n".join(text)
