"""The node graph (oxygen_ros.graph) and the launch file built from it.

The launch file is executed against the real launch/launch_ros API where installed; on
machines without them (PyPI has no ROS 2 launch) it runs against a recording stand-in of the
five launch names it uses, which checks the file's wiring to `graph.resolve` - not launch itself.
"""

import importlib.util
import sys
import types
from pathlib import Path

import pytest
import yaml

from oxygen_ros import graph

ROOT = Path(__file__).resolve().parents[1]
LAUNCH_FILE = ROOT / "launch" / "humanoid.launch.py"
WORKCELL_LAUNCH_FILE = ROOT / "launch" / "workcell.launch.py"


def test_default_graph_is_perception_and_inference_with_yaml() -> None:
    nodes = graph.resolve({})
    assert [n.spec.name for n in nodes] == ["perception", "inference", "viewer"]
    assert all(Path(n.params_file).name == "humanoid.yaml" for n in nodes)
    assert all(Path(n.params_file).is_file() for n in nodes)
    assert all(n.overrides == {} and n.namespace == "" for n in nodes)


def test_use_sim_adds_sensors_first_and_overrides_reach_their_nodes(tmp_path) -> None:
    params = tmp_path / "p.yaml"
    params.write_text("/**:\n  ros__parameters: {}\n")
    nodes = graph.resolve(
        {
            "use_sim": "True",
            "model_preset": "pi05",
            "checkpoint_dir": "/ck",
            "namespace": "robot1/",
            "params_file": str(params),
            "remap": "joint_states:=robot/joint_states  oxygen/actions:=/fleet/actions",
        }
    )
    assert [n.spec.name for n in nodes] == ["sim_sensors", "perception", "inference", "viewer"]
    assert nodes[2].overrides == {
        "model_preset": "pi05",
        "checkpoint_dir": "/ck",
        "allow_random_weights": True,  # simulation
    }
    assert nodes[1].overrides == {"model_preset": "pi05"}  # perception: the image size
    assert nodes[0].overrides == {}
    with pytest.raises(ValueError, match="overrides_dir"):
        nodes[2].ros_arguments()
    assert nodes[0].ros_arguments() == nodes[0].ros_arguments(tmp_path)  # nothing to write
    assert nodes[2].ros_arguments(tmp_path) == [
        "-r",
        "__node:=inference",
        "-r",
        "__ns:=/robot1",
        "-r",
        "joint_states:=robot/joint_states",
        "-r",
        "oxygen/actions:=/fleet/actions",
        "--params-file",
        str(params),
        "--params-file",
        str(tmp_path / "inference_overrides.yaml"),
    ]
    written = yaml.safe_load((tmp_path / "inference_overrides.yaml").read_text())
    assert written == {"/robot1/inference": {"ros__parameters": nodes[2].overrides}}
    nodes[1].ros_arguments(tmp_path)
    written = yaml.safe_load((tmp_path / "perception_overrides.yaml").read_text())
    assert written == {"/robot1/perception": {"ros__parameters": {"model_preset": "pi05"}}}


def test_random_weights_are_allowed_in_simulation_or_when_asked_for() -> None:
    def allowed(**launch: str) -> object:
        (inference,) = [n for n in graph.resolve(launch) if n.spec.name == "inference"]
        return inference.overrides.get("allow_random_weights")

    for profile in graph.PROFILES:  # a robot: the YAML's value, false, stays
        assert allowed(profile=profile) is None
        yaml_values = graph.node_parameters(
            yaml.safe_load(graph.default_params_file(profile).read_text()), "inference"
        )
        assert yaml_values["allow_random_weights"] is False
    assert allowed(use_sim="true") is True
    assert allowed(allow_random_weights="true") is True  # a stand
    assert allowed(use_sim="true", allow_random_weights="false") is False
    with pytest.raises(ValueError, match="not a boolean"):
        graph.resolve({"allow_random_weights": "maybe"})


