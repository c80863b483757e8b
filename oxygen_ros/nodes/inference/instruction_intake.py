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
- `accept(key)` is True exactly once per key among the last `history` keys seen; a message
  from a latched publisher (same key on both subscriptions) is accepted once, two
  publications of the same text (different source timestamps) twice.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping

HISTORY = 64  # keys remembered; the two copies of a message arrive within a few messages


def message_key(info: Mapping[str, int], text: str) -> tuple[int, int, str]:
    """The identity of one publication: source timestamp, publisher sequence number, text."""
    return (
        int(info.get("source_timestamp", 0)),
        int(info.get("publication_sequence_number", 0)),
        text,
    )


class Deduplicator:
    """Accepts each key once among the last `history` keys."""

    def __init__(self, history: int = HISTORY) -> None:
        if history < 1:
            raise ValueError(f"history must be >= 1, got {history}")
        self._order: collections.deque = collections.deque(maxlen=history)
        self._seen: set = set()

    def accept(self, key: object) -> bool:
        if key in self._seen:
            return False
        if len(self._order) == self._order.maxlen:
            self._seen.discard(self._order[0])
        self._order.append(key)
        self._seen.add(key)
        return True
