"""oxygen_ros engine: pi0.5 (openpi, JAX) as a multi-task robot brain, ROS-free.

Public names are listed in `__all__`. Types and configs import without JAX; the model side
(`Engine`, `Pi05Model`, model functions) is imported lazily on first use, so nodes that only
convert messages to engine types do not pay for importing JAX and openpi.

Invariant: nothing under `oxygen_ros.engine` imports rclpy or message modules.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from oxygen_ros.engine.config import (
    CacheConfig,
    EngineConfig,
    LanguageTaskConfig,
    ModelConfig,
    NormConfig,
    PromptConfig,
    SchedulerConfig,
    get_engine_config,
    get_model_config,
)
from oxygen_ros.engine.types import (
    ActionResult,
    AddResult,
    EngineStats,
    FrameResult,
    FrameTimings,
    LanguageRequest,
    Observation,
    RequestKind,
    RequestOutput,
    RequestStatus,
)

if TYPE_CHECKING:
    from oxygen_ros.engine.checkpoint import CheckpointError
    from oxygen_ros.engine.engine import Engine
    from oxygen_ros.engine.model import Pi05Model

_LAZY = {
    "Engine": "oxygen_ros.engine.engine",
    "Pi05Model": "oxygen_ros.engine.model",
    "CheckpointError": "oxygen_ros.engine.checkpoint",
}

__all__ = [
    "ActionResult",
    "AddResult",
    "CacheConfig",
    "CheckpointError",
    "Engine",
    "EngineConfig",
    "EngineStats",
    "FrameResult",
    "FrameTimings",
    "LanguageRequest",
    "LanguageTaskConfig",
    "ModelConfig",
    "NormConfig",
    "Observation",
    "Pi05Model",
    "PromptConfig",
    "RequestKind",
    "RequestOutput",
    "RequestStatus",
    "SchedulerConfig",
    "get_engine_config",
    "get_model_config",
]


def __getattr__(name: str) -> object:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