def test_perception_and_inference_respawn_unless_turned_off() -> None:
    def respawning(**launch: str) -> dict[str, tuple[bool, float]]:
        return {n.spec.name: (n.respawn, n.respawn_delay_s) for n in graph.resolve(launch)}

    for profile in graph.PROFILES:
        nodes = respawning(profile=profile, use_sim="true")
        simulator = "sim_sensors" if profile == "humanoid" else "workcell_sim"
        assert nodes == {
            simulator: (False, 2.0),
            "perception": (True, 2.0),
            "inference": (True, 2.0),
            "viewer": (True, 2.0),
        }
    assert respawning(profile="workcell", use_sim="true", policy="expert")["expert"][0] is False
    assert not any(r for r, _ in respawning(respawn="false").values())
    assert respawning(respawn_delay="0.5")["inference"] == (True, 0.5)
    for bad in ("-1", "soon", "inf"):
        with pytest.raises(ValueError, match="respawn_delay must be a number >= 0"):
            graph.resolve({"respawn_delay": bad})
    with pytest.raises(ValueError, match="not a boolean"):
        graph.resolve({"respawn": "always"})


def test_workcell_profile_starts_its_simulator_and_the_chosen_policy(tmp_path) -> None:
    nodes = graph.resolve({"profile": "workcell", "view": "false"})
    assert [n.spec.name for n in nodes] == ["perception", "inference"]
    assert all(Path(n.params_file).name == "workcell.yaml" for n in nodes)
    nodes = graph.resolve(
        {"profile": "workcell", "use_sim": "true", "real_time_factor": "0.3", "view": "off"}
    )
    assert [n.spec.name for n in nodes] == ["workcell_sim", "perception", "inference"]
    assert nodes[0].spec.module == "oxygen_ros.nodes.workcell.workcell_sim_node"
    assert nodes[0].overrides == {"real_time_factor": 0.3}  # a float parameter, not a string
    assert nodes[0].ros_arguments(tmp_path)[-2:] == [
        "--params-file",
        str(tmp_path / "workcell_sim_overrides.yaml"),
    ]
    assert "real_time_factor: 0.3" in (tmp_path / "workcell_sim_overrides.yaml").read_text()
    # Strings read as `-p name:=value` reads them (benchmarks pass "1.0", "true", paths).
    typed = graph.ResolvedNode(
        nodes[2].spec, "", nodes[2].params_file, {"a": "1.0", "b": "true", "c": "/x", "d": ""}
    )
    typed.ros_arguments(tmp_path)
    written = yaml.safe_load((tmp_path / "inference_overrides.yaml").read_text())
    assert written["/inference"]["ros__parameters"] == {"a": 1.0, "b": True, "c": "/x", "d": ""}
    assert nodes[2].overrides == {
        "allow_random_weights": True
    }  # a simulator: no checkpoint needed
    expert = graph.resolve(
        {"profile": "workcell", "use_sim": "true", "policy": "expert", "model_preset": "pi05"}
    )
    assert [n.spec.name for n in expert] == ["workcell_sim", "perception", "expert", "viewer"]
    assert expert[2].spec.executable == "expert_node"
    assert expert[2].spec.module == "oxygen_ros.nodes.workcell.expert_node"
    assert [n.overrides for n in expert] == [{}, {"model_preset": "pi05"}, {}, {}]


def test_every_node_executable_has_an_installed_wrapper_script() -> None:
    cmake = (ROOT / "CMakeLists.txt").read_text()
    for spec in graph.NODES:
        wrapper = ROOT / "scripts" / "nodes" / spec.executable
        assert wrapper.is_file(), wrapper
        assert f"from {spec.module} import main" in wrapper.read_text()
        assert f"scripts/nodes/{spec.executable}" in cmake


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"use_sm": "true"}, "unknown launch argument"),
        ({"use_sim": "maybe"}, "not a boolean"),
        ({"params_file": "/nonexistent/x.yaml"}, "does not exist"),
        ({"profile": "quadruped"}, "profile must be one of"),
        ({"policy": "random"}, "policy must be one of"),
        ({"policy": "expert"}, "not available for profile 'humanoid'"),
        ({"profile": "workcell", "real_time_factor": "fast"}, "real_time_factor"),
        ({"profile": "workcell", "real_time_factor": "-1"}, "real_time_factor"),
    ],
)
def test_bad_arguments_are_refused_with_a_reason(args, message) -> None:
    with pytest.raises(ValueError, match=message):
        graph.resolve(args)


