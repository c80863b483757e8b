"""The shipped model acting through the whole ROS graph (workcell_sim -> perception ->
inference -> /oxygen/actions -> workcell_sim) with subtask, narration and memory requests
running: `benchmarks/closed_loop.py` in its own process on held-out seeds, with nothing but the
workcell profile's defaults (config/workcell.yaml: run 64 of the one-frequency DAgger line,
models/workcell_run64, fed the instructed cube's pose and offsets in metres by perception's
`cube_state: target_m`).

Checked: the graph brings the checkpoint up from `package://` (its own tokenizer, state layout
and delta actions, the 96 px perception resolution), actions flow without starvation, periodic
subtasks are spoken and name the phase the sim is in, memory entries state the episode's facts.
Thresholds from the measured rates (docs/TRAINING.md "Scheduler modes through ROS: run 64":
80 episodes on seeds 0-9, subtask right in 68-83 % per setting, one episode as low as 33 %):
every pool of three of those episodes from one setting is right in at least 45.1 % of its
subtasks (960 pools; 99 % of them at least 52.9 %), so three episodes and 45 % are asserted;
memory entries are true in 78-100 % per setting. Memory is requested every second here, not
every 5 s as the YAML has it, so that three episodes give enough entries for a rate. Task
success is not asserted: at run 64's 61 % through ROS (49 of 80) three episodes finish none with
a probability of 6 %; the success guard is test/trained/test_line_checkpoint_rollouts.py (12
episodes without ROS), and issue 10's bar is not met.
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
SEED_START = 0  # held out: run 64 trained on seeds 1000-1999, 120-239 and 920-979
EPISODES = 3
SUBTASK_ACCURACY_MIN = 0.45
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
    # requested every 0.5 s (subtask), 2 s (narration), MEMORY_PERIOD_S (memory) of sim time;
    # an episode that succeeds ends early (the shortest in run 64's grid: 4.0 s)
    sim_s = sum(e["elapsed_s"] for e in run["episodes"])
    assert summary["subtasks_spoken"] >= 1.5 * sim_s
    assert summary["subtask_accuracy"] >= SUBTASK_ACCURACY_MIN, run["episodes"]
    assert summary["narrations_spoken"] >= 0.3 * sim_s
    assert summary["memories_written"] >= 0.6 * sim_s / MEMORY_PERIOD_S
    examples = [e["spoken_examples"] for e in run["episodes"]]
    assert summary["memory_accuracy"] >= MEMORY_ACCURACY_MIN, examples
