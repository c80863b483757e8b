"""The parameters of the humanoid's synthetic sensors (sim_sensors_node); the shared ones are
in `common/params.py`."""

from __future__ import annotations

from oxygen_ros.nodes.common.parameters import (
    ParamSpec,
    int_range,
    one_of,
    positive,
    positive_rate,
    topic_name,
)

SIM_SENSORS: tuple[ParamSpec, ...] = (
    ParamSpec(
        "camera_rate_hz",
        30.0,
        "synthetic camera rate",
        "float",
        runtime=True,
        check=positive_rate(200.0),
    ),
    ParamSpec(
        "joint_rate_hz",
        30.0,
        "synthetic joint state rate",
        "float",
        runtime=True,
        check=positive_rate(1000.0),
    ),
    ParamSpec(
        "motion_period_s",
        4.0,
        "period of the synthetic motion",
        "float",
        runtime=True,
        check=positive,
    ),
)
SIM_CAMERA: tuple[ParamSpec, ...] = (
    ParamSpec("topic", "", "image topic", "str", check=topic_name),
    ParamSpec(
        "encoding",
        "rgb8",
        "encoding the sim publishes",
        "str",
        check=one_of("rgb8", "bgr8", "rgba8", "bgra8", "mono8"),
    ),
    ParamSpec("width", 640, "sim image width", "int", check=int_range(1, 4096)),
    ParamSpec("height", 480, "sim image height", "int", check=int_range(1, 4096)),
)
