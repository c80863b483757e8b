"""Shared fixtures. Every test run gets its own ROS domain id, LOCALHOST discovery and a
private log directory, set before anything imports rclpy."""

from __future__ import annotations

import os
import random
import re
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from harness import ProcessLauncher, SpinningNode, ros_test_env

# Unique per run: several runs (developers, CI) may share a machine. Valid Fast DDS domain ids on
# Linux are 0..101 for the default port mapping; avoid 0 (the default everyone else uses).
_DOMAIN_ID = int(os.environ.get("OXYGEN_TEST_DOMAIN_ID", random.SystemRandom().randint(1, 101)))
_LOG_DIR = Path(tempfile.mkdtemp(prefix="oxygen_ros_test_log_"))
os.environ.update(ros_test_env(_LOG_DIR, _DOMAIN_ID))
os.environ.setdefault("JAX_PLATFORMS", "cpu")


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
