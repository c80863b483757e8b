"""The ROS-free packages stay ROS-free: no module under oxygen_ros/engine, oxygen_ros/sim,
oxygen_ros/perception or oxygen_ros/training imports rclpy, rosidl or any message/service
module, statically (AST) or at run time (after importing everything). The engine imports
nothing else of the project, the simulation nothing but itself, perception only the simulation
(the workcell camera's calibration), training only the engine, the simulation and perception.
Inside the engine, layers point down: the model functions (`model_fns`) never import the
language cache (`kv_cache`); the runner and the reference decoder join the two."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE_ROOT = Path(__file__).resolve().parents[1] / "oxygen_ros"
ROS_FREE = ("engine", "sim", "perception", "training", "recording")
# Project packages each ROS-free package may import.
ALLOWED = {
    "engine": {"engine"},
    "sim": {"sim"},
    "perception": {"perception", "sim"},
    "training": {"training", "engine", "sim", "perception"},
    "recording": {"recording", "resources"},
}
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


def _forbidden(name: str, package: str = "engine") -> bool:
    parts = name.split(".")
    return (
        parts[0] in FORBIDDEN_ROOTS
        or "msg" in parts[1:]
        or "srv" in parts[1:]
        or (parts[0] == "oxygen_ros" and len(parts) > 1 and parts[1] not in ALLOWED[package])
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


def _modules(package: str) -> list[Path]:
    directory = PACKAGE_ROOT / package
    return sorted(p for p in directory.rglob("*.py") if "__pycache__" not in p.parts)


@pytest.mark.parametrize("package", ROS_FREE)
def test_package_has_modules(package: str) -> None:
    assert len(_modules(package)) >= 2


@pytest.mark.parametrize(
    ("package", "path"),
    [(package, path) for package in ROS_FREE for path in _modules(package)],
    ids=lambda v: v if isinstance(v, str) else v.name,
)
def test_module_imports_no_ros(package: str, path: Path) -> None:
    bad = [
        f"{path.name}:{line}: {name}" for line, name in _imports(path) if _forbidden(name, package)
    ]
    assert not bad, f"{package} must stay ROS-free:\n" + "\n".join(bad)


def test_forbidden_detector_catches_rclpy(tmp_path: Path) -> None:
    sample = tmp_path / "bad.py"
    sample.write_text("import os\nfrom rclpy.node import Node\nfrom oxygen_ros.msg import X\n")
    assert [n for _, n in _imports(sample) if _forbidden(n)] == [
        "rclpy.node",
        "rclpy.node.Node",
        "oxygen_ros.msg",
        "oxygen_ros.msg.X",
    ]


def _engine_imports(path: Path) -> set[str]:
    """Engine modules the file imports by absolute name (`oxygen_ros.engine.X[...]`,
    `from oxygen_ros.engine import X`) or relatively (`from .X import ...`, `from . import X`)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 1:
            base = f"oxygen_ros.engine.{node.module}" if node.module else "oxygen_ros.engine"
            names = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[:2] == ["oxygen_ros", "engine"] and len(parts) > 2:
                found.add(parts[2])
    return found


def test_model_fns_does_not_import_kv_cache() -> None:
    imported = _engine_imports(PACKAGE_ROOT / "engine" / "model_fns.py")
    assert {"config", "model"} <= imported  # positive control: its real imports are seen
    assert "kv_cache" not in imported, "model_fns must not know the language cache"


def test_engine_import_detector_sees_every_import_form(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import os\n"
        "import oxygen_ros.engine.a\n"
        "from oxygen_ros.engine.b import X\n"
        "from oxygen_ros.engine import c\n"
        "from .d import Y\n"
        "from . import e\n"
        "from oxygen_ros.sim import f\n"
        "def g():\n    from oxygen_ros.engine.h import Z\n"
    )
    assert _engine_imports(sample) == {"a", "b", "c", "d", "e", "h"}


@pytest.mark.parametrize("package", ROS_FREE)
def test_importing_every_module_loads_no_ros(package: str) -> None:
    names = [
        f"oxygen_ros.{package}" + ("" if p.stem == "__init__" else "." + p.stem)
        for p in _modules(package)
        if p.parent == PACKAGE_ROOT / package
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


def _loads_jax(module: str) -> bool:
    code = (
        f"import importlib, sys\nimportlib.import_module({module!r})\n"
        "print(any(m.split('.')[0] in ('jax', 'flax', 'openpi') for m in sys.modules))\n"
    )
    # -P: the installed package (with its generated messages), not the source tree in the cwd
    proc = subprocess.run(
        [sys.executable, "-P", "-c", code], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip() == "True"


def test_the_inference_node_imports_without_jax() -> None:
    """The inference node loads JAX only when it configures the engine, so a node stopped
    while it starts exits at once (test_nodes_bringup): its module, and what it reads of a
    checkpoint before configuring (`checkpoint_assets`), import no JAX, flax or openpi."""
    assert _loads_jax("oxygen_ros.engine.checkpoint")  # positive control: the loader does
    assert not _loads_jax("oxygen_ros.engine.checkpoint_assets")
    assert not _loads_jax("oxygen_ros.nodes.inference.inference_node")
