"""The workcell profile's checkpoint (config/workcell.yaml's inference checkpoint_dir: run 76
of the one-frequency DAgger line, run 69's actions with its language head trained on the
learner's own episodes, models/workcell_run76) through the engine, no ROS: what it says at the
first frame of held-out episodes (seeds never trained on: its line's demonstrations used seeds
1000-1999, its DAgger rounds 920-979, 120-239, 300-359, 1000-1059 and 1180-1419;
docs/TRAINING.md "Runs 62-66", "Runs 67-68", "Run 69", "Run 73", "Runs 75-76").

The checkpoint, its preset and its object state are read from the YAML, so this test follows
the default. Asserted is what the checkpoint measurably does: at the first frame of 40
held-out episodes (seeds 0-39) its subtask, narration and memory entry equal the expert's texts
in 40 of 40 (checked when it became the default); the eight seeds here cover every template.
Its closed-loop success is tested in test_line_checkpoint_rollouts.py (without ROS) and
test/integration/test_trained_closed_loop.py (through ROS).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from oxygen_ros import graph
from oxygen_ros.engine.config import SchedulerConfig
from oxygen_ros.engine.engine import Engine
from oxygen_ros.engine.types import LanguageRequest
from oxygen_ros.perception import workcell_cubes
from oxygen_ros.resources import resolve_path
from oxygen_ros.sim import language, tasks
from oxygen_ros.sim.workcell import Workcell, WorkcellConfig
from oxygen_ros.training import data, train

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
PROFILE = yaml.safe_load((ROOT / "config" / "workcell.yaml").read_text())
INFERENCE = graph.node_parameters(PROFILE, "inference")
PERCEPTION = graph.node_parameters(PROFILE, "perception")
CHECKPOINT = resolve_path(INFERENCE["checkpoint_dir"])
ASSETS = Path(CHECKPOINT) / "assets" / INFERENCE["assets_id"]
SEEDS = (0, 1, 2, 3, 4, 5, 10, 11)  # held out; every template among them


@pytest.fixture(scope="module")
def engine() -> Engine:
    config = train.engine_config(
        CHECKPOINT,
        INFERENCE["assets_id"],
        INFERENCE["model_preset"],
        scheduler=SchedulerConfig(mode="shared_kv"),
    )
    return Engine(config)


@pytest.fixture(scope="module")
def workcell():
    cell = Workcell(WorkcellConfig())
    yield cell
    cell.close()


def test_the_profile_serves_the_line_checkpoint() -> None:
    assert Path(CHECKPOINT).name == "workcell_run76"
    assert INFERENCE["model_preset"] == PERCEPTION["model_preset"] == "workcell_target_m_bins"
    assert PERCEPTION["cube_state"] == "target_m" and PERCEPTION["cube_state_camera"]


def test_held_out_first_frames_say_what_the_expert_says(engine, workcell) -> None:
    templates = set()
    for seed in SEEDS:
        spec = tasks.sample_episode(seed)
        templates.add(spec.template)
        observation = data.first_frame(
            workcell, spec, engine.config.model.image_resolution, PERCEPTION["cube_state"]
        )
        requests = [LanguageRequest(kind) for kind in data.LANGUAGE_KINDS]
        result = engine.step(observation, requests, noise=engine.make_noise(seed))
        said = {out.kind.value: out.text for out in result.outputs}
        expected = language.targets(spec, 0)
        assert said.keys() == expected.keys()
        for kind, text in said.items():
            assert language.same_text(text, expected[kind]), (seed, kind, text, expected[kind])
    assert templates == set(tasks.TEMPLATES)


def test_checkpoint_is_small_and_self_contained() -> None:
    root = Path(CHECKPOINT)
    size = sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
    assert size < 8 * 2**20, size
    for name in ("tokenizer.model", "norm_stats.json", "state_layout.json", "action_space.json"):
        assert (ASSETS / name).is_file(), name
    layout = json.loads((ASSETS / "state_layout.json").read_text())
    assert layout["joint_names"] == PROFILE["/**"]["ros__parameters"]["joint_names"]
    assert layout["state_extra_names"] == list(workcell_cubes.TARGET_METRES_STATE_NAMES)
    run = json.loads((root / "run.json").read_text())["config"]
    assert run["preset"] == INFERENCE["model_preset"] and run["object_state"] == "target_m"
