"""scripts/repair_ros_cmake.py (run by setup.sh): the ROS wheels' exported CMake files point at
this venv's include directories by their real paths, so a venv shared by clones does not keep
the path of the clone that set it up (that clone deleted, every later clone's CMake generate
step failed on the missing numpy include directory)."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import numpy

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("repair", ROOT / "scripts" / "repair_ros_cmake.py")
assert _spec is not None and _spec.loader is not None
repair = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(repair)

PY_INC, NP_INC = (
    "/usr/include/python3.11",
    "/cache/venvs/k/lib/python3.11/site-packages/numpy/_core/include",
)
WHEEL = (
    'set_target_properties(t PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${_IMPORT_PREFIX}/include;'
    "/opt/python/cp311-cp311/include/python3.11;"
    '/opt/python/cp311-cp311/lib/python3.11/site-packages/numpy/_core/include")\n'
)
STALE = WHEEL.replace(
    "/opt/python/cp311-cp311/lib/python3.11", "/tmp/cloneA/.build/venv/lib/python3.11"
).replace("/opt/python/cp311-cp311/include/python3.11", PY_INC)


def test_the_wheel_builders_and_a_clones_paths_become_the_venvs_own() -> None:
    expected = f'"${{_IMPORT_PREFIX}}/include;{PY_INC};{NP_INC}")'
    assert repair.repair_text(WHEEL, PY_INC, NP_INC).endswith(expected + "\n")
    assert repair.repair_text(STALE, PY_INC, NP_INC).endswith(expected + "\n")  # a clone's link
    fixed = repair.repair_text(WHEEL, PY_INC, NP_INC)
    assert repair.repair_text(fixed, PY_INC, NP_INC) == fixed  # idempotent


def test_only_the_files_that_change_are_written(tmp_path: Path) -> None:
    (tmp_path / "a" / "cmake").mkdir(parents=True)
    wheel, other = tmp_path / "a" / "cmake" / "aExport.cmake", tmp_path / "b.cmake"
    wheel.write_text(WHEEL)
    other.write_text("set(X 1)\n")
    assert repair.repair(tmp_path, PY_INC, NP_INC) == [wheel]
    assert "/opt/python" not in wheel.read_text() and other.read_text() == "set(X 1)\n"
    assert repair.repair(tmp_path, PY_INC, NP_INC) == []  # a second run writes nothing


def test_the_venvs_cmake_files_name_its_own_numpy_by_its_real_path() -> None:
    """What setup.sh left in the venv this test runs in (the control: the wheels ship paths
    that would fail this)."""
    share = Path(sys.prefix) / "share"
    own = os.path.realpath(numpy.get_include())
    found = set()
    for path in share.rglob("*.cmake"):
        found.update(repair.NUMPY_INCLUDE.findall(path.read_text(errors="replace")))
    assert found == {own}, sorted(found)[:5]
    assert Path(own).is_dir()
    assert repair.NUMPY_INCLUDE.findall(WHEEL) != [own]
