"""QoS as a bag records it (rosbag2's `offered_qos_profiles`) and the choices recording and
replay make from it, as rosbag2 does.

- Recording: a topic is subscribed reliable only when every publisher offers reliable (a
  reliable reader never matches a best-effort writer), and transient local only when every
  publisher offers it (a transient-local reader never matches a volatile writer); otherwise
  best effort / volatile, which match every publisher.
- A publisher that appears later with a weaker QoS than the recorder subscribed with (a
  volatile one on a latched topic) is not matched: `reader_matches` tells the recorder to warn.
- Replay: a topic is published with the recorded publishers' reliability and durability (the
  same rules), so a latched topic reaches late subscribers and a reliable reader matches.

Invariants: ROS-free. The enum values are rmw's (rclpy's QoS policy enums share them), so a
node converts its endpoint info with plain ints; durations are nanoseconds (rmw's infinite
duration, 2**63 - 1 ns, is recorded as rosbag2 writes it: 9223372036 s 854775807 ns).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from rosbags.interfaces import (
    Qos,
    QosDurability,
    QosHistory,
    QosLiveliness,
    QosReliability,
    QosTime,
)

NS_PER_S = 1_000_000_000


def _time(ns: int) -> QosTime:
    ns = max(0, int(ns))
    return QosTime(ns // NS_PER_S, ns % NS_PER_S)


def _enum(kind, value: int):
    try:
        return kind(int(value))
    except ValueError:
        return kind.UNKNOWN


def offered_qos(
    history: int,
    depth: int,
    reliability: int,
    durability: int,
    deadline_ns: int = 0,
    lifespan_ns: int = 0,
    liveliness: int = 0,
    liveliness_lease_duration_ns: int = 0,
    avoid_ros_namespace_conventions: bool = False,
) -> Qos:
    """One publisher's QoS (rmw enum values, durations in ns) as the bag records it."""
    return Qos(
        history=_enum(QosHistory, history),
        depth=int(depth),
        reliability=_enum(QosReliability, reliability),
        durability=_enum(QosDurability, durability),
        deadline=_time(deadline_ns),
        lifespan=_time(lifespan_ns),
        liveliness=_enum(QosLiveliness, liveliness),
        liveliness_lease_duration=_time(liveliness_lease_duration_ns),
        avoid_ros_namespace_conventions=bool(avoid_ros_namespace_conventions),
    )


@dataclasses.dataclass(frozen=True)
class EndpointQos:
    """What a reader (recording) or writer (replay) of a topic uses."""

    reliable: bool  # else best effort
    transient_local: bool  # else volatile
    depth: int  # keep-last depth


def reader_qos(offered: Sequence[Qos], depth: int) -> EndpointQos:
    """The recorder's subscription QoS for a topic whose publishers offer `offered` (no
    publisher: best effort, volatile)."""
    reliable = bool(offered) and all(q.reliability == QosReliability.RELIABLE for q in offered)
    latched = bool(offered) and all(q.durability == QosDurability.TRANSIENT_LOCAL for q in offered)
    return EndpointQos(reliable, latched, depth)


def reader_matches(reader: EndpointQos, offered: Qos) -> bool:
    """Whether a reader with `reader` QoS receives a publisher offering `offered` (a reliable
    reader misses a best-effort writer, a transient-local one a volatile writer)."""
    if reader.reliable and offered.reliability == QosReliability.BEST_EFFORT:
        return False
    return not (reader.transient_local and offered.durability == QosDurability.VOLATILE)


def writer_qos(offered: Sequence[Qos], min_depth: int = 10) -> EndpointQos:
    """Replay's publisher QoS for a topic recorded with `offered` (none recorded: reliable,
    volatile, as `ros2 bag play` does). Depth: the largest recorded one, at least `min_depth`."""
    if not offered:
        return EndpointQos(True, False, min_depth)
    depth = max([min_depth, *(q.depth for q in offered)])
    best_effort = any(q.reliability == QosReliability.BEST_EFFORT for q in offered)
    latched = all(q.durability == QosDurability.TRANSIENT_LOCAL for q in offered)
    return EndpointQos(not best_effort, latched, depth)
