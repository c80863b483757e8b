"""oxygen_ros.supervisor, with real child processes (short Python one-liners): an abnormal exit
of a respawning node restarts it after its delay, its output appended to the same log; an exit
with code 0, or of a node that does not respawn, ends it; a stop cancels a restart that is due."""

from __future__ import annotations

import dataclasses
import io
import sys
from pathlib import Path

from harness import wait_for

from oxygen_ros import graph, supervisor


def child(tmp_path: Path, code: int, respawn: bool, delay_s: float = 0.0) -> supervisor.Child:
    """A node whose process prints one line and exits with `code`."""
    spec = dataclasses.replace(graph.NODES[0], name=f"exit{code}")
    node = graph.ResolvedNode(spec, "", "unused.yaml", respawn=respawn, respawn_delay_s=delay_s)
    log = tmp_path / f"exit{code}_{respawn}.log"
    command = [sys.executable, "-c", f"print('run', flush=True); raise SystemExit({code})"]
    env = supervisor.node_env()
    return supervisor.Child(node, supervisor.spawn(command, env, log), log, command, env)


def events_until(children, wanted: str, timeout_s: float = 20.0) -> list[tuple[str, str]]:
    seen: list[tuple[str, str]] = []

    def poll() -> bool:
        seen.extend((c.name, e) for c, e in supervisor.poll_children(children))
        return any(e == wanted for _, e in seen)

    wait_for(poll, timeout_s, f"a {wanted!r} event", poll_s=0.02)
    return seen


def test_an_abnormal_exit_restarts_a_respawning_node_after_its_delay(tmp_path: Path) -> None:
    crashing = child(tmp_path, 3, respawn=True, delay_s=0.3)
    assert events_until([crashing], "exited") == [("exit3", "exited")]
    assert crashing.state == "restarting" and crashing.restarts == 0
    down = crashing.down_since
    # Not before its delay (the same call restarts it once the delay has passed).
    assert supervisor.poll_children([crashing], now=down + 0.1) == []
    assert supervisor.poll_children([crashing], now=down + 0.3) == [(crashing, "restarted")]
    assert crashing.restarts == 1 and crashing.state in ("up", "EXITED")
    crashing.popen.wait(20)
    assert crashing.log_path.read_text().count("run") == 2  # appended, not overwritten


def test_a_clean_exit_or_a_node_that_does_not_respawn_ends(tmp_path: Path) -> None:
    clean = child(tmp_path, 0, respawn=True)
    assert events_until([clean], "ended") == [("exit0", "ended")]
    assert clean.state == "EXITED" and clean.restarts == 0
    assert supervisor.poll_children([clean]) == []  # ended once
    fixed = child(tmp_path, 3, respawn=False)
    assert events_until([fixed], "ended") == [("exit3", "ended")]
    assert fixed.restarts == 0


def test_a_stop_cancels_a_restart_that_is_due(tmp_path: Path) -> None:
    crashing = child(tmp_path, 3, respawn=True, delay_s=60.0)
    events_until([crashing], "exited")
    out = io.StringIO()
    supervisor.stop_children([crashing], out)
    assert supervisor.poll_children([crashing]) == [] and crashing.restarts == 0
    assert crashing.state == "EXITED"


def test_start_children_adds_each_nodes_environment_and_prefix_and_keeps_them(
    tmp_path: Path,
) -> None:
    """`per_node`'s environment entries and command prefix (as a network namespace's `ip netns
    exec`) reach that node's process, its restart too; the other nodes get neither."""
    prefix = [sys.executable, "-c", PRINT_SIDE_AND_EXIT]
    # `python -m this` prints and exits 0: the node without a prefix runs its own command.
    specs = [
        dataclasses.replace(graph.NODES[0], name=n, module="this") for n in ("inside", "outside")
    ]
    nodes = [
        graph.ResolvedNode(s, "", str(tmp_path / "p.yaml"), respawn=True, respawn_delay_s=0.0)
        for s in specs
    ]

    def per_node(node):
        return ({"OXY_SIDE": "b"}, prefix) if node.spec.name == "inside" else ({}, ())

    env = {**supervisor.node_env(), "OXY_SIDE": "a"}
    inside, outside = supervisor.start_children(nodes, tmp_path, env, per_node)
    assert inside.command == [*prefix, *nodes[0].command(tmp_path)]
    assert outside.command == nodes[1].command(tmp_path)
    assert inside.env["OXY_SIDE"] == "b" and outside.env["OXY_SIDE"] == "a"
    events_until([inside], "restarted")
    inside.popen.wait(20)
    runs = inside.log_path.read_text().splitlines()
    assert runs == [f"side=b node={sys.executable}"] * 2  # the restart: same prefix and env
    assert outside.popen.wait(20) == 0 and "Beautiful is better" in outside.log_path.read_text()
    supervisor.stop_children([inside, outside], io.StringIO())


# argv[1:] is the node's own command, after the prefix.
PRINT_SIDE_AND_EXIT = (
    "import os, sys; print(f\"side={os.environ['OXY_SIDE']} node={sys.argv[1]}\", flush=True);"
    " raise SystemExit(3)"
)
