"""Parameter specs of every node (`<node package>/params.py`; the machinery in
`common/parameters.py`): conversion, checks, and config/<profile>.yaml matching the
declarations."""

from pathlib import Path

import numpy as np
import pytest
import yaml

from oxygen_ros import graph
from oxygen_ros.engine.config import PRESET_NAMES, get_model_config
from oxygen_ros.nodes.common.parameters import (
    NodeParameters,
    ParameterError,
    ParamSpec,
    camera_specs,
    coerce,
    validate,
)
from oxygen_ros.nodes.common.params import MODEL_SHARED, SHARED
from oxygen_ros.nodes.humanoid.params import SIM_CAMERA, SIM_SENSORS
from oxygen_ros.nodes.inference.engine_bridge import build_engine_config
from oxygen_ros.nodes.inference.params import INFERENCE, trajectory_group_specs
from oxygen_ros.nodes.inference.trajectory_groups import parse_groups
from oxygen_ros.nodes.perception.params import (
    CUBE_STATES,
    PERCEPTION,
    PERCEPTION_CAMERA,
    TARGET_CUBE_STATES,
)
from oxygen_ros.nodes.recorder.params import RECORDER
from oxygen_ros.nodes.viewer.params import VIEWER
from oxygen_ros.nodes.workcell.params import (
    EXPERT,
    EXPERT_CAMERA,
    EXPERT_SHARED,
    WORKCELL_CAMERA,
    WORKCELL_SIM,
)

CONFIG = Path(__file__).resolve().parents[2] / "config"
YAML_PATH = CONFIG / "humanoid.yaml"
# Parameters every rclpy node declares itself (set per node in the YAML, never in our tables).
ROS_BUILTIN = {"use_sim_time"}
PROFILE_NODES = {
    "humanoid": {
        "sim_sensors": (SHARED + SIM_SENSORS, SIM_CAMERA),
        "perception": (SHARED + PERCEPTION, PERCEPTION_CAMERA),
        "inference": (SHARED + INFERENCE, ()),
        "viewer": (SHARED + VIEWER, ()),
        "recorder": (RECORDER, ()),
    },
    "workcell": {
        "workcell_sim": (SHARED + WORKCELL_SIM, WORKCELL_CAMERA),
        "perception": (SHARED + PERCEPTION, PERCEPTION_CAMERA),
        "inference": (SHARED + INFERENCE, ()),
        "viewer": (SHARED + VIEWER, ()),
        "recorder": (RECORDER, ()),
    },
}
PROFILE_NODES["workcell"]["expert"] = (EXPERT_SHARED + EXPERT, EXPERT_CAMERA)
NODE_SPECS = PROFILE_NODES["humanoid"]
PROFILE_NODE_PAIRS = [(prof, node) for prof, nodes in PROFILE_NODES.items() for node in nodes]
# Nodes that follow the simulator's /clock in the workcell profile (the simulator never does).
SIM_TIME_NODES = {"perception", "inference", "expert", "viewer"}


def flatten(tree: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def load(profile: str) -> dict:
    return yaml.safe_load((CONFIG / f"{profile}.yaml").read_text())


def yaml_values(node: str, profile: str = "humanoid") -> dict:
    return flatten(graph.node_parameters(load(profile), node))


def declared(node: str, values: dict, profile: str = "humanoid") -> dict[str, ParamSpec]:
    specs, camera = PROFILE_NODES[profile][node]
    out = {s.name: s for s in specs}
    for name in values.get("camera_names", []):
        out.update({s.name: s for s in camera_specs(name, camera)})
    if node == "inference":
        for name in values.get("trajectory_groups", []):
            out.update({s.name: s for s in trajectory_group_specs(name)})
    return out


def commented_trajectory_groups(profile: str = "humanoid") -> dict:
    """The inference section's commented trajectory group example, uncommented."""
    lines = (CONFIG / f"{profile}.yaml").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("    # trajectory_groups:"))
    block = []
    for line in lines[start:]:
        if not line.startswith("    # "):
            break
        block.append(line.replace("    # ", "", 1))
    return flatten(yaml.safe_load("\n".join(block)))


