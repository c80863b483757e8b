"""Helpers for tests that start real ROS 2 node processes and talk to them over DDS.

Invariants: nothing here sleeps for a fixed time to wait for the system; every wait polls a
condition with a deadline and fails with a message naming what did not happen.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from oxygen_ros.resources import cache_dir

DISCOVERY_TIMEOUT_S = 15.0  # discovery usually takes 0.1-0.2 s, sometimes about 3 s
T = TypeVar("T")


def wait_for(
    predicate: Callable[[], bool],
    timeout_s: float,
    what: str | Callable[[], str],
    poll_s: float = 0.01,
) -> None:
    """Polls `predicate` until it is true; raises AssertionError naming `what` on timeout
    (a callable `what` is evaluated then, to report the state at the timeout)."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            name = what() if callable(what) else what
            raise AssertionError(f"timed out after {timeout_s:.1f} s waiting for {name}")
        time.sleep(poll_s)


def call_service(client, request, timeout_s: float = 15.0):
    """Waits for `client`'s service, calls it, waits for and returns the reply."""
    wait_for(client.service_is_ready, timeout_s, f"service {client.srv_name}")
    future = client.call_async(request)
    wait_for(future.done, timeout_s, f"reply from {client.srv_name}")
    return future.result()


def newest_status(diagnostics, node: str) -> dict[str, str]:
    """The key/values of the newest `oxygen_ros: <node>` status among collected /diagnostics
    arrays ({} before one arrived)."""
    name = f"oxygen_ros: {node}"
    for array in reversed(list(diagnostics)):
        for status in array.status:
            if status.name == name:
                return {kv.key: kv.value for kv in status.values}
    return {}


@dataclass
class NodeProcess:
    """A node started as its own OS process (`python -m <module> --ros-args ...`)."""

    name: str
    popen: subprocess.Popen
    log_path: Path

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, sig: int = signal.SIGINT, timeout_s: float = 15.0) -> int:
        """Sends `sig` and waits for exit; kills after `timeout_s`. Returns the exit code."""
        if self.popen.poll() is None:
            self.popen.send_signal(sig)
            try:
                self.popen.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(5)
        return self.popen.returncode


@dataclass
class ProcessLauncher:
    """Starts node processes with the test run's ROS environment and stops them at teardown."""

    env: dict[str, str]
    workdir: Path
    processes: list[NodeProcess] = field(default_factory=list)

    def start(
        self,
        module: str,
        ros_args: Sequence[str] = (),
        name: str | None = None,
        args: Sequence[str] = (),
    ) -> NodeProcess:
        name = name or Path(module).stem.rsplit(".", 1)[-1]
        log_path = self.workdir / f"{name}-{len(self.processes)}.log"
        # A path to a .py file runs as a script, anything else as a module.
        target = [module] if module.endswith(".py") else ["-m", module]
        cmd = [sys.executable, *target, *args]
        if ros_args:
            cmd += ["--ros-args", *ros_args]
        with log_path.open("wb") as log_file:
            popen = subprocess.Popen(
                cmd, env=self.env, cwd=self.workdir, stdout=log_file, stderr=subprocess.STDOUT
            )
        proc = NodeProcess(name, popen, log_path)
        self.processes.append(proc)
        return proc

    def stop_all(self) -> None:
        for proc in reversed(self.processes):
            proc.stop()


