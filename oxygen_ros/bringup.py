"""Bring-up without `ros2 launch`: `python -m oxygen_ros.bringup [name:=value ...] [--duration S]`.

Starts the node processes of `oxygen_ros.graph` (the same graph, YAML and argument handling as
`launch/humanoid.launch.py`; `use_sim` defaults to true here because these machines have no
robot; `profile:=workcell` brings up the simulated ALOHA workcell), then shows a live console
view: action rate, frame time, tokens/s, the workcell's episode status, the speech text as it
streams, and memory entries. Node output goes to one log file per node.

Invariants:
- Ctrl-C or SIGTERM (or the end of `--duration`) stops every child with SIGINT in reverse start
  order, kills a child only if it has not exited after `STOP_TIMEOUT_S`, and exits 0.
- A node that respawns (perception and inference, launch argument `respawn`) and exits
  abnormally is restarted after `respawn_delay` (`oxygen_ros.supervisor`); the exit, the tail
  of its log and the restart are printed, and the restarts are counted in the console view
  and on `/diagnostics` (status `oxygen_ros: bringup`, with the view).
- While any node respawns, the graph and the view talk over UDP only
  (`FASTDDS_BUILTIN_TRANSPORTS=UDPv4` unless set): shared memory can leave the survivors of a
  kill -9 deaf to the restarted participant.
- Any other exit of a child ends the bring-up with exit code 1 (after stopping the others)
  and the tail of its log is printed.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import importlib.util
import os
import re
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from oxygen_ros import graph
from oxygen_ros.supervisor import Child, poll_children, start_children, stop_children, tail

REFRESH_S = 0.5
VIEW_URL = re.compile(r"\bview: (http://\S+)")  # the viewer node's start-up line
STATUS_PERIOD_S = 1.0  # the bring-up's own /diagnostics status
SPEECH_LINES = 6
MEMORY_LINES = 5


def parse_args(argv: Sequence[str]) -> tuple[dict[str, str], argparse.Namespace]:
    """Splits `name:=value` launch arguments from the bring-up's own options."""
    launch_args = {}
    rest = []
    for arg in argv:
        if ":=" in arg and not arg.startswith("-"):
            key, value = arg.split(":=", 1)
            launch_args[key] = value
        else:
            rest.append(arg)
    known = "\n".join(
        f"  {a.name}:=<{a.default or 'empty'}>  {a.description}" for a in graph.LAUNCH_ARGUMENTS
    )
    parser = argparse.ArgumentParser(
        prog="python -m oxygen_ros.bringup",
        description="Start an oxygen_ros graph (humanoid or workcell) with a live console view.",
        epilog=f"launch arguments (name:=value):\n{known}\n(use_sim defaults to true here)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--duration",
        type=float,
        default=0.0,
        help="stop after this many seconds (0: run until Ctrl-C)",
    )
    parser.add_argument(
        "--log-dir",
        default="",
        help="directory for the nodes' logs (default: a new temporary one)",
    )
    parser.add_argument(
        "--no-console", action="store_true", help="do not show the console view (text)"
    )
    parser.add_argument(
        "--print",
        dest="print_only",
        action="store_true",
        help="print the nodes the arguments resolve to (params file, overrides, command line)"
        " and exit without starting them",
    )
    options = parser.parse_args(rest)
    launch_args.setdefault("use_sim", "true")
    return launch_args, options


def event_line(child: Child, event: str) -> str:
    """What the bring-up prints for a `supervisor.poll_children` event."""
    if event == "restarted":
        return (
            f"[bringup] restarted {child.name} (pid {child.popen.pid}, restart {child.restarts})"
        )
    code = child.popen.returncode
    then = (
        f"restarting in {child.node.respawn_delay_s:g} s"
        if event == "exited"
        else "stopping the graph"
    )
    return (
        f"[bringup] {child.name} exited with code {code}; {then}; last lines of "
        f"{child.log_path}:\n{tail(child.log_path)}"
    )


def topic_names(params_file: str) -> dict[str, str]:
    """The inference node's output topics and the workcell simulator's episode status topic
    from the YAML (defaults from the declarations)."""
    import yaml

    from oxygen_ros.nodes.inference.params import INFERENCE
    from oxygen_ros.nodes.workcell.params import WORKCELL_SIM

    inference = {s.name: s.default for s in INFERENCE if s.name.endswith("_topic")}
    status = {s.name: s.default for s in WORKCELL_SIM if s.name == "episode_status_topic"}
    names = {**inference, **status}
    try:
        data = yaml.safe_load(Path(params_file).read_text()) or {}
    except (OSError, yaml.YAMLError):
        return names
    for node, keys in (("inference", inference), ("workcell_sim", status)):
        values = graph.node_parameters(data, node)
        names.update({k: v for k, v in values.items() if k in keys and isinstance(v, str)})
    return names


