"""One instruction topic, every kind of publisher: latched (transient local) and volatile.

A transient-local subscription gets a latched publisher's last message even when the node
starts later (the workcell simulator publishes each episode's instruction once), but DDS
refuses to match it with a volatile publisher (`ros2 topic pub` by default, rqt, most
speech-to-text nodes). A volatile subscription matches both kinds but gets no history. The
inference node therefore holds both, and a latched publisher's message, which reaches both
subscriptions, must count once.

ROS-free: a message is identified by what DDS reports with it (rclpy's message info: source
timestamp, publication sequence number) plus its text.

Invariants:
- With `common.deduplicator.Deduplicator(HISTORY)`, a message from a latched publisher (the same
  `message_key` on both subscriptions) is accepted once, two publications of the same text
  (different source timestamps) twice.
"""

from __future__ import annotations

from collections.abc import Mapping

HISTORY = 64  # keys remembered (common.deduplicator); a message's two copies come close


def message_key(info: Mapping[str, int], text: str) -> tuple[int, int, str]:
    """The identity of one publication: source timestamp, publisher sequence number, text."""
    return (
        int(info.get("source_timestamp", 0)),
        int(info.get("publication_sequence_number", 0)),
        text,
    )
