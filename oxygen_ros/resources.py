"""`package://<package>/<path>` URIs for files a package ships (checkpoints, parameter files).

ROS users name shipped files the way URDFs do: `checkpoint_dir:
package://oxygen_ros/models/workcell` resolves to `<share>/oxygen_ros/models/workcell` of the
installed package (ament index), and, for this package only, to the source tree when it is not
installed (tests, scripts run from a checkout). Other strings are plain paths (`~` expanded).

Invariant: ROS-free apart from the optional ament index lookup.
"""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE = "oxygen_ros"
SCHEME = "package://"
SOURCE_ROOT = Path(__file__).resolve().parents[1]


def cache_dir(name: str) -> Path:
    """The user's cache folder `name` of this project: `$XDG_CACHE_HOME/oxygen_ros/<name>`
    (`~/.cache` without it). Compiled XLA programs ("jax"), the tests' own ("jax_tests");
    scripts/setup.sh keeps its venvs and scripts/gpu_bundle.py its archive in the same place
    (they run before this package can be imported)."""
    home = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(home) / PACKAGE / name


def resolve_path(text: str) -> str:
    """A `package://` URI or a path -> a filesystem path ("" stays "").

    Raises:
        ValueError: a `package://` URI without a path, or of a package that is not installed.
    """
    if not text.startswith(SCHEME):
        return os.path.expanduser(text) if text else text
    package, _, relative = text[len(SCHEME) :].partition("/")
    if not package or not relative:
        raise ValueError(f"{text!r}: expected package://<package>/<path>")
    share = _share_directory(package)
    if share is not None and (share / relative).exists():
        return str(share / relative)
    if package == PACKAGE and (SOURCE_ROOT / relative).exists():
        return str(SOURCE_ROOT / relative)
    if share is None and package != PACKAGE:
        raise ValueError(f"{text!r}: package {package!r} is not installed")
    return str((share or SOURCE_ROOT) / relative)  # missing: the caller names the path


def _share_directory(package: str) -> Path | None:
    try:
        from ament_index_python.packages import (
            PackageNotFoundError,
            get_package_share_directory,
        )
    except ImportError:
        return None
    try:
        return Path(get_package_share_directory(package))
    except PackageNotFoundError:
        return None
