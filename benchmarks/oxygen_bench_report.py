"""oxygen_bench's report: the JSON document, the printed table and lines, the plot.

`document` gathers a run (arguments, machine, definitions, peaks, component times, results,
the headline per language head and the best speedup); `print_summary` prints the table and
the lines after it, the last one `speedup_vs_isolated=<x>` (the headline's steady-state
speedup); `plot` draws action frequency against tokens/s per method (gpu_bench draws its own
results with it).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import platform
import time

import jax
from oxygen_bench_metrics import DEFINITIONS
from oxygen_bench_protocol import METHODS, max_rss_mb

HEADLINE = {"method": "cb_k5", "denoise_steps": 10, "max_tokens": 30, "arrival": "u1"}


COLUMNS = (
    ("method", "method", "{}"),
    ("N", "denoise_steps", "{}"),
    ("M", "max_tokens", "{}"),
    ("arr", "arrival", "{}"),
    ("fr_mean", "frame_ms_mean", "{:.0f}"),
    ("fr_p50", "frame_ms_p50", "{:.0f}"),
    ("fr_p99", "frame_ms_p99", "{:.0f}"),
    ("act_Hz", "action_hz", "{:.1f}"),
    ("tok/s", "tokens_per_s", "{:.0f}"),
    ("lat_p50", "latency_ms_p50", "{:.0f}"),
    ("lat_p99", "latency_ms_p99", "{:.0f}"),
    ("batch", "mean_batch", "{:.1f}"),
    ("comp", "compiles_after_warmup", "{}"),
    ("rss_MB", "peak_rss_mb", "{:.0f}"),
    ("e2e_s", "e2e_s", "{:.2f}"),
    ("steady_s", "steady_s", "{:.2f}"),
    ("tok_bal", "token_balance", "{:.2f}"),
    ("bound_s", "bound_e2e_s", "{:.2f}"),
    ("gap", "gap", "{:.2f}"),
    ("head", "vocab", "{}"),
    ("slots", "num_slots", "{}"),
    ("speedup", "speedup", "{:.2f}"),
    ("steady_x", "speedup_steady", "{:.2f}"),
    ("act_x", "act_speedup", "{:.2f}"),
)


def format_table(results: list[dict[str, object]]) -> str:
    rows = [[title for title, _, _ in COLUMNS]]
    for r in results:
        row = []
        for _, key, fmt in COLUMNS:
            value = r.get(key)
            if key == "max_tokens" and value is None:
                value = "5|20"
            row.append("-" if value is None else fmt.format(value))
        rows.append(row)
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    lines = [
        "  ".join(cell.rjust(width) for cell, width in zip(row, widths, strict=True))
        for row in rows
    ]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def plot(results: list[dict[str, object]], path: pathlib.Path, title: str) -> None:
    """Action frequency vs tokens/s, one panel per N; hollow markers: the computed bound."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = sorted({int(r["denoise_steps"]) for r in results}) or [0]  # type: ignore[call-overload]
    fig, axes = plt.subplots(
        1, len(steps), figsize=(6.5 * len(steps), 5.0), squeeze=False, sharey=True
    )
    markers = dict(zip(METHODS, "osD^v*", strict=True))
    colors = dict(zip(METHODS, plt.rcParams["axes.prop_cycle"].by_key()["color"], strict=False))
    for ax, n in zip(axes[0], steps, strict=True):
        for method in METHODS:
            points = [r for r in results if r["method"] == method and r["denoise_steps"] == n]
            if not points:
                continue
            style = {"marker": markers[method], "color": colors[method]}
            ax.scatter(
                [r["tokens_per_s"] for r in points],
                [r["action_hz"] for r in points],
                label=method,
                alpha=0.85,
                **style,
            )
            ax.scatter(
                [r["bound_tokens_per_s"] for r in points],
                [r["bound_action_hz"] for r in points],
                facecolors="none",
                edgecolors=colors[method],
                marker=markers[method],
                alpha=0.5,
            )
        ax.set_xlabel("language throughput [tokens/s]")
        ax.set_title(f"{title}, N={n} denoise steps (hollow: bound)", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0][0].set_ylabel("action frequency [Hz] (horizon / frame time)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def headlines(
    results: list[dict[str, object]], vocabs: list[str]
) -> dict[str, dict[str, object] | None]:
    """Per language head, the result of the HEADLINE setting (None where it did not run)."""
    return {
        vocab: next(
            (
                r
                for r in results
                if r["vocab"] == vocab and all(r[k] == v for k, v in HEADLINE.items())
            ),
            None,
        )
        for vocab in vocabs
    }


