"""Record scripted-expert demonstrations in the simulated workcell, through ROS.

`python -m oxygen_ros.record_demos --episodes 200 --seed-start 1000 --out data/demos
--real-time-factor 1.0` (or `scripts/record_demos ...`, which sets everything up first).

Starts the workcell graph with the scripted expert (`profile:=workcell use_sim:=true
policy:=expert`, from `oxygen_ros.graph`: the same nodes, names and YAML as the bring-up; the
perception node is left out unless `--with-perception`, since nothing consumes its frames here)
with recording on (`expert:record_dir`) and the simulator's start-up episode off. Episode i is
reset with seed `seed-start + i` through the `ResetEpisode` service and ends when its
`EpisodeStatus` leaves RUNNING (success decided from the simulator state, or the time limit).
The expert writes `episode_<index>.hdf5` per episode into `--out` (indices continue after the
files already there); this process waits for each file, checks it against the status, and
prints a summary (episodes recorded, success rate, wall time). A JSON summary goes next to the
files (`record_<first seed>-<last seed>.json`, with the successful file names).

Only successful episodes are training data: failed ones stay on disk with the `success`
attribute false (readers filter on it; `recorder.read_episode(p).success`). Nothing is
downloaded. Exit code 0 when every episode was recorded, 1 otherwise, 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import json
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import h5py
import yaml

from oxygen_ros import graph, supervisor

START_TIMEOUT_S = 120.0  # scene compile + EGL context + DDS discovery on a busy machine
RESET_TIMEOUT_S = 30.0
FILE_TIMEOUT_S = 60.0  # wall seconds from an episode's end until its file must exist
EPISODE_SLACK_S = 60.0  # wall seconds beyond the time limit (at the real-time factor)
POLL_S = 0.02


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="scripts/record_demos",
        description="Record scripted-expert demonstrations in the simulated workcell via ROS.",
    )
    parser.add_argument("--episodes", type=int, default=10, help="number of episodes")
    parser.add_argument("--seed-start", type=int, default=0, help="episode i uses seed S+i")
    parser.add_argument("--out", default="data/demos", help="directory for the HDF5 files")
    parser.add_argument(
        "--real-time-factor",
        type=float,
        default=1.0,
        help="sim seconds per wall second (lower it if the machine cannot keep up)",
    )
    parser.add_argument("--instruction", default="", help="fixed instruction ('' = by seed)")
    parser.add_argument("--params-file", default="", help="YAML (default config/workcell.yaml)")
    parser.add_argument("--log-dir", default="", help="node logs (default: a temporary dir)")
    parser.add_argument(
        "--with-perception", action="store_true", help="also run the perception node"
    )
    args = parser.parse_args(argv)
    if args.episodes < 1:
        parser.error("--episodes must be >= 1")
    if not 0 < args.real_time_factor <= 10:
        parser.error("--real-time-factor must be in (0, 10]")
    return args


@dataclasses.dataclass
class EpisodeResult:
    """One recorded episode, as the status reported it and as its file says."""

    seed: int
    episode_id: int
    instruction: str
    template: str
    success: bool  # the status's phase was SUCCEEDED
    time_to_success_s: float  # sim seconds; -1 when it failed
    elapsed_s: float  # sim seconds until the episode ended
    wall_s: float  # wall seconds from the reset to the end
    stage: str  # the simulator state's subtask label at the end
    starvation_events: int  # ticks the sim ran out of the expert's rows (the expert stalled)
    file: str = ""  # the episode file ("" if none appeared)
    steps: int = 0
    file_success: bool | None = None  # the file's success attribute


def sim_parameter(params_file: str, name: str, default):
    """A workcell_sim parameter from the YAML (its sections, else `default`)."""
    data = yaml.safe_load(Path(params_file).read_text()) or {}
    return graph.node_parameters(data, "workcell_sim").get(name, default)


def graph_nodes(args: argparse.Namespace, out: Path) -> list[graph.ResolvedNode]:
    """The workcell graph with the expert recording into `out`."""
    launch = {
        "profile": "workcell",
        "use_sim": "true",
        "policy": "expert",
        "real_time_factor": repr(args.real_time_factor),
        "view": "false",
    }
    if args.params_file:
        launch["params_file"] = args.params_file
    nodes = []
    for node in graph.resolve(launch):
        name = node.spec.name
        if name == "perception" and not args.with_perception:
            continue
        extra: dict[str, str | float] = {}
        if name == "workcell_sim":
            extra["initial_seed"] = "-1"  # only the requested seeds are episodes
        if name == "expert":
            extra["record_dir"] = str(out)
            # The files' fps is the simulator's camera rate.
            extra["camera_rate_hz"] = float(
                sim_parameter(node.params_file, "camera_rate_hz", 10.0)
            )
        nodes.append(dataclasses.replace(node, overrides={**node.overrides, **extra}))
    return nodes


class Recorder:
    """A node in this process that resets episodes and follows their status."""

    def __init__(self, params_file: str) -> None:
        import rclpy
        from rclpy.executors import SingleThreadedExecutor
        from rclpy.signals import SignalHandlerOptions

        from oxygen_ros.msg import EpisodeStatus
        from oxygen_ros.nodes.common.runtime import latched_qos
        from oxygen_ros.srv import ResetEpisode

        self.context = rclpy.Context()
        rclpy.init(context=self.context, signal_handler_options=SignalHandlerOptions.NO)
        self.node = rclpy.create_node("record_demos", context=self.context)
        self.lock = threading.Lock()
        self.status = None
        self.ends: dict[int, object] = {}  # episode id -> its first status not RUNNING
        self.status_topic = sim_parameter(
            params_file, "episode_status_topic", "workcell/episode_status"
        )
        self.node.create_subscription(
            EpisodeStatus,
            self.status_topic,
            self._on_status,
            latched_qos(10),
        )
        self.reset_client = self.node.create_client(
            ResetEpisode, sim_parameter(params_file, "reset_service", "workcell/reset_episode")
        )
        self.executor = SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)
        self.thread = threading.Thread(target=self._spin, daemon=True)
        self.thread.start()

    def _spin(self) -> None:
        from rclpy.executors import ExternalShutdownException

        with contextlib.suppress(ExternalShutdownException):
            self.executor.spin()

    def _on_status(self, msg) -> None:
        with self.lock:
            self.status = msg
            if msg.phase in (msg.PHASE_SUCCEEDED, msg.PHASE_FAILED):
                self.ends.setdefault(msg.episode_id, msg)

    def latest(self):
        with self.lock:
            return self.status

    def end_of(self, episode_id: int):
        """The first status of `episode_id` that was no longer RUNNING (None until then; later
        ones keep counting `elapsed_s` past the end)."""
        with self.lock:
            return self.ends.get(episode_id)

    def reset(self, seed: int, instruction: str, stop: threading.Event):
        from oxygen_ros.srv import ResetEpisode

        future = self.reset_client.call_async(
            ResetEpisode.Request(seed=seed, instruction=instruction)
        )
        deadline = time.monotonic() + RESET_TIMEOUT_S
        while not future.done():
            if stop.is_set() or time.monotonic() > deadline:
                raise RuntimeError("ResetEpisode did not answer")
            time.sleep(POLL_S)
        return future.result()

    def close(self) -> None:
        self.executor.shutdown(timeout_sec=2.0)
        self.node.destroy_node()
        self.context.try_shutdown()
        self.thread.join(2.0)


def file_info(path: Path) -> tuple[int, bool, int, int]:
    """(steps, success, seed, sim episode id) from an episode file's attributes."""
    with h5py.File(path, "r") as f:
        extra = json.loads(f.attrs.get("extra", "{}"))
        return (
            int(f["timestamps"].shape[0]),
            bool(f.attrs["success"]),
            int(f.attrs["seed"]),
            int(extra.get("episode_id", -1)),
        )


