"""The humanoid node graph, defined once.

Both `launch/humanoid.launch.py` (for `ros2 launch` on a real ROS 2 install) and the project's
own bring-up (`python -m oxygen_ros.bringup`, used where `launch` is not installable) build their
processes from `resolve()`, so the two cannot drift: same nodes, same names, same YAML, same
argument handling.

Invariant: every launch argument has a string default; an empty `model_preset` or
`checkpoint_dir` means "keep the YAML's value".
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

PACKAGE = "oxygen_ros"


@dataclass(frozen=True)
class LaunchArgument:
    """A launch argument (`name:=value` for both `ros2 launch` and the bring-up)."""

    name: str  # argument name
    default: str  # default value, always a string (launch semantics)
    description: str  # shown by `ros2 launch -s` and `bringup --help`


LAUNCH_ARGUMENTS: tuple[LaunchArgument, ...] = (
    LaunchArgument("params_file", "", "YAML parameter file (empty: config/humanoid.yaml)"),
    LaunchArgument("namespace", "", "namespace for every node (empty: none)"),
    LaunchArgument("model_preset", "", "engine preset, tiny or pi05 (empty: the YAML's value)"),
    LaunchArgument(
        "checkpoint_dir",
        "",
        "openpi checkpoint directory with params/ and assets/ (empty: the YAML's value; "
        "no checkpoint: random init, outputs meaningless)",
    ),
    LaunchArgument("use_sim", "false", "start the synthetic humanoid sensor node (true/false)"),
)


@dataclass(frozen=True)
class NodeSpec:
    """One node of the graph."""

    executable: str  # `ros2 run oxygen_ros <executable>`
    module: str  # Python module with main(), for the bring-up's `python -m`
    name: str  # node name (the YAML's top-level key)
    sim_only: bool = False  # started only when use_sim is true
    overridable: tuple[str, ...] = ()  # launch arguments that override same-named parameters


NODES: tuple[NodeSpec, ...] = (
    NodeSpec(
        "sim_sensors_node", "oxygen_ros.nodes.sim_sensors_node", "sim_sensors", sim_only=True
    ),
    NodeSpec("perception_node", "oxygen_ros.nodes.perception_node", "perception"),
    NodeSpec(
        "inference_node",
        "oxygen_ros.nodes.inference_node",
        "inference",
        overridable=("model_preset", "checkpoint_dir"),
    ),
)


@dataclass(frozen=True)
class ResolvedNode:
    """A node with its arguments resolved: what to start."""

    spec: NodeSpec
    namespace: str  # "" or a namespace without a trailing slash
    params_file: str  # absolute path of the YAML file
    overrides: dict[str, str] = field(default_factory=dict)  # parameter -> value

    def ros_arguments(self) -> list[str]:
        """Command-line `--ros-args` for the bring-up (what `launch_ros.actions.Node` builds)."""
        args = ["-r", f"__node:={self.spec.name}"]
        if self.namespace:
            args += ["-r", f"__ns:={self.namespace}"]
        args += ["--params-file", self.params_file]
        for key, value in self.overrides.items():
            args += ["-p", f"{self.spec.name}:{key}:={value}"]
        return args


def parse_bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("true", "1", "yes", "on"):
        return True
    if value in ("false", "0", "no", "off", ""):
        return False
    raise ValueError(f"not a boolean: {text!r} (use true or false)")


def default_params_file() -> Path:
    """config/humanoid.yaml from the package's share directory, else from the source tree."""
    try:
        from ament_index_python.packages import (
            PackageNotFoundError,
            get_package_share_directory,
        )

        try:
            shared = Path(get_package_share_directory(PACKAGE)) / "config" / "humanoid.yaml"
            if shared.is_file():
                return shared
        except PackageNotFoundError:
            pass
    except ImportError:
        pass
    return Path(__file__).resolve().parents[1] / "config" / "humanoid.yaml"


def resolve(arguments: Mapping[str, str]) -> list[ResolvedNode]:
    """Turns launch argument values into the nodes to start.

    Args:
        arguments: argument name -> value; missing names take their defaults.

    Returns:
        The nodes to start, in start order (sensors first, inference last).

    Raises:
        ValueError: an unknown argument, a bad boolean, or a missing params file.
    """
    known = {a.name: a.default for a in LAUNCH_ARGUMENTS}
    unknown = sorted(set(arguments) - set(known))
    if unknown:
        raise ValueError(f"unknown launch argument(s) {unknown}; known: {sorted(known)}")
    values = {**known, **{k: str(v) for k, v in arguments.items()}}
    use_sim = parse_bool(values["use_sim"])
    params_file = (
        Path(os.path.expanduser(values["params_file"]))
        if values["params_file"]
        else default_params_file()
    )
    if not params_file.is_file():
        raise ValueError(f"params_file {str(params_file)!r} does not exist")
    namespace = values["namespace"].strip().rstrip("/")
    if namespace and not namespace.startswith("/"):
        namespace = "/" + namespace
    nodes = []
    for spec in NODES:
        if spec.sim_only and not use_sim:
            continue
        overrides = {k: values[k] for k in spec.overridable if values[k] != ""}
        nodes.append(ResolvedNode(spec, namespace, str(params_file.resolve()), overrides))
    return nodes