class ConsoleView:
    """A node that listens to the graph's outputs and renders a text summary."""

    def __init__(self, namespace: str, topics: dict[str, str]) -> None:
        import rclpy
        from diagnostic_msgs.msg import DiagnosticArray
        from rclpy.executors import SingleThreadedExecutor
        from rclpy.signals import SignalHandlerOptions

        from oxygen_ros.msg import ActionChunk, EpisodeStatus, MemoryEntry, SpeechToken
        from oxygen_ros.nodes.common.runtime import (
            LATCHED_QOS,
            RELIABLE_QOS,
            SPEECH_QOS,
            latched_qos,
        )
        from oxygen_ros.nodes.inference.engine_bridge import RateMeter

        self.context = rclpy.Context()
        rclpy.init(  # args=[]: the launch arguments in sys.argv are not ROS arguments
            args=[], context=self.context, signal_handler_options=SignalHandlerOptions.NO
        )
        self.node = rclpy.create_node("bringup", namespace=namespace or None, context=self.context)
        self._lock = threading.Lock()
        self.action_rate = RateMeter(window_s=2.0)
        self.num_actions = 0
        self.last_chunk = None
        self.diagnostics: dict[str, tuple[int, str, dict[str, str]]] = {}
        self.speech: collections.OrderedDict[str, list] = collections.OrderedDict()
        self.memory: collections.deque = collections.deque(maxlen=MEMORY_LINES)
        self.num_memory = 0
        self.episode = None  # the newest EpisodeStatus (workcell profile)
        self.node.create_subscription(
            EpisodeStatus, topics["episode_status_topic"], self._on_episode, LATCHED_QOS
        )
        self.node.create_subscription(
            ActionChunk, topics["actions_topic"], self._on_action, RELIABLE_QOS
        )
        self.node.create_subscription(
            SpeechToken, topics["speech_topic"], self._on_speech, SPEECH_QOS
        )
        self.node.create_subscription(
            MemoryEntry, topics["memory_topic"], self._on_memory, latched_qos(20)
        )
        self.node.create_subscription(DiagnosticArray, "/diagnostics", self._on_diagnostics, 10)
        self._status_pub = self.node.create_publisher(DiagnosticArray, "/diagnostics", 10)
        self.executor = SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)
        self._thread = threading.Thread(target=self._spin, daemon=True)
        self._thread.start()

    def _spin(self) -> None:
        from rclpy.executors import ExternalShutdownException

        with contextlib.suppress(ExternalShutdownException):
            self.executor.spin()

    def _on_action(self, msg) -> None:
        self.action_rate.add()
        with self._lock:
            self.num_actions += 1
            self.last_chunk = msg

    def _on_speech(self, msg) -> None:
        with self._lock:
            entry = self.speech.setdefault(msg.request_id, [msg.kind, "", False, msg.status])
            entry[1] += msg.text_delta
            entry[2], entry[3] = msg.final, msg.status
            if msg.final and msg.error:
                entry[1] += f" [{msg.error}]"
            self.speech.move_to_end(msg.request_id)
            while len(self.speech) > SPEECH_LINES:
                self.speech.popitem(last=False)

    def _on_memory(self, msg) -> None:
        with self._lock:
            self.memory.append((msg.entry_id, msg.kind, msg.text))
            self.num_memory += 1

    def _on_episode(self, msg) -> None:
        with self._lock:
            self.episode = msg

    def _on_diagnostics(self, msg) -> None:
        from oxygen_ros.nodes.common.conversions import diagnostic_values

        with self._lock:
            for status in msg.status:
                if status.name.startswith("oxygen_ros"):
                    self.diagnostics[status.name.split(": ", 1)[-1]] = (
                        int.from_bytes(status.level, "little")
                        if isinstance(status.level, bytes)
                        else int(status.level),
                        status.message,
                        diagnostic_values(status),
                    )

    def render(self, elapsed: float, children: Sequence[Child]) -> str:
        with self._lock:
            diags = dict(self.diagnostics)
            speech = list(self.speech.items())
            memory = list(self.memory)
            num_memory, chunk, episode = self.num_memory, self.last_chunk, self.episode
        inf = diags.get("inference", (0, "", {}))[2]
        per = diags.get("perception", (0, "", {}))[2]
        running = " ".join(
            f"{c.name}:{c.state}" + (f"({c.restarts} restarts)" if c.restarts else "")
            for c in children
        )
        level = {0: "OK", 1: "WARN", 2: "ERROR", 3: "STALE"}
        lines = [
            f"oxygen_ros bring-up  t={elapsed:6.1f} s   {running}   (Ctrl-C to stop)",
            f"  actions    {self.action_rate.rate():6.1f} Hz received "
            f"(target {inf.get('action_rate_target_hz', '?')} Hz)   horizon "
            f"{chunk.horizon if chunk else '-'} x {len(chunk.joint_names) if chunk else '-'}",
            f"  engine     {inf.get('engine_state', 'starting')} ({inf.get('model_preset', '?')})"
            f"   frame time {_fmt(inf.get('frame_time_s'), 's')}   tokens "
            f"{_fmt(inf.get('tokens_per_s'), '/s')}   requests {inf.get('active_requests', 0)}"
            f" active, {inf.get('queued_requests', 0)} queued   watchdog "
            f"{inf.get('watchdog', '-')}",
            f"  perception {_fmt(per.get('observation_rate_hz'), 'Hz')} frames",
        ]
        if episode is not None:
            lines.append(episode_line(episode))
        for name, (lvl, message, _) in sorted(diags.items()):
            lines.append(f"  status     {name}: {level.get(lvl, lvl)} {message}")
        lines.append("  speech:")
        kinds = {0: "subtask", 1: "narration", 2: "memory"}
        for request_id, (kind, text, final, _) in speech:
            mark = "done" if final else "...."
            lines.append(
                f"    {request_id:<14} {kinds.get(kind, kind):<9} [{mark}] {_clip(text)!r}"
            )
        lines.append(f"  memory ({num_memory} received):")
        for entry_id, kind, text in memory:
            lines.append(f"    #{entry_id:<5} {kind:<9} {_clip(text)!r}")
        return "\n".join(lines)

    def publish_status(self, children: Sequence[Child]) -> None:
        """The bring-up's own status: WARN while a node is down for its restart, OK otherwise;
        per node its state and restarts."""
        from oxygen_ros.nodes.common.runtime import publish_status

        down = [c.name for c in children if c.state != "up"]
        restarts = {c.name: c.restarts for c in children if c.restarts}
        message = f"down: {', '.join(down)}" if down else "all nodes up"
        if restarts:
            message += "; restarts: " + ", ".join(f"{k} {v}" for k, v in restarts.items())
        values: dict[str, object] = {}
        for c in children:
            values[f"state.{c.name}"] = c.state
            values[f"restarts.{c.name}"] = c.restarts
        publish_status(self.node, self._status_pub, "WARN" if down else "OK", message, values)

    def close(self) -> None:
        self.executor.shutdown(timeout_sec=2.0)
        self.node.destroy_node()
        self.context.try_shutdown()
        self._thread.join(2.0)


