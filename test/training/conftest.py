"""Fixtures of the training tests; episode helpers live in demo_episodes.py."""

from __future__ import annotations

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))
# The engine tests' factories (perturbed models, the bundled tokenizer for openpi).
sys.path.insert(0, str(pathlib.Path(__file__).parents[1] / "engine"))

from demo_episodes import SEEDS, write_episode


@pytest.fixture(scope="session")
def demos_dir(tmp_path_factory) -> pathlib.Path:
    directory = tmp_path_factory.mktemp("demos")
    for index, seed in enumerate(SEEDS):
        write_episode(directory, index, seed)
    return directory
