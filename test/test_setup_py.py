"""setup.py builds the engine-only wheel, which imports without ROS in a clean environment."""

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_engine_wheel_contains_only_the_engine_and_imports_without_ros(tmp_path) -> None:
    # Build from a copy: setuptools writes build/ and *.egg-info next to setup.py.
    src = tmp_path / "src"
    shutil.copytree(
        ROOT / "oxygen_ros", src / "oxygen_ros", ignore=shutil.ignore_patterns("__pycache__")
    )
    shutil.copy2(ROOT / "setup.py", src / "setup.py")
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path / "dist"),
            str(src),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert build.returncode == 0, build.stderr
    wheels = list((tmp_path / "dist").glob("oxygen_ros_engine-*.whl"))
    assert len(wheels) == 1
    names = zipfile.ZipFile(wheels[0]).namelist()
    code = [n for n in names if n.endswith(".py")]
    assert code and all(n.startswith("oxygen_ros/engine/") for n in code), code
    assert not any("/nodes/" in n or n.endswith(("graph.py", "bringup.py")) for n in names)

    target = tmp_path / "site"
    install = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "-q",
            "--target",
            str(target),
            str(wheels[0]),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert install.returncode == 0, install.stderr
    # A clean PYTHONPATH: only the wheel's files (and the venv's site-packages for jax).
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "AMENT_PREFIX_PATH")}
    env["PYTHONPATH"] = str(target)
    probe = (
        "import sys, oxygen_ros.engine as e; "
        "assert e.__file__.startswith(sys.argv[1]), e.__file__; "
        "assert 'rclpy' not in sys.modules; print('ok')"
    )
    run = subprocess.run(
        [sys.executable, "-c", probe, str(target)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=300,
    )
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-2000:]
