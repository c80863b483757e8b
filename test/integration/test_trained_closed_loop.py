"""The shipped model acting through the whole ROS graph (workcell_sim -> perception ->
inference -> /oxygen/actions -> workcell_sim) with subtask, narration and memory requests
running: `benchmarks/closed_loop.py` in its own process on held-out seeds.

Checked: the graph brings the shipped checkpoint up from `package://` (its own tokenizer, the
96 px perception resolution, 0.1 s rows), actions flow without starvation, periodic subtasks
are spoken and name the phase the sim is in, memory entries state the episode's facts.
Thresholds from the measured rates (docs/TRAINING.md, 10 held-out episodes: subtask 86.9 % of
289, memory 96.7 % of 30). Memory is requested every second here, not every 5 s as the YAML
has it: two episodes at 5 s give about 5 entries, too few for a rate (3 of 5 failed one CI
run). Task success is not asserted: the shipped model does not do the tasks yet (0/10), the
open part of issue 10.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
SEED_START = 0  # held out: training used seeds 1000-1189
EPISODES = 2
SUBTASK_ACCURACY_MIN = 0.7
MEMORY_ACCURACY_MIN = 0.7
MEMORY_PERIOD_S = 1.0


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("closed_loop") / "result.json"
    command = [
        sys.executable, "-P", str(ROOT / "benchmarks" / "closed_loop.py"),
        "--policy", "model", "--episodes", str(EPISODES), "--seed-start", str(SEED_START),
        "--real-time-factor", "1.0", "--out", str(out), "--log-dir", str(out.parent / "logs"),
        "--ros-arg", f"inference:memory_period_s:={MEMORY_PERIOD_S}",
    ]  # fmt: skip
    done = subprocess.run(
        command, env=dict(os.environ), capture_output=True, text=True, timeout=900, check=False
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(out.read_text())


def test_actions_flow_from_the_shipped_checkpoint(run) -> None:
    summary = run["summary"]
    assert summary["starvation_events_total"] == 0
    for episode in run["episodes"]:
        assert episode["chunks"] >= 5 * episode["elapsed_s"], episode  # ~10 new chunks/s
        assert episode["furthest_stage"] >= 0


def test_speech_names_the_phase_and_memory_the_facts(run) -> None:
    summary = run["summary"]
    assert summary["subtasks_spoken"] >= 8 * EPISODES  # every 0.5 s, episodes last >= 12 s
    assert summary["subtask_accuracy"] >= SUBTASK_ACCURACY_MIN, run["episodes"]
    assert summary["narrations_spoken"] >= 2 * EPISODES
    assert summary["memories_written"] >= 8 * EPISODES
    examples = [e["spoken_examples"] for e in run["episodes"]]
    assert summary["memory_accuracy"] >= MEMORY_ACCURACY_MIN, examples