def test_commented_trajectory_group_example_is_valid() -> None:
    values = yaml_values("inference")
    values.update(commented_trajectory_groups())
    specs = declared("inference", values)
    groups = values["trajectory_groups"]
    assert len(groups) >= 2 and {f"trajectory_group.{g}.joints" for g in groups} <= set(specs)
    for name in set(specs) & set(commented_trajectory_groups()):
        _, reason = validate(specs[name], values[name])
        assert reason is None, reason
    parsed = parse_groups(
        values["joint_names"],
        {
            g: (values[f"trajectory_group.{g}.topic"], values[f"trajectory_group.{g}.joints"])
            for g in groups
        },
    )
    # The example sends every joint, each to one controller.
    assert sorted(j for g in parsed for j in g.joint_names) == sorted(values["joint_names"])


@pytest.mark.parametrize(
    ("name", "value", "ok"),
    [
        ("trajectory_groups", [], True),
        ("trajectory_groups", ["arm", "arm"], False),
        ("trajectory_group.arm.topic", "", False),
        ("trajectory_group.arm.topic", "arm_controller/joint_trajectory", True),
        ("trajectory_group.arm.joints", [], False),
        ("trajectory_group.arm.joints", ["a", "a"], False),
    ],
)
def test_trajectory_group_checks(name, value, ok) -> None:
    specs = {s.name: s for s in INFERENCE + trajectory_group_specs("arm")}
    _, reason = validate(specs[name], value)
    assert (reason is None) == ok, reason


@pytest.mark.parametrize(("profile", "node"), PROFILE_NODE_PAIRS)
def test_yaml_sets_every_declared_parameter_with_a_valid_value(profile: str, node: str) -> None:
    if f"/**/{node}" not in load(profile):
        pytest.skip(f"{profile}.yaml has no {node} section yet")
    values = yaml_values(node, profile)
    specs = declared(node, values, profile)
    missing = sorted(set(specs) - set(values))
    assert not missing, f"{node}: declared but not in {profile}.yaml: {missing}"
    for name, spec in specs.items():
        value = None if values[name] == [] else values[name]  # ROS reads [] as "not set"
        _, reason = validate(spec, value)
        assert reason is None, reason


@pytest.mark.parametrize("profile", list(PROFILE_NODES))
def test_every_yaml_key_is_declared_by_some_node(profile: str) -> None:
    data = load(profile)
    for section, body in data.items():
        keys = set(flatten(body["ros__parameters"]))
        assert section == "/**" or section.startswith("/**/"), f"{section}: not namespace-proof"
        nodes = list(PROFILE_NODES[profile]) if section == "/**" else [section[len("/**/") :]]
        known = set(ROS_BUILTIN) if section != "/**" else set()
        for node in nodes:
            known |= set(declared(node, yaml_values(node, profile), profile))
        # Per-camera width/height are for the sim; slot for perception: union over nodes.
        assert keys <= known, f"{section}: not declared: {sorted(keys - known)}"


def test_workcell_nodes_follow_the_simulator_clock_but_the_simulator_does_not() -> None:
    data = load("workcell")
    assert "use_sim_time" not in data["/**"]["ros__parameters"]
    assert not graph.node_parameters(data, "workcell_sim").get("use_sim_time", False)
    for node in SIM_TIME_NODES:
        if f"/**/{node}" in data:
            assert graph.node_parameters(data, node).get("use_sim_time") is True, node


def test_workcell_profile_matches_the_simulated_robot() -> None:
    from oxygen_ros.sim import robot
    from oxygen_ros.sim.workcell import CAMERAS, Workcell, WorkcellConfig

    values = yaml_values("inference", "workcell")
    assert tuple(values["joint_names"]) == robot.JOINT_NAMES
    assert tuple(values["camera_names"]) == CAMERAS
    slots = [values[f"cameras.{c}.slot"] for c in CAMERAS]
    assert slots == ["base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb"]
    workcell = Workcell(WorkcellConfig(render=False))
    np.testing.assert_allclose(values["joint_position_lower"], workcell.lower, atol=1e-9)
    np.testing.assert_allclose(values["joint_position_upper"], workcell.upper, atol=1e-9)
    sim = yaml_values("workcell_sim", "workcell")
    model = get_model_config(values["model_preset"])
    # A whole model chunk runs before the simulator calls it stale.
    assert sim["chunk_max_age_s"] > model.action_horizon * values["action_dt_s"]


