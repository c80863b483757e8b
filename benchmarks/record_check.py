"""Recording check (issue 69): a workcell bring-up with `record:=DIR` runs for 60 s while a
subscriber in this process counts the same topics; the bag, read afterwards by an independent
MCAP reader (`mcap` + `mcap_ros2`, not the project's rosbags-based code), must hold every topic
with each count within 1 % of the subscriber's, and every message must decode.

Usage (inside `source scripts/env.sh`):
    python -P benchmarks/record_check.py [--seconds 60] [--out docs/results/record_60s.json]
                                         [--keep-bag] [--startup-timeout-s 600]

Steps: start `python -m oxygen_ros.bringup profile:=workcell record:=<tmp>/bag view:=false
--no-console` as a child (its own session; a `--duration` backstop ends it should this process
die); subscribe, as the recorder does, to each listed topic once it has publishers, with the
QoS they offer (`recording.qos.reader_qos`, the recorder's default keep-last depth); wait
until the recorder's /diagnostics report a message on every listed topic and this subscriber
has one on each; count for `--seconds`; stop the graph with SIGINT to the bring-up (it stops
its nodes in reverse start order, the recorder last, which closes the bag); read the bag; write
the JSON (`--out`); print the summary line
`record_check topics=<n> present=<n> max_count_diff_pct=<x> decoded=yes|no`.
Exit code 1 when a listed topic is missing from the bag, a window count differs by more than
1 %, a message fails to decode, or the graph did not start or stop cleanly.

Topics: the three cameras, joint_states, oxygen/observation, oxygen/instruction,
oxygen/current_instruction, oxygen/actions, joint_commands, oxygen/speech, oxygen/memory,
workcell/episode_status, /diagnostics and /clock, names read from config/workcell.yaml (the
resolved params file); oxygen/joint_trajectory only when inference publishes it
(`publish_joint_trajectory`), otherwise listed as not published and not judged.

What is compared (fairness): both sides count the same wall-clock window, by reception time.
The window opens 1 s after both the recorder (its diagnostics) and this subscriber reported a
message on every topic, so neither side's late subscription, nor the history a transient-local
subscription receives on joining (the latched instruction, the memory's last 20 entries), is
counted; it closes `--seconds` later, before the SIGINT, so the shutdown is not counted either.
The bag's timestamps are the recorder's reception times on its node clock, which is wall time
(the recorder runs without use_sim_time; checked: a bag whose times are not near this
process's wall clock fails the check); this subscriber stamps with `time.time_ns()` in its
callback. A message received at the window's edge by one side and a few ms later by the other
can fall in one window only: under a message per topic at the rates here (100 Hz at most). To
tell such edge effects from losses, every message is also matched by content (a hash of its
serialized CDR payload, which the recorder stores as received, end padding aside):
`lost_by_recorder` counts what this subscriber received in the window but the whole bag lacks,
`lost_by_subscriber` what the bag's window holds but this subscriber never received. Reception
time rather than message stamps: several listed topics carry none (the instructions, speech,
memory), and a stamp says when a message was made, not whether both readers were listening.
A latched topic published once per episode (the instructions) may have no message in the
window on either side: it counts as present when the bag holds it at all. The report's
`subscriber_total` and `bag_total` (start-up and shutdown included, where the two sides
subscribed and stopped at different times) are shown, not judged; every message the bag holds
on a listed topic is decoded, not a sample. Transport: UDP only
(`FASTDDS_BUILTIN_TRANSPORTS=UDPv4`), as the bring-up sets for its graph and its console view
while nodes may respawn.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import hashlib
import json
import os
import platform
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
WINDOW_MARGIN_S = 1.0  # after both sides reported every topic (latched history delivered)
MAX_DIFF_PCT = 1.0
STOP_TIMEOUT_S = 120.0  # the bring-up stops its nodes (each up to 10 s) and closes the bag
WALL_CLOCK_SLACK_S = 3600.0  # bag times farther than this from the wall clock: not wall time
STARTED = re.compile(r"\[bringup\] started (\S+) \(pid (\d+)\)")


def listed_topics() -> tuple[dict[str, bool], str]:
    """{absolute topic: judged} of the issue's list from the workcell params file (a topic
    not judged is one no node publishes in this configuration), and the params file."""
    from oxygen_ros import graph

    nodes = graph.resolve({"profile": "workcell", "use_sim": "true", "view": "false"})
    params_file = nodes[0].params_file
    config = yaml.safe_load(Path(params_file).read_text())
    perception = graph.node_parameters(config, "perception")
    sim = graph.node_parameters(config, "workcell_sim")
    inference = graph.node_parameters(config, "inference")
    names = [perception["cameras"][c]["topic"] for c in perception["camera_names"]]
    names += [
        perception["joint_state_topic"],
        perception["observation_topic"],
        sim["instruction_topic"],
        inference["current_instruction_topic"],
        inference["actions_topic"],
        sim["joint_command_topic"],
        inference["speech_topic"],
        inference["memory_topic"],
        sim["episode_status_topic"],
        "/diagnostics",
        "/clock",
    ]
    topics = {graph_name(n): True for n in names}
    topics[graph_name(inference["joint_trajectory_topic"])] = bool(
        inference.get("publish_joint_trajectory", False)
    )
    return topics, params_file


def graph_name(topic: str) -> str:
    return topic if topic.startswith("/") else "/" + topic


def digest(data: bytes) -> bytes:
    """A serialized message's identity: its CDR payload without trailing zero bytes. The wire
    pads a payload to 4 bytes, a node's delivery to its own reader does not (the recorder
    stores its own /diagnostics unpadded), and the encapsulation options do not say so; a
    distinct message of the same type never differs from another by trailing zeros alone
    (sequences and strings carry their lengths before their contents)."""
    return hashlib.blake2b(data[:2] + data[4:].rstrip(b"\0"), digest_size=12).digest()


class Counter:
    """The subscriber: per listed topic, (reception wall ns, content hash) of each message;
    subscribes as the recorder does (once a topic has publishers, with their QoS)."""

    def __init__(self, topics: list[str], depth: int) -> None:
        import rclpy
        from diagnostic_msgs.msg import DiagnosticArray
        from rclpy.executors import SingleThreadedExecutor
        from rclpy.signals import SignalHandlerOptions

        self._topics, self._depth = topics, depth
        self.context = rclpy.Context()
        rclpy.init(args=[], context=self.context, signal_handler_options=SignalHandlerOptions.NO)
        self.node = rclpy.create_node("record_check", context=self.context)
        self._lock = threading.Lock()
        self.received: dict[str, list[tuple[int, bytes]]] = {t: [] for t in topics}
        self.qos: dict[str, str] = {}
        self.recorder_status: dict[str, str] = {}
        self.node.create_subscription(DiagnosticArray, "/diagnostics", self._on_diagnostics, 100)
        self.node.create_timer(0.5, self._discover)
        self.executor = SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)
        self._thread = threading.Thread(target=self._spin, daemon=True)
        self._thread.start()

    def _spin(self) -> None:
        from rclpy.executors import ExternalShutdownException

        with contextlib.suppress(ExternalShutdownException):
            self.executor.spin()

    def _discover(self) -> None:
        from oxygen_ros.nodes.recorder.conversions import bag_qos, message_class, qos_profile
        from oxygen_ros.recording.qos import reader_qos

        types = dict(self.node.get_topic_names_and_types())
        for topic in self._topics:
            if topic in self.qos or len(types.get(topic, ())) != 1:
                continue
            publishers = self.node.get_publishers_info_by_topic(topic)
            if not publishers:
                continue
            endpoint = reader_qos([bag_qos(p.qos_profile) for p in publishers], self._depth)
            self.node.create_subscription(
                message_class(types[topic][0]),
                topic,
                lambda data, t=topic: self._on(t, data),
                qos_profile(endpoint),
                raw=True,
            )
            self.qos[topic] = ("reliable" if endpoint.reliable else "best_effort") + (
                ", transient_local" if endpoint.transient_local else ""
            )

    def _on(self, topic: str, data: bytes) -> None:
        entry = (time.time_ns(), digest(data))
        with self._lock:
            self.received[topic].append(entry)

    def _on_diagnostics(self, msg) -> None:
        for status in msg.status:
            if status.name == "oxygen_ros: recorder":
                values = {kv.key: kv.value for kv in status.values}
                with self._lock:
                    self.recorder_status = values

    def counts(self) -> dict[str, int]:
        with self._lock:
            return {t: len(v) for t, v in self.received.items()}

    def status(self) -> dict[str, str]:
        with self._lock:
            return dict(self.recorder_status)

    def snapshot(self) -> dict[str, list[tuple[int, bytes]]]:
        with self._lock:
            return {t: list(v) for t, v in self.received.items()}

    def close(self) -> None:
        self.executor.shutdown(timeout_sec=2.0)
        self.node.destroy_node()
        self.context.try_shutdown()
        self._thread.join(2.0)


def read_bag(bag_dir: Path, topics: list[str]) -> dict[str, dict]:
    """Per topic of `topics` in the bag: [(log time ns, content hash)], the number that
    decoded and the first decode error, by the independent reader."""
    from mcap.reader import make_reader
    from mcap_ros2.decoder import DecoderFactory

    (path,) = bag_dir.glob("*.mcap")
    factory = DecoderFactory()
    decoders: dict[int, object] = {}
    out = {t: {"messages": [], "decoded": 0, "error": "", "type": ""} for t in topics}
    with path.open("rb") as stream:
        reader = make_reader(stream)
        for schema, channel, message in reader.iter_messages(topics=topics):
            entry = out[channel.topic]
            entry["messages"].append((message.log_time, digest(message.data)))
            entry["type"] = schema.name if schema else ""
            decoder = decoders.get(channel.id)
            if decoder is None:
                decoder = decoders[channel.id] = factory.decoder_for(
                    channel.message_encoding, schema
                )
            try:
                if decoder is None:
                    raise ValueError(f"no decoder for {channel.message_encoding}")
                decoder(message.data)
                entry["decoded"] += 1
            except Exception as exc:  # counted and reported: the check fails
                entry["error"] = entry["error"] or f"{type(exc).__name__}: {exc}"
    return out


def compare(topic: str, judged: bool, got, kept, window: tuple[int, int]) -> dict:
    """One topic's row of the report."""
    lo, hi = window
    got_w = [h for t, h in got if lo <= t <= hi]
    kept_w = [h for t, h in kept["messages"] if lo <= t <= hi]
    all_kept = collections.Counter(h for _, h in kept["messages"])
    all_got = collections.Counter(h for _, h in got)
    diff = abs(len(kept_w) - len(got_w))
    pct = 100.0 * diff / len(got_w) if got_w else (0.0 if not kept_w else 100.0)
    return {
        "judged": judged,
        "type": kept["type"],
        "subscriber_count": len(got_w),
        "bag_count": len(kept_w),
        "diff_pct": round(pct, 3),
        "lost_by_recorder": sum((collections.Counter(got_w) - all_kept).values()),
        "lost_by_subscriber": sum((collections.Counter(kept_w) - all_got).values()),
        "subscriber_total": len(got),
        "bag_total": len(kept["messages"]),
        "present": bool(kept["messages"]),
        "decoded": kept["decoded"],
        "decoded_ok": kept["decoded"] == len(kept["messages"]) and not kept["error"],
        "decode_error": kept["error"],
    }


