"""Replay a rosbag2 bag onto the graph with its original timing, as `ros2 bag play` does:

    python -m oxygen_ros.replay BAG [--rate R] [--topics T ...] [--sensors] [--clock [HZ]]
                                [--remap FROM:=TO ...] [--wait-for-subscribers S]

Each selected message is published as recorded (serialized bytes, never decoded) at its bag
time relative to the first selected message, divided by the rate (`recording.schedule`), with
the recorded publishers' reliability and durability (`recording.qos.writer_qos`). `--sensors`
selects the cameras, joint states and /clock (`recording.selection`), so perception and
inference run on recorded sensors; nodes with use_sim_time follow the replayed /clock.
`--clock` publishes the playback's bag time on /clock instead (for bags without one).

Invariants: a message is never sent early and never skipped (a slow replay falls behind and
says by how much); a topic whose type has no message class here is skipped with a warning;
SIGINT ends the replay early; the last line of output is a one-line summary.
"""

from __future__ import annotations

import argparse
import collections
import signal
import sys
import threading
import time
from collections.abc import Sequence

from rosbags.rosbag2 import ReaderError

from oxygen_ros.recording.bag_reader import BagReader
from oxygen_ros.recording.qos import writer_qos
from oxygen_ros.recording.schedule import ReplaySchedule
from oxygen_ros.recording.selection import CLOCK_TOPIC, parse_remaps, replay_topics
from oxygen_ros.recording.typestore import UnknownTypeError

POLL_S = 0.05


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="replay", description=__doc__.split("\n\n")[0])
    parser.add_argument("bag", help="rosbag2 directory (or .mcap file)")
    parser.add_argument("--rate", type=float, default=1.0, help="playback speed factor")
    parser.add_argument("--topics", nargs="+", default=[], help="topics to replay")
    parser.add_argument(
        "--sensors", action="store_true", help="replay cameras, joint states and /clock"
    )
    parser.add_argument(
        "--clock",
        nargs="?",
        type=float,
        const=100.0,
        default=0.0,
        metavar="HZ",
        help="publish the bag time on /clock at HZ (default 100; the bag's /clock is not "
        "replayed then)",
    )
    parser.add_argument(
        "--remap", nargs="+", default=[], metavar="FROM:=TO", help="publish FROM on TO"
    )
    parser.add_argument(
        "--wait-for-subscribers",
        type=float,
        default=0.0,
        metavar="S",
        help="before playing, wait up to S seconds for a subscriber on every replayed topic",
    )
    args = parser.parse_args(list(argv))
    if not args.rate > 0:
        parser.error("--rate must be > 0")
    try:
        args.remaps = parse_remaps(args.remap)
    except ValueError as exc:
        parser.error(str(exc))
    return args


def main(argv: Sequence[str] | None = None) -> int:
    import rclpy
    from rclpy.signals import SignalHandlerOptions

    argv = list(sys.argv if argv is None else argv)
    # Our arguments end at --ros-args: rcl would take a `from:=to` outside it for a (legacy)
    # remap rule of its own.
    split = argv.index("--ros-args") if "--ros-args" in argv else len(argv)
    args = parse_args(argv[1:split])
    try:
        bag = BagReader(args.bag)
    except (OSError, ReaderError) as exc:
        print(f"replay: cannot read the bag {args.bag}: {exc}", file=sys.stderr)
        return 2
    stop = threading.Event()
    previous = {
        s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGINT, signal.SIGTERM)
    }
    rclpy.init(args=[argv[0], *argv[split:]], signal_handler_options=SignalHandlerOptions.NO)
    node = rclpy.create_node("replay")
    try:
        with bag:
            return _replay(node, bag, args, stop)
    finally:
        node.destroy_node()
        rclpy.try_shutdown()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _replay(node, bag: BagReader, args: argparse.Namespace, stop: threading.Event) -> int:
    log = node.get_logger()
    try:
        publishers = _publishers(node, bag, args)
    except KeyError as exc:
        log.error(str(exc.args[0]))
        return 2
    _wait_for_subscribers(publishers, args.wait_for_subscribers, stop)
    log.info(
        f"replaying {len(publishers)} topics of {args.bag} at rate {args.rate:g}: "
        + ", ".join(sorted(publishers))
    )
    start = time.monotonic()
    sent, schedule = _play(node, bag, publishers, args, stop)
    elapsed = time.monotonic() - start
    late = (
        f"; late by {schedule.mean_late_s * 1e3:.1f} ms on average, "
        f"{schedule.max_late_s * 1e3:.1f} ms at most"
        if schedule
        else ""
    )
    print(
        f"replay {'interrupted' if stop.is_set() else 'done'}: {sum(sent.values())} messages "
        f"on {len(sent)} topics in {elapsed:.1f} s (rate {args.rate:g}){late}",
        flush=True,
    )
    return 0


