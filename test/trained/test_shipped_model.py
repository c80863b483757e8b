"""The shipped checkpoint (models/workcell) through the engine, no ROS: what it says about the
first frame of held-out episodes (seeds never trained on: training used 1000-1189, see
models/workcell/run.json).

What is asserted is what the checkpoint measurably does (docs/TRAINING.md): the subtask and the
memory entry name the instructed cube. It does not yet choose the arm at home (narration and
first chunk at chance), so neither is asserted here; the closed-loop task success it lacks is
the open part of issue 10.
"""

from __future__ import annotations

import dataclasses

import pytest

from oxygen_ros.engine.config import SchedulerConfig
from oxygen_ros.engine.engine import Engine
from oxygen_ros.engine.types import LanguageRequest
from oxygen_ros.resources import resolve_path
from oxygen_ros.sim import language, tasks
from oxygen_ros.sim.workcell import Workcell, WorkcellConfig
from oxygen_ros.training import data, train

pytestmark = pytest.mark.slow
CHECKPOINT = resolve_path("package://oxygen_ros/models/workcell")
SEEDS = (0, 1, 2, 3, 4, 5, 10, 11)  # held out; every template among them


@pytest.fixture(scope="module")
def engine() -> Engine:
    config = train.engine_config(CHECKPOINT, scheduler=SchedulerConfig(mode="shared_kv"))
    return Engine(config)


@pytest.fixture(scope="module")
def workcell():
    cell = Workcell(WorkcellConfig())
    yield cell
    cell.close()


def test_held_out_first_frames_name_the_instructed_cube(engine, workcell) -> None:
    templates = set()
    for seed in SEEDS:
        spec = tasks.sample_episode(seed)
        templates.add(spec.template)
        observation = data.first_frame(workcell, spec, engine.config.model.image_resolution)
        requests = [LanguageRequest(kind) for kind in data.LANGUAGE_KINDS]
        result = engine.step(observation, requests, noise=engine.make_noise(seed))
        said = {out.kind.value: out.text for out in result.outputs}
        expected = language.targets(spec, 0)
        assert said["subtask"] == expected["subtask"], (seed, spec.instruction, said)
        assert said["memory"] == expected["memory"], (seed, spec.instruction, said)
        assert said["narration"].startswith("step 1 of "), said  # the phase count's form
    assert templates == set(tasks.TEMPLATES)


def test_checkpoint_is_small_and_self_contained() -> None:
    from pathlib import Path

    root = Path(CHECKPOINT)
    size = sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
    assert size < 8 * 2**20, size
    assert (root / "assets" / "workcell" / "tokenizer.model").is_file()
    assert (root / "assets" / "workcell" / "norm_stats.json").is_file()
    assert dataclasses.asdict(train.engine_config(CHECKPOINT))["model"]["name"] == "workcell"
