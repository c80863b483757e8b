"""rclpy <-> bag conversions of the recorder: publisher QoS to the bag's offered profiles,
a reader QoS to an rclpy profile, a type name to its generated message class."""

from __future__ import annotations

import importlib

from rclpy.qos import QoSDurabilityPolicy, QoSHistoryPolicy, QoSProfile, QoSReliabilityPolicy
from rosbags.interfaces import Qos

from oxygen_ros.recording.qos import EndpointQos, offered_qos
from oxygen_ros.recording.typestore import UnknownTypeError


def bag_qos(profile: QoSProfile) -> Qos:
    """A publisher's rclpy QoS (from `get_publishers_info_by_topic`) as the bag records it."""
    return offered_qos(
        history=int(profile.history),
        depth=profile.depth,
        reliability=int(profile.reliability),
        durability=int(profile.durability),
        deadline_ns=profile.deadline.nanoseconds,
        lifespan_ns=profile.lifespan.nanoseconds,
        liveliness=int(profile.liveliness),
        liveliness_lease_duration_ns=profile.liveliness_lease_duration.nanoseconds,
        avoid_ros_namespace_conventions=profile.avoid_ros_namespace_conventions,
    )


def qos_profile(endpoint: EndpointQos) -> QoSProfile:
    return QoSProfile(
        history=QoSHistoryPolicy.KEEP_LAST,
        depth=endpoint.depth,
        reliability=(
            QoSReliabilityPolicy.RELIABLE
            if endpoint.reliable
            else QoSReliabilityPolicy.BEST_EFFORT
        ),
        durability=(
            QoSDurabilityPolicy.TRANSIENT_LOCAL
            if endpoint.transient_local
            else QoSDurabilityPolicy.VOLATILE
        ),
    )


def message_class(msgtype: str) -> type:
    """The generated Python class of "pkg/msg/Name" (or pkg/action/..., pkg/srv/...).

    Raises:
        UnknownTypeError: Not a type name, or its package is not importable here.
    """
    parts = msgtype.split("/")
    if len(parts) != 3 or not all(parts):
        raise UnknownTypeError(f"{msgtype!r} is not a pkg/msg/Name type name")
    package, kind, name = parts
    try:
        return getattr(importlib.import_module(f"{package}.{kind}"), name)
    except (ImportError, AttributeError) as exc:
        raise UnknownTypeError(f"no Python message class for {msgtype!r} ({exc})") from None