@pytest.mark.parametrize("profile", list(PROFILE_NODES))
def test_model_preset_is_set_once_for_perception_and_inference(profile: str) -> None:
    """Perception converts images to the preset's resolution and inference accepts no other:
    both declare the one `model_preset` spec and the YAML sets it in the shared section only,
    so no node section can give the two different presets."""
    data = load(profile)
    assert data["/**"]["ros__parameters"]["model_preset"] in PRESET_NAMES
    for section, body in data.items():
        assert section == "/**" or "model_preset" not in body["ros__parameters"], section
    for node in ("perception", "inference"):
        specs, _camera = PROFILE_NODES[profile][node]
        assert [s for s in specs if s.name == "model_preset"] == list(MODEL_SHARED), node
    assert not any(s.name in ("image_height", "image_width") for s in PERCEPTION)


def test_yaml_builds_a_valid_engine_config() -> None:
    values = {}
    for name, spec in declared("inference", yaml_values("inference")).items():
        raw = yaml_values("inference")[name]
        values[name], reason = validate(spec, None if raw == [] else raw)
        assert reason is None
    cfg = build_engine_config(values, len(values["joint_names"]))
    assert cfg.action_output_dim == 19 and cfg.model.name == "tiny"
    assert cfg.checkpoint_dir is None
    assert values["chunk_transition"] == "blend" and not cfg.rtc.enabled
    # rtc: the engine guides its denoise, on the rows' own spacing, capped as configured.
    rtc = build_engine_config(
        {**values, "chunk_transition": "rtc", "rtc_max_guidance": 2.5}, len(values["joint_names"])
    ).rtc
    assert rtc.enabled and (rtc.row_dt_s, rtc.max_guidance) == (values["action_dt_s"], 2.5)


@pytest.mark.parametrize(
    ("kind", "value", "expected"),
    [
        ("float", 70, 70.0),
        ("float", 2.5, 2.5),
        ("int", 3, 3),
        ("bool", True, True),
        ("str", "x", "x"),
        ("float_list", None, []),
        ("float_list", [1, 2.5], [1.0, 2.5]),
        ("str_list", ["a"], ["a"]),
    ],
)
def test_coerce_accepts(kind, value, expected) -> None:
    assert coerce(kind, value) == expected


@pytest.mark.parametrize(
    ("kind", "value"),
    [
        ("float", "70"),
        ("float", True),
        ("int", 2.5),
        ("bool", 1),
        ("str", 3),
        ("float_list", "abc"),
        ("str_list", [1]),
    ],
)
def test_coerce_refuses(kind, value) -> None:
    with pytest.raises(ValueError):
        coerce(kind, value)


def spec(name: str) -> ParamSpec:
    return {s.name: s for s in SHARED + INFERENCE + PERCEPTION}[name]


@pytest.mark.parametrize(
    ("name", "value", "ok"),
    [
        ("action_rate_hz", 50, True),
        ("action_rate_hz", 0.0, False),
        ("action_rate_hz", -5.0, False),
        ("action_rate_hz", 5000.0, False),
        ("action_rate_hz", float("nan"), False),
        ("action_rate_hz", "fast", False),
        ("narration_period_s", 0.0, True),
        ("narration_period_s", 0.01, False),
        ("memory_period_s", 10.0, True),
        ("chunk_transition", "cubic", False),
        ("watchdog_policy", "hold", True),
        ("joint_names", [], False),
        ("joint_names", ["a", "a"], False),
        ("observation_rate_hz", 30.0, True),
    ],
)
def test_checks(name, value, ok) -> None:
    _converted, reason = validate(spec(name), value)
    assert (reason is None) == ok, reason
    if not ok:
        assert name in reason


