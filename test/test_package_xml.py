"""package.xml lists every ROS package the code imports, so `rosdep install` gives a user what
the nodes need: each top-level module imported anywhere under `oxygen_ros/` that is a ROS 2
package of the environment (a `share/<name>/package.xml` on AMENT_PREFIX_PATH) is a
`depend`/`exec_depend` of this package."""

from __future__ import annotations

import ast
import os
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNTIME_TAGS = ("depend", "exec_depend")


def ros_packages() -> set[str]:
    """Names of the ROS 2 packages installed in this environment."""
    names = set()
    for prefix in filter(None, os.environ.get("AMENT_PREFIX_PATH", "").split(os.pathsep)):
        share = Path(prefix) / "share"
        if share.is_dir():
            names.update(p.parent.name for p in share.glob("*/package.xml"))
    return names


def imported_roots(package: Path) -> dict[str, str]:
    """Top-level module -> one file that imports it, over every module of `package`."""
    roots: dict[str, str] = {}
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                roots.setdefault(name.split(".")[0], str(path.relative_to(ROOT)))
    return roots


def declared() -> set[str]:
    tree = ET.parse(ROOT / "package.xml")
    return {e.text.strip() for tag in RUNTIME_TAGS for e in tree.getroot().iter(tag) if e.text}


def test_every_imported_ros_package_is_a_runtime_dependency() -> None:
    ros = ros_packages()
    imported = imported_roots(ROOT / "oxygen_ros")
    # Positive control: the check sees ROS packages the code is known to import.
    assert {"rclpy", "std_msgs", "diagnostic_msgs"} <= ros & set(imported)
    missing = {
        name: where
        for name, where in imported.items()
        if name in ros and name != "oxygen_ros" and name not in declared()
    }
    assert not missing, f"imported but not in package.xml (<exec_depend>): {missing}"
