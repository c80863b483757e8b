"""Soak: the served workcell graph for a long run with faults at known times, then a control.

The graph is the bring-up's workcell graph (`profile:=workcell policy:=model`, the served
checkpoint, perception and inference respawning after an abnormal exit as the launch file and
the bring-up do), with episodes one after another at real time (`next_episode_after_s`), the
inference node's own periodic language requests (subtask, narration, memory) and a steady
language load from here (one RequestLanguage every `--language-period-s`, kinds in turn).
Where network namespaces can be made (root, iproute2) the inference node runs in one of its
own (UDP only, as on another host) so that DDS can be cut (soak_faults.Network); the rest of
the graph and this process run in the other. The top camera and the joint states reach
perception through this process (soak_monitor.Relay), which can freeze or stop them.

Faults (soak_faults.py) are injected at known times; soak_monitor records what the graph
publishes and how its processes grow; soak_report turns it into the invariants, the recovery
after each fault, the growth from a sixth of the run to its end and the episodes outside the
fault windows. With `--control-minutes` the same graph then runs again without faults, and the
success rates are compared (Fisher's exact test).

Writes JSON and a PNG timeline; the last line is `soak minutes=<m> lost_entries=<n>
missing_finals=<n> expired_rows=<n> nan=<n> rss_growth=<x> recover_max_s=<s>`.

Usage: `benchmarks/soak --minutes 60 --faults schedule --control-minutes 20`
(`--faults kill_inference@90,dds_cut@150` for a custom schedule, seconds after the first chunk).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its pieces (run with python -P)

import soak_report as report
from soak_faults import BURST_MALFORMED, BURST_REQUESTS, Fault, Network, schedule
from soak_monitor import RELAY_PREFIX, Observer, Sampler

ROOT = Path(__file__).resolve().parents[1]
STARTUP_TIMEOUT_S = 300.0  # the engine loads and warms up (compile cache: tens of seconds)
POLL_S = 0.05


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=60.0, help="length of the soak")
    parser.add_argument(
        "--faults", default="schedule", help="schedule | none | name@seconds,... (soak_faults)"
    )
    parser.add_argument(
        "--control-minutes", type=float, default=0.0, help="then a run without faults"
    )
    parser.add_argument(
        "--language-period-s", type=float, default=2.0, help="one RequestLanguage this often"
    )
    parser.add_argument("--sample-period-s", type=float, default=10.0, help="RSS/fd sampling")
    parser.add_argument("--real-time-factor", type=float, default=1.0)
    parser.add_argument("--no-netns", action="store_true", help="one network namespace")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/soak.json")
    parser.add_argument("--inside-netns", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    schedule(args.faults, args.minutes)  # refuses a bad schedule before anything starts
    return args


@dataclasses.dataclass
class Phase:
    """One run of the graph (the soak or the control) and what happened in it."""

    name: str
    minutes: float
    faults: list[Fault]
    network: Network | None
    workdir: Path
    events: list[str] = dataclasses.field(default_factory=list)
    injected: list[dict] = dataclasses.field(default_factory=list)
    killed: dict[str, dict] = dataclasses.field(default_factory=dict)  # awaiting the restart


def start_graph(phase: Phase, args: argparse.Namespace):
    from oxygen_ros import graph, supervisor

    launch = {
        "profile": "workcell",
        "use_sim": "true",
        "policy": "model",
        "respawn": "true",
        "respawn_delay": "2.0",
        "next_episode_after_s": "2.0",
        "real_time_factor": repr(args.real_time_factor),
        "view": "false",
    }
    nodes = graph.resolve(launch)
    config = yaml.safe_load(Path(nodes[0].params_file).read_text())
    camera = graph.node_parameters(config, "perception")["cameras"]["top"]["topic"]
    joints = graph.node_parameters(config, "perception")["joint_state_topic"]
    inference = graph.node_parameters(config, "inference")
    topics = {
        "actions": inference["actions_topic"],
        "speech": inference["speech_topic"],
        "memory": inference["memory_topic"],
        "episode_status": inference["task_status_topic"],
        "request_language": inference["request_language_service"],
        "instruction": inference["instruction_topic"],
    }
    db_path = phase.workdir / "memory.sqlite3"
    resolved = []
    for node in nodes:
        if node.spec.name == "inference":
            node = dataclasses.replace(
                node, overrides={**node.overrides, "memory_db_path": str(db_path)}
            )
        if node.spec.name == "perception":
            relayed = ((camera, RELAY_PREFIX + camera), (joints, RELAY_PREFIX + joints))
            node = dataclasses.replace(node, remappings=(*node.remappings, *relayed))
        resolved.append(node)
    env = {**supervisor.node_env(), "FASTDDS_BUILTIN_TRANSPORTS": "UDPv4"}  # see bringup

    def per_node(node):  # inference on side b of the network, the rest on side a
        if phase.network is None:
            return {}, ()
        side = "b" if node.spec.name == "inference" else "a"
        return phase.network.env(side), phase.network.exec_prefix(side) if side == "b" else ()

    children = supervisor.start_children(resolved, phase.workdir, env, per_node)
    return children, topics, {"camera": camera, "joint_states": joints}, db_path


def inject(fault: Fault, children, observer: Observer, phase: Phase, now: float) -> list:
    """Starts a fault; returns its (end wall time, action) pairs still to do. A kill ends when
    the node's new process starts: a fresh chunk is one made from an observation after that."""
    by_name = {child.name: child for child in children}
    record = {"name": fault.name, "start_wall": now, "sim_at_start": observer.sim_now}
    ends = []
    if fault.name.startswith("kill_"):
        child = by_name[fault.name.removeprefix("kill_")]
        record["pid"] = child.popen.pid
        child.popen.kill()
        phase.injected.append(record)
        phase.killed[child.name] = record
        return []
    elif fault.name == "camera_freeze":
        observer.relay.freeze_camera(fault.duration_s)
    elif fault.name == "joint_stop":
        observer.relay.stop_joint_states(fault.duration_s)
    elif fault.name == "dds_cut":
        if phase.network is None:
            phase.events.append(f"{fault.name} skipped: one network namespace")
            return []
        phase.network.link(up=False)
        ends.append(lambda: phase.network.link(up=True))
    elif fault.name == "language_burst":
        for i in range(BURST_REQUESTS):
            observer.request_language(i % 3)
        observer.publish_malformed_instructions(BURST_MALFORMED)
    elif fault.name == "clock_pause":
        observer.set_sim_param("paused", True)
        ends.append(lambda: observer.set_sim_param("paused", False))
    phase.injected.append(record)

    def finish() -> None:
        for end in ends:
            end()
        record["end_wall"] = time.monotonic()
        record["sim_at_end"] = observer.sim_now

    if fault.duration_s == 0:
        finish()
        return []
    return [(now + fault.duration_s, finish)]


