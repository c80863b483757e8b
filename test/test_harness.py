"""The test harness's spinning node: work handed to its spin thread runs there, its errors
come back to the caller, and the thread keeps spinning afterwards."""

from __future__ import annotations

import os
import threading

import pytest
from harness import MAX_WORKERS, SpinningNode, domain_id_for, prune_cache, wait_for
from rclpy.action import ActionClient
from std_msgs.msg import String

from oxygen_ros.action import Instruct


def assert_spin_thread_serves(ros_node) -> None:
    """A message published now reaches the node's subscription (callbacks still run)."""
    received = ros_node.collect(String, "harness_probe")
    publisher = ros_node.node.create_publisher(String, "harness_probe", 10)
    ros_node.wait_for_subscribers(publisher)
    wait_for(
        lambda: publisher.publish(String(data="x")) or received, 10, "the probe message", 0.05
    )


def test_on_spin_thread_runs_there_and_returns_the_result(ros_node) -> None:
    ident = ros_node.on_spin_thread(threading.get_ident)
    assert ident == ros_node._thread.ident != threading.get_ident()


def test_an_error_in_the_task_is_raised_here_and_the_thread_keeps_spinning(ros_node) -> None:
    def fail() -> None:
        raise ValueError("made on purpose")

    with pytest.raises(ValueError, match="made on purpose"):
        ros_node.on_spin_thread(fail)
    assert_spin_thread_serves(ros_node)
    assert ros_node.spin_error is None


def test_action_client_is_made_on_the_spin_thread(ros_node, monkeypatch) -> None:
    made_on: list[int] = []
    original = ActionClient.__init__

    def record(self, *args, **kwargs) -> None:
        made_on.append(threading.get_ident())
        original(self, *args, **kwargs)

    monkeypatch.setattr(ActionClient, "__init__", record)
    client = ros_node.action_client(Instruct, "oxygen/instruct")
    assert isinstance(client, ActionClient)
    assert made_on == [ros_node._thread.ident]
    assert_spin_thread_serves(ros_node)


def test_a_spin_thread_that_died_is_reported_at_close() -> None:
    """The positive control of `spin_error is None` above: a task that raises where the
    executor sees it ends the spin thread, and close() names that error."""
    view = SpinningNode("test_harness_dies")

    def fail() -> None:
        raise ValueError("ends the spin thread")

    view.executor.create_task(fail)
    wait_for(lambda: not view._thread.is_alive(), 10, "the spin thread's end")
    assert isinstance(view.spin_error, ValueError)
    with pytest.raises(AssertionError, match="test_harness_dies's spin thread died"):
        view.close()


def test_prune_cache_deletes_the_least_recently_used_down_to_half(tmp_path) -> None:
    for age, name in enumerate(["newest", "new", "old", "oldest"]):
        path = tmp_path / name
        path.write_bytes(b"x" * 100)
        os.utime(path, (1_000_000 - age * 10, 1_000_000 - age * 10))
    assert prune_cache(tmp_path, max_bytes=400) == []  # control: at the bound, nothing goes
    deleted = prune_cache(tmp_path, max_bytes=399)
    assert [p.name for p in deleted] == ["oldest", "old", "new"]  # down to 199 bytes
    assert [p.name for p in tmp_path.iterdir()] == ["newest"]
    assert prune_cache(tmp_path / "absent", max_bytes=0) == []


def test_xdist_workers_of_one_run_get_domains_of_their_own() -> None:
    runs = [{"PYTEST_XDIST_TESTRUNUID": f"run{k}"} for k in range(20)]
    for run in runs:
        ids = [domain_id_for({**run, "PYTEST_XDIST_WORKER": f"gw{w}"}) for w in range(6)]
        assert len(set(ids)) == len(ids) and all(1 <= i <= 101 for i in ids), ids
        # The same run and worker: the same domain in every process that computes it.
        assert ids[3] == domain_id_for({**run, "PYTEST_XDIST_WORKER": "gw3"})
    # Runs spread over the blocks (control: the run id is read at all).
    first = {domain_id_for({**run, "PYTEST_XDIST_WORKER": "gw0"}) for run in runs}
    assert len(first) > 1 and all((i - 1) % MAX_WORKERS == 0 for i in first)
    assert domain_id_for({"OXYGEN_TEST_DOMAIN_ID": "42", "PYTEST_XDIST_WORKER": "gw1"}) == 42
    assert 1 <= domain_id_for({}) <= 101
