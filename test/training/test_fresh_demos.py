"""Demonstrations generated straight into training arrays equal the written-then-loaded ones."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from oxygen_ros.engine.config import get_model_config
from oxygen_ros.sim import generate_demos, recorder
from oxygen_ros.training import data, fresh_demos

CONFIG = get_model_config("workcell_objects")


def _assert_episodes_equal(got: data.Episodes, want: data.Episodes) -> None:
    for field in dataclasses.fields(data.Episodes):
        a, b = getattr(got, field.name), getattr(want, field.name)
        if field.name == "images":
            assert a.keys() == b.keys()
            for key in a:
                np.testing.assert_array_equal(a[key], b[key], key)
        elif isinstance(a, np.ndarray):
            np.testing.assert_array_equal(a, b, field.name)
        else:
            assert a == b, field.name


def test_demo_set_parses_seeds_and_noise() -> None:
    assert fresh_demos.DemoSet.parse("1000:20") == fresh_demos.DemoSet(1000, 20, 0.0)
    assert fresh_demos.DemoSet.parse("3000:5:0.025") == fresh_demos.DemoSet(3000, 5, 0.025)
    assert fresh_demos.DemoSet.parse("3000:5:0.01:feedback") == fresh_demos.DemoSet(
        3000, 5, 0.01, "feedback"
    )
    for bad in ("1000", "1:2:3:plan:5", "a:2", "1:2:0:oracle"):
        with pytest.raises(ValueError):
            fresh_demos.DemoSet.parse(bad)


@pytest.mark.slow
def test_generated_arrays_equal_loading_the_files_generate_demos_writes(tmp_path) -> None:
    """Same seeds, same worker split (one fresh workcell), DART noise on the second set."""
    written = []
    for start, count, noise in ((1000, 2, 0.0), (3000, 1, 0.025)):
        out = tmp_path / f"{start}"
        generate_demos.generate(out, count, start, workers=1, command_noise_rad=noise)
        written.extend(recorder.list_episodes(out))
    want = data.load_episodes(written, CONFIG, object_state="positions")
    got, failed = fresh_demos.generate_episodes(
        [fresh_demos.DemoSet(1000, 2), fresh_demos.DemoSet(3000, 1, 0.025)],
        CONFIG,
        workers=1,
        object_state="positions",
    )
    assert failed == [] and got.seeds == [1000, 1001, 3000]
    _assert_episodes_equal(got, want)


def test_merged_episodes_equal_episodes_loaded_together(demos_dir) -> None:
    paths = recorder.list_episodes(demos_dir)
    config = get_model_config("workcell")
    together = data.load_episodes(paths, config)
    parts = [data.load_episodes([p], config) for p in paths]
    merged = data.merge_episodes(parts)
    _assert_episodes_equal(merged, together)
    # Positive control: the episode indices were renumbered (each part alone starts at 0).
    assert all(int(p.episode.max()) == 0 for p in parts)
    assert sorted(set(merged.episode.tolist())) == list(range(len(paths)))
    with pytest.raises(ValueError):
        data.merge_episodes([])
