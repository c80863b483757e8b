"""`colcon test` on this package, as a ROS 2 user runs it: a fresh colcon build with
BUILD_TESTING=ON into its own build/install bases, then `colcon test`, whose CTest target
(CMakeLists.txt: `ament_add_pytest_test`) runs this test suite against that install space.

The environment is the one `scripts/setup.sh` builds with: the venv's ROS 2 and nothing of the
project's own install space, so the tests can only import the `oxygen_ros` (with its generated
msg/ and srv/) that this build installed; the source tree's `oxygen_ros/` has no msg/ and would
fail at the first message import. PYTEST_ADDOPTS narrows the run to a few fast modules that do
import the generated messages (the whole suite is what `.ci/run` runs anyway).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
VENV = Path(sys.executable).parent.parent
# Modules that import oxygen_ros.msg (generated) and oxygen_ros.graph (hand-written).
SELECTED = "test_conversions or test_instruction_intake or test_graph"
UNSELECTED_FOLDERS = ("engine", "training", "trained", "integration", "sim", "perception")


def colcon_env(source: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "AMENT_PREFIX_PATH", "CMAKE_PREFIX_PATH", "COLCON_PREFIX_PATH")
        and not k.startswith("PYTEST_XDIST")  # this process's worker: not the inner run's
    }
    env["PATH"] = f"{VENV / 'bin'}:{env.get('PATH', '')}"
    env["AMENT_PREFIX_PATH"] = env["CMAKE_PREFIX_PATH"] = str(VENV)
    # A few seconds, no workers; the folders without a selected module are not even collected
    # (each import of the engine's and training's modules costs seconds). The source folder is
    # named both ways: through the workspace's link and resolved.
    ignored = [
        f"--ignore={base / 'test' / folder}"
        for base in (source, ROOT)
        for folder in UNSELECTED_FOLDERS
    ]
    env["PYTEST_ADDOPTS"] = " ".join(["-n 0", f"-k '{SELECTED}'", *ignored])
    return env


def run(args: list[str], cwd: Path, env: dict[str, str], log: Path) -> int:
    with log.open("w") as out:
        return subprocess.run(
            args, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT
        ).returncode


def test_colcon_test_runs_the_suite_against_the_install_space(tmp_path: Path) -> None:
    colcon = shutil.which("colcon", path=str(VENV / "bin"))
    assert colcon, "colcon is not installed (scripts/setup.sh installs it)"
    # A workspace whose src/ links to the repository, as scripts/setup.sh makes: CMake refuses
    # include paths inside the source directory, and the venv lives under the repository.
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "oxygen_ros").symlink_to(ROOT)
    env = colcon_env(tmp_path / "src" / "oxygen_ros")
    bases = [
        "--build-base",
        str(tmp_path / "build"),
        "--install-base",
        str(tmp_path / "install"),
    ]
    common = [colcon, "--log-base", str(tmp_path / "log")]
    build = [
        *common,
        "build",
        "--base-paths",
        str(tmp_path / "src"),
        *bases,
        "--event-handlers",
        "console_cohesion-",
        "--cmake-args",
        "-G",
        "Ninja",
        f"-DPython3_EXECUTABLE={sys.executable}",
        "-DBUILD_TESTING=ON",
        "-DCMAKE_BUILD_TYPE=Release",
    ]
    build_log = tmp_path / "build.log"
    assert run(build, tmp_path, env, build_log) == 0, build_log.read_text()[-4000:]
    test_log = tmp_path / "test.log"
    test = [
        *common,
        "test",
        "--base-paths",
        str(tmp_path / "src"),
        *bases,
        "--event-handlers",
        "console_cohesion+",
    ]
    assert run(test, tmp_path, env, test_log) == 0, test_log.read_text()[-4000:]
    output = test_log.read_text()
    result = tmp_path / "build" / "oxygen_ros" / "test_results" / "oxygen_ros"
    (xml_file,) = result.glob("*.xunit.xml")
    suite = ET.parse(xml_file).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors")}
    assert counts["tests"] >= 10 and counts["failures"] == counts["errors"] == 0, output[-4000:]
    names = {case.get("classname", "") for case in suite.iter("testcase")}
    assert any("test_conversions" in n for n in names), names  # generated messages imported
    assert "100% tests passed" in output, output[-4000:]
