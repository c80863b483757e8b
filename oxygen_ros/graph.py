"""The node graphs of the robot profiles, defined once.

Both launch files (`launch/humanoid.launch.py`, `launch/workcell.launch.py`, for `ros2 launch` on
a real ROS 2 install) and the project's own bring-up (`python -m oxygen_ros.bringup`, used where
`launch` is not installable) build their processes from `resolve()`, so they cannot drift: same
nodes, same names, same YAML, same argument handling.

Profiles: `humanoid` (synthetic sensors when simulated, perception, inference) and `workcell`
(the simulated ALOHA workcell, perception, and the policy: the inference node with
`policy:=model`, the scripted expert with `policy:=expert`). Each profile's parameters are in
`config/<profile>.yaml` unless `params_file` names another file.

Invariants:
- Every launch argument has a string default; an empty `model_preset`, `checkpoint_dir`,
  `real_time_factor` or `next_episode_after_s` means "keep the YAML's value".
- `model_preset` overrides perception's and inference's parameter alike (perception converts
  images to the preset's resolution, the only one inference accepts); `checkpoint_dir`
  reaches inference only.
- Inference activates without a checkpoint only in simulation (`use_sim:=true` sets its
  `allow_random_weights`) or when `allow_random_weights:=true` asks for it; outside simulation
  it stays inactive (its parameter's default), so a robot never moves under random weights.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from oxygen_ros.engine.config import PRESET_NAMES
from oxygen_ros.resources import resolve_path

PACKAGE = "oxygen_ros"


@dataclass(frozen=True)
class LaunchArgument:
    """A launch argument (`name:=value` for both `ros2 launch` and the bring-up)."""

    name: str  # argument name
    default: str  # default value, always a string (launch semantics)
    description: str  # shown by `ros2 launch -s` and `bringup --help`


LAUNCH_ARGUMENTS: tuple[LaunchArgument, ...] = (
    LaunchArgument("profile", "humanoid", "robot profile: humanoid or workcell"),
    LaunchArgument("params_file", "", "YAML parameter file (empty: config/<profile>.yaml)"),
    LaunchArgument("namespace", "", "namespace for every node (empty: none)"),
    LaunchArgument(
        "model_preset",
        "",
        f"engine preset ({', '.join(PRESET_NAMES)}), also perception's image size "
        "(empty: the YAML's value)",
    ),
    LaunchArgument(
        "checkpoint_dir",
        "",
        "openpi checkpoint directory with params/ and assets/ (empty: the YAML's value; "
        "no checkpoint: random init, outputs meaningless)",
    ),
    LaunchArgument(
        "use_sim",
        "false",
        "start the profile's simulator: synthetic sensors (humanoid) or the workcell "
        "simulation (true/false)",
    ),
    LaunchArgument(
        "allow_random_weights",
        "",
        "without a checkpoint, activate inference anyway (true: a stand's plumbing test; "
        "empty: only in simulation, use_sim:=true; false: never)",
    ),
    LaunchArgument(
        "respawn",
        "true",
        "restart perception and inference when they exit abnormally, after respawn_delay "
        "(true/false; the simulators and the expert never restart)",
    ),
    LaunchArgument(
        "respawn_delay",
        "2.0",
        "seconds from a node's abnormal exit to its restart (a number >= 0)",
    ),
    LaunchArgument(
        "policy",
        "model",
        "what commands the robot: model (inference node) or expert (scripted, workcell only)",
    ),
    LaunchArgument(
        "remap",
        "",
        "topic remappings for every node, space-separated from:=to pairs "
        "(e.g. 'joint_states:=robot/joint_states'; empty: none)",
    ),
    LaunchArgument(
        "real_time_factor",
        "",
        "workcell simulation speed, sim seconds per wall second (empty: the YAML's value)",
    ),
    LaunchArgument(
        "next_episode_after_s",
        "",
        "workcell simulation: start the next seed this many sim seconds after an episode "
        "ends (empty: the YAML's value; 0: wait for a reset request)",
    ),
    LaunchArgument(
        "view",
        "true",
        "serve the live view (the viewer node: cameras, speech, memory, actions in a browser; "
        "true/false)",
    ),
    LaunchArgument(
        "record",
        "",
        "record every topic into a rosbag2 MCAP bag in this directory, which must not exist "
        "(the recorder node; empty: no recording)",
    ),
)
PROFILES = ("humanoid", "workcell")
POLICIES = ("model", "expert")


@dataclass(frozen=True)
class NodeSpec:
    """One node of the graph."""

    executable: str  # `ros2 run oxygen_ros <executable>`
    module: str  # Python module with main(), for the bring-up's `python -m`
    name: str  # node name (the YAML's top-level key)
    sim_only: bool = False  # started only when use_sim is true
    overridable: tuple[str, ...] = ()  # launch arguments that override same-named parameters
    profiles: tuple[str, ...] = PROFILES  # profiles that include this node
    policy: str = ""  # started only with this policy ("": always)
    # Restarted when it exits abnormally (launch argument `respawn`). The robot's brain:
    # perception and inference come back by themselves (inference reopens its memory database
    # and compile cache; both serve only fresh observations). The simulators and the expert
    # stand for the world and the demonstrator: a restarted simulator would start a new world
    # at time 0 and the expert a partial demonstration, so their exit ends the bring-up.
    respawn: bool = False
    # Started only when this launch argument is on (a true boolean, or a non-empty value for
    # `record`, which is then the node's `output_dir`); "": always.
    enabled_by: str = ""


NODES: tuple[NodeSpec, ...] = (
    # First: it records from the start (it subscribes to topics as they appear).
    NodeSpec(
        "recorder_node", "oxygen_ros.nodes.recorder.recorder_node", "recorder", enabled_by="record"
    ),
    NodeSpec(
        "sim_sensors_node",
        "oxygen_ros.nodes.humanoid.sim_sensors_node",
        "sim_sensors",
        sim_only=True,
        profiles=("humanoid",),
    ),
    NodeSpec(
        "workcell_sim_node",
        "oxygen_ros.nodes.workcell.workcell_sim_node",
        "workcell_sim",
        sim_only=True,
        overridable=("real_time_factor", "next_episode_after_s"),
        profiles=("workcell",),
    ),
    # model_preset reaches perception too: it converts images to the preset's resolution.
    NodeSpec(
        "perception_node",
        "oxygen_ros.nodes.perception.perception_node",
        "perception",
        overridable=("model_preset",),
        respawn=True,
    ),
    NodeSpec(
        "inference_node",
        "oxygen_ros.nodes.inference.inference_node",
        "inference",
        overridable=("model_preset", "checkpoint_dir", "allow_random_weights"),
        policy="model",
        respawn=True,
    ),
    NodeSpec(
        "expert_node",
        "oxygen_ros.nodes.workcell.expert_node",
        "expert",
        profiles=("workcell",),
        policy="expert",
    ),
    # Restarted like the brain: a person watching is no reason to stop the robot.
    NodeSpec(
        "viewer_node",
        "oxygen_ros.nodes.viewer.viewer_node",
        "viewer",
        respawn=True,
        enabled_by="view",
    ),
)


@dataclass(frozen=True)
class ResolvedNode:
    """A node with its arguments resolved: what to start."""

    spec: NodeSpec
    namespace: str  # "" or a namespace without a trailing slash
    params_file: str  # absolute path of the YAML file
    overrides: dict[str, str | float | bool] = field(default_factory=dict)  # parameter -> value
    remappings: tuple[tuple[str, str], ...] = ()  # (from, to) topic remappings
    respawn: bool = False  # restarted after an abnormal exit (launch_ros's `respawn`)
    respawn_delay_s: float = 0.0  # launch_ros's `respawn_delay`

    @property
    def fully_qualified_name(self) -> str:
        return f"{self.namespace}/{self.spec.name}"

    def command(self, overrides_dir: Path | None = None) -> list[str]:
        """The node's process command line (`python -P -m <module> --ros-args ...`); -P: never
        import the source tree's oxygen_ros (no generated msg/) from the working directory."""
        head = [sys.executable, "-P", "-m", self.spec.module, "--ros-args"]
        return [*head, *self.ros_arguments(overrides_dir)]

    def ros_arguments(self, overrides_dir: Path | None = None) -> list[str]:
        """Command-line `--ros-args` for the bring-up (what `launch_ros.actions.Node` builds).

        Overrides go into a second parameter file in `overrides_dir`, keyed by the node's fully
        qualified name, as launch_ros does with a parameter dict: rcl applies the most specific
        match, so they win over the YAML's `/**/<name>` section in any namespace (a `-p` rule
        cannot: unprefixed it is a `/**` rule, and a `node:` prefix matches only a node
        without a namespace).

        Raises:
            ValueError: The node has overrides and no `overrides_dir` was given.
        """
        args = ["-r", f"__node:={self.spec.name}"]
        if self.namespace:
            args += ["-r", f"__ns:={self.namespace}"]
        for source, target in self.remappings:
            args += ["-r", f"{source}:={target}"]
        args += ["--params-file", self.params_file]
        if self.overrides:
            if overrides_dir is None:
                raise ValueError(f"{self.spec.name} has overrides: give overrides_dir")
            path = Path(overrides_dir) / f"{self.spec.name}_overrides.yaml"
            # A string value reads as `-p name:=value` would: as a YAML scalar ("1.0" a float).
            values = {
                k: yaml.safe_load(v) if isinstance(v, str) and v else v
                for k, v in self.overrides.items()
            }
            body = {self.fully_qualified_name: {"ros__parameters": values}}
            path.write_text(yaml.safe_dump(body))
            args += ["--params-file", str(path)]
        return args


