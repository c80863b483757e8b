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

from oxygen_ros import graph

ROOT = Path(__file__).resolve().parents[1]
LAUNCH_FILE = ROOT / "launch" / "humanoid.launch.py"
WORKCELL_LAUNCH_FILE = ROOT / "launch" / "workcell.launch.py"


def test_default_graph_is_perception_and_inference_with_yaml() -> None:
    nodes = graph.resolve({})
    assert [n.spec.name for n in nodes] == ["perception", "inference"]
    assert all(Path(n.params_file).name == "humanoid.yaml" for n in nodes)
    assert all(Path(n.params_file).is_file() for n in nodes)
    assert all(n.overrides == {} and n.namespace == "" for n in nodes)


def test_use_sim_adds_sensors_first_and_overrides_reach_inference_only(tmp_path) -> None:
    params = tmp_path / "p.yaml"
    params.write_text("/**:\n  ros__parameters: {}\n")
    nodes = graph.resolve(
        {
            "use_sim": "True",
            "model_preset": "pi05",
            "checkpoint_dir": "/ck",
            "namespace": "robot1/",
            "params_file": str(params),
        }
    )
    assert [n.spec.name for n in nodes] == ["sim_sensors", "perception", "inference"]
    assert nodes[2].overrides == {"model_preset": "pi05", "checkpoint_dir": "/ck"}
    assert nodes[0].overrides == {} and nodes[1].overrides == {}
    assert nodes[2].ros_arguments() == [
        "-r",
        "__node:=inference",
        "-r",
        "__ns:=/robot1",
        "--params-file",
        str(params),
        "-p",
        "inference:model_preset:=pi05",
        "-p",
        "inference:checkpoint_dir:=/ck",
    ]


def test_workcell_profile_starts_its_simulator_and_the_chosen_policy() -> None:
    nodes = graph.resolve({"profile": "workcell"})
    assert [n.spec.name for n in nodes] == ["perception", "inference"]
    assert all(Path(n.params_file).name == "workcell.yaml" for n in nodes)
    nodes = graph.resolve({"profile": "workcell", "use_sim": "true", "real_time_factor": "0.3"})
    assert [n.spec.name for n in nodes] == ["workcell_sim", "perception", "inference"]
    assert nodes[0].spec.module == "oxygen_ros.nodes.workcell_sim_node"
    assert nodes[0].overrides == {"real_time_factor": 0.3}  # a float parameter, not a string
    assert nodes[0].ros_arguments()[-2:] == ["-p", "workcell_sim:real_time_factor:=0.3"]
    assert nodes[2].overrides == {}
    expert = graph.resolve(
        {"profile": "workcell", "use_sim": "true", "policy": "expert", "model_preset": "pi05"}
    )
    assert [n.spec.name for n in expert] == ["workcell_sim", "perception", "expert"]
    assert expert[2].spec.executable == "expert_node"
    assert expert[2].spec.module == "oxygen_ros.nodes.expert_node"
    assert all(n.overrides == {} for n in expert)


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
    assert [n.kwargs["name"] for n in nodes] == ["sim_sensors", "perception", "inference"]
    assert nodes[-1].kwargs["parameters"] == [expected[-1].params_file, {"model_preset": "tiny"}]
    assert all(n.kwargs["package"] == "oxygen_ros" for n in nodes)


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
    context = defaults | {"use_sim": "true", "real_time_factor": "0.25"}
    nodes = entities[-1].kwargs["function"](context)
    assert [n.kwargs["name"] for n in nodes] == ["workcell_sim", "perception", "inference"]
    assert nodes[0].kwargs["parameters"][1] == {"real_time_factor": 0.25}
    assert Path(nodes[0].kwargs["parameters"][0]).name == "workcell.yaml"
