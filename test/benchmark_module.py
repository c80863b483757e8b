"""Loads a benchmarks/ script as a module for its tests: benchmarks/ is no package, and some
scripts put the source tree first on sys.path when they load, so the caller's order is put back."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load_benchmark(name: str) -> ModuleType:
    """benchmarks/<name>.py, loaded once per process (later calls return the same module)."""
    if name in sys.modules:
        return sys.modules[name]
    saved = list(sys.path)
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    try:
        sys.path.insert(0, str(BENCHMARKS))
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    finally:
        sys.path[:] = saved
    return module
