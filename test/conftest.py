"""Shared fixtures. Every test run gets its own ROS domain id, LOCALHOST discovery and a
private log directory, set before anything imports rclpy."""

from __future__ import annotations

import os
import re
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from harness import (
    JAX_TEST_CACHE,
    ProcessLauncher,
    SpinningNode,
    domain_id_for,
    prune_cache,
    ros_test_env,
)

# The run's own ROS domain (per pytest-xdist worker: `harness.domain_id_for`).
_WORKER = os.environ.get("PYTEST_XDIST_WORKER")  # unset without xdist and in its controller
_DOMAIN_ID = domain_id_for(dict(os.environ))
_LOG_DIR = Path(tempfile.mkdtemp(prefix="oxygen_ros_test_log_"))
os.environ.update(ros_test_env(_LOG_DIR, _DOMAIN_ID))
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# One persistent XLA cache for this process and every node process the tests start, outside
# the clone so that a later clone on the same machine reuses it (a cache hit is keyed on the
# HLO, the flags and the JAX version: deterministic). Tests about the cache itself set their
# own directory. Every compilation is kept, not only those over JAX's default 1 s. Its size is
# bounded here, before the run (JAX's own bound, JAX_COMPILATION_CACHE_MAX_SIZE, fails every
# later write once one process wrote without it).
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(JAX_TEST_CACHE))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
if _WORKER is None:  # once per run: xdist's controller prunes before its workers start
    prune_cache(Path(os.environ["JAX_COMPILATION_CACHE_DIR"]), max_bytes=4 * 2**30)
if "jax" in sys.modules:  # a plugin imported JAX before this file: its config is read already
    import jax

    jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)


@pytest.fixture(scope="session")
def ros_domain_id() -> int:
    return _DOMAIN_ID


@pytest.fixture
def launcher(tmp_path: Path):
    """Starts node processes for one test and stops them (SIGINT, then kill) afterwards."""
    pl = ProcessLauncher(env=ros_test_env(_LOG_DIR, _DOMAIN_ID), workdir=tmp_path)
    yield pl
    pl.stop_all()


@pytest.fixture
def ros_node(request):
    """An rclpy node in the test process, spinning in a background thread."""
    node = SpinningNode(re.sub(r"\W", "_", f"test_{request.node.name}")[:60])
    yield node
    node.close()


def pytest_collection_modifyitems(config, items) -> None:
    """Files with slow tests first (stable: each file's own order is kept). Under pytest-xdist
    this orders only files with as many tests: `--dist loadfile` hands out files by their number
    of tests, most first (its `--loadscope-reorder`, on by default). Handing them out longest
    first instead (`--no-loadscope-reorder`, measured times) made a clean-clone run slower: the
    heavy JAX files then ran side by side on the two cores (test_train 140 s against 86 s)."""
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow)
