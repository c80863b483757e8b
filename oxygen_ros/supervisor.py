"""The bring-up's node processes: start them, watch them, restart the ones that crash, stop them.

ROS-free (`oxygen_ros.bringup` shows what happens; `benchmarks/closed_loop_evaluator.py` starts
its graph here too). A node respawns as `ros2 launch` respawns it (launch_ros's `respawn` and
`respawn_delay`, from `graph.ResolvedNode`), with one difference: here only an abnormal exit (a
non-zero code or a signal: a crash, kill -9, a node that gives up with code 1) restarts it. A
node that exits with code 0 was stopped on purpose (SIGINT, SIGTERM, a lifecycle shutdown) and
stays down.

Invariants:
- A child that exits abnormally and whose node respawns is started again `respawn_delay_s`
  after its exit was seen, with the same command and environment, its output appended to the
  same log; `restarts` counts it. Meanwhile its state is "restarting".
- Any other exit ends the child (`ended`); the bring-up then stops the graph (exit code 1).
- `stop_children` sends SIGINT in reverse start order and kills a child that has not exited
  after `STOP_TIMEOUT_S`; a child waiting for its restart is not restarted afterwards.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TextIO

from oxygen_ros import graph
from oxygen_ros.resources import cache_dir

STOP_TIMEOUT_S = 10.0


@dataclasses.dataclass
class Child:
    """One node's process (the newest, after restarts)."""

    node: graph.ResolvedNode
    popen: subprocess.Popen
    log_path: Path
    command: list[str]
    env: dict[str, str]
    restarts: int = 0
    down_since: float | None = None  # monotonic time its abnormal exit was seen (restarting)
    ended: bool = False  # exited and will not be restarted

    @property
    def name(self) -> str:
        return self.node.spec.name

    @property
    def state(self) -> str:
        """ "up", "restarting" (down, its restart due) or "EXITED" (down for good)."""
        if self.down_since is not None:
            return "restarting"
        return "EXITED" if self.ended or self.popen.poll() is not None else "up"


def spawn(command: list[str], env: dict[str, str], log_path: Path) -> subprocess.Popen:
    with log_path.open("ab") as log_file:  # a restart appends to the same log
        return subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT, env=env)


def tail(path: Path, lines: int = 15) -> str:
    """The last `lines` lines of a child's log ("" if it cannot be read)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def node_env() -> dict[str, str]:
    """The node processes' environment: unbuffered output, and compiled XLA programs reused
    across runs and restarts (the engine starts in seconds, not tens)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.setdefault("JAX_COMPILATION_CACHE_DIR", str(cache_dir("jax")))
    env.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    return env


def start_children(
    nodes: Sequence[graph.ResolvedNode],
    log_dir: Path,
    env: Mapping[str, str] | None = None,
    per_node: Callable[[graph.ResolvedNode], tuple[Mapping[str, str], Sequence[str]]]
    | None = None,
) -> list[Child]:
    """Starts every node in order, its output in `log_dir/<name>.log` (a new file).

    Args:
        env: the processes' environment (default `node_env()`).
        per_node: a node's own additions: (environment entries, command prefix), for example a
            network namespace's (`ip netns exec <ns>`); kept for its restarts.
    """
    children = []
    base = node_env() if env is None else dict(env)
    for node in nodes:
        extra, prefix = per_node(node) if per_node is not None else ({}, ())
        log_path = log_dir / f"{node.spec.name}.log"
        log_path.write_bytes(b"")
        command, child_env = [*prefix, *node.command(log_dir)], {**base, **extra}
        children.append(
            Child(node, spawn(command, child_env, log_path), log_path, command, child_env)
        )
    return children


def poll_children(children: Sequence[Child], now: float | None = None) -> list[tuple[Child, str]]:
    """Looks at every child once: notices exits and starts the restarts that are due.

    Returns:
        What happened, in order: (child, "exited") for an abnormal exit that will restart,
        (child, "restarted") when its new process started, (child, "ended") for an exit that
        ends it (code 0, or a node that does not respawn).
    """
    now = time.monotonic() if now is None else now
    events = []
    for child in children:
        if child.ended:
            continue
        if child.down_since is None:
            code = child.popen.poll()
            if code is None:
                continue
            if code != 0 and child.node.respawn:
                child.down_since = now
                events.append((child, "exited"))
            else:
                child.ended = True
                events.append((child, "ended"))
                continue
        if now - child.down_since >= child.node.respawn_delay_s:
            child.popen = spawn(child.command, child.env, child.log_path)
            child.restarts += 1
            child.down_since = None
            events.append((child, "restarted"))
    return events


def stop_children(children: Sequence[Child], out: TextIO) -> None:
    """SIGINT in reverse start order, then wait; kill what is still running after the timeout.
    No restart is started from here on."""
    for child in children:
        child.down_since = None
        child.ended = True
    for child in reversed(children):
        if child.popen.poll() is None:
            child.popen.send_signal(signal.SIGINT)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for child in reversed(children):
        try:
            child.popen.wait(max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            print(
                f"[bringup] {child.name} did not stop in {STOP_TIMEOUT_S:g} s; killing it",
                file=out,
            )
            child.popen.kill()
            child.popen.wait(5)
