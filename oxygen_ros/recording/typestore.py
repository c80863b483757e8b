"""The message types a bag of this graph may carry: ROS 2 Kilted's standard interfaces plus this
package's own messages, parsed from their .msg files.

Other tools (the `mcap` reader with `mcap_ros2`, Foxglove, `ros2 bag`) decode a recorded topic
from the definition the bag carries, so every connection gets the full ros2msg text of its type
(dependencies included) and its RIHS01 type hash, the same hash rosidl generates (a test checks).

Invariants: ROS-free (no rclpy, no generated message classes); the .msg files come from the
installed package's share directory (`package://oxygen_ros/msg`), or the source tree's msg/.
"""

from __future__ import annotations

import functools
from pathlib import Path

from rosbags.typesys import Stores, TypesysError, get_types_from_msg, get_typestore
from rosbags.typesys.store import Typestore

from oxygen_ros.resources import PACKAGE, resolve_path


class UnknownTypeError(LookupError):
    """A message type that is neither a Kilted standard type nor one of this package's."""


def msg_directory() -> Path:
    """This package's msg/ folder (installed share directory, else the source tree)."""
    return Path(resolve_path(f"package://{PACKAGE}/msg"))


def own_type_names(directory: Path | None = None) -> list[str]:
    """`oxygen_ros/msg/<Name>` of every .msg file, sorted."""
    directory = directory or msg_directory()
    return [f"{PACKAGE}/msg/{path.stem}" for path in sorted(directory.glob("*.msg"))]


@functools.cache
def graph_typestore(directory: Path | None = None) -> Typestore:
    """Kilted's standard types plus this package's messages (cached per directory).

    Raises:
        FileNotFoundError: `directory` (default: `msg_directory()`) holds no .msg file.
    """
    directory = directory or msg_directory()
    paths = sorted(directory.glob("*.msg"))
    if not paths:
        raise FileNotFoundError(f"no .msg files in {directory}")
    store = get_typestore(Stores.ROS2_KILTED)
    types: dict = {}
    for path in paths:
        types.update(get_types_from_msg(path.read_text(), f"{PACKAGE}/msg/{path.stem}"))
    store.register(types)
    return store


def message_definition(store: Typestore, msgtype: str) -> tuple[str, str]:
    """(ros2msg text with its dependencies, RIHS01 hash) of `msgtype` ("pkg/msg/Name").

    Raises:
        UnknownTypeError: `store` does not know the type (or one of its fields' types).
    """
    try:
        text, _ = store.generate_msgdef(msgtype, ros_version=2)
        return text, store.hash_rihs01(msgtype)
    except (KeyError, TypesysError) as exc:
        raise UnknownTypeError(f"unknown message type {msgtype!r} ({exc})") from None
