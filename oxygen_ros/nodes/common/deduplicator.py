"""Accepting each key once among the newest ones: a latched topic's message that also reaches
a volatile subscription (inference's instruction intake), entries a latched topic sends again
to a reader that joins (the viewer's memory panel). ROS-free.

Invariants:
- `accept(key)` is True exactly once per key among the last `history` keys seen; memory stays
  bounded by `history` however many keys come.
"""

from __future__ import annotations

import collections


class Deduplicator:
    """Accepts each key once among the last `history` keys."""

    def __init__(self, history: int) -> None:
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
