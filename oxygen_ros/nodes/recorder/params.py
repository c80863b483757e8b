"""The recorder node's parameters (`diagnostics_period_s` is the shared one of
`common/params.py`)."""

from __future__ import annotations

import re

from oxygen_ros.nodes.common.parameters import (
    ParamSpec,
    float_range,
    int_range,
    one_of,
)
from oxygen_ros.nodes.common.params import SHARED
from oxygen_ros.recording.bag_writer import COMPRESSIONS


def _regex(v: str) -> str | None:
    try:
        re.compile(v)
    except re.error as exc:
        return f"not a regular expression: {exc}"
    return None


DIAGNOSTICS_PERIOD = next(s for s in SHARED if s.name == "diagnostics_period_s")
RECORDER: tuple[ParamSpec, ...] = (
    ParamSpec(
        "output_dir",
        "",
        "the bag directory, which must not exist yet (its parents are created); '' = "
        "rosbag2_<local date-time> in the working directory, as ros2 bag record names it",
        "str",
    ),
    ParamSpec(
        "compression",
        "zstd",
        "MCAP chunk compression: zstd (the workcell's rendered cameras shrink about 40-fold for "
        "a few percent of a core) or none (as ros2 bag record's default)",
        "str",
        check=one_of(*COMPRESSIONS),
    ),
    ParamSpec(
        "topics",
        [],
        "topics to record ([] = every topic of the graph, as ros2 bag record -a)",
        "str_list",
    ),
    ParamSpec(
        "exclude_regex",
        "",
        "topics matching this regular expression (re.search) are not recorded ('' = none)",
        "str",
        check=_regex,
    ),
    ParamSpec(
        "include_hidden_topics",
        False,
        "also record hidden topics (a name component starting with '_', such as actions' "
        "feedback and status) when topics is empty",
        "bool",
    ),
    ParamSpec(
        "discovery_period_s",
        1.0,
        "how often the graph is searched for new topics",
        "float",
        check=float_range(0.05, 60.0),
    ),
    ParamSpec(
        "queue_depth",
        500,
        "keep-last depth of every subscription (messages a busy recorder may fall behind by)",
        "int",
        check=int_range(1, 10000),
    ),
    DIAGNOSTICS_PERIOD,
)
