"""benchmarks/soak's pure pieces: the fault schedule (soak_faults), and the figures
(soak_report): recovery after a fault, which requests are judged, growth, the episodes outside
the fault windows, Fisher's exact test and the last line. The soak itself runs in
test/integration/test_soak.py."""

from __future__ import annotations

import math
import re
import sqlite3
from types import SimpleNamespace

import pytest
from benchmark_module import load_benchmark
from scipy import stats

faults = load_benchmark("soak_faults")
report = load_benchmark("soak_report")
monitor = load_benchmark("soak_monitor")
LAST_LINE = re.compile(
    r"^soak minutes=[0-9.]+ lost_entries=\d+ missing_finals=\d+ expired_rows=\d+ nan=\d+ "
    r"rss_growth=(-?[0-9.]+|nan) recover_max_s=([0-9.]+|nan)$"
)


def test_the_preset_kills_before_a_sixth_then_cycles_the_other_faults() -> None:
    schedule = faults.schedule("schedule", 60)
    kills = [f for f in schedule if f.name.startswith("kill_")]
    assert [f.name for f in kills] == ["kill_inference", "kill_perception"] * 2
    assert all(60 <= f.at_s <= 600 - 60 for f in kills)
    rest = [f for f in schedule if not f.name.startswith("kill_")]
    assert rest[0].at_s >= 600 and rest[-1].at_s <= 3600 - 60
    assert {f.name for f in rest} == set(faults.CYCLE)
    assert len(rest) >= 5 * 10  # a cycle every 4 minutes over 48 minutes
    assert [f.at_s for f in schedule] == sorted(f.at_s for f in schedule)
    short = faults.schedule("schedule", 3)  # too short for a cycle: the kills only
    assert [f.name for f in short] == ["kill_inference", "kill_perception"] * 2
    assert faults.schedule("none", 60) == []


def test_a_custom_schedule_is_sorted_and_bad_ones_refused() -> None:
    schedule = faults.schedule("dds_cut@90, kill_inference@40s", 2)
    assert [(f.name, f.at_s, f.duration_s) for f in schedule] == [
        ("kill_inference", 40.0, 0.0),
        ("dds_cut", 90.0, 2.0),
    ]
    with pytest.raises(ValueError, match="unknown fault"):
        faults.schedule("kill_sim@10", 2)
    with pytest.raises(ValueError, match="outside the run"):
        faults.schedule("dds_cut@200", 2)


def test_recovery_is_the_first_fresh_chunk_after_the_fault() -> None:
    fault = {"name": "dds_cut", "start_wall": 100.0, "end_wall": 102.0, "sim_at_end": 50.0}
    chunks = [
        (1, 101.0, 49.0),  # during the fault
        (2, 103.0, 49.9),  # after it, from an observation made before its end: not fresh
        (3, 104.5, 50.1),  # the first fresh one
        (4, 105.0, 50.2),
    ]
    (out,) = report.recoveries([fault], chunks)
    assert out["recover_s"] == pytest.approx(4.5)
    (never,) = report.recoveries([fault], chunks[:2])
    assert math.isnan(never["recover_s"])
    # A kill ends when the new process starts; one never restarted never recovers.
    (unrestarted,) = report.recoveries([{"name": "kill_inference", "start_wall": 100.0}], chunks)
    assert math.isnan(unrestarted["recover_s"])


def _request(first: float, finals: int, final_wall: float = math.nan, source: str = "node"):
    return monitor.Request("narration", source, first, finals, final_wall, 1 if finals else -1)


def test_requests_need_exactly_one_final_unless_a_kill_or_the_end_held_them() -> None:
    requests = {
        "ok": _request(10.0, 1, 11.0),
        "twice": _request(12.0, 2, 13.0),
        "lost": _request(40.0, 0),  # after the kill: the new process lost it
        "killed": _request(29.0, 0),  # in flight when inference was killed at 30
        "done_before_kill": _request(28.0, 1, 29.5),
        "at_the_end": _request(95.0, 0),  # within END_GRACE_S of the end (100)
    }
    sent = [(10.0, "narration", True, "ok"), (11.0, "memory", False, "queue full")]
    judged = report.judged_requests(requests, sent, kills=[30.0], end_wall=100.0)
    assert judged["judged"] == 4  # ok, twice, lost, done_before_kill
    assert judged["missing_finals"] == 1
    assert [r["id"] for r in judged["missing_requests"]] == ["lost"]
    assert judged["missing_requests"][0]["first_wall"] == 40.0
    assert judged["duplicate_finals"] == 1
    assert judged["held_by_a_killed_process"] == 1
    assert judged["service_accepted"] == 1
    assert judged["service_refused_reasons"] == {"queue full": 1}


def test_growth_is_measured_on_the_instance_alive_at_the_end() -> None:
    samples = {
        # pid 1 killed at 50 s, pid 2 from 60 s on: its growth from 100 s (the start) to 300 s
        "inference": [
            (10.0, 1, 500.0, 40, 9),
            (60.0, 2, 300.0, 30, 8),
            (100.0, 2, 400.0, 40, 8),
            (300.0, 2, 420.0, 40, 9),
        ],
        "perception": [(5.0, 3, 100.0, 20, 4), (150.0, 3, 100.0, 20, 4), (290.0, 3, 99.0, 21, 4)],
    }
    out = report.growth(samples, start_wall=100.0, end_wall=300.0)
    assert out["inference"]["rss_growth"] == pytest.approx(0.05)
    assert out["inference"]["restarted"] == 1 and out["inference"]["pid"] == 2
    assert out["perception"]["rss_growth"] == pytest.approx(-0.01)
    assert out["perception"]["fds_growth"] == pytest.approx(0.05)


def test_episodes_overlapping_a_fault_window_are_left_out() -> None:
    def episode(start: float, end: float):
        return SimpleNamespace(start_wall=start, end_wall=end, success=True)

    episodes = [episode(0, 10), episode(12, 22), episode(24, 34), episode(40, 50)]
    outside = report.episodes_outside(episodes, [(20.0, 25.0)])
    assert [e.start_wall for e in outside] == [0, 40]


@pytest.mark.parametrize("table", [(8, 2, 1, 9), (30, 10, 28, 12), (5, 0, 0, 5), (0, 4, 0, 7)])
def test_fisher_exact_equals_scipys(table) -> None:
    a, b, c, d = table
    expected = stats.fisher_exact([[a, b], [c, d]]).pvalue
    assert report.fisher_exact(a, b, c, d) == pytest.approx(expected, rel=1e-9)


def test_the_last_line(tmp_path) -> None:
    summary = {
        "minutes": 60.02,
        "lost_entries": 0,
        "missing_finals": 0,
        "expired_rows": 0,
        "nan": 0,
        "rss_growth": 0.0123,
        "recover_max_s": math.nan,
    }
    line = report.last_line(summary)
    assert line == (
        "soak minutes=60.0 lost_entries=0 missing_finals=0 expired_rows=0 nan=0 "
        "rss_growth=0.012 recover_max_s=nan"
    )
    assert LAST_LINE.match(line)
    db = tmp_path / "memory.sqlite3"
    with sqlite3.connect(db) as conn:
        conn.execute("create table memory (entry_id integer primary key, text, request_id)")
        conn.executemany("insert into memory values (?, ?, ?)", [(3, "a", "m-1"), (7, "b", "m-2")])
    assert report.db_entries(db) == {3: ("a", "m-1"), 7: ("b", "m-2")}
    assert report.db_entries(tmp_path / "none.sqlite3") == {}
