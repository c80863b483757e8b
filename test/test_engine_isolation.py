"""The engine package is ROS-free: no module under oxygen_ros/engine imports rclpy, rosidl or
any message/service module, statically (AST) or at run time (after importing everything)."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ENGINE_DIR = Path(__file__).resolve().parents[1] / "oxygen_ros" / "engine"
FORBIDDEN_ROOTS = {
    "rclpy",
    "rosidl_runtime_py",
    "rosidl_parser",
    "std_msgs",
    "sensor_msgs",
    "builtin_interfaces",
    "trajectory_msgs",
    "diagnostic_msgs",
    "std_srvs",
    "rcl_interfaces",
    "geometry_msgs",
    "launch",
    "launch_ros",
}


def _forbidden(name: str) -> bool:
    parts = name.split(".")
    return (
        parts[0] in FORBIDDEN_ROOTS
        or "msg" in parts[1:]
        or "srv" in parts[1:]
        or (parts[0] == "oxygen_ros" and len(parts) > 1 and parts[1] != "engine")
    )


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
            found += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
    return found


def _engine_modules() -> list[Path]:
    return sorted(p for p in ENGINE_DIR.rglob("*.py") if "__pycache__" not in p.parts)


def test_engine_has_modules() -> None:
    assert len(_engine_modules()) >= 1


@pytest.mark.parametrize("path", _engine_modules(), ids=lambda p: p.name)
def test_engine_module_imports_no_ros(path: Path) -> None:
    bad = [f"{path.name}:{line}: {name}" for line, name in _imports(path) if _forbidden(name)]
    assert not bad, "engine must stay ROS-free:\n" + "\n".join(bad)


def test_forbidden_detector_catches_rclpy(tmp_path: Path) -> None:
    sample = tmp_path / "bad.py"
    sample.write_text("import os\nfrom rclpy.node import Node\nfrom oxygen_ros.msg import X\n")
    assert [n for _, n in _imports(sample) if _forbidden(n)] == [
        "rclpy.node",
        "rclpy.node.Node",
        "oxygen_ros.msg",
        "oxygen_ros.msg.X",
    ]


def test_importing_every_engine_module_loads_no_ros() -> None:
    names = [
        "oxygen_ros.engine" + ("" if p.stem == "__init__" else "." + p.stem)
        for p in _engine_modules()
        if p.parent == ENGINE_DIR
    ]
    code = (
        "import importlib, sys\n"
        f"for n in {names!r}: importlib.import_module(n)\n"
        f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {sorted(FORBIDDEN_ROOTS)!r}"
        " or m.startswith(('oxygen_ros.msg', 'oxygen_ros.srv')))\n"
        "assert not bad, bad\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
