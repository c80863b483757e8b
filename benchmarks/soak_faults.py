"""soak's faults: the schedule, the two network namespaces, and how each fault is injected.

Faults (name@seconds in `--faults`, or the `schedule` preset scaled to the run):
- kill_inference, kill_perception: SIGKILL to the node's process; the graph respawns it
  (oxygen_ros.supervisor, as the bring-up and the launch file do).
- camera_freeze: the top camera repeats its last image, same stamp, for 3 s (the relay).
- joint_stop: no joint states reach perception for 2 s (the relay).
- dds_cut: the inference node's network namespace loses its link for 2 s (veth down, up).
- language_burst: 50 RequestLanguage calls at once and 20 malformed instructions.
- clock_pause: the simulator is paused for 3 s (its `paused` parameter): /clock stands still.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess

DURATIONS_S = {
    "kill_inference": 0.0,
    "kill_perception": 0.0,
    "camera_freeze": 3.0,
    "joint_stop": 2.0,
    "dds_cut": 2.0,
    "language_burst": 0.0,
    "clock_pause": 3.0,
}
BURST_REQUESTS = 50
BURST_MALFORMED = 20
KILLS_BEFORE = 1 / 6  # kills end before a sixth of the run: RSS growth is measured after it
CYCLE = ("camera_freeze", "joint_stop", "dds_cut", "language_burst", "clock_pause")


@dataclasses.dataclass(frozen=True)
class Fault:
    name: str
    at_s: float  # wall seconds after the graph served its first chunk

    @property
    def duration_s(self) -> float:
        return DURATIONS_S[self.name]


def schedule(spec: str, minutes: float) -> list[Fault]:
    """`none`, `schedule` (the preset) or `name@seconds,...` -> faults in time order.

    The preset: four kills (inference, perception, alternating) spread over the first sixth of
    the run but after its first minute, then the cycle of the other faults repeated every
    four minutes (at least one cycle, spread over the rest) until a minute before the end.

    Raises:
        ValueError: an unknown fault, a time outside the run.
    """
    total = 60.0 * minutes
    if spec == "none":
        return []
    if spec == "schedule":
        kills_end = max(KILLS_BEFORE * total - 60.0, 60.0)
        first = min(60.0, kills_end / 2)
        kill_times = [first + i * (kills_end - first) / 3 for i in range(4)]
        faults = [
            Fault("kill_inference" if i % 2 == 0 else "kill_perception", t)
            for i, t in enumerate(kill_times)
        ]
        start, end = kills_end + 60.0, total - 60.0
        step = min(240.0 / len(CYCLE), (end - start) / len(CYCLE))
        t = start
        while step > 0 and t + step * (len(CYCLE) - 1) <= end:
            for name in CYCLE:
                faults.append(Fault(name, t))
                t += step
        return faults
    faults = []
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, _, at = item.partition("@")
        if name not in DURATIONS_S:
            raise ValueError(f"unknown fault {name!r}; known: {sorted(DURATIONS_S)}")
        seconds = float(at.rstrip("s"))
        if not 0 <= seconds < total:
            raise ValueError(f"{item}: outside the run (0 .. {total:g} s)")
        faults.append(Fault(name, seconds))
    return sorted(faults, key=lambda f: f.at_s)


class Network:
    """Two network namespaces joined by a veth pair: A holds the soak, the simulator and
    perception; B the inference node. UDP only, SUBNET discovery with static peers."""

    def __init__(self, tag: str) -> None:
        self.ns_a, self.ns_b = f"oxs{tag}a", f"oxs{tag}b"
        self.veth_a, self.veth_b = f"oxw{tag}a", f"oxw{tag}b"
        self.subnet = f"10.201.{int(tag) % 250}"

    @staticmethod
    def available() -> str:
        """ "" if namespaces can be made here, else why not."""
        if shutil.which("ip") is None:
            return "`ip` (iproute2) is not installed"
        if os.geteuid() != 0:
            return "network namespaces need root"
        return ""

    def create(self) -> None:
        _ip("netns", "add", self.ns_a)
        _ip("netns", "add", self.ns_b)
        _ip("link", "add", self.veth_a, "type", "veth", "peer", "name", self.veth_b)
        for ns, dev, host in ((self.ns_a, self.veth_a, 1), (self.ns_b, self.veth_b, 2)):
            _ip("link", "set", dev, "netns", ns)
            _ip("-n", ns, "addr", "add", f"{self.subnet}.{host}/24", "dev", dev)
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "link", "set", dev, "up")
            _ip("-n", ns, "route", "add", "224.0.0.0/4", "dev", dev)  # discovery multicast

    def delete(self) -> None:
        for ns in (self.ns_a, self.ns_b):
            _ip("netns", "del", ns, check=False)  # also removes the veth pair

    def env(self, side: str) -> dict[str, str]:
        peer = f"{self.subnet}.{2 if side == 'a' else 1}"
        return {
            "ROS_AUTOMATIC_DISCOVERY_RANGE": "SUBNET",
            "ROS_STATIC_PEERS": peer,
            "FASTDDS_BUILTIN_TRANSPORTS": "UDPv4",
        }

    def exec_prefix(self, side: str) -> list[str]:
        return ["ip", "netns", "exec", self.ns_a if side == "a" else self.ns_b]

    def link(self, up: bool) -> None:
        _ip("-n", self.ns_b, "link", "set", self.veth_b, "up" if up else "down")

    def rx_bytes(self) -> int:
        """Bytes the inference side received over the veth so far."""
        shown = _ip("-n", self.ns_b, "-j", "-s", "link", "show", "dev", self.veth_b).stdout
        return int(json.loads(shown)[0]["stats64"]["rx"]["bytes"])

    def encode(self) -> str:
        return ",".join((self.ns_a, self.ns_b, self.veth_a, self.veth_b, self.subnet))

    @classmethod
    def decode(cls, text: str) -> Network:
        net = cls.__new__(cls)
        net.ns_a, net.ns_b, net.veth_a, net.veth_b, net.subnet = text.split(",")
        return net


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=10)