def document(
    args: argparse.Namespace,
    peaks: dict[str, object],
    components: dict[str, object],
    results: list[dict[str, object]],
    started: float,
) -> dict[str, object]:
    """The run's JSON document (`started`: `time.perf_counter()` when the run began)."""
    per_head = headlines(results, args.vocab)
    best = max(
        (r for r in results if r.get("speedup") is not None and r["method"] != "isolated"),
        key=lambda r: r["speedup"],  # type: ignore[arg-type, return-value]
        default=None,
    )
    return {
        "benchmark": "oxygen_bench",
        "mode": "quick" if args.quick else "full",
        "preset": args.preset,
        "args": {k: str(v) if isinstance(v, pathlib.Path) else v for k, v in vars(args).items()},
        "machine": {
            "cpu_count": os.cpu_count(),
            "platform": platform.platform(),
            "jax": jax.__version__,
            "jax_backend": jax.default_backend(),
            "devices": [str(d) for d in jax.devices()],
        },
        "definitions": DEFINITIONS,
        "machine_peaks": peaks,
        "components": components,
        "results": results,
        "headline": per_head[args.vocab[0]],
        "headline_per_head": per_head,
        "best_speedup": None
        if best is None
        else {"label": best["label"], "speedup": best["speedup"]},
        "max_rss_mb": max_rss_mb(),
        "wall_s": time.perf_counter() - started,
    }


def print_summary(
    document: dict[str, object], json_path: pathlib.Path, png_path: pathlib.Path
) -> None:
    """The table, the deadline lines, where the files are, the best speedup, the headlines;
    last `speedup_vs_isolated=<x>` (the headline's steady state; nan when it did not run)."""
    results = document["results"]
    assert isinstance(results, list)
    print(format_table(results))
    for r in results:
        if "p99_over_budget" in r:
            print(
                f"deadline {r['label']}: budget {r['budget_ms']:.0f} ms, p99 frame / budget = "
                f"{r['p99_over_budget']:.2f} (action-only frames alone: "
                f"{r['mandatory_p99_over_budget']:.2f})"
            )
    print(f"results: {json_path}  plot: {png_path}  ({document['wall_s']:.0f} s)")
    best = document["best_speedup"]
    if isinstance(best, dict):
        print(f"best speedup over the grid: {best['speedup']:.2f}x ({best['label']})")
    per_head = document["headline_per_head"]
    assert isinstance(per_head, dict)
    for vocab, r in per_head.items():
        if r is not None:
            print(
                f"headline ({r['label']}): wall-time speedup {r['speedup']:.2f}x, steady state "
                f"{r['speedup_steady']:.2f}x, action frequency {r['act_speedup']:.2f}x "
                f"(head: {vocab})"
            )
    headline = document["headline"]
    assert headline is None or isinstance(headline, dict)
    wall = headline.get("speedup") if headline is not None else None
    speedup = headline.get("speedup_steady") if headline is not None else None
    print(f"wall-time speedup of this finite run: {'nan' if wall is None else f'{wall:.2f}'}")
    print(f"speedup_vs_isolated={'nan' if speedup is None else f'{speedup:.2f}'}")
