"""The shipped model acting through the whole ROS graph (workcell_sim -> perception ->
inference -> /oxygen/actions -> workcell_sim) with subtask, narration and memory requests
running: `benchmarks/closed_loop.py` in its own process on held-out seeds, with nothing but the
workcell profile's defaults (config/workcell.yaml: run 76 of the one-frequency DAgger line,
models/workcell_run76, fed the instructed cube's pose and offsets in metres by perception's
`cube_state: target_m`; the scheduler continuous with k = 5, real time).

Checked: the graph brings the checkpoint up from `package://` (its own tokenizer, state layout
and delta actions, the 96 px perception resolution), actions flow without starvation, the arm
finishes a task, periodic subtasks are spoken and name the phase the sim is in, memory entries
state the episode's facts. Thresholds from the measured rates (docs/TRAINING.md "Scheduler
modes through ROS: run 76 over 30 seeds" and "... over 60 seeds, slowed": 360 episodes over
the eight settings on seeds 0-29 and the four slowed ones on seeds 30-59, 327 finished (91 %),
one episode right in as few as 50 % of its subtasks). At a 9 % failure rate three episodes all
fail with a probability below 0.1 %, so at least one success is asserted. Over every pool of
three episodes from one setting (48,720 pools) the subtask is right in at least 59.7 %, and in
less than 70 % in 0.98 % of them; this test's seeds 0-2 were right in 87-97 % in every setting
and finished in all, so 70 % is asserted (run 69's grid, the same actions with the head before
run 73's training: pools down to 60 %). Memory is requested every second here (the YAML's
period is 5 s), so that three episodes give enough entries for a rate; an episode's entries
then grow with its length and one long episode weighs most: with run 73, seeds 0-9 at this
test's settings, all ten finishing, were true in 94 % (49 of 52; seeds 0-2: 17 of 20), while
one clean-clone CI run of this test measured 48 % (15 of 31 entries: its episodes ran longer),
so 30 % is asserted (random weights: 0 %).
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
SEED_START = 0  # held out: run 76's line trained on seeds 120-239, 300-359 and 920-1999
EPISODES = 3
SUBTASK_ACCURACY_MIN = 0.7
SUCCESSES_MIN = 1
MEMORY_ACCURACY_MIN = 0.3
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
    assert sum(e["success"] for e in run["episodes"]) >= SUCCESSES_MIN, run["episodes"]


def test_speech_names_the_phase_and_memory_the_facts(run) -> None:
    summary = run["summary"]
    # requested every 0.5 s (subtask), 2 s (narration), MEMORY_PERIOD_S (memory) of sim time;
    # an episode that succeeds ends early (the shortest in run 73's grid: 3.8 s)
    sim_s = sum(e["elapsed_s"] for e in run["episodes"])
    assert summary["subtasks_spoken"] >= 1.5 * sim_s
    assert summary["subtask_accuracy"] >= SUBTASK_ACCURACY_MIN, run["episodes"]
    assert summary["narrations_spoken"] >= 0.3 * sim_s
    assert summary["memories_written"] >= 0.6 * sim_s / MEMORY_PERIOD_S
    episodes = [
        {k: e[k] for k in ("seed", "success", "elapsed_s", "memories_correct", "memories_written")}
        | {"memory": [x for x in e["spoken_examples"] if x.startswith("memory")]}
        for e in run["episodes"]
    ]
    assert summary["memory_accuracy"] >= MEMORY_ACCURACY_MIN, episodes
