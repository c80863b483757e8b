"""soak's figures from what the observer, the sampler and the database hold: the invariants,
the recovery after each fault, growth of RSS and file descriptors, the episodes outside the
fault windows against the control (Fisher's exact test), the PNG timeline and the last line.
"""

from __future__ import annotations

import math
import sqlite3
from pathlib import Path

END_GRACE_S = 20.0  # requests sent this close to the end may still be running: not judged
RECOVERY_LIMIT_S = 120.0  # a fault not recovered from within this is reported as such


def db_entries(path: Path) -> dict[int, tuple[str, str]]:
    """The memory database's rows (read only, after the graph stopped): id -> (text, request)."""
    if not path.is_file():
        return {}
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        rows = db.execute("select entry_id, text, request_id from memory")
        return {int(r[0]): (r[1], r[2]) for r in rows}


def recoveries(injected: list[dict], chunks: list[tuple[int, float, float]]) -> list[dict]:
    """Per fault: seconds from its start to the first chunk made from an observation newer
    than the sim time at its end (a fresh chunk), received after its end (a fault without an
    end, a kill never restarted, recovers never)."""
    out = []
    for fault in injected:
        if "end_wall" not in fault:
            out.append({**fault, "recover_s": math.nan})
            continue
        fresh = next(
            (
                wall
                for _, wall, stamp in chunks
                if wall >= fault["end_wall"] and stamp > fault["sim_at_end"]
            ),
            math.nan,
        )
        recover = fresh - fault["start_wall"]
        out.append({**fault, "recover_s": recover if recover <= RECOVERY_LIMIT_S else math.nan})
    return out


def judged_requests(
    requests: dict, sent: list, kills: list[float], end_wall: float
) -> dict[str, object]:
    """Every accepted request must end with exactly one final message. Not judged: those still
    running within END_GRACE_S of the end, and those the killed inference process held (first
    seen before a kill of inference, no final before it: that process is gone)."""
    judged = missing = duplicate = held_by_kill = 0
    missing_requests = []
    for request_id, request in requests.items():
        final_wall = request.final_wall
        killed = any(
            request.first_wall <= k and not final_wall <= k
            for k in kills  # nan <= k: False
        )
        if request.finals == 0 and killed:
            held_by_kill += 1
            continue
        if request.finals == 0 and request.first_wall > end_wall - END_GRACE_S:
            continue
        judged += 1
        if request.finals == 0:
            missing += 1
            missing_requests.append(
                {
                    "id": request_id,
                    "source": request.source,
                    "first_wall": request.first_wall,
                    "tokens": request.tokens,
                    "last_wall": request.last_wall,
                }
            )
        elif request.finals > 1:
            duplicate += 1
    accepted = sum(1 for s in sent if s[2])
    refused = [s for s in sent if not s[2]]
    reasons: dict[str, int] = {}
    for s in refused:
        reasons[s[3]] = reasons.get(s[3], 0) + 1
    return {
        "judged": judged,
        "missing_finals": missing,
        "duplicate_finals": duplicate,
        "held_by_a_killed_process": held_by_kill,
        "missing_requests": missing_requests[:20],
        "service_sent": len(sent),
        "service_accepted": accepted,
        "service_refused_reasons": reasons,
        "node_requests": sum(1 for r in requests.values() if r.source == "node"),
    }


def growth(samples: dict[str, list], start_wall: float, end_wall: float) -> dict[str, dict]:
    """Per process (the instance alive at the end): RSS and fds at `start_wall` (the first
    sample at or after it, of that instance) against the last; relative growth."""
    out = {}
    for name, rows in samples.items():
        if not rows:
            continue
        pid = rows[-1][1]
        mine = [r for r in rows if r[1] == pid and r[0] >= start_wall and r[0] <= end_wall]
        if len(mine) < 2:
            continue
        first, last = mine[0], mine[-1]
        out[name] = {
            "pid": pid,
            "rss_mb_from": round(first[2], 1),
            "rss_mb_to": round(last[2], 1),
            "rss_growth": (last[2] - first[2]) / first[2] if first[2] else math.nan,
            "rss_mb_max": round(max(r[2] for r in mine), 1),
            "fds_from": first[3],
            "fds_to": last[3],
            "fds_growth": (last[3] - first[3]) / first[3] if first[3] else math.nan,
            "threads_from": first[4],
            "threads_to": last[4],
            "restarted": len({r[1] for r in rows}) - 1,
        }
    return out


def episodes_outside(episodes: list, windows: list[tuple[float, float]]) -> list:
    """Episodes that overlap no fault window."""
    return [e for e in episodes if all(e.end_wall < a or e.start_wall > b for a, b in windows)]


def fisher_exact(a: int, b: int, c: int, d: int) -> float:
    """Two-sided p of Fisher's exact test on [[a, b], [c, d]] (successes, failures per group)."""
    n1, n2, k = a + b, c + d, a + c
    total = math.comb(n1 + n2, k)

    def p(x: int) -> float:
        return math.comb(n1, x) * math.comb(n2, k - x) / total

    observed = p(a)
    low, high = max(0, k - n2), min(k, n1)
    return min(1.0, sum(p(x) for x in range(low, high + 1) if p(x) <= observed * (1 + 1e-9)))


def last_line(summary: dict) -> str:
    def fmt(value: float, digits: int) -> str:
        return "nan" if value is None or not math.isfinite(value) else f"{value:.{digits}f}"

    return (
        f"soak minutes={fmt(summary['minutes'], 1)} lost_entries={summary['lost_entries']} "
        f"missing_finals={summary['missing_finals']} expired_rows={summary['expired_rows']} "
        f"nan={summary['nan']} rss_growth={fmt(summary['rss_growth'], 3)} "
        f"recover_max_s={fmt(summary['recover_max_s'], 1)}"
    )


def plot(document: dict, png: Path) -> bool:
    """Timeline: RSS per process, action chunks per 10 s, episodes and the faults."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"matplotlib not importable: no {png.name}")
        return False
    phases = [p for p in ("soak", "control") if p in document["phases"]]
    fig, axes = plt.subplots(3, len(phases), figsize=(7 * len(phases), 8), squeeze=False)
    for col, name in enumerate(phases):
        phase = document["phases"][name]
        t0 = phase["timeline"]["t0"]
        ax = axes[0][col]
        for proc, rows in phase["timeline"]["rss"].items():
            ax.plot([(r[0] - t0) / 60 for r in rows], [r[1] for r in rows], label=proc)
        ax.set_ylabel("RSS (MB)")
        ax.set_title(f"{name}: {phase['minutes']:.1f} min")
        ax.legend(fontsize=7)
        ax = axes[1][col]
        rate = phase["timeline"]["chunks_per_10s"]
        ax.plot([i / 6 for i in range(len(rate))], [n / 10 for n in rate], lw=0.8)
        ax.set_ylabel("new chunks / s")
        ax = axes[2][col]
        for e in phase["timeline"]["episodes"]:
            ax.plot(
                [(e[0] - t0) / 60, (e[1] - t0) / 60],
                [1 if e[2] else 0] * 2,
                color="tab:green" if e[2] else "tab:red",
                lw=4,
            )
        ax.set_yticks([0, 1], ["failed", "succeeded"])
        ax.set_xlabel("minutes")
        for fault in phase.get("faults", []):
            for row in axes:
                row[col].axvline((fault["start_wall"] - t0) / 60, color="grey", lw=0.5)
    fig.tight_layout()
    fig.savefig(png, dpi=90)
    plt.close(fig)
    return True
