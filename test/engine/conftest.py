"""Session-scoped models for the engine tests; factories live in engine_factories.py.

One perturbed `tiny` model is built per session and shared; compiled model functions are
cached per `ModelConfig`, so every engine built on it reuses one compilation.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from engine_factories import TINY, make_engine_config, perturb_zero_params

from oxygen_ros.engine.config import EngineConfig, SchedulerConfig
from oxygen_ros.engine.model import Pi05Model, create_model


@pytest.fixture(scope="session")
def tiny_model() -> Pi05Model:
    """The `tiny` preset, seed 0, with its zero-initialised parameters perturbed."""
    return perturb_zero_params(create_model(TINY, seed=0), seed=1)


@pytest.fixture(scope="session")
def tiny_config() -> EngineConfig:
    """shared_kv mode: every request finishes in the frame it was passed to `step`."""
    return make_engine_config(scheduler=SchedulerConfig(mode="shared_kv"))
