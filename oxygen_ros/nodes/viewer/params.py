"""The viewer node's parameters; the shared ones (joint names, observation and joint state
topics, diagnostics period) are in `common/params.py`. Topic defaults are the workcell's
(config/workcell.yaml); `episode_status_topic: ""` turns the episode panel off (humanoid)."""

from __future__ import annotations

from oxygen_ros.nodes.common.parameters import (
    ParamSpec,
    int_range,
    optional_topic_name,
    positive_rate,
    topic_name,
)


def _memory_size(v: str) -> str | None:
    """Rerun's server memory limit: a size with a unit (256MiB, 1GB) or a share of RAM (10%)."""
    units = ("%", "KiB", "MiB", "GiB", "KB", "MB", "GB", "B")
    number = next((v[: -len(u)] for u in units if v.endswith(u)), None)
    try:
        ok = number is not None and float(number) > 0
    except ValueError:
        ok = False
    return None if ok else "a positive size such as 256MiB, 1GB or 10%"


VIEWER: tuple[ParamSpec, ...] = (
    ParamSpec("actions_topic", "oxygen/actions", "ActionChunk topic", "str", check=topic_name),
    ParamSpec(
        "instruction_topic",
        "oxygen/instruction",
        "instructions sent to the robot (std_msgs/String, any publisher)",
        "str",
        check=topic_name,
    ),
    ParamSpec(
        "current_instruction_topic",
        "oxygen/current_instruction",
        "the instruction inference uses (std_msgs/String, latched)",
        "str",
        check=topic_name,
    ),
    ParamSpec("speech_topic", "oxygen/speech", "SpeechToken topic", "str", check=topic_name),
    ParamSpec(
        "memory_topic", "oxygen/memory", "MemoryEntry topic (latched)", "str", check=topic_name
    ),
    ParamSpec(
        "memory_depth",
        20,
        "latched memory entries received on joining (inference's memory_republish_count)",
        "int",
        check=int_range(1, 1000),
    ),
    ParamSpec(
        "episode_status_topic",
        "workcell/episode_status",
        "the workcell simulator's EpisodeStatus ('' = no episode panel)",
        "str",
        check=optional_topic_name,
    ),
    ParamSpec(
        "grpc_port",
        0,
        "port of Rerun's gRPC log server (0: a free one)",
        "int",
        check=int_range(0, 65535),
    ),
    ParamSpec(
        "web_port",
        0,
        "port of Rerun's web viewer, the page a browser opens (0: a free one)",
        "int",
        check=int_range(0, 65535),
    ),
    ParamSpec(
        "server_memory_limit",
        "256MiB",
        "log data Rerun's server keeps for browsers that connect later; the oldest goes "
        "first (a brain that runs for hours stays bounded)",
        "str",
        check=_memory_size,
    ),
    ParamSpec(
        "image_rate_hz",
        2.0,
        "camera images (ObservationFrame slots) shown per second at most",
        "float",
        runtime=True,
        check=positive_rate(60.0),
    ),
    ParamSpec(
        "plot_rate_hz",
        20.0,
        "commanded and measured joint samples plotted per second at most (each)",
        "float",
        runtime=True,
        check=positive_rate(200.0),
    ),
    ParamSpec(
        "text_rate_hz",
        4.0,
        "updates per second of the task and streaming-text panels (and the rate plots)",
        "float",
        runtime=True,
        check=positive_rate(30.0),
    ),
    ParamSpec(
        "max_text_chars",
        2000,
        "longer texts (instruction, speech, memory) are cut to this many characters",
        "int",
        check=int_range(16, 100000),
    ),
)