def run_phase(phase: Phase, args: argparse.Namespace) -> dict:
    from oxygen_ros import supervisor

    children, topics, relay_topics, db_path = start_graph(phase, args)
    observer = Observer(topics, relay_topics)
    sampler = Sampler()
    try:
        try:
            t0 = _serve(phase, args, children, observer, sampler)
            stopped = time.monotonic()
        finally:  # before the snapshot: it then holds all the graph sent
            supervisor.stop_children(children, sys.stderr)
        snap = observer.snapshot()
    finally:
        observer.close()
    return summarise_phase(phase, snap, sampler, db_path, t0, stopped, children)


def _serve(phase, args, children, observer: Observer, sampler: Sampler) -> float:
    """Serves the phase: its faults, language load and samples. Returns the wall time of its
    first chunk (the phase's start)."""
    from oxygen_ros import supervisor

    started = time.monotonic()
    while not observer.chunks:
        for child, event in supervisor.poll_children(children):
            raise RuntimeError(f"{child.name} {event} during start-up; see {child.log_path}")
        if time.monotonic() - started > STARTUP_TIMEOUT_S:
            raise RuntimeError(f"no action chunk within {STARTUP_TIMEOUT_S:g} s")
        time.sleep(0.2)
    t0 = observer.chunks[0][1]
    end = t0 + 60.0 * phase.minutes
    print(f"[soak] {phase.name}: serving after {t0 - started:.0f} s; {phase.minutes:g} min")
    pending, ends = list(phase.faults), []
    next_language = next_sample = next_progress = t0
    kinds = 0
    while (now := time.monotonic()) < end:
        for child, event in supervisor.poll_children(children, now):
            phase.events.append(f"{now - t0:.1f} s: {child.name} {event}")
            if event == "ended":
                raise RuntimeError(f"{child.name} ended; see {child.log_path}")
            if event == "restarted" and child.name in phase.killed:
                record = phase.killed.pop(child.name)
                record.update(end_wall=now, sim_at_end=observer.sim_now)
        while pending and now >= t0 + pending[0].at_s:
            fault = pending.pop(0)
            print(f"[soak] {phase.name} {(now - t0) / 60:.1f} min: {fault.name}")
            ends += inject(fault, children, observer, phase, now)
        for due, action in [e for e in ends if now >= e[0]]:
            action()
            ends.remove((due, action))
        if now >= next_language:
            observer.request_language(kinds % 3)
            kinds, next_language = kinds + 1, next_language + args.language_period_s
        if now >= next_sample:
            processes = {c.name: c.popen.pid for c in children if c.popen.poll() is None}
            sampler.sample({**processes, "soak": os.getpid()}, alone=("soak",))
            next_sample += args.sample_period_s
        if now >= next_progress:
            snap = observer.snapshot()
            done = snap["episodes"]
            print(
                f"[soak] {phase.name} {(now - t0) / 60:5.1f} min: {len(snap['chunks'])} chunks, "
                f"{sum(e.success for e in done)}/{len(done)} episodes, restarts "
                f"{ {c.name: c.restarts for c in children if c.restarts} }",
                flush=True,
            )
            next_progress += 60.0
        time.sleep(POLL_S)
    for _, action in ends:  # a fault still running at the end is ended first
        action()
    return t0