EPISODE_PHASES = {0: "IDLE", 1: "RUNNING", 2: "SUCCEEDED", 3: "FAILED"}


def episode_line(status) -> str:
    """One console line for an `EpisodeStatus`."""
    phase = EPISODE_PHASES.get(status.phase, str(status.phase))
    success = (
        f"   success at {status.time_to_success_s:.1f} s" if status.time_to_success_s >= 0 else ""
    )
    return (
        f"  episode    #{status.episode_id} {phase} {_clip(status.instruction, 40)!r}   "
        f"t {status.elapsed_s:5.1f}/{status.time_limit_s:.0f} s   stage {status.stage!r}"
        f"{success}   rtf {status.real_time_factor:.2f}   starved {status.starvation_events}"
    )


def _fmt(value: str | None, unit: str) -> str:
    if value is None:
        return "-"
    try:
        return f"{float(value):.2f} {unit}"
    except ValueError:
        return f"{value} {unit}"


def _clip(text: str, width: int = 60) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def view_urls(log_path: Path) -> list[str]:
    """The URLs the viewer's log announced, one per start (a restart may serve new ports)."""
    try:
        return VIEW_URL.findall(log_path.read_text(errors="replace"))
    except OSError:
        return []


def describe(nodes: Sequence[graph.ResolvedNode], overrides_dir: Path) -> str:
    """What `--print` shows: per node its name, namespace, params file, launch overrides and
    the command line the bring-up would run (with its overrides file in `overrides_dir`)."""
    lines = []
    for node in nodes:
        lines += [
            f"{node.spec.name}: {node.spec.module}",
            f"  namespace    {node.namespace or '/'}",
            f"  params_file  {node.params_file}",
            f"  overrides    {dict(node.overrides) or '-'}",
            f"  command      {' '.join(node.command(overrides_dir))}",
        ]
    return "\n".join(lines)