def cpu_s(pid: int) -> float:
    import psutil

    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def started_pids(log: Path) -> dict[str, int]:
    return {m[0]: int(m[1]) for m in STARTED.findall(log.read_text(errors="replace"))}


def wait_until(condition, timeout_s: float, proc: subprocess.Popen, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if proc.poll() is not None:
            raise RuntimeError(f"the bring-up exited ({proc.returncode}) while waiting for {what}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"no {what} within {timeout_s:g} s")
        time.sleep(0.2)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="the counted window")
    parser.add_argument("--startup-timeout-s", type=float, default=600.0)
    parser.add_argument("--out", type=Path, default=ROOT / "docs/results/record_60s.json")
    parser.add_argument("--keep-bag", action="store_true", help="keep the bag and the logs")
    return parser.parse_args(argv)


def run(args: argparse.Namespace, workdir: Path) -> tuple[dict, int]:
    from oxygen_ros.nodes.recorder.params import RECORDER

    topics, params_file = listed_topics()
    judged = [t for t, j in topics.items() if j]
    depth = next(s.default for s in RECORDER if s.name == "queue_depth")
    bag_dir, log_dir, out_log = workdir / "bag", workdir / "logs", workdir / "bringup.log"
    command = [sys.executable, "-P", "-m", "oxygen_ros.bringup", "profile:=workcell"]
    command += [f"record:={bag_dir}", "view:=false", "--no-console", "--log-dir", str(log_dir)]
    command += ["--duration", f"{args.startup_timeout_s + args.seconds + 60:g}"]  # backstop
    counter = Counter(list(topics), depth)
    load_start = os.getloadavg()
    with out_log.open("w") as log:
        proc = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=workdir
        )
    failures: list[str] = []
    started = time.monotonic()
    try:

        def ready() -> bool:
            status, counts = counter.status(), counter.counts()
            return all(int(status.get(f"messages.{t}", 0)) > 0 and counts[t] > 0 for t in judged)

        wait_until(ready, args.startup_timeout_s, proc, "message from every topic on both sides")
        ready_s = time.monotonic() - started
        time.sleep(WINDOW_MARGIN_S)
        recorder_pid = started_pids(out_log)["recorder"]
        lo, cpu0, wall0 = time.time_ns(), cpu_s(recorder_pid), time.monotonic()
        me0 = cpu_s(os.getpid())
        print(
            f"[record_check] every topic on both sides after {ready_s:.0f} s; counting "
            f"{args.seconds:g} s",
            flush=True,
        )
        wait_until(
            lambda: time.monotonic() - wall0 >= args.seconds,
            args.seconds + 5,
            proc,
            "the window's end",
        )
        hi = time.time_ns()
        elapsed = time.monotonic() - wall0
        recorder_cpu = (cpu_s(recorder_pid) - cpu0) / elapsed
        own_cpu = (cpu_s(os.getpid()) - me0) / elapsed
        status_at_end = counter.status()
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        try:
            code = proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            code = proc.wait()
            failures.append(f"the bring-up did not stop within {STOP_TIMEOUT_S:g} s")
        time.sleep(0.5)
        received = counter.snapshot()
        counter.close()
    if code != 0:
        failures.append(f"the bring-up exited with {code}")
    bag = read_bag(bag_dir, list(topics))
    times = [t for b in bag.values() for t, _ in b["messages"]]
    if times and abs(min(times) - lo) > WALL_CLOCK_SLACK_S * 1e9:
        failures.append("the bag's times are not wall time: the windows cannot be compared")
    rows = {t: compare(t, topics[t], received[t], bag[t], (lo, hi)) for t in topics}
    for topic, row in rows.items():
        if not row["judged"]:
            continue
        if not row["present"]:
            failures.append(f"{topic} is not in the bag")
        elif row["diff_pct"] > MAX_DIFF_PCT:
            failures.append(f"{topic}: counts differ by {row['diff_pct']:.2f} %")
        if not row["decoded_ok"]:
            failures.append(f"{topic}: {row['bag_total'] - row['decoded']} not decoded")
    info = yaml.safe_load((bag_dir / "metadata.yaml").read_text())["rosbag2_bagfile_information"]
    meta_counts = {
        t["topic_metadata"]["name"]: t["message_count"] for t in info["topics_with_message_count"]
    }
    mismatched = [t for t in topics if meta_counts.get(t, 0) != rows[t]["bag_total"]]
    if mismatched:
        failures.append(f"metadata.yaml's counts differ from the reader's on {mismatched}")
    judged_rows = [rows[t] for t in judged]
    report = {
        "benchmark": "record_check",
        "issue": 69,
        "command": " ".join(command[1:]),
        "params_file": params_file,
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "loadavg_at_start": load_start,
        "loadavg_at_end": os.getloadavg(),
        "window_s": (hi - lo) * 1e-9,
        "startup_s": ready_s,
        "window_rule": "reception wall time, from 1 s after both sides had every topic",
        "subscriber_qos_depth": depth,
        "subscriber_qos": counter.qos,
        "recorder_cpu_share": round(recorder_cpu, 4),  # of one core, over the window
        "checker_cpu_share": round(own_cpu, 4),
        "recorder_status_at_end": {
            k: v for k, v in status_at_end.items() if not k.startswith(("messages.", "bytes."))
        },
        "bag": {
            "size_bytes": sum(f.stat().st_size for f in bag_dir.iterdir()),
            "duration_s": info["duration"]["nanoseconds"] * 1e-9,
            "message_count": info["message_count"],
            "topics": len(meta_counts),
            "compression": "zstd (MCAP chunks)",
        },
        "topics": rows,
        "failures": failures,
    }
    max_pct = max((r["diff_pct"] for r in judged_rows), default=0.0)
    decoded = all(r["decoded_ok"] for r in judged_rows)
    report["summary"] = (
        f"record_check topics={len(judged)} present={sum(r['present'] for r in judged_rows)} "
        f"max_count_diff_pct={max_pct:.2f} decoded={'yes' if decoded else 'no'}"
    )
    return report, 1 if failures else 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    # a domain of its own (other runs may share the machine), UDP as the bring-up's graph
    os.environ.setdefault("ROS_DOMAIN_ID", str(random.SystemRandom().randint(1, 101)))
    os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    os.environ.setdefault("FASTDDS_BUILTIN_TRANSPORTS", "UDPv4")
    workdir = Path(tempfile.mkdtemp(prefix="record_check_"))
    try:
        report, code = run(args, workdir)
    except RuntimeError as exc:
        print(f"[record_check] {exc}; logs in {workdir}", file=sys.stderr)
        return 1
    finally:
        if not args.keep_bag and "report" in locals():
            shutil.rmtree(workdir, ignore_errors=True)
    report["domain_id"] = int(os.environ["ROS_DOMAIN_ID"])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"{'topic':<34}{'subscriber':>11}{'bag':>8}{'diff %':>8}  decoded")
    for topic, row in report["topics"].items():
        mark = "" if row["judged"] else "  (not published; not judged)"
        print(
            f"{topic:<34}{row['subscriber_count']:>11}{row['bag_count']:>8}"
            f"{row['diff_pct']:>8.2f}  {row['decoded_ok']}{mark}"
        )
    for failure in report["failures"]:
        print(f"[record_check] FAIL: {failure}")
    print(report["summary"])
    return code


if __name__ == "__main__":
    sys.exit(main())