def _recording_launch_modules() -> dict[str, types.ModuleType]:
    """Stand-ins for launch/launch_ros that record constructor arguments."""

    class Recorded:
        def __init__(self, *args, **kwargs):
            self.args, self.kwargs = args, kwargs

    class LaunchConfiguration(Recorded):
        def perform(self, context):
            return context[self.args[0]]

    modules = {
        name: types.ModuleType(name)
        for name in (
            "launch",
            "launch.actions",
            "launch.substitutions",
            "launch_ros",
            "launch_ros.actions",
        )
    }
    modules["launch"].LaunchDescription = type("LaunchDescription", (Recorded,), {})
    modules["launch.actions"].DeclareLaunchArgument = type(
        "DeclareLaunchArgument", (Recorded,), {}
    )
    modules["launch.actions"].OpaqueFunction = type("OpaqueFunction", (Recorded,), {})
    modules["launch.substitutions"].LaunchConfiguration = LaunchConfiguration
    modules["launch_ros.actions"].Node = type("Node", (Recorded,), {})
    return modules


def _load_launch_file(monkeypatch, path: Path = LAUNCH_FILE):
    try:
        import launch
        import launch_ros  # noqa: F401

        real = hasattr(launch, "LaunchDescription")
    except ImportError:
        real = False
    if not real:
        for name, module in _recording_launch_modules().items():
            monkeypatch.setitem(sys.modules, name, module)
    spec = importlib.util.spec_from_file_location(path.stem.replace(".", "_"), path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, real


def test_launch_file_declares_every_argument_and_starts_the_resolved_graph(monkeypatch) -> None:
    module, real = _load_launch_file(monkeypatch)
    description = module.generate_launch_description()
    if real:  # pragma: no cover - only on a real ROS 2 install
        from launch import LaunchContext

        context = LaunchContext()
        context.launch_configurations.update(use_sim="true", model_preset="tiny")
        entities = description.entities
        declared = [e.name for e in entities[:-1]]
        nodes = entities[-1].execute(context)
        names = [n.node_name.split("/")[-1] if n.node_name else None for n in nodes]
        assert declared == [a.name for a in graph.LAUNCH_ARGUMENTS]
        assert len(nodes) == 3, names
        return
    entities = description.args[0]
    declared = [(e.args[0], e.kwargs["default_value"]) for e in entities[:-1]]
    assert declared == [(a.name, a.default) for a in graph.LAUNCH_ARGUMENTS]
    opaque = entities[-1]
    context = {a.name: a.default for a in graph.LAUNCH_ARGUMENTS} | {
        "use_sim": "true",
        "model_preset": "tiny",
    }
    nodes = opaque.kwargs["function"](context)
    expected = graph.resolve(context)
    assert [n.kwargs["executable"] for n in nodes] == [r.spec.executable for r in expected]
    assert [n.kwargs["name"] for n in nodes] == [
        "sim_sensors",
        "perception",
        "inference",
        "viewer",
    ]
    assert nodes[2].kwargs["parameters"] == [
        expected[2].params_file,
        {"model_preset": "tiny", "allow_random_weights": True},
    ]
    assert nodes[3].kwargs["parameters"] == [expected[3].params_file]
    assert nodes[1].kwargs["parameters"] == [expected[1].params_file, {"model_preset": "tiny"}]
    assert nodes[0].kwargs["parameters"] == [expected[0].params_file]
    assert all(n.kwargs["remappings"] == [] for n in nodes)
    assert all(n.kwargs["package"] == "oxygen_ros" for n in nodes)
    # launch_ros restarts perception, inference and the viewer, not the simulator
    assert [n.kwargs["respawn"] for n in nodes] == [False, True, True, True]
    assert all(n.kwargs["respawn_delay"] == 2.0 for n in nodes)


def test_workcell_launch_file_defaults_the_profile_to_workcell(monkeypatch) -> None:
    module, real = _load_launch_file(monkeypatch, WORKCELL_LAUNCH_FILE)
    description = module.generate_launch_description()
    if real:  # pragma: no cover - only on a real ROS 2 install
        from launch import LaunchContext

        context = LaunchContext()
        context.launch_configurations.update(
            {a.name: a.default for a in graph.LAUNCH_ARGUMENTS}
            | {"profile": "workcell", "use_sim": "true", "policy": "expert"}
        )
        names = [n.node_name.split("/")[-1] for n in description.entities[-1].execute(context)]
        assert names == ["workcell_sim", "perception", "expert"]
        return
    entities = description.args[0]
    defaults = {e.args[0]: e.kwargs["default_value"] for e in entities[:-1]}
    assert defaults["profile"] == "workcell" and defaults["use_sim"] == "false"
    assert list(defaults) == [a.name for a in graph.LAUNCH_ARGUMENTS]
    context = defaults | {"use_sim": "true", "real_time_factor": "0.25", "view": "false"}
    nodes = entities[-1].kwargs["function"](context)
    assert [n.kwargs["name"] for n in nodes] == ["workcell_sim", "perception", "inference"]
    assert nodes[0].kwargs["parameters"][1] == {"real_time_factor": 0.25}
    assert Path(nodes[0].kwargs["parameters"][0]).name == "workcell.yaml"


def test_view_and_record_start_their_nodes(tmp_path) -> None:
    """The viewer by default (view:=false: none); the recorder only with record:=DIR, first
    (it records from the start), its bag directory as `output_dir`, which must be new."""
    names = [n.spec.name for n in graph.resolve({"profile": "workcell", "use_sim": "true"})]
    assert names == ["workcell_sim", "perception", "inference", "viewer"]
    bag = tmp_path / "bags" / "run1"
    nodes = graph.resolve({"record": str(bag), "view": "false", "use_sim": "true"})
    assert [n.spec.name for n in nodes] == ["recorder", "sim_sensors", "perception", "inference"]
    assert nodes[0].overrides == {"output_dir": str(bag)} and not nodes[0].respawn
    assert all("output_dir" not in n.overrides for n in nodes[1:])
    relative = graph.resolve({"record": "rel/bag", "view": "false"})[0].overrides["output_dir"]
    assert relative == str(Path.cwd() / "rel" / "bag")  # the caller's directory
    bag.mkdir(parents=True)
    with pytest.raises(ValueError, match="exists"):
        graph.resolve({"record": str(bag)})
    with pytest.raises(ValueError, match="not a boolean"):
        graph.resolve({"view": "sometimes"})


def test_remap_argument_is_checked() -> None:
    assert graph.parse_remappings("") == ()
    assert graph.parse_remappings(" a:=b\tc/d:=/e ") == (("a", "b"), ("c/d", "/e"))
    for bad in ("a", "a:=", ":=b", "a=b"):
        with pytest.raises(ValueError, match="from:=to"):
            graph.resolve({"remap": bad})


def test_node_parameters_merge_the_sections_rcl_applies_in_file_order() -> None:
    data = {
        "/**": {"ros__parameters": {"a": 1, "b": 1}},
        "/**/inference": {"ros__parameters": {"b": 2, "c": 2}},
        "perception": {"ros__parameters": {"a": 9}},
        "inference": {"ros__parameters": {"c": 3}},
    }
    assert graph.node_parameters(data, "inference") == {"a": 1, "b": 2, "c": 3}
    assert graph.node_parameters(data, "perception") == {"a": 9, "b": 1}
    assert graph.node_parameters({}, "inference") == {}


def rcl_values(arguments: list[str], name: str, keys, namespace: str = "") -> dict:
    """What rcl itself (no spinning) gives a node `name` started with these `--ros-args`: the
    value of each of `keys` that is set, and the node's namespace as `__ns`."""
    import rclpy
    from rcl_interfaces.msg import ParameterDescriptor
    from rclpy.node import Node

    context = rclpy.Context()
    rclpy.init(args=["--ros-args", *arguments], context=context)
    try:
        node = Node(name, namespace=namespace, context=context)
        dynamic = ParameterDescriptor(dynamic_typing=True)
        out = {
            k: (
                node.get_parameter(k)
                if node.has_parameter(k)  # built in (use_sim_time)
                else node.declare_parameter(k, None, dynamic)
            ).value
            for k in dict.fromkeys(keys)
        }
        out = {k: v for k, v in out.items() if v is not None}
        out["__ns"] = node.get_namespace()
        node.destroy_node()
        return out
    finally:
        rclpy.shutdown(context=context)


@pytest.mark.parametrize("profile", graph.PROFILES)
def test_profile_yaml_and_overrides_reach_nodes_in_a_namespace(profile: str, tmp_path) -> None:
    """rcl itself (no spinning): a node started with the bring-up's arguments under a
    namespace gets its own YAML section and the launch overrides. Positive control: a plain
    `inference:` section and a `-p inference:...` override (what the files and the bring-up
    used before) reach the node without a namespace but not the namespaced one."""
    launch = {"model_preset": "pi05"} if profile == "humanoid" else {"real_time_factor": "0.3"}
    for namespace in ("", "robot1/"):
        nodes = graph.resolve(
            {"profile": profile, "use_sim": "true", "namespace": namespace, **launch}
        )
        data = yaml.safe_load(Path(nodes[0].params_file).read_text())
        shared = data["/**"]["ros__parameters"]
        for node in nodes:
            section = graph.node_parameters(data, node.spec.name)
            own = {
                k: v
                for k, v in section.items()
                if k not in shared and not isinstance(v, dict) and v != []  # [] reads as unset
            }
            assert own, node.spec.name  # each node has parameters of its own in the YAML
            args = node.ros_arguments(tmp_path)
            got = rcl_values(args, node.spec.name, [*own, *node.overrides])
            assert got.pop("__ns") == ("/robot1" if namespace else "/")
            assert got == {**own, **node.overrides}, (namespace, node.spec.name)
    old_yaml = tmp_path / "old.yaml"
    old_yaml.write_text("inference:\n  ros__parameters:\n    seed: 7\n")
    old = ["--params-file", str(old_yaml), "-p", "inference:model_preset:=pi05"]
    keys = ["seed", "model_preset"]
    assert rcl_values(old, "inference", keys) == {"seed": 7, "model_preset": "pi05", "__ns": "/"}
    assert rcl_values(old, "inference", keys, "/robot1") == {"__ns": "/robot1"}


@pytest.mark.parametrize(
    ("profile", "preset", "size"),
    [("humanoid", "workcell", (96, 96)), ("workcell", "tiny", (224, 224))],
)
def test_model_preset_override_gives_perception_and_inference_one_image_size(
    profile: str, preset: str, size: tuple[int, int], tmp_path
) -> None:
    """`model_preset:=<preset>`, read by rcl as each node starts (in a namespace too): the
    image size perception converts to and the one inference accepts are both the preset's.
    Positive control: without the override, perception would keep the YAML's preset, whose
    size differs."""
    from oxygen_ros.engine.config import get_model_config

    for namespace in ("", "robot1"):
        nodes = graph.resolve(
            {"profile": profile, "namespace": namespace, "model_preset": preset, "view": "false"}
        )
        assert [n.spec.name for n in nodes] == ["perception", "inference"]
        sizes = {}
        for node in nodes:
            got = rcl_values(node.ros_arguments(tmp_path), node.spec.name, ["model_preset"])
            sizes[node.spec.name] = get_model_config(got["model_preset"]).image_resolution
        assert sizes == {"perception": size, "inference": size}, namespace
        yaml_only = rcl_values(
            ["--params-file", nodes[0].params_file], "perception", ["model_preset"]
        )
        assert get_model_config(yaml_only["model_preset"]).image_resolution != size
