"""scripts/setup.sh run again from inside the project's venv (as the tests and every script that
sets up first do: the venv's bin first on PATH) keeps the venv it links and the build: the
venv's key comes from the base interpreter, not from whichever python3.11 PATH finds first."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
VENV = ROOT / ".build" / "venv"


def test_setup_from_inside_the_venv_links_the_same_venv_and_builds_nothing() -> None:
    if not VENV.is_symlink():
        pytest.skip(".build/venv is a directory of its own (no shared venv to key)")
    inside = VENV / "bin" / "python3.11"
    # The situation: PATH finds the venv's interpreter, whose sys.executable is not the base's.
    probe = "import sys; print(sys.executable, sys._base_executable)"
    executable, base = subprocess.check_output([str(inside), "-c", probe], text=True).split()
    assert executable != base
    before = os.readlink(VENV)
    env = {**os.environ, "PATH": f"{VENV / 'bin'}:{os.environ['PATH']}"}
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts" / "setup.sh")],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert os.readlink(VENV) == before
    assert "creating virtual environment" not in proc.stderr, proc.stderr
    assert "colcon build" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().endswith("ready: source scripts/env.sh to use the install space")
