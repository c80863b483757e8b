"""Parameters several nodes declare (the tables of one node are in its package's params.py).

- `SHARED`: the robot's joints and frame, the observation, joint state and camera names, the
  diagnostics period (every node but the expert, which declares a subset: `EXPERT_SHARED`).
- `MODEL_SHARED`: the model image size has one source, `model_preset` (declared by perception
  and inference alike): perception's output size is the preset's `image_resolution`.
"""

from __future__ import annotations

from oxygen_ros.engine.config import PRESET_NAMES
from oxygen_ros.nodes.common.parameters import (
    ParamSpec,
    one_of,
    period_or_zero,
    topic_name,
    unique_names,
)

SHARED: tuple[ParamSpec, ...] = (
    ParamSpec(
        "joint_names",
        [],
        "model joint order (state and action columns)",
        "str_list",
        check=unique_names,
    ),
    ParamSpec("frame_id", "base_link", "robot base frame of published messages", "str"),
    ParamSpec(
        "observation_topic",
        "oxygen/observation",
        "fused ObservationFrame topic",
        "str",
        check=topic_name,
    ),
    ParamSpec(
        "joint_state_topic",
        "joint_states",
        "sensor_msgs/JointState topic",
        "str",
        check=topic_name,
    ),
    ParamSpec(
        "camera_names",
        [],
        "cameras; each has cameras.<name>.* parameters",
        "str_list",
        check=lambda v: None if len(set(v)) == len(v) else "names must be unique",
    ),
    ParamSpec(
        "diagnostics_period_s",
        1.0,
        "period of /diagnostics messages",
        "float",
        runtime=True,
        check=period_or_zero(0.1),
    ),
)

# The model both perception and inference serve: perception converts every image to the
# preset's `image_resolution`, the only size inference accepts. Both nodes declare it and the
# YAMLs set it once, in their `/**` section (a test checks), so the two cannot disagree.
MODEL_SHARED: tuple[ParamSpec, ...] = (
    ParamSpec(
        "model_preset",
        "tiny",
        "engine model preset; perception converts images to its image resolution",
        "str",
        check=one_of(*PRESET_NAMES),
    ),
)
