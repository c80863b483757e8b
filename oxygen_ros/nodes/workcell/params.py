"""The parameters of the workcell's nodes: the ALOHA workcell simulator (workcell_sim_node) and
the scripted expert (expert_node); the shared ones are in `common/params.py`."""

from __future__ import annotations

import math

from oxygen_ros.nodes.common.parameters import (
    ParamSpec,
    float_range,
    int_range,
    non_negative,
    one_of,
    positive,
    positive_rate,
    topic_name,
)
from oxygen_ros.nodes.common.params import SHARED

# The ALOHA workcell simulator (workcell_sim_node). Rates are in simulated time.
WORKCELL_SIM: tuple[ParamSpec, ...] = (
    ParamSpec(
        "control_rate_hz",
        100.0,
        "control ticks per simulated second (command buffer -> actuator targets -> physics)",
        "float",
        check=positive_rate(500.0),
    ),
    ParamSpec(
        "joint_rate_hz",
        50.0,
        "JointState rate (sim time; also published on every camera tick)",
        "float",
        runtime=True,
        check=positive_rate(500.0),
    ),
    ParamSpec(
        "camera_rate_hz",
        10.0,
        "rate at which every camera is rendered (sim time)",
        "float",
        runtime=True,
        check=positive_rate(100.0),
    ),
    ParamSpec(
        "status_rate_hz",
        10.0,
        "EpisodeStatus rate (sim time; also published on every phase change and before each "
        "camera tick's images)",
        "float",
        runtime=True,
        check=positive_rate(100.0),
    ),
    ParamSpec(
        "real_time_factor",
        1.0,
        "simulated seconds per wall-clock second the loop aims for (0.25: four times slower)",
        "float",
        runtime=True,
        check=float_range(0.01, 10.0),
    ),
    ParamSpec(
        "paused",
        False,
        "hold the simulation: no tick, no /clock, sim time stands still until false again "
        "(then paced anew from where it stood, no catching up)",
        "bool",
        runtime=True,
    ),
    ParamSpec(
        "chunk_max_age_s",
        1.5,
        "a command (chunk or trajectory) drives the robot at most this long after its first row "
        "(sim seconds); later rows are not executed and the joints hold",
        "float",
        check=positive,
    ),
    ParamSpec(
        "max_joint_speed",
        [],
        "per joint (joint_names order), units per second: how fast the servos follow a target "
        "(targets are rate limited like a servo's profile velocity; [] = no limit)",
        "float_list",
        check=lambda v: None if all(math.isfinite(x) and x > 0 for x in v) else "must be > 0",
    ),
    ParamSpec(
        "episode_time_limit_s",
        0.0,
        "time limit of new episodes in sim seconds (0: the task's own)",
        "float",
        runtime=True,
        check=non_negative,
    ),
    ParamSpec(
        "initial_seed",
        -1,
        "start an episode with this seed at start-up (-1: wait for a reset request)",
        "int",
        check=int_range(-1, 2**62),
    ),
    ParamSpec(
        "next_episode_after_s",
        0.0,
        "after an episode ends, start the next seed (the ended episode's + 1) this many sim "
        "seconds later (0: wait for a reset request)",
        "float",
        runtime=True,
        check=non_negative,
    ),
    ParamSpec("publish_instruction", True, "publish each episode's instruction", "bool"),
    ParamSpec(
        "test_pattern",
        False,
        "TEST ONLY: a coloured panel in front of each camera (top red, wrists green, blue)",
        "bool",
    ),
    ParamSpec("actions_topic", "oxygen/actions", "ActionChunk input", "str", check=topic_name),
    ParamSpec(
        "joint_trajectory_topic",
        "oxygen/joint_trajectory",
        "JointTrajectory input",
        "str",
        check=topic_name,
    ),
    ParamSpec(
        "joint_command_topic",
        "joint_commands",
        "JointState of the targets commanded at each control tick",
        "str",
        check=topic_name,
    ),
    ParamSpec(
        "instruction_topic",
        "oxygen/instruction",
        "std_msgs/String instruction output",
        "str",
        check=topic_name,
    ),
    ParamSpec(
        "episode_status_topic",
        "workcell/episode_status",
        "EpisodeStatus output",
        "str",
        check=topic_name,
    ),
    ParamSpec(
        "reset_service",
        "workcell/reset_episode",
        "ResetEpisode service",
        "str",
        check=topic_name,
    ),
)
WORKCELL_CAMERA: tuple[ParamSpec, ...] = (
    ParamSpec("topic", "", "image topic", "str", check=topic_name),
    ParamSpec("encoding", "rgb8", "the workcell renders rgb8", "str", check=one_of("rgb8")),
    ParamSpec("width", 224, "rendered image width", "int", check=int_range(1, 2048)),
    ParamSpec("height", 224, "rendered image height", "int", check=int_range(1, 2048)),
)

# The scripted expert (expert_node). Topics and cameras come from the shared section.
EXPERT_SHARED: tuple[ParamSpec, ...] = tuple(
    s
    for s in SHARED
    if s.name in ("frame_id", "joint_state_topic", "camera_names", "diagnostics_period_s")
)
EXPERT: tuple[ParamSpec, ...] = (
    ParamSpec(
        "publish_rate_hz",
        10.0,
        "ActionChunk publish rate (node clock: sim time under use_sim_time)",
        "float",
        runtime=True,
        check=positive_rate(200.0),
    ),
    ParamSpec(
        "horizon",
        50,
        "rows per ActionChunk (horizon x action_dt_s must stay below the sim's chunk_max_age_s)",
        "int",
        runtime=True,
        check=int_range(1, 10_000),
    ),
    ParamSpec(
        "action_dt_s",
        0.02,
        "seconds between ActionChunk rows",
        "float",
        runtime=True,
        check=positive,
    ),
    ParamSpec("actions_topic", "oxygen/actions", "ActionChunk output", "str", check=topic_name),
    ParamSpec(
        "subtask_topic",
        "oxygen/expert_subtask",
        "std_msgs/String output (latched): the plan's subtask label when it changes",
        "str",
        check=topic_name,
    ),
    ParamSpec(
        "episode_status_topic",
        "workcell/episode_status",
        "EpisodeStatus input (workcell_sim's output)",
        "str",
        check=topic_name,
    ),
    ParamSpec(
        "record_dir",
        "",
        "write one episode_<index>.hdf5 per episode here ('' = no recording)",
        "str",
    ),
    ParamSpec(
        "camera_rate_hz",
        10.0,
        "the recording's fps attribute: must equal workcell_sim's camera_rate_hz",
        "float",
        check=positive_rate(100.0),
    ),
)
EXPERT_CAMERA: tuple[ParamSpec, ...] = (
    ParamSpec("topic", "", "image topic (recorded)", "str", check=topic_name),
)
