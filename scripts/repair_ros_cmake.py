"""Points the ROS wheels' exported CMake targets at this venv's include directories.

Run by scripts/setup.sh with the venv's python: `python scripts/repair_ros_cmake.py VENV`.

The ROS 2 wheels' exported CMake files hard-code the wheel build machine's interpreter include
directory (`/opt/python/cp3X-cp3X/include/python3.X`) and numpy include directory. Each is
rewritten to this venv's, by its real path: a venv shared by several clones is reached through
each clone's `.build/venv` link, and a path through one clone's link breaks every other clone
once that clone is deleted (seen: CMake's generate step failed on "non-existent path
/tmp/<deleted clone>/.build/venv/.../numpy/_core/include"). Any numpy include path that is not
the venv's own is rewritten too, so a venv repaired through a link is mended. Idempotent: a
file is written only when something in it changes.
"""

from __future__ import annotations

import os
import re
import sys
import sysconfig
from pathlib import Path

WHEEL_PYTHON_INCLUDE = re.compile(r"/opt/python/cp3\d+-cp3\d+/include/python3\.\d+")
# A numpy include directory inside a CMake list or string ("a;b" or "...").
NUMPY_INCLUDE = re.compile(r'[^";\s]*/site-packages/numpy/(?:_core|core)/include')


def repair_text(text: str, python_include: str, numpy_include: str) -> str:
    """`text` with the wheel builder's include paths replaced by these."""
    text = WHEEL_PYTHON_INCLUDE.sub(python_include, text)
    return NUMPY_INCLUDE.sub(lambda m: numpy_include, text)


def repair(share: Path, python_include: str, numpy_include: str) -> list[Path]:
    """Rewrites every .cmake file under `share` that needs it; returns those written."""
    written = []
    for path in sorted(share.rglob("*.cmake")):
        text = path.read_text(errors="surrogateescape")
        fixed = repair_text(text, python_include, numpy_include)
        if fixed != text:
            path.write_text(fixed, errors="surrogateescape")
            written.append(path)
    return written


def main(argv: list[str]) -> int:
    import numpy

    (venv,) = argv
    python_include = os.path.realpath(sysconfig.get_paths()["include"])
    numpy_include = os.path.realpath(numpy.get_include())
    written = repair(Path(venv) / "share", python_include, numpy_include)
    if written:
        print(
            f"[setup] repaired {len(written)} exported CMake files of the ROS wheels",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