def test_runtime_parameters_are_rates_periods_and_policies() -> None:
    runtime = {s.name for s in SHARED + INFERENCE + PERCEPTION + SIM_SENSORS if s.runtime}
    assert {
        "action_rate_hz",
        "narration_period_s",
        "memory_period_s",
        "observation_rate_hz",
        "camera_rate_hz",
        "joint_rate_hz",
    } <= runtime
    assert "model_preset" not in runtime and "memory_db_path" not in runtime


def test_engine_config_refuses_too_many_joints() -> None:
    values = {s.name: s.default for s in INFERENCE}
    with pytest.raises(ValueError, match="exceed"):
        build_engine_config(values, 33)


def test_engine_config_refuses_small_cache() -> None:
    values = {s.name: s.default for s in INFERENCE}
    values["cache_max_seq_len"] = 16
    with pytest.raises(ValueError):
        build_engine_config(values, 19)


def _node_with(arguments: list[str]):
    """A real rclpy node (not spun) in its own context with these `--ros-args`."""
    import rclpy
    from rclpy.node import Node

    context = rclpy.Context()
    rclpy.init(args=["--ros-args", *arguments], context=context)
    return Node("inference", context=context), context


def test_descriptors_show_ranges_and_constraints_and_rclpy_enforces_them() -> None:
    """`ros2 param describe` reads these descriptors: a bounded float/int check gives the range,
    a choice its options. A set outside the range is refused (rclpy's own check, with our check
    behind it); inside it is accepted and reaches the listeners."""
    import rclpy
    from rclpy.parameter import Parameter

    node, context = _node_with(["-p", "joint_names:=[a, b]"])
    try:
        params = NodeParameters(node, SHARED + INFERENCE)
        rate, slots, mode = node.describe_parameters(
            ["action_rate_hz", "cache_num_slots", "scheduler_mode"]
        )
        spec = next(s for s in INFERENCE if s.name == "action_rate_hz")
        (bounds,) = rate.floating_point_range
        assert (bounds.from_value, bounds.to_value) == spec.check.bounds
        assert rate.additional_constraints.startswith("a rate in (0,")
        assert not rate.read_only and slots.read_only
        assert slots.integer_range and slots.integer_range[0].from_value >= 1
        assert "'continuous'" in mode.additional_constraints
        assert not mode.floating_point_range and not mode.integer_range
        changed = []
        params.add_listener(changed.append)
        refused = node.set_parameters([Parameter("action_rate_hz", value=1.0e6)])[0]
        assert not refused.successful and params["action_rate_hz"] == 70.0
        assert node.set_parameters([Parameter("action_rate_hz", value=50.0)])[0].successful
        assert params["action_rate_hz"] == 50.0 and changed == [{"action_rate_hz": 50.0}]
        # An integer for a float parameter (`ros2 param set /inference action_rate_hz 60`).
        assert node.set_parameters([Parameter("action_rate_hz", value=60)])[0].successful
        assert params["action_rate_hz"] == 60.0
        # Zero is inside the descriptor's closed range but not a rate: our check refuses it.
        zero = node.set_parameters([Parameter("action_rate_hz", value=0.0)])[0]
        assert not zero.successful and "rate" in zero.reason
    finally:
        node.destroy_node()
        rclpy.shutdown(context=context)


def test_perception_refuses_an_unknown_model_preset_at_start() -> None:
    import rclpy

    node, context = _node_with(["-p", "model_preset:=pi06"])
    try:
        with pytest.raises(ParameterError, match="model_preset"):
            NodeParameters(node, SHARED + PERCEPTION)
    finally:
        node.destroy_node()
        rclpy.shutdown(context=context)


def test_out_of_range_start_value_fails_with_our_reason_not_an_rclpy_exception() -> None:
    import rclpy

    node, context = _node_with(["-p", "action_rate_hz:=5000.0", "-p", "cache_num_slots:=0"])
    try:
        with pytest.raises(ParameterError) as caught:
            NodeParameters(node, SHARED + INFERENCE)
        assert "action_rate_hz" in str(caught.value) and "cache_num_slots" in str(caught.value)
    finally:
        node.destroy_node()
        rclpy.shutdown(context=context)


