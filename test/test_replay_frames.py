"""benchmarks/replay_frames.py end to end: recorded frames served to a real engine built from
the shipped run-38 checkpoint, the state put back in the checkpoint's order, and agreement
counted against the engine's own greedy words."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from benchmark_module import load_benchmark
from std_msgs.msg import Header

from oxygen_ros.engine.config import SchedulerConfig
from oxygen_ros.engine.engine import Engine
from oxygen_ros.engine.types import LanguageRequest, Observation, RequestKind
from oxygen_ros.perception import workcell_cubes
from oxygen_ros.sim import robot
from oxygen_ros.training import data, train

CHECKPOINT = Path(__file__).resolve().parents[1] / "models" / "workcell_run38"
INSTRUCTION = "pick up the red cube with the left arm"


def _frames(rng: np.random.Generator, resolution: tuple[int, int]):
    """Two ObservationFrame messages whose state names run in reverse of the checkpoint's
    order, and the canonical (checkpoint-order) state, images and masks of each."""
    from oxygen_ros.msg import ObservationFrame
    from oxygen_ros.nodes.common.conversions import rgb_image_msg, seconds_to_time

    names = [*robot.JOINT_NAMES, *workcell_cubes.TARGET_STATE_NAMES]
    slots = ["base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb"]
    messages, canonical = [], []
    for k in range(2):
        state = rng.uniform(-0.5, 0.5, len(names))
        pixels = rng.integers(0, 256, (len(slots), *resolution, 3), dtype=np.uint8)
        valid = [True, k == 0, True]
        stamp = seconds_to_time(20.0 + 0.1 * k)
        messages.append(
            ObservationFrame(
                header=Header(stamp=stamp),
                image_names=slots,
                images=[rgb_image_msg(p, stamp, "world") for p in pixels],
                image_valid=valid,
                joint_names=names[::-1],
                joint_positions=state[::-1].tolist(),
            )
        )
        canonical.append((state.astype(np.float32), dict(zip(slots, pixels, strict=True)), valid))
    return messages, canonical, slots


def test_replay_serves_recorded_frames_in_checkpoint_order(tmp_path, monkeypatch) -> None:
    closed_loop = load_benchmark("closed_loop_evaluator")  # save_frames
    replay = load_benchmark("replay_frames")
    preset = data.model_preset("", "target")
    engine = Engine(
        train.engine_config(
            str(CHECKPOINT), preset=preset, scheduler=SchedulerConfig(mode="shared_kv")
        )
    )
    resolution = engine.config.model.image_resolution
    messages, canonical, slots = _frames(np.random.default_rng(3), resolution)

    def said(k: int, kind: RequestKind) -> str:
        state, images, valid = canonical[k]
        observation = Observation(
            images=images,
            image_masks=dict(zip(slots, valid, strict=True)),
            state=state,
            prompt=INSTRUCTION,
            stamp=20.0 + 0.1 * k,
        )
        result = engine.step(observation, [LanguageRequest(kind)])
        return next(o.text for o in result.outputs).strip()

    subtask, narration = said(0, RequestKind.SUBTASK), said(1, RequestKind.NARRATION)
    memory = said(1, RequestKind.MEMORY)
    spoken = [
        (0, subtask, 20.0),  # agrees
        (1, narration + " and more", 20.1),  # the positive control: a disagreement
        (0, subtask, 19.0),  # from before the recording began: not served
    ]
    closed_loop.save_frames(
        tmp_path / "seed_4.npz", messages, 19.5, INSTRUCTION, spoken, [(memory, 20.1)]
    )

    served: list[Observation] = []
    step = Engine.step

    def recording_step(self, observation, *args, **kwargs):
        served.append(observation)
        return step(self, observation, *args, **kwargs)

    monkeypatch.setattr(Engine, "step", recording_step)
    out = tmp_path / "replay.json"
    argv = ["--frames", str(tmp_path), "--checkpoint", str(CHECKPOINT), "--out", str(out)]
    assert replay.main([*argv, "--object-state", "target"]) == 0

    got = json.loads(out.read_text())
    assert [(r["kind"], r["agree"]) for r in got["outputs"]] == [
        ("subtask", True),
        ("narration", False),
        ("memory", True),
    ]
    assert got["outputs"][1]["offline"] == narration
    assert got["agreement"] == pytest.approx(2 / 3)
    assert got["agreement_by_kind"] == {"memory": 1.0, "narration": 0.0, "subtask": 1.0}
    # What the engine was served: the checkpoint's state order, the images and their masks.
    assert [o.stamp for o in served] == pytest.approx([20.0, 20.1, 20.1])
    for observation, k in zip(served, (0, 1, 1), strict=True):
        state, images, valid = canonical[k]
        np.testing.assert_allclose(observation.state, state, rtol=0, atol=1e-6)
        assert observation.image_masks == dict(zip(slots, valid, strict=True))
        for slot in slots:
            np.testing.assert_array_equal(observation.images[slot], images[slot])
        assert observation.prompt == INSTRUCTION