def summarise_phase(phase, snap, sampler, db_path, t0, stopped, children) -> dict:
    chunks = snap["chunks"]
    faults = report.recoveries(phase.injected, chunks)
    kills = [f["start_wall"] for f in faults if f["name"] == "kill_inference"]
    published = snap["memory"]
    stored = report.db_entries(db_path)
    lost = sorted(i for i, entry in published.items() if stored.get(i) != entry)
    windows = [(f["start_wall"], f["start_wall"] + _or(f["recover_s"], 1e9)) for f in faults]
    served = [e for e in snap["episodes"] if e.start_wall >= t0]
    outside = report.episodes_outside(served, windows)
    total_s = stopped - t0
    bins = [0] * max(1, math.ceil(total_s / 10))
    for _, wall, _ in chunks:
        if t0 <= wall < stopped:
            bins[min(int((wall - t0) / 10), len(bins) - 1)] += 1
    return {
        "minutes": total_s / 60,
        "faults": [{k: v for k, v in f.items() if k != "pid"} for f in faults],
        "events": phase.events,
        "restarts": {c.name: c.restarts for c in children},
        "memory": {
            "published": len(published),
            "db_rows": len(stored),
            "lost": lost[:50],  # published, but not in the database as published
            "lost_count": len(lost),
            "unpublished_count": len(stored.keys() - published.keys()),
            "new_ids_out_of_order": snap["memory_order_broken"],
        },
        "network": network_figures(phase),
        "language": report.judged_requests(snap["requests"], snap["sent"], kills, stopped),
        "actions": {
            "messages": snap["messages"],
            "new_chunks": len(chunks),
            "nan_messages": snap["nan_messages"],
            "rows_after_valid_until": snap["rows_after_valid_until"],
        },
        "relay": snap["relay"],
        "episodes": {
            "served": len(served),
            "succeeded": sum(e.success for e in served),
            "outside_faults": len(outside),
            "outside_succeeded": sum(e.success for e in outside),
            "before_serving": len(snap["episodes"]) - len(served),
        },
        "growth": report.growth(sampler.samples, t0 + total_s / 6, stopped),
        "timeline": {
            "t0": t0,
            "rss": {
                name: [(r[0], round(r[2], 1)) for r in rows]
                for name, rows in sampler.samples.items()
            },
            "chunks_per_10s": bins,
            "episodes": [(e.start_wall, e.end_wall, e.success) for e in served],
        },
        "log_dir": str(phase.workdir),
    }