def parse_bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("true", "1", "yes", "on"):
        return True
    if value in ("false", "0", "no", "off", ""):
        return False
    raise ValueError(f"not a boolean: {text!r} (use true or false)")


def _parse_float(name: str, text: str, valid, wanted: str) -> float:
    """A float launch argument (a float parameter, so never passed on as a string)."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not valid(value):
        raise ValueError(f"{name} must be {wanted}, got {text!r}")
    return value


def parse_factor(text: str) -> float:
    """A real-time factor: a number > 0."""
    return _parse_float(
        "real_time_factor", text, lambda v: v > 0 and v != float("inf"), "a number > 0"
    )


def parse_delay(text: str) -> float:
    """`next_episode_after_s`: a finite number >= 0."""
    return _parse_float(
        "next_episode_after_s", text, lambda v: 0 <= v < float("inf"), "a number >= 0"
    )


def parse_respawn_delay(text: str) -> float:
    """`respawn_delay`: a finite number >= 0 (seconds)."""
    return _parse_float("respawn_delay", text, lambda v: 0 <= v < float("inf"), "a number >= 0")


def parse_remappings(text: str) -> tuple[tuple[str, str], ...]:
    """'a:=b c:=d' -> (('a', 'b'), ('c', 'd')); empty -> ().

    Raises:
        ValueError: a pair without `:=` or with an empty side.
    """
    pairs = []
    for item in text.split():
        source, sep, target = item.partition(":=")
        if not sep or not source or not target:
            raise ValueError(f"remap entries are from:=to pairs, got {item!r}")
        pairs.append((source, target))
    return tuple(pairs)


def node_parameters(data: Mapping, name: str) -> dict:
    """A node's `ros__parameters` from a loaded parameter file: every section that applies to
    a node of that name (`/**`, `/**/<name>`, `<name>`, `/<name>`), merged in file order (a
    later section wins, as rcl applies them)."""
    values: dict = {}
    for key, section in data.items():
        if key in ("/**", f"/**/{name}", name, f"/{name}"):
            values.update(((section or {}).get("ros__parameters")) or {})
    return values


def default_params_file(profile: str = "humanoid") -> Path:
    """config/<profile>.yaml from the package's share directory, else from the source tree."""
    return Path(resolve_path(f"package://{PACKAGE}/config/{profile}.yaml"))