def _reexec_without_source_tree(argv: Sequence[str]) -> None:
    """`python -m oxygen_ros.bringup` run from the repository root imports the source tree's
    oxygen_ros, which lacks the generated messages; start again with -P (install space)."""
    if importlib.util.find_spec("oxygen_ros.msg") is None and not sys.flags.safe_path:
        os.execv(sys.executable, [sys.executable, "-P", "-m", "oxygen_ros.bringup", *argv])


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    _reexec_without_source_tree(argv)
    launch_args, options = parse_args(argv)
    try:
        nodes = graph.resolve(launch_args)
    except ValueError as exc:
        print(f"[bringup] {exc}", file=sys.stderr)
        return 2
    log_dir = Path(options.log_dir or tempfile.mkdtemp(prefix="oxygen_bringup_"))
    log_dir.mkdir(parents=True, exist_ok=True)
    if options.print_only:
        print(describe(nodes, log_dir))
        return 0
    if any(n.respawn for n in nodes) and "FASTDDS_BUILTIN_TRANSPORTS" not in os.environ:
        # Fast DDS's shared-memory transport can leave the processes that outlive a kill -9
        # unable to reach the restarted participant (eProsima/Fast-DDS#5469, #5053; the view
        # here saw no action of a respawned inference node in a CI run): the graph and this
        # process's view talk over UDP only while nodes may respawn.
        os.environ["FASTDDS_BUILTIN_TRANSPORTS"] = "UDPv4"
        print("[bringup] respawn on: FASTDDS_BUILTIN_TRANSPORTS=UDPv4", file=sys.stdout)
    stop = threading.Event()
    previous = {
        sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)
    }
    out = sys.stdout
    tty = out.isatty()
    print(
        f"[bringup] starting {', '.join(n.spec.name for n in nodes)} with "
        f"{nodes[0].params_file if nodes else '-'}; logs in {log_dir}",
        file=out,
        flush=True,
    )
    children = start_children(nodes, log_dir)
    for child in children:
        print(
            f"[bringup] started {child.name} (pid {child.popen.pid}), log {child.log_path}",
            file=out,
            flush=True,
        )
    view = (
        None
        if options.no_console
        else ConsoleView(nodes[0].namespace if nodes else "", topic_names(nodes[0].params_file))
    )
    viewer = next((c for c in children if c.name == "viewer"), None)
    urls_shown = 0  # one per start of the viewer
    start = time.monotonic()
    code = 0
    last_print = last_status = last_url_check = 0.0
    try:
        while not stop.is_set():
            elapsed = time.monotonic() - start
            if options.duration and elapsed >= options.duration:
                break
            ended = False
            for child, event in poll_children(children):
                print(event_line(child, event), file=out, flush=True)
                ended = ended or event == "ended"
            if ended:
                code = 1
                break
            if (
                viewer is not None
                and urls_shown <= viewer.restarts  # this start has not announced its URL
                and elapsed - last_url_check >= 1.0
            ):
                last_url_check = elapsed
                for url in view_urls(viewer.log_path)[urls_shown:]:
                    print(f"[bringup] live view: {url}", file=out, flush=True)
                    urls_shown += 1
            if view is not None and elapsed - last_status >= STATUS_PERIOD_S:
                view.publish_status(children)
                last_status = elapsed
            if view is not None and (tty or elapsed - last_print >= 5.0):
                text = view.render(elapsed, children)
                print(("\x1b[H\x1b[J" if tty else "") + text, file=out, flush=True)
                last_print = elapsed
            stop.wait(REFRESH_S)
    finally:
        print("[bringup] stopping nodes", file=out, flush=True)
        stop_children(children, out)
        if view is not None:
            print(view.render(time.monotonic() - start, children), file=out, flush=True)
            view.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    codes = {c.name: c.popen.returncode for c in children}
    print(f"[bringup] stopped; exit codes {codes}; logs in {log_dir}", file=out, flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
