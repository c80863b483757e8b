"""Bring-up: `ros2 launch oxygen_ros humanoid.launch.py [profile:=workcell] [use_sim:=true] ...`.

The node graph and argument handling live in `oxygen_ros.graph` (shared with the project's own
bring-up command, so the two cannot drift); this file only maps them onto launch/launch_ros.
`workcell.launch.py` is this file with `profile` defaulting to `workcell`.
"""

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, OpaqueFunction
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import Node

from oxygen_ros import graph


def _nodes(context, *args, **kwargs):
    values = {a.name: LaunchConfiguration(a.name).perform(context) for a in graph.LAUNCH_ARGUMENTS}
    return [
        Node(
            package=graph.PACKAGE,
            executable=node.spec.executable,
            name=node.spec.name,
            namespace=node.namespace or None,
            remappings=list(node.remappings),
            parameters=[node.params_file, node.overrides]
            if node.overrides
            else [node.params_file],
            output="screen",
            emulate_tty=True,
            respawn=node.respawn,
            respawn_delay=node.respawn_delay_s,
        )
        for node in graph.resolve(values)
    ]


def generate_launch_description(defaults: dict[str, str] | None = None) -> LaunchDescription:
    """Declares every graph argument (`defaults` overrides some defaults) and the nodes."""
    defaults = defaults or {}
    return LaunchDescription(
        [
            *(
                DeclareLaunchArgument(
                    a.name,
                    default_value=defaults.get(a.name, a.default),
                    description=a.description,
                )
                for a in graph.LAUNCH_ARGUMENTS
            ),
            OpaqueFunction(function=_nodes),
        ]
    )
