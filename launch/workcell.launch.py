"""Workcell bring-up: `ros2 launch oxygen_ros workcell.launch.py [use_sim:=true] [policy:=expert]`.

`humanoid.launch.py` with `profile` defaulting to `workcell` (the simulated ALOHA workcell with
`use_sim:=true`; `real_time_factor:=0.3` slows the whole graph down).
"""

import importlib.util
from pathlib import Path

from launch import LaunchDescription

_spec = importlib.util.spec_from_file_location(
    "oxygen_ros_humanoid_launch", Path(__file__).with_name("humanoid.launch.py")
)
_base = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_base)


def generate_launch_description() -> LaunchDescription:
    return _base.generate_launch_description({"profile": "workcell"})
