"""Which topics a recording or a replay takes (ROS-free).

Recording (`ros2 bag record -a` semantics): every topic of the graph, or only the listed ones,
minus those matching an exclude regex (`re.search`); hidden topics (a name component starting
with `_`, such as actions' `_action/feedback`) only when asked for.

Replay: the listed topics, and with `sensors` the sensor streams perception consumes: every
`sensor_msgs/Image` and `CompressedImage` topic, every `JointState` topic named `joint_states`
(a workcell's `joint_commands` are JointStates too, but commands, not measurements) and
`/clock` when the bag has it. Nothing listed and no `sensors`: every topic.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

IMAGE_TYPES = frozenset({"sensor_msgs/msg/Image", "sensor_msgs/msg/CompressedImage"})
JOINT_STATE_TYPE = "sensor_msgs/msg/JointState"
CLOCK_TOPIC = "/clock"


def absolute(topic: str) -> str:
    """`topic` with a leading slash (the graph reports absolute names; bags store them)."""
    return topic if topic.startswith("/") else "/" + topic


def is_hidden(topic: str) -> bool:
    return any(part.startswith("_") for part in topic.split("/") if part)


def compile_exclude(pattern: str) -> re.Pattern | None:
    """The exclude regex ('' = none). Raises re.error for an invalid pattern."""
    return re.compile(pattern) if pattern else None


def should_record(
    topic: str,
    include: Iterable[str] = (),
    exclude: re.Pattern | None = None,
    include_hidden: bool = False,
) -> bool:
    """Whether the recorder subscribes to `topic` (an absolute name)."""
    wanted = {absolute(t) for t in include}
    if wanted and topic not in wanted:
        return False
    if not wanted and is_hidden(topic) and not include_hidden:
        return False
    return not (exclude is not None and exclude.search(topic))


def is_sensor_topic(topic: str, msgtype: str) -> bool:
    if msgtype in IMAGE_TYPES or topic == CLOCK_TOPIC:
        return True
    return msgtype == JOINT_STATE_TYPE and topic.rsplit("/", 1)[-1] == "joint_states"


def replay_topics(
    types: Mapping[str, str], topics: Iterable[str] = (), sensors: bool = False
) -> list[str]:
    """The bag topics (`types`: topic -> msgtype) a replay publishes, sorted.

    Raises:
        KeyError: A listed topic is not in the bag.
    """
    listed = {absolute(t) for t in topics}
    missing = sorted(listed - set(types))
    if missing:
        raise KeyError(f"not in the bag: {', '.join(missing)}")
    if not listed and not sensors:
        return sorted(types)
    chosen = set(listed)
    if sensors:
        chosen |= {t for t, m in types.items() if is_sensor_topic(t, m)}
    return sorted(chosen)


def parse_remaps(items: Iterable[str]) -> dict[str, str]:
    """`from:=to` pairs -> {absolute from: absolute to}.

    Raises:
        ValueError: An item without `:=` or with an empty side.
    """
    out = {}
    for item in items:
        source, sep, target = item.partition(":=")
        if not sep or not source or not target:
            raise ValueError(f"remap {item!r}: expected from:=to")
        out[absolute(source)] = absolute(target)
    return out
