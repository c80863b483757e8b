"""A rosbag2 bag (MCAP storage) written from serialized messages, as `ros2 bag record -s mcap`
writes one: a directory holding `<name>.mcap` and `metadata.yaml`.

Invariants:
- Messages are written as received (CDR bytes, never decoded or re-encoded), with the
  timestamp the caller gives (the recorder's reception time, ns).
- Every topic's connection carries its type's full ros2msg definition (dependencies
  included) and RIHS01 hash from `typestore.graph_typestore`, and its publishers' QoS as
  `offered_qos_profiles`, so independent readers decode it and replay matches the publishers.
- A topic whose type the typestore does not know is refused (`UnknownTypeError`) before
  anything is written for it; the bag stays valid.
- Thread-safe: topics may be added and messages written from several threads. `close()` is
  idempotent and completes the MCAP summary and `metadata.yaml`; nothing is accepted after.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence
from pathlib import Path

from rosbags.interfaces import Connection, Qos
from rosbags.rosbag2 import CompressionFormat, CompressionMode, StoragePlugin, Writer
from rosbags.typesys.store import Typestore

from oxygen_ros.recording.typestore import graph_typestore, message_definition

BAG_VERSION = 9  # rosbag2's metadata version since Jazzy
COMPRESSIONS = ("none", "zstd")


@dataclasses.dataclass
class TopicStats:
    """What was written on one topic."""

    msgtype: str
    messages: int = 0
    bytes: int = 0


class BagClosedError(RuntimeError):
    """A write after `close()`."""


class BagWriter:
    """Writes serialized messages of named topics into a new rosbag2 MCAP bag."""

    def __init__(
        self, path: str | Path, compression: str = "none", store: Typestore | None = None
    ) -> None:
        """Creates the bag directory `path` (which must not exist) and its .mcap file.

        Args:
            path: The bag directory.
            compression: "none" or "zstd": MCAP chunk compression (inside the .mcap, as
                `ros2 bag record -s mcap --storage-preset-profile zstd_fast` writes; every
                MCAP reader decompresses it, metadata.yaml names no compression).
            store: The typestore (default `graph_typestore()`).

        Raises:
            rosbags.rosbag2.WriterError: `path` exists.
            ValueError: An unknown compression.
        """
        if compression not in COMPRESSIONS:
            raise ValueError(f"compression {compression!r}: expected one of {COMPRESSIONS}")
        self.path = Path(path)
        self._store = store or graph_typestore()
        self._writer = Writer(self.path, version=BAG_VERSION, storage_plugin=StoragePlugin.MCAP)
        if compression == "zstd":
            self._writer.set_compression(CompressionMode.STORAGE, CompressionFormat.ZSTD)
        self._writer.open()
        self._connections: dict[str, Connection] = {}
        self._stats: dict[str, TopicStats] = {}
        self._lock = threading.Lock()
        self._closed = False

    def add_topic(self, topic: str, msgtype: str, offered_qos: Sequence[Qos] = ()) -> None:
        """Registers `topic` with its type ("pkg/msg/Name") and its publishers' QoS.

        Raises:
            UnknownTypeError: The type is not in the typestore.
            ValueError: `topic` was added already.
            BagClosedError: After `close()`.
        """
        msgdef, rihs01 = message_definition(self._store, msgtype)
        with self._lock:
            if self._closed:
                raise BagClosedError(f"{self.path} is closed")
            if topic in self._connections:
                raise ValueError(f"topic {topic!r} was added already")
            self._connections[topic] = self._writer.add_connection(
                topic,
                msgtype,
                msgdef=msgdef,
                rihs01=rihs01,
                offered_qos_profiles=list(offered_qos),
            )
            self._stats[topic] = TopicStats(msgtype)

    def has_topic(self, topic: str) -> bool:
        with self._lock:
            return topic in self._connections

    def write(self, topic: str, timestamp_ns: int, data: bytes | memoryview) -> None:
        """Appends one serialized message of an added topic.

        Raises:
            KeyError: `topic` was not added.
            BagClosedError: After `close()`.
        """
        with self._lock:
            if self._closed:
                raise BagClosedError(f"{self.path} is closed")
            self._writer.write(self._connections[topic], int(timestamp_ns), data)
            stats = self._stats[topic]
            stats.messages += 1
            stats.bytes += len(data)

    def stats(self) -> dict[str, TopicStats]:
        """A copy of the per-topic counts."""
        with self._lock:
            return {t: dataclasses.replace(s) for t, s in self._stats.items()}

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Completes the MCAP file and writes `metadata.yaml` (idempotent)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._writer.close()
