"""Durable memory entries in SQLite (ROS-free).

The inference node writes one entry per finished memory request and publishes it only after
`add` returns, so an entry a subscriber has seen is already on disk.

Invariants:
- WAL journal, `synchronous=FULL`: `add` returns only after its transaction is committed, so a
  `kill -9` right after it loses nothing.
- `entry_id` is `INTEGER PRIMARY KEY AUTOINCREMENT`: strictly increasing and never reused, also
  across restarts and after deletions.
- A file that is not a readable database of this schema is never overwritten: it (with its
  -wal/-shm files) is renamed to `<name>.corrupt-<UTC time>` and a fresh database is created;
  `MemoryStore.moved_aside` says where it went so the node can log an error.
- Thread-safe: one connection guarded by a lock (engine thread writes, service thread reads).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sqlite3
import threading
import time
from pathlib import Path

SCHEMA_VERSION = 1
_SCHEMA = """
CREATE TABLE IF NOT EXISTS memory (
    entry_id INTEGER PRIMARY KEY AUTOINCREMENT,
    stamp REAL NOT NULL,
    observation_stamp REAL NOT NULL,
    kind TEXT NOT NULL,
    text TEXT NOT NULL,
    tags TEXT NOT NULL,
    request_id TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS memory_stamp ON memory (stamp);
"""
_COLUMNS = "entry_id, stamp, observation_stamp, kind, text, tags, request_id"


@dataclasses.dataclass(frozen=True)
class MemoryRecord:
    """One stored entry (the fields of `oxygen_ros/MemoryEntry`)."""

    entry_id: int
    stamp: float  # creation time, seconds
    observation_stamp: float  # stamp of the observation it was produced from
    kind: str  # "memory" (periodic) or "on_demand"
    text: str
    tags: tuple[str, ...]
    request_id: str


class MemoryStore:
    """A SQLite file of memory entries."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        """Opens (or creates) the database at `path`, moving an unusable file aside.

        Raises:
            OSError: The directory cannot be created, or an unusable file cannot be moved.
            sqlite3.Error: A fresh database cannot be created either.
        """
        self.path = Path(path).expanduser()
        self.moved_aside: Path | None = None  # where an unusable file went, if one did
        self.moved_aside_reason = ""
        self._lock = threading.Lock()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._conn = self._open()
        except (sqlite3.DatabaseError, OSError) as exc:
            self.moved_aside_reason = f"{type(exc).__name__}: {exc}"
            self.moved_aside = self._move_aside()
            self._conn = self._open()

    def _open(self) -> sqlite3.Connection:
        if self.path.exists() and not os.access(self.path, os.R_OK | os.W_OK):
            raise PermissionError(f"{self.path} is not readable and writable")
        conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            check = conn.execute("PRAGMA quick_check").fetchone()
            if check is None or check[0] != "ok":
                raise sqlite3.DatabaseError(f"quick_check failed: {check}")
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
            if version not in (0, SCHEMA_VERSION) or (
                version == 0 and tables - {"sqlite_sequence"}
            ):
                raise sqlite3.DatabaseError(
                    f"not an oxygen_ros memory database (user_version={version}, "
                    f"tables={sorted(tables)})"
                )
            conn.executescript(_SCHEMA)
            conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            cols = [r[1] for r in conn.execute("PRAGMA table_info(memory)")]
            if ", ".join(cols) != _COLUMNS:
                raise sqlite3.DatabaseError(f"unexpected memory columns {cols}")
        except BaseException:
            conn.close()
            raise
        return conn

    def _move_aside(self) -> Path:
        suffix = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        target = self.path.with_name(f"{self.path.name}.corrupt-{suffix}")
        n = 1
        while target.exists():
            target = self.path.with_name(f"{self.path.name}.corrupt-{suffix}-{n}")
            n += 1
        for extra in ("-wal", "-shm"):
            side = self.path.with_name(self.path.name + extra)
            if side.exists():
                side.rename(target.with_name(target.name + extra))
        if self.path.exists():
            self.path.rename(target)
        return target

    def add(
        self,
        text: str,
        kind: str,
        stamp: float,
        observation_stamp: float,
        tags: tuple[str, ...] | list[str] = (),
        request_id: str = "",
    ) -> MemoryRecord:
        """Inserts and commits one entry; returns it with its new id."""
        tags = tuple(tags)
        with self._lock:
            cur = self._conn.execute(
                "INSERT INTO memory (stamp, observation_stamp, kind, text, tags, request_id)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (stamp, observation_stamp, kind, text, json.dumps(list(tags)), request_id),
            )  # autocommit mode: committed (and synced) when execute returns
            entry_id = int(cur.lastrowid)
        return MemoryRecord(entry_id, stamp, observation_stamp, kind, text, tags, request_id)

    def recent(self, count: int) -> list[MemoryRecord]:
        """The newest `count` entries, oldest first (for republishing on start)."""
        with self._lock:
            rows = self._conn.execute(
                f"SELECT {_COLUMNS} FROM memory ORDER BY entry_id DESC LIMIT ?", (count,)
            ).fetchall()
        return [_record(r) for r in reversed(rows)]

    def query(
        self, text: str = "", since: float = 0.0, max_entries: int = 20
    ) -> list[MemoryRecord]:
        """Entries containing `text` (case-insensitive) created at or after `since`, newest first.

        Args:
            text: Substring to match; "" matches every entry.
            since: Lower bound on the creation stamp; 0 for none.
            max_entries: Limit (>= 1).
        """
        needle = text.casefold()
        out: list[MemoryRecord] = []
        with self._lock:
            cursor = self._conn.execute(
                f"SELECT {_COLUMNS} FROM memory WHERE stamp >= ? ORDER BY entry_id DESC",
                (since,),
            )
            for row in cursor:
                if needle in row[4].casefold():
                    out.append(_record(row))
                    if len(out) >= max_entries:
                        break
        return out

    def count(self) -> int:
        with self._lock:
            return int(self._conn.execute("SELECT COUNT(*) FROM memory").fetchone()[0])

    def last_id(self) -> int:
        """The highest id ever assigned (0 for a new database)."""
        with self._lock:
            row = self._conn.execute(
                "SELECT seq FROM sqlite_sequence WHERE name = 'memory'"
            ).fetchone()
        return int(row[0]) if row else 0

    def close(self) -> None:
        """Checkpoints the WAL and closes; further calls raise `sqlite3.ProgrammingError`."""
        with self._lock:
            try:
                self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            finally:
                self._conn.close()


def _record(row: tuple) -> MemoryRecord:
    try:
        tags = tuple(str(t) for t in json.loads(row[5]))
    except (ValueError, TypeError):
        tags = ()
    return MemoryRecord(int(row[0]), float(row[1]), float(row[2]), row[3], row[4], tags, row[6])
