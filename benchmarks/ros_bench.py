"""ROS-level benchmark of the humanoid graph (sim sensors -> perception -> inference).

Measures, with real node processes over DDS on this machine:
- `/oxygen/actions` tick rate and period jitter (messages with `trigger == TRIGGER_TICK` only),
  without and with language load (narration every 1 s, memory every 2 s, instructions
  starting subtask requests);
- observation -> first action latency: for each new chunk, the DDS source time of its
  new-chunk publish (`TRIGGER_NEW_CHUNK`, sent the moment the engine hands the chunk over)
  minus its observation stamp (sensor stamp, through perception and the engine);
- from the inference node's /diagnostics in the same run, over the same span (the bench sets
  `stats_window_s` to the span of each phase before reading): the engine's action path per
  frame (`FrameTimings.action_s`: input preparation + prefill + denoise + transforms) and
  prefill + denoise alone, p50/p99; observation -> hand-off as the node saw it; future
  coverage of the published rows; new chunks per second; and, between the phase's first
  diagnostics message and one after it, ticks skipped and ticks starved;
- from the same diagnostics, observation -> hand-off decomposed per frame (p50/p99): frame age
  when it reached the inference node (split into stamp -> perception's DDS write, DDS
  transport, and the inference process's dispatch to its inbox), its wait there (and the
  part of that wait spent in the previous frame's language work, and in the `frame_pickup`
  policy's wait for a newer frame),
  taken -> `Engine.step` (deserialisation alone too), the engine's action path, the rest;
  the engine's idle time between frames, `frames_waited_for` / `frame_wait_timeouts`; and from
  perception's diagnostics (its last 10 s): frame age at publish and build time;
- first speech token latency after an instruction (instruction published -> first SpeechToken
  of the subtask request it started, as received here).

Period jitter is |period - 1/rate| between consecutive ticks: "publish" from the DDS source
timestamps (what the node controls), "arrival" from the DDS receive timestamps in this process
(what a consumer sees; it includes this process's own scheduling delays). A skipped tick shows
as one period of jitter.

Writes JSON (default benchmarks/results/) and prints a table; the last line is
`action_rate_hz=<x> jitter_p99_ms=<y> obs_to_action_p99_ms=<z> engine_action_p99_ms=<w>`
(tick rate, tick period jitter p99, observation -> new-chunk publish p99, the engine's action
path p99) for the language-load phase.

Usage: `python benchmarks/ros_bench.py [--quick] [--preset tiny] [--out FILE]
[--frame-trigger timer|joint_state] [--frame-pickup newest|on_arrival] [--param
NODE:NAME:=VALUE ...]` (overrides of the YAML's perception `frame_trigger`, inference
`frame_pickup`, and any other parameter)
(`benchmarks/ros_quick` sets everything up and runs the quick mode, under 60 s once set up).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
ACTION_RATE_HZ = 70.0  # config/humanoid.yaml's action_rate_hz
# Issue 11's bar, per phase: observation -> first action p99 at most this much above the
# engine's own prefill + denoise p99 (same run), and tick period jitter p99 at most this.
BAR_OVER_ENGINE_MS = 10.0
BAR_JITTER_P99_MS = 2.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short phases (under 60 s)")
    parser.add_argument("--preset", default="tiny", help="engine preset (tiny, pi05)")
    parser.add_argument("--checkpoint-dir", default="", help="openpi checkpoint for pi05")
    parser.add_argument(
        "--phase-s",
        type=float,
        default=0.0,
        help="seconds per measured phase (default 5 quick, 20 full)",
    )
    parser.add_argument(
        "--instructions",
        type=int,
        default=0,
        help="instructions for the speech latency (default 3 quick, 10 full)",
    )
    parser.add_argument("--out", default="", help="JSON output path")
    parser.add_argument("--frame-trigger", default="", help="perception frame_trigger override")
    parser.add_argument("--frame-pickup", default="", help="inference frame_pickup override")
    parser.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="NODE:NAME:=VALUE",
        help="any other parameter override, e.g. perception:convert_on_arrival:=true",
    )
    parser.add_argument("--startup-timeout-s", type=float, default=300.0)
    return parser.parse_args(argv)


def percentile(values, q: float) -> float:
    return float(np.percentile(values, q)) if len(values) else float("nan")


class Bench:
    """The graph's processes plus a measuring node in this process."""

    def __init__(self, args: argparse.Namespace, workdir: Path) -> None:
        import rclpy
        from diagnostic_msgs.msg import DiagnosticArray
        from rclpy.executors import SingleThreadedExecutor
        from std_msgs.msg import String

        from oxygen_ros import graph
        from oxygen_ros.msg import ActionChunk, SpeechToken
        from oxygen_ros.nodes.common.runtime import LATCHED_QOS, RELIABLE_QOS, SPEECH_QOS

        self.args = args
        self.workdir = workdir
        self.lock = threading.Lock()
        # (receive time, DDS source time, observation stamp, chunk id, trigger) per message.
        self.actions: list[tuple[float, float, float, int, int]] = []
        self.speech: list[tuple[float, object]] = []
        self.diagnostics: list[tuple[float, dict[str, str]]] = []  # the inference node's
        self.perception: list[tuple[float, dict[str, str]]] = []  # the perception node's
        self.new_chunk = ActionChunk.TRIGGER_NEW_CHUNK
        self.tick = ActionChunk.TRIGGER_TICK
        overrides = {"model_preset": args.preset}
        if args.checkpoint_dir:
            overrides["checkpoint_dir"] = args.checkpoint_dir
        nodes = graph.resolve({"use_sim": "true", "view": "false", **overrides})
        extra = {
            "inference": [
                "-p",
                f"inference:memory_db_path:={workdir / 'memory.sqlite3'}",
                "-p",
                "inference:narration_period_s:=0.0",
                "-p",
                "inference:memory_period_s:=0.0",
                "-p",  # its windows are read within a quarter second of a phase's end
                "inference:diagnostics_period_s:=0.25",
            ],
            "perception": [],
        }
        if args.frame_pickup:
            extra["inference"] += ["-p", f"inference:frame_pickup:={args.frame_pickup}"]
        if args.frame_trigger:
            extra["perception"] += ["-p", f"perception:frame_trigger:={args.frame_trigger}"]
        for override in args.param:
            extra.setdefault(override.split(":", 1)[0], []).extend(["-p", override])
        self.procs: list[tuple[str, subprocess.Popen, Path]] = []
        for node in nodes:
            log = workdir / f"{node.spec.name}.log"
            cmd = [*node.command(workdir), *extra.get(node.spec.name, [])]
            with log.open("wb") as handle:
                self.procs.append(
                    (
                        node.spec.name,
                        subprocess.Popen(cmd, stdout=handle, stderr=subprocess.STDOUT),
                        log,
                    )
                )
        self.context = rclpy.Context()
        rclpy.init(context=self.context)
        self.node = rclpy.create_node("oxygen_ros_bench", context=self.context)
        self.node.create_subscription(ActionChunk, "oxygen/actions", self._on_action, RELIABLE_QOS)
        self.node.create_subscription(SpeechToken, "oxygen/speech", self._on_speech, SPEECH_QOS)
        self.node.create_subscription(DiagnosticArray, "/diagnostics", self._on_diagnostics, 10)
        self.instruction_pub = self.node.create_publisher(
            String, "oxygen/instruction", LATCHED_QOS
        )
        self.string_type = String
        self.executor = SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)
        self.thread = threading.Thread(target=self._spin, daemon=True)
        self.thread.start()

    def _spin(self) -> None:
        from rclpy.executors import ExternalShutdownException

        with contextlib.suppress(ExternalShutdownException):
            self.executor.spin()

    def now(self) -> float:
        return self.node.get_clock().now().nanoseconds * 1e-9

    def _on_action(self, msg, info) -> None:
        stamp = msg.observation_stamp.sec + msg.observation_stamp.nanosec * 1e-9
        with self.lock:
            self.actions.append(
                (
                    info["received_timestamp"] * 1e-9,
                    info["source_timestamp"] * 1e-9,
                    stamp,
                    msg.chunk_id,
                    msg.trigger,
                )
            )

    def _on_speech(self, msg) -> None:
        with self.lock:
            self.speech.append((self.now(), msg))

    def _on_diagnostics(self, msg) -> None:
        from oxygen_ros.nodes.common.conversions import diagnostic_values

        for status in msg.status:
            if status.name.endswith(": inference"):
                with self.lock:
                    self.diagnostics.append((self.now(), diagnostic_values(status)))
            elif status.name.endswith(": perception"):
                with self.lock:
                    self.perception.append((self.now(), diagnostic_values(status)))

    def wait(self, predicate, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not predicate():
            for name, proc, log in self.procs:
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited ({proc.returncode}); see {log}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")
            time.sleep(0.05)

    def set_params(self, **values: float) -> None:
        from rcl_interfaces.srv import SetParameters
        from rclpy.parameter import Parameter

        client = self.node.create_client(SetParameters, "/inference/set_parameters")
        self.wait(client.service_is_ready, 30, "the inference parameter service")
        request = SetParameters.Request(
            parameters=[Parameter(k, value=v).to_parameter_msg() for k, v in values.items()]
        )
        future = client.call_async(request)
        self.wait(future.done, 30, "set_parameters reply")
        for result in future.result().results:
            if not result.successful:
                raise RuntimeError(f"set_parameters refused: {result.reason}")

    def diagnostics_after(self, t: float, window_s: float | None = None) -> dict[str, str]:
        """The first inference status received after time `t` (with `stats_window_s` ==
        `window_s` when given); waits for it."""

        def matches(values: dict[str, str]) -> bool:
            if window_s is None:
                return True
            return abs(float(values.get("stats_window_s", "nan")) - window_s) < 1e-3

        def first() -> dict[str, str] | None:
            with self.lock:
                return next((dict(v) for r, v in self.diagnostics if r > t and matches(v)), None)

        self.wait(lambda: first() is not None, 30, "inference diagnostics")
        return first()

    def node_window(self, start: float) -> dict[str, str]:
        """The inference node's diagnostics over [start, now]: sets its `stats_window_s` to
        that span, then takes the first status published with it."""
        window = round(self.now() - start, 3)  # diagnostics print 6 significant digits
        asked = self.now()
        self.set_params(stats_window_s=window)
        return self.diagnostics_after(asked, window)

    def measure_actions(self, seconds: float) -> dict:
        start = self.now()
        self.wait(
            lambda: self.actions and self.actions[-1][0] - start >= seconds,
            seconds + 30,
            f"{seconds} s of actions",
        )
        with self.lock:
            window = [a for a in self.actions if a[0] >= start]
        # Counters: from the first status of the phase to one after it.
        before = self.diagnostics_after(start)
        node = self.node_window(start)
        ticks = [a for a in window if a[4] == self.tick]
        recv = np.array([a[0] for a in ticks])
        sent = np.array([a[1] for a in ticks])
        nominal = 1.0 / ACTION_RATE_HZ
        publish_jitter_ms = np.abs(np.diff(sent) - nominal) * 1e3
        arrival_jitter_ms = np.abs(np.diff(recv) - nominal) * 1e3
        # The first message of each chunk is its new-chunk publish.
        obs_to_action_ms = [(p - o) * 1e3 for _, p, o, _, trig in window if trig == self.new_chunk]

        with self.lock:
            perception = dict(self.perception[-1][1]) if self.perception else {}

        def node_value(key: str) -> float:
            return float(node.get(key, "nan"))

        def path(name: str) -> dict[str, float]:
            return {
                f"{name}_p50_ms": node_value(f"frame.{name}_p50_ms"),
                f"{name}_p99_ms": node_value(f"frame.{name}_p99_ms"),
            }

        def node_delta(key: str) -> float:
            return float(node.get(key, 0)) - float(before.get(key, 0))

        return {
            "seconds": float(sent[-1] - sent[0]),
            "messages": len(window),
            "ticks": len(ticks),
            "action_rate_hz": float((len(sent) - 1) / (sent[-1] - sent[0])),
            "jitter_p50_ms": percentile(publish_jitter_ms, 50),
            "jitter_p99_ms": percentile(publish_jitter_ms, 99),
            "jitter_max_ms": float(publish_jitter_ms.max()),
            "arrival_rate_hz": float((len(recv) - 1) / (recv[-1] - recv[0])),
            "arrival_jitter_p99_ms": percentile(arrival_jitter_ms, 99),
            "arrival_jitter_max_ms": float(arrival_jitter_ms.max()),
            "chunks": len(obs_to_action_ms),
            "obs_to_action_p50_ms": percentile(obs_to_action_ms, 50),
            "obs_to_action_p99_ms": percentile(obs_to_action_ms, 99),
            # Observation -> first action p99 minus the engine's prefill + denoise p99 below.
            "obs_to_action_over_engine_p99_ms": percentile(obs_to_action_ms, 99)
            - node_value("frame.prefill_denoise_p99_ms"),
            # From the inference node's diagnostics over the same span.
            "engine_frames": int(node_value("frame.count_in_window")),
            "engine_action_p50_ms": node_value("frame.action_path_p50_ms"),
            "engine_action_p99_ms": node_value("frame.action_path_p99_ms"),
            "engine_prefill_denoise_p50_ms": node_value("frame.prefill_denoise_p50_ms"),
            "engine_prefill_denoise_p99_ms": node_value("frame.prefill_denoise_p99_ms"),
            "node_obs_to_handoff_p50_ms": node_value("frame.obs_to_handoff_p50_ms"),
            "node_obs_to_handoff_p99_ms": node_value("frame.obs_to_handoff_p99_ms"),
            "handoff_to_publish_p99_ms": node_value("actions.handoff_to_publish_p99_ms"),
            "chunk_rate_hz": node_value("actions.chunk_rate_hz"),
            "coverage_p50_s": node_value("actions.coverage_p50_s"),
            "coverage_min_s": node_value("actions.coverage_min_s"),
            "ticks_skipped": node_delta("action_ticks_skipped"),
            "ticks_empty": sum(node_delta(k) for k in node if k.startswith("action_ticks_empty.")),
            # Per frame: observation -> hand-off minus that frame's prefill + denoise.
            **path("outside_model"),
            # Observation -> hand-off, decomposed (inference node, same span).
            **path("age_at_arrival"),
            **path("sender_age"),
            **path("transport"),
            **path("dispatch"),
            **path("inbox_wait"),
            **path("wait_in_language"),
            **path("pickup_wait"),
            **path("pre_step"),
            **path("decode"),
            **path("unaccounted"),
            **path("language"),
            **path("engine_idle"),
            "frame_pickup": node.get("frame_pickup", ""),
            "frame_period_ms": node_value("frame_period_ms"),
            "frames_waited_for": node_delta("frames_waited_for"),
            "frame_wait_timeouts": node_delta("frame_wait_timeouts"),
            "pickup_idle_s": node_delta("pickup_idle_s"),
            # Perception's own windows (its last 10 s).
            "frame_trigger": perception.get("frame_trigger", ""),
            "perception_rate_hz": float(perception.get("observation_rate_hz", "nan")),
            "perception_age_p50_ms": float(perception.get("frame.age_at_publish_p50_ms", "nan")),
            "perception_age_p99_ms": float(perception.get("frame.age_at_publish_p99_ms", "nan")),
            "perception_build_p50_ms": float(perception.get("frame.build_p50_ms", "nan")),
            "perception_build_p99_ms": float(perception.get("frame.build_p99_ms", "nan")),
        }

    def measure_speech_latency(self, count: int, gap_s: float) -> list[float]:
        from oxygen_ros.msg import SpeechToken

        latencies = []
        for i in range(count):
            with self.lock:
                known = {
                    m.request_id for _, m in self.speech if m.kind == SpeechToken.KIND_SUBTASK
                }
            sent = self.now()
            self.instruction_pub.publish(self.string_type(data=f"pick up object number {i}"))

            def first_new(known=known):
                with self.lock:
                    return next(
                        (
                            t
                            for t, m in self.speech
                            if m.kind == SpeechToken.KIND_SUBTASK and m.request_id not in known
                        ),
                        None,
                    )

            self.wait(
                lambda first_new=first_new: first_new() is not None,
                60,
                "the instruction's first speech token",
            )
            latencies.append((first_new() - sent) * 1e3)
            time.sleep(gap_s)  # spread the instructions over the phase (load, not a wait)
        return latencies

    def close(self) -> None:
        for _, proc, _ in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        for _, proc, _ in reversed(self.procs):
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
        self.executor.shutdown(timeout_sec=2)
        self.node.destroy_node()
        self.context.try_shutdown()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    phase_s = args.phase_s or (5.0 if args.quick else 20.0)
    instructions = args.instructions or (3 if args.quick else 10)
    os.environ.setdefault("ROS_DOMAIN_ID", str(random.SystemRandom().randint(1, 101)))
    os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(ROOT / ".build" / "jax_cache"))
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    workdir = Path(tempfile.mkdtemp(prefix="oxygen_ros_bench_"))
    os.environ.setdefault("ROS_LOG_DIR", str(workdir / "ros_log"))
    started = time.monotonic()
    bench = Bench(args, workdir)
    try:
        bench.wait(lambda: len(bench.actions) >= 10, args.startup_timeout_s, "first actions")
        startup_s = time.monotonic() - started
        idle = bench.measure_actions(phase_s)
        bench.set_params(narration_period_s=1.0, memory_period_s=2.0)
        load_start = bench.now()
        speech_ms = bench.measure_speech_latency(instructions, gap_s=0.5)
        remaining = phase_s - (bench.now() - load_start)
        loaded = bench.measure_actions(max(remaining, 0.0) + phase_s)
        with bench.lock:
            finals = sum(1 for t, m in bench.speech if m.final and t >= load_start)
        loaded["speech_requests_finished"] = finals
        load_avg = os.getloadavg()[0]  # other work on the machine during the measurement
    finally:
        bench.close()
    result = {
        "benchmark": "ros_bench",
        "mode": "quick" if args.quick else "full",
        "preset": args.preset,
        "machine": {
            "cpus": os.cpu_count(),
            "load_avg_1m": load_avg,
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "startup_s": startup_s,
        "no_language": idle,
        "language_load": loaded,
        "bar": {  # issue 11, per phase (BAR_* above)
            phase: bool(
                result_phase["obs_to_action_over_engine_p99_ms"] <= BAR_OVER_ENGINE_MS
                and result_phase["jitter_p99_ms"] <= BAR_JITTER_P99_MS
                and abs(result_phase["action_rate_hz"] - ACTION_RATE_HZ) < 0.005
            )
            for phase, result_phase in (("no_language", idle), ("language_load", loaded))
        },
        "first_speech_token_ms": {
            "values": speech_ms,
            "p50": percentile(speech_ms, 50),
            "max": max(speech_ms),
        },
        "logs": str(workdir),
    }
    out = (
        Path(args.out)
        if args.out
        else (ROOT / "benchmarks" / "results" / f"ros_bench-{time.strftime('%Y%m%d-%H%M%S')}.json")
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print_table(result, out)
    return 0


def print_table(result: dict, out: Path) -> None:
    rows = [
        ("tick rate [Hz]", "action_rate_hz", "{:.2f}"),
        ("tick period jitter p50 [ms]", "jitter_p50_ms", "{:.2f}"),
        ("tick period jitter p99 [ms]", "jitter_p99_ms", "{:.2f}"),
        ("tick period jitter max [ms]", "jitter_max_ms", "{:.2f}"),
        ("tick arrival rate [Hz]", "arrival_rate_hz", "{:.2f}"),
        ("tick arrival jitter p99 [ms]", "arrival_jitter_p99_ms", "{:.2f}"),
        ("tick arrival jitter max [ms]", "arrival_jitter_max_ms", "{:.2f}"),
        ("ticks skipped (late)", "ticks_skipped", "{:.0f}"),
        ("ticks empty (starved)", "ticks_empty", "{:.0f}"),
        ("obs -> first action p50 [ms]", "obs_to_action_p50_ms", "{:.1f}"),
        ("obs -> first action p99 [ms]", "obs_to_action_p99_ms", "{:.1f}"),
        ("  minus prefill+denoise p99 [ms]", "obs_to_action_over_engine_p99_ms", "{:.1f}"),
        ("per frame: hand-off - its model [ms]", "outside_model", "p"),
        ("node obs -> hand-off p50 [ms]", "node_obs_to_handoff_p50_ms", "{:.1f}"),
        ("node obs -> hand-off p99 [ms]", "node_obs_to_handoff_p99_ms", "{:.1f}"),
        ("hand-off -> publish p99 [ms]", "handoff_to_publish_p99_ms", "{:.2f}"),
        ("engine action path p50 [ms]", "engine_action_p50_ms", "{:.1f}"),
        ("engine action path p99 [ms]", "engine_action_p99_ms", "{:.1f}"),
        ("engine prefill+denoise p50 [ms]", "engine_prefill_denoise_p50_ms", "{:.1f}"),
        ("engine prefill+denoise p99 [ms]", "engine_prefill_denoise_p99_ms", "{:.1f}"),
        ("engine frames", "engine_frames", "{}"),
        ("decomposition, p50 / p99 [ms]:", None, ""),
        ("  perception: stamp -> publish", "perception_age", "p"),
        ("  perception: build (fuse+convert)", "perception_build", "p"),
        ("  stamp -> inference arrival", "age_at_arrival", "p"),
        ("    stamp -> perception's write", "sender_age", "p"),
        ("    DDS write -> reception", "transport", "p"),
        ("    reception -> inbox (executor)", "dispatch", "p"),
        ("  arrival -> taken by the engine", "inbox_wait", "p"),
        ("    of it in previous language", "wait_in_language", "p"),
        ("  taken -> Engine.step", "pre_step", "p"),
        ("    of it deserialise+convert", "decode", "p"),
        ("  engine action path", "engine_action", "p"),
        ("  rest (latency - parts)", "unaccounted", "p"),
        ("engine language per frame", "language", "p"),
        ("engine idle between frames", "engine_idle", "p"),
        ("  of it pick-up wait for a frame", "pickup_wait", "p"),
        ("frames waited for / timeouts", "frames_waited_for", "w"),
        ("pick-up idle in phase [s]", "pickup_idle_s", "{:.2f}"),
        ("frame period at inference [ms]", "frame_period_ms", "{:.1f}"),
        ("perception frame rate [Hz]", "perception_rate_hz", "{:.1f}"),
        ("new chunks / s", "chunk_rate_hz", "{:.2f}"),
        ("coverage p50 [s]", "coverage_p50_s", "{:.2f}"),
        ("coverage min [s]", "coverage_min_s", "{:.2f}"),
        ("chunks", "chunks", "{}"),
        ("messages (ticks + new chunks)", "messages", "{}"),
    ]
    idle, loaded = result["no_language"], result["language_load"]
    print(
        f"\nros_bench ({result['mode']}, preset {result['preset']}, "
        f"{result['machine']['cpus']} CPUs, load average {result['machine']['load_avg_1m']:.1f})"
        f", startup {result['startup_s']:.1f} s"
    )
    print(
        f"frame_trigger {idle['frame_trigger']}, frame_pickup {idle['frame_pickup']}; "
        "perception rows: its last 10 s"
    )
    print(f"{'metric':<34} {'no language':>12} {'language load':>14}")

    def cell(phase: dict, key: str | None, fmt: str) -> str:
        if key is None:
            return ""
        if fmt == "p":  # a p50 / p99 pair
            return f"{phase[key + '_p50_ms']:.1f} / {phase[key + '_p99_ms']:.1f}"
        if fmt == "w":
            return f"{phase['frames_waited_for']:.0f} / {phase['frame_wait_timeouts']:.0f}"
        return fmt.format(phase[key])

    for label, key, fmt in rows:
        print(f"{label:<34} {cell(idle, key, fmt):>12} {cell(loaded, key, fmt):>14}")
    speech = result["first_speech_token_ms"]
    print(
        f"{'first speech token [ms]':<34} {'':>12} "
        f"{'p50 {:.0f}, max {:.0f}'.format(speech['p50'], speech['max']):>14}"
    )
    print(f"{'speech requests finished':<34} {'':>12} {loaded['speech_requests_finished']:>14}")
    bar = result["bar"]
    print(
        f"{'issue 11 bar met':<34} {bar['no_language']!s:>12} {bar['language_load']!s:>14}"
        f"  (obs -> action p99 <= prefill+denoise p99 + {BAR_OVER_ENGINE_MS:g} ms, jitter p99"
        f" <= {BAR_JITTER_P99_MS:g} ms, 70.00 Hz)"
    )
    print(f"json: {out}")
    print(
        f"action_rate_hz={loaded['action_rate_hz']:.2f} "
        f"jitter_p99_ms={loaded['jitter_p99_ms']:.2f} "
        f"obs_to_action_p99_ms={loaded['obs_to_action_p99_ms']:.1f} "
        f"engine_action_p99_ms={loaded['engine_action_p99_ms']:.1f}"
    )


if __name__ == "__main__":
    sys.exit(main())