def network_figures(phase: Phase) -> dict:
    if phase.network is None:
        return {"namespaces": False}
    return {"namespaces": True, "rx_mb_into_inference": phase.network.rx_bytes() / 1e6}


def _or(value: float, default: float) -> float:
    return value if math.isfinite(value) else default


def compare(soak: dict, control: dict | None) -> dict:
    a, n1 = soak["episodes"]["outside_succeeded"], soak["episodes"]["outside_faults"]
    if control is None:
        return {"soak_outside_faults": f"{a}/{n1}"}
    c, n2 = control["episodes"]["succeeded"], control["episodes"]["served"]
    return {
        "soak_outside_faults": f"{a}/{n1}",
        "control": f"{c}/{n2}",
        "test": "Fisher's exact test, two-sided",
        "p_value": report.fisher_exact(a, n1 - a, c, n2 - c) if n1 and n2 else math.nan,
    }


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    network = Network.decode(args.inside_netns) if args.inside_netns else None
    if network is None and not args.no_netns:
        why = Network.available()
        if not why:
            network = Network(str(os.getpid() % 10000))
            network.create()
            try:  # this process again, inside namespace A
                command = [*network.exec_prefix("a"), sys.executable, "-P", __file__, *argv]
                env = {**os.environ, **network.env("a")}
                command += ["--inside-netns", network.encode()]
                return subprocess.run(command, env=env).returncode
            finally:
                network.delete()
        print(f"[soak] one network namespace ({why}): dds_cut is skipped")
    root = Path(tempfile.mkdtemp(prefix="soak_"))
    phases = {}
    runs = [("soak", args.minutes, schedule(args.faults, args.minutes))]
    if args.control_minutes > 0:
        runs.append(("control", args.control_minutes, []))
    for name, minutes, faults in runs:
        workdir = root / name
        workdir.mkdir()
        phases[name] = run_phase(Phase(name, minutes, faults, network, workdir), args)
    soak = phases["soak"]
    language = soak["language"]
    recover = [f["recover_s"] for f in soak["faults"]]
    # The graph's processes (this one, the measuring side, keeps every record in memory).
    graph_growth = [g for name, g in soak["growth"].items() if name != "soak"]
    growth = [g["rss_growth"] for g in graph_growth]
    summary = {
        "minutes": soak["minutes"],
        "lost_entries": soak["memory"]["lost_count"],
        "missing_finals": language["missing_finals"] + language["duplicate_finals"],
        "expired_rows": soak["actions"]["rows_after_valid_until"],
        "nan": soak["actions"]["nan_messages"],
        "rss_growth": max(growth) if growth else math.nan,
        "fd_growth": max((g["fds_growth"] for g in graph_growth), default=math.nan),
        "recover_max_s": max(map(lambda r: _or(r, math.inf), recover), default=math.nan),
        "unrecovered": sum(1 for r in recover if not math.isfinite(r)),
    }
    document = {
        "benchmark": "soak",
        "argv": argv,
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "summary": summary,
        "success_outside_faults_vs_control": compare(soak, phases.get("control")),
        "phases": phases,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(document, indent=1, default=float))
    report.plot(document, args.out.with_suffix(".png"))
    print(json.dumps({"summary": summary, **document["success_outside_faults_vs_control"]}))
    print(report.last_line(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