def resolve(arguments: Mapping[str, str]) -> list[ResolvedNode]:
    """Turns launch argument values into the nodes to start.

    Args:
        arguments: argument name -> value; missing names take their defaults.

    Returns:
        The nodes to start, in start order (sensors first, inference last).

    Raises:
        ValueError: an unknown argument, a bad boolean, profile, policy, real-time factor,
            next-episode or respawn delay, a missing params file, a remap entry that is not a
            from:=to pair, or a `record` directory that exists.
    """
    known = {a.name: a.default for a in LAUNCH_ARGUMENTS}
    unknown = sorted(set(arguments) - set(known))
    if unknown:
        raise ValueError(f"unknown launch argument(s) {unknown}; known: {sorted(known)}")
    values = {**known, **{k: str(v) for k, v in arguments.items()}}
    use_sim = parse_bool(values["use_sim"])
    profile, policy = values["profile"].strip(), values["policy"].strip()
    if profile not in PROFILES:
        raise ValueError(f"profile must be one of {PROFILES}, got {profile!r}")
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
    if not any(profile in n.profiles and n.policy == policy for n in NODES):
        raise ValueError(f"policy {policy!r} is not available for profile {profile!r}")
    overrides_by_name: dict[str, str | float | bool] = {
        k: values[k] for k in ("model_preset", "checkpoint_dir") if values[k] != ""
    }
    # A simulator's graph may serve random weights; a robot's only when asked to.
    if values["allow_random_weights"] != "" or use_sim:
        overrides_by_name["allow_random_weights"] = (
            parse_bool(values["allow_random_weights"])
            if values["allow_random_weights"] != ""
            else True
        )
    if values["real_time_factor"] != "":
        overrides_by_name["real_time_factor"] = parse_factor(values["real_time_factor"])
    if values["next_episode_after_s"] != "":
        overrides_by_name["next_episode_after_s"] = parse_delay(values["next_episode_after_s"])
    params_file = (
        Path(os.path.expanduser(values["params_file"]))
        if values["params_file"]
        else default_params_file(profile)
    )
    if not params_file.is_file():
        raise ValueError(f"params_file {str(params_file)!r} does not exist")
    remappings = parse_remappings(values["remap"])
    respawn = parse_bool(values["respawn"])
    respawn_delay_s = parse_respawn_delay(values["respawn_delay"])
    namespace = values["namespace"].strip().rstrip("/")
    if namespace and not namespace.startswith("/"):
        namespace = "/" + namespace
    enabled = {"view": parse_bool(values["view"]), "record": values["record"].strip() != ""}
    record_dir = os.path.abspath(os.path.expanduser(values["record"].strip()))
    if enabled["record"] and os.path.exists(record_dir):
        raise ValueError(f"record: {record_dir!r} exists (a bag directory must be new)")
    nodes = []
    for spec in NODES:
        if profile not in spec.profiles or (spec.sim_only and not use_sim):
            continue
        if spec.policy and spec.policy != policy:
            continue
        if spec.enabled_by and not enabled[spec.enabled_by]:
            continue
        overrides = {k: overrides_by_name[k] for k in spec.overridable if k in overrides_by_name}
        if spec.enabled_by == "record":
            overrides["output_dir"] = record_dir
        nodes.append(
            ResolvedNode(
                spec,
                namespace,
                str(params_file.resolve()),
                overrides,
                remappings,
                respawn=respawn and spec.respawn,
                respawn_delay_s=respawn_delay_s,
            )
        )
    return nodes