def check_children(children: Sequence[supervisor.Child]) -> None:
    for child in children:
        if child.popen.poll() is not None:
            raise RuntimeError(
                f"{child.name} exited ({child.popen.returncode}); last lines of "
                f"{child.log_path}:\n{supervisor.tail(child.log_path)}"
            )


def run(args: argparse.Namespace, stop: threading.Event) -> int:
    from oxygen_ros.msg import EpisodeStatus
    from oxygen_ros.nodes.workcell.expert_recording import next_episode_index
    from oxygen_ros.sim.recorder import episode_path

    out = Path(args.out).expanduser().resolve()
    out.mkdir(parents=True, exist_ok=True)
    first_index = next_episode_index(out)
    nodes = graph_nodes(args, out)
    log_dir = Path(args.log_dir or tempfile.mkdtemp(prefix="oxygen_record_"))
    log_dir.mkdir(parents=True, exist_ok=True)
    print(
        f"[record_demos] {args.episodes} episodes from seed {args.seed_start} at real-time "
        f"factor {args.real_time_factor:g} -> {out} (first index {first_index}); nodes "
        f"{[n.spec.name for n in nodes]}, logs in {log_dir}",
        flush=True,
    )
    start_wall = time.monotonic()
    children = supervisor.start_children(nodes, log_dir)
    recorder = Recorder(nodes[0].params_file)
    results: list[EpisodeResult] = []
    code = 0
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        status_topic = recorder.status_topic
        # Up: the reset service answers and the expert follows the status (with this process).
        while (
            not recorder.reset_client.service_is_ready()
            or recorder.node.count_subscribers(status_topic) < 2
        ):
            check_children(children)
            if stop.is_set() or time.monotonic() > deadline:
                raise RuntimeError("the workcell graph did not come up")
            time.sleep(0.1)
        for i in range(args.episodes):
            if stop.is_set():
                break
            seed = args.seed_start + i
            reply = recorder.reset(seed, args.instruction, stop)
            if not reply.success:
                raise RuntimeError(f"reset with seed {seed} refused: {reply.message}")
            started = time.monotonic()
            while (status := recorder.end_of(reply.episode_id)) is None:
                check_children(children)
                latest = recorder.latest()
                limit = latest.time_limit_s if latest is not None else 30.0
                if time.monotonic() - started > limit / args.real_time_factor + EPISODE_SLACK_S:
                    raise RuntimeError(f"episode with seed {seed} never ended")
                if stop.is_set():
                    raise KeyboardInterrupt
                time.sleep(POLL_S)
            result = EpisodeResult(
                seed=seed,
                episode_id=int(reply.episode_id),
                instruction=status.instruction,
                template=status.task_template,
                success=status.phase == EpisodeStatus.PHASE_SUCCEEDED,
                time_to_success_s=float(status.time_to_success_s),
                elapsed_s=float(status.elapsed_s),
                wall_s=time.monotonic() - started,
                stage=status.stage,
                starvation_events=int(status.starvation_events),
            )
            results.append(result)
            # The file closes once the expert has heard of the end (and so stopped publishing
            # the episode's plan): only then is the next reset free of its chunks.
            path = episode_path(out, first_index + i)
            deadline = time.monotonic() + FILE_TIMEOUT_S
            while not path.exists() and time.monotonic() < deadline and not stop.is_set():
                check_children(children)
                time.sleep(POLL_S)
            if path.exists():
                steps, success, file_seed, episode_id = file_info(path)
                if (file_seed, episode_id) == (seed, result.episode_id):
                    result.file, result.steps, result.file_success = path.name, steps, success
            ok = sum(r.success for r in results)
            print(
                f"[record_demos] {i + 1}/{args.episodes} seed {seed} "
                f"{'SUCCEEDED' if result.success else 'FAILED'} in {result.elapsed_s:.1f} s "
                f"sim ({result.wall_s:.1f} s wall): {result.instruction!r} -> "
                f"{result.file or 'NO FILE'} ({result.steps} steps)"
                + ("" if result.success else f", ended in {result.stage!r}")
                + (f", {result.starvation_events} starvation" if result.starvation_events else "")
                + f"   [{ok}/{len(results)} succeeded]",
                flush=True,
            )
    except KeyboardInterrupt:
        print("[record_demos] interrupted", flush=True)
        code = 1
    except RuntimeError as exc:
        print(f"[record_demos] error: {exc}", file=sys.stderr, flush=True)
        code = 1
    finally:
        recorder.close()
        supervisor.stop_children(children, sys.stderr)
    wall = time.monotonic() - start_wall
    recorded = [r for r in results if r.file]
    mismatched = [r.seed for r in recorded if r.file_success != r.success]
    successes = [r for r in recorded if r.file_success]
    summary = {
        "episodes_requested": args.episodes,
        "episodes_run": len(results),
        "episodes_recorded": len(recorded),
        "successes": len(successes),
        "success_rate": len([r for r in results if r.success]) / len(results) if results else 0.0,
        "wall_s": wall,
        "sim_s": sum(r.elapsed_s for r in results),
        "steps": sum(r.steps for r in recorded),
        "starvation_events": sum(r.starvation_events for r in results),
        "out": str(out),
        "successful_files": [r.file for r in successes],
        "episodes": [dataclasses.asdict(r) for r in results],
    }
    if results:
        name = f"record_{results[0].seed}-{results[-1].seed}.json"
        (out / name).write_text(json.dumps(summary, indent=2) + "\n")
    print(
        f"[record_demos] recorded {len(recorded)}/{args.episodes} episodes "
        f"({summary['steps']} steps) in {wall:.0f} s wall, {summary['sim_s']:.0f} s sim; "
        f"success rate {summary['success_rate']:.2f} ({len(successes)} successful files: "
        f"training data; failures kept with success=false)",
        flush=True,
    )
    if mismatched:
        print(f"[record_demos] file/status success differ for seeds {mismatched}", flush=True)
    if len(recorded) != args.episodes or mismatched:
        code = 1
    return code


def _reexec_without_source_tree(argv: Sequence[str]) -> None:
    """Run from the repository root, `python -m` would import the source tree's oxygen_ros
    (no generated messages); start again with -P (the install space)."""
    if importlib.util.find_spec("oxygen_ros.msg") is None and not sys.flags.safe_path:
        os.execv(sys.executable, [sys.executable, "-P", "-m", "oxygen_ros.record_demos", *argv])


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    _reexec_without_source_tree(argv)
    args = parse_args(argv)
    stop = threading.Event()
    previous = {
        sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        return run(args, stop)
    except ValueError as exc:  # graph.resolve: bad params file
        print(f"[record_demos] {exc}", file=sys.stderr)
        return 2
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


if __name__ == "__main__":
    sys.exit(main())