@pytest.mark.parametrize("profile", ["humanoid", "workcell"])
def test_every_profile_ships_motion_limits_for_every_joint(profile: str) -> None:
    values = yaml_values("inference", profile)
    n = len(values["joint_names"])
    lower, upper = values["joint_position_lower"], values["joint_position_upper"]
    velocity = values["joint_max_velocity"]
    assert len(lower) == len(upper) == len(velocity) == n
    assert all(lo < hi for lo, hi in zip(lower, upper, strict=True))
    assert all(v > 0 for v in velocity)


def _inference_values(**overrides) -> dict:
    values = {}
    for name, spec in declared("inference", yaml_values("inference")).items():
        raw = yaml_values("inference")[name]
        values[name], _ = validate(spec, None if raw == [] else raw)
    return {**values, **overrides}


def test_action_space_parameter_becomes_the_engines_delta_mask() -> None:
    from oxygen_ros.nodes.inference.engine_bridge import delta_action_mask

    values = _inference_values()
    joints = values["joint_names"]
    assert values["action_space"] == "checkpoint" and delta_action_mask(values) is None
    assert delta_action_mask({**values, "action_space": "absolute"}) == ()
    arms = [j for j in joints if j.startswith("left_") and j != "left_gripper"]
    mask = delta_action_mask({**values, "action_space": "delta", "delta_action_joints": arms})
    assert mask == tuple(j in arms for j in joints) and sum(mask) == 7
    cfg = build_engine_config(
        {**values, "action_space": "delta", "delta_action_joints": arms}, len(joints)
    )
    assert cfg.delta_action_mask == mask
    for bad in ([], ["left_elbow", "tail"]):
        with pytest.raises(ValueError, match="delta_action_joints"):
            delta_action_mask({**values, "action_space": "delta", "delta_action_joints": bad})


def test_delta_actions_round_trip_through_openpi_transforms_with_the_node_mask() -> None:
    """Absolute targets -> openpi's DeltaActions (what training on delta actions sees) -> the
    engine's AbsoluteActions with the mask the node builds -> the same targets; the joints
    outside the mask are never touched."""
    from openpi import transforms

    from oxygen_ros.engine.checkpoint import Normalizer
    from oxygen_ros.nodes.inference.engine_bridge import delta_action_mask

    values = _inference_values()
    joints = values["joint_names"]
    arms = [j for j in joints if "shoulder" in j or "elbow" in j]
    mask = delta_action_mask({**values, "action_space": "delta", "delta_action_joints": arms})
    rng = np.random.default_rng(0)
    state = rng.normal(size=len(joints)).astype(np.float32)
    absolute = rng.normal(size=(10, len(joints))).astype(np.float32)
    data = {"state": state, "actions": absolute.copy()}
    delta = transforms.DeltaActions(mask)(data)["actions"]
    inside, outside = np.array(mask), ~np.array(mask)
    np.testing.assert_allclose(delta[:, inside], absolute[:, inside] - state[inside], atol=1e-6)
    np.testing.assert_array_equal(delta[:, outside], absolute[:, outside])
    back = Normalizer.absolute_actions(delta, state, mask)
    np.testing.assert_allclose(back, absolute, atol=1e-6)


def test_perceptions_cube_states_are_the_workcells_object_states() -> None:
    """`cube_state` takes exactly the workcell's object states, and the node tells the
    instructed cube to exactly the states that take one (params keeps its own copies so that
    loading parameters does not import the perception)."""
    from oxygen_ros.perception import workcell_cubes

    assert tuple(kind for kind in workcell_cubes.OBJECT_STATES if kind) == CUBE_STATES
    assert TARGET_CUBE_STATES == workcell_cubes.TARGET_KINDS
    for kind in CUBE_STATES:
        workcell_cubes.object_state(kind, "red_cube" if kind in TARGET_CUBE_STATES else None)
