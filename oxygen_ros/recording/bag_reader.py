"""Reading a rosbag2 bag (MCAP or SQLite storage) for replay: its topics with their types and
recorded QoS, and its serialized messages in time order (ROS-free, over rosbags' reader).

Invariant: messages come back as stored (CDR bytes), never decoded.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from pathlib import Path

from rosbags.interfaces import ConnectionExtRosbag2, Qos
from rosbags.rosbag2 import Reader


@dataclasses.dataclass(frozen=True)
class BagTopic:
    """One recorded topic."""

    name: str
    msgtype: str
    num_messages: int
    offered_qos: tuple[Qos, ...]  # the recorded publishers' QoS (may be empty)


class BagReader:
    """An open bag; use as a context manager or call `close()`."""

    def __init__(self, path: str | Path) -> None:
        """Raises: rosbags.rosbag2.ReaderError (not a bag, unreadable metadata)."""
        self.path = Path(path)
        self._reader = Reader(self.path)
        self._reader.open()

    def __enter__(self) -> BagReader:
        return self

    def __exit__(self, *_exc) -> None:
        self.close()

    def close(self) -> None:
        if self._reader.is_open:
            self._reader.close()

    def topics(self) -> dict[str, BagTopic]:
        """{topic: BagTopic}; a topic recorded with several connections merges their QoS."""
        out: dict[str, BagTopic] = {}
        for conn in self._reader.connections:
            qos = (
                tuple(conn.ext.offered_qos_profiles)
                if isinstance(conn.ext, ConnectionExtRosbag2)
                else ()
            )
            old = out.get(conn.topic)
            if old is None:
                out[conn.topic] = BagTopic(conn.topic, conn.msgtype, conn.msgcount, qos)
            else:
                out[conn.topic] = dataclasses.replace(
                    old,
                    num_messages=old.num_messages + conn.msgcount,
                    offered_qos=old.offered_qos + qos,
                )
        return out

    @property
    def duration_s(self) -> float:
        return self._reader.duration * 1e-9

    def messages(self, topics: Iterable[str]) -> Iterator[tuple[str, int, bytes]]:
        """(topic, timestamp ns, serialized bytes) of the `topics`' messages, in time order."""
        wanted = set(topics)
        connections = [c for c in self._reader.connections if c.topic in wanted]
        if not connections:
            return
        for conn, timestamp, data in self._reader.messages(connections=connections):
            yield conn.topic, timestamp, data
