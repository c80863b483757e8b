"""SQLite memory: commit before return, ids continue across restarts, unusable files moved."""

import os
import sqlite3
import subprocess
import sys

import pytest

from oxygen_ros.nodes.inference.memory_store import MemoryStore


def test_add_query_recent(tmp_path) -> None:
    store = MemoryStore(tmp_path / "m.db")
    a = store.add("The red cup is on the LEFT", "memory", 10.0, 9.9, ("kitchen",), "memory-1")
    b = store.add("door open", "on_demand", 11.0, 10.9, (), "memory-2")
    c = store.add("red ball under table", "memory", 12.0, 11.9, ("toys", "floor"), "memory-3")
    assert (a.entry_id, b.entry_id, c.entry_id) == (1, 2, 3)
    assert [r.entry_id for r in store.query("RED")] == [3, 1]  # newest first, case-insensitive
    assert [r.entry_id for r in store.query("", since=11.0)] == [3, 2]
    assert [r.entry_id for r in store.query("", max_entries=1)] == [3]
    assert [r.entry_id for r in store.recent(2)] == [2, 3]  # oldest first
    assert store.query("red")[0].tags == ("toys", "floor")
    assert store.count() == 3 and store.last_id() == 3
    store.close()


def test_ids_continue_after_restart_and_entries_survive(tmp_path) -> None:
    path = tmp_path / "m.db"
    store = MemoryStore(path)
    for i in range(3):
        store.add(f"entry {i}", "memory", float(i), float(i))
    store.close()
    again = MemoryStore(path)
    assert [r.text for r in again.recent(10)] == ["entry 0", "entry 1", "entry 2"]
    assert again.add("after restart", "memory", 5.0, 5.0).entry_id == 4
    assert again.moved_aside is None
    again.close()


def test_entry_survives_kill_9_right_after_add(tmp_path) -> None:
    path = tmp_path / "m.db"
    code = (
        "import os, signal, sys\n"
        "from oxygen_ros.nodes.inference.memory_store import MemoryStore\n"
        f"s = MemoryStore({str(path)!r})\n"
        "r = s.add('durable', 'memory', 1.0, 1.0)\n"
        "print(r.entry_id, flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == -9 and proc.stdout.strip() == "1", proc.stderr
    store = MemoryStore(path)
    assert [r.text for r in store.recent(5)] == ["durable"]
    assert store.add("next", "memory", 2.0, 2.0).entry_id == 2


def test_ids_never_reused_after_delete(tmp_path) -> None:
    path = tmp_path / "m.db"
    store = MemoryStore(path)
    store.add("a", "memory", 1.0, 1.0)
    store.add("b", "memory", 2.0, 2.0)
    store.close()
    with sqlite3.connect(path) as conn:
        conn.execute("DELETE FROM memory WHERE entry_id = 2")
    store = MemoryStore(path)
    assert store.add("c", "memory", 3.0, 3.0).entry_id == 3


def test_corrupt_file_moved_aside_not_overwritten(tmp_path) -> None:
    path = tmp_path / "m.db"
    garbage = b"this is not a database" * 100
    path.write_bytes(garbage)
    store = MemoryStore(path)
    assert store.moved_aside is not None and store.moved_aside.read_bytes() == garbage
    assert "corrupt" in store.moved_aside.name and store.moved_aside_reason
    assert store.add("fresh", "memory", 1.0, 1.0).entry_id == 1
    store.close()


def test_foreign_database_moved_aside(tmp_path) -> None:
    path = tmp_path / "m.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE users (name TEXT)")
    store = MemoryStore(path)
    assert store.moved_aside is not None
    with sqlite3.connect(store.moved_aside) as conn:
        assert conn.execute("SELECT name FROM sqlite_master").fetchall() == [("users",)]


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files regardless of permissions")
def test_unreadable_file_moved_aside(tmp_path) -> None:
    path = tmp_path / "m.db"
    MemoryStore(path).close()
    path.chmod(0)
    store = MemoryStore(path)
    assert store.moved_aside is not None


def test_creates_parent_directories(tmp_path) -> None:
    store = MemoryStore(tmp_path / "a" / "b" / "m.db")
    assert store.add("x", "memory", 1.0, 1.0).entry_id == 1