def _publishers(node, bag: BagReader, args: argparse.Namespace) -> dict:
    """{bag topic: raw publisher} of the selected topics (on their remapped names).

    Raises:
        KeyError: A listed topic is not in the bag.
    """
    from oxygen_ros.nodes.recorder.conversions import message_class, qos_profile

    topics = bag.topics()
    selected = replay_topics({t: b.msgtype for t, b in topics.items()}, args.topics, args.sensors)
    if args.clock and CLOCK_TOPIC in selected:
        selected.remove(CLOCK_TOPIC)
        node.get_logger().warning("--clock: the bag's own /clock is not replayed")
    publishers = {}
    for topic in selected:
        info = topics[topic]
        try:
            cls = message_class(info.msgtype)
        except UnknownTypeError as exc:
            node.get_logger().warning(f"{topic} is skipped: {exc}")
            continue
        qos = qos_profile(writer_qos(info.offered_qos))
        publishers[topic] = node.create_publisher(cls, args.remaps.get(topic, topic), qos)
    return publishers


def _play(node, bag: BagReader, publishers: dict, args, stop: threading.Event):
    """Publishes the messages at their due times; returns (sent per topic, the schedule)."""
    from rosgraph_msgs.msg import Clock

    clock_pub = node.create_publisher(Clock, CLOCK_TOPIC, 10) if args.clock else None
    sent: collections.Counter[str] = collections.Counter()
    schedule: ReplaySchedule | None = None
    next_clock = time.monotonic()
    for topic, stamp_ns, data in bag.messages(publishers):
        if schedule is None:
            schedule = ReplaySchedule(stamp_ns, time.monotonic(), args.rate)
        while not stop.is_set():
            now = time.monotonic()
            if clock_pub is not None and now >= next_clock:
                # never past the message not sent yet
                bag_now = min(schedule.bag_time_ns(now), stamp_ns)
                clock_pub.publish(_clock(Clock, bag_now))
                next_clock = now + 1.0 / args.clock
            wait = schedule.wait_s(stamp_ns, now)
            if wait <= 0:
                break
            limit = next_clock - now if clock_pub is not None else POLL_S
            stop.wait(min(wait, max(0.0, limit), POLL_S))
        if stop.is_set():
            break
        publishers[topic].publish(data)
        schedule.record_send(stamp_ns, time.monotonic())
        sent[topic] += 1
    return sent, schedule


def _wait_for_subscribers(publishers: dict, timeout_s: float, stop: threading.Event) -> None:
    deadline = time.monotonic() + timeout_s
    while not stop.is_set() and time.monotonic() < deadline:
        if all(p.get_subscription_count() > 0 for p in publishers.values()):
            return
        stop.wait(POLL_S)


def _clock(cls, ns: int):
    msg = cls()
    msg.clock.sec, msg.clock.nanosec = divmod(ns, 1_000_000_000)
    return msg


if __name__ == "__main__":
    sys.exit(main())