class SpinningNode:
    """An rclpy node in the test process, spun by a background executor thread.

    A single-threaded executor: rclpy's MultiThreadedExecutor loops in its spin thread while a
    callback waits in its pool (the entity stays ready until the pool thread takes it). With
    camera frames arriving at 30 Hz it held the GIL that the tests' own sensor threads need:
    the fake sensors of test_nodes_perception ticked at about 10 Hz instead of 30 and the rate
    test failed in 7 of 10 module runs here (also with cheaper polling); with this executor 3
    of 3 passed, in 36 s instead of 57-117 s."""

    def __init__(self, name: str) -> None:
        import rclpy
        from rclpy.executors import SingleThreadedExecutor

        self.name = name
        self.context = rclpy.Context()
        rclpy.init(context=self.context)
        self.node = rclpy.create_node(name, context=self.context)
        self.executor = SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)
        self._closed = False
        self.spin_error: Exception | None = None
        self._thread = threading.Thread(target=self._spin, daemon=True)
        self._thread.start()

    def _spin(self) -> None:
        from rclpy.executors import ExternalShutdownException

        try:
            self.executor.spin()
        except ExternalShutdownException:
            pass
        except Exception as error:  # close() raises it: this node's callbacks stopped here
            self.spin_error = error

    def on_spin_thread(self, make: Callable[[], T], timeout_s: float = DISCOVERY_TIMEOUT_S) -> T:
        """Runs `make` as an executor task on the spin thread; returns its result or raises its
        exception here (raised in the task, it would end the spin thread). For entities whose
        construction races a spinning executor."""

        def run() -> tuple[T | None, Exception | None]:
            try:
                return make(), None
            except Exception as error:
                return None, error

        task = self.executor.create_task(run)
        wait_for(task.done, timeout_s, "a task on the spin thread")
        value, error = task.result()
        if error is not None:
            raise error
        return value

    def action_client(self, action_type, name: str):
        """An rclpy ActionClient of this node, made on the spin thread: ActionClient adds itself
        to the node before it creates its lock, and an executor collecting the node's entities
        in between raises AttributeError and stops spinning (ros2/rclpy#1589). In one CI run
        that silenced this node's callbacks for the rest of a test module."""
        from rclpy.action import ActionClient

        return self.on_spin_thread(lambda: ActionClient(self.node, action_type, name))

    def collect(self, msg_type, topic: str, qos=10) -> list:
        """Subscribes to `topic`; returns the list the messages are appended to."""
        received: list = []
        self.node.create_subscription(msg_type, topic, received.append, qos)
        return received

    def wait_for_subscribers(
        self, publisher, count: int = 1, timeout_s: float = DISCOVERY_TIMEOUT_S
    ) -> None:
        wait_for(
            lambda: publisher.get_subscription_count() >= count,
            timeout_s,
            f"{count} subscriber(s) on {publisher.topic_name}",
        )

    def wait_for_publishers(
        self, topic: str, count: int = 1, timeout_s: float = DISCOVERY_TIMEOUT_S
    ) -> None:
        wait_for(
            lambda: self.node.count_publishers(topic) >= count,
            timeout_s,
            f"{count} publisher(s) on {topic}",
        )

    def close(self) -> None:
        """Idempotent; the spin thread ends before the node is destroyed (a node destroyed
        under a waiting executor can abort the process)."""
        if self._closed:
            return
        self._closed = True
        self.executor.shutdown(timeout_sec=5)
        self._thread.join(5)
        self.node.destroy_node()
        if self.context.ok():
            self.context.try_shutdown()
        if self.spin_error is not None:
            raise AssertionError(f"{self.name}'s spin thread died") from self.spin_error


# The XLA cache of test runs (test/conftest.py puts it in the environment of every process).
JAX_TEST_CACHE = cache_dir("jax_tests")


def prune_cache(directory: Path, max_bytes: int) -> list[Path]:
    """Deletes the least recently used files of `directory` until it holds at most half of
    `max_bytes`, once it holds more than `max_bytes`; returns what it deleted. A file another
    process is reading as it goes is a cache miss there, not an error."""
    entries = []
    for path in directory.glob("*") if directory.is_dir() else []:
        with contextlib.suppress(FileNotFoundError):
            stat = path.stat()
            entries.append((max(stat.st_atime, stat.st_mtime), stat.st_size, path))
    total = sum(size for _, size, _ in entries)
    deleted: list[Path] = []
    if total <= max_bytes:
        return deleted
    for _, size, path in sorted(entries):
        if total <= max_bytes // 2:
            break
        path.unlink(missing_ok=True)
        total -= size
        deleted.append(path)
    return deleted


MAX_WORKERS = 8  # pytest-xdist workers with a domain of their own (pyproject: at most 6)
XDIST_RUN_BLOCKS = 12  # blocks of MAX_WORKERS domains: 1..96


def domain_id_for(env: dict[str, str]) -> int:
    """The ROS domain id of a test process with environment `env`. Several runs (developers,
    CI) may share a machine, so each picks its own; Fast DDS's valid ids on Linux are 0..101
    for the default port mapping, and 0 is left to everyone else. Under pytest-xdist (`-n N`)
    each worker is a process of its own: the run's id (shared by its workers) picks a block of
    `MAX_WORKERS` domains and the worker's number one in it, so the workers' graphs never see
    each other. `OXYGEN_TEST_DOMAIN_ID` overrides."""
    if "OXYGEN_TEST_DOMAIN_ID" in env:
        return int(env["OXYGEN_TEST_DOMAIN_ID"])
    worker = env.get("PYTEST_XDIST_WORKER")  # gw0, gw1, ... (unset without xdist)
    if worker is None:
        return random.SystemRandom().randint(1, 101)
    block = random.Random(env.get("PYTEST_XDIST_TESTRUNUID", "")).randrange(XDIST_RUN_BLOCKS)
    return 1 + block * MAX_WORKERS + int(worker.removeprefix("gw")) % MAX_WORKERS


def ros_test_env(log_dir: Path, domain_id: int) -> dict[str, str]:
    """The environment for node processes of this test run."""
    env = dict(os.environ)
    env.update(
        ROS_DOMAIN_ID=str(domain_id),
        ROS_AUTOMATIC_DISCOVERY_RANGE="LOCALHOST",
        ROS_LOG_DIR=str(log_dir),
        PYTHONUNBUFFERED="1",
        RCUTILS_LOGGING_BUFFERED_STREAM="0",
    )
    return env
