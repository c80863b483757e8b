"""`python -m oxygen_ros.bringup`: starts the graph of oxygen_ros.graph, shows the console view,
restarts perception and inference when they crash (counted in the console and on
/diagnostics), and stops every child cleanly (exit 0) on SIGINT/SIGTERM or at the end of
--duration."""

import os
import re
import signal
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from diagnostic_msgs.msg import DiagnosticArray
from harness import SpinningNode, call_service, newest_status, wait_for
from rclpy.qos import QoSProfile, QoSReliabilityPolicy

from oxygen_ros.msg import ActionChunk, SpeechToken
from oxygen_ros.nodes.common.conversions import time_to_seconds
from oxygen_ros.nodes.common.runtime import RELIABLE_QOS, SPEECH_QOS

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
PARAMS = ROOT / "config" / "humanoid.yaml"


def params_file(tmp_path: Path) -> Path:
    """humanoid.yaml with the memory database in tmp_path (never the user's)."""
    data = yaml.safe_load(PARAMS.read_text())
    data["/**/inference"]["ros__parameters"]["memory_db_path"] = str(tmp_path / "memory.sqlite3")
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def child_pids(log: str) -> dict[str, int]:
    return {m[0]: int(m[1]) for m in re.findall(r"started (\w+) \(pid (\d+)\)", log)}


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def bringup_status(diagnostics) -> dict[str, str]:
    """The bring-up's newest own status values ({} before one)."""
    return newest_status(diagnostics, "bringup")


def test_bringup_streams_respawns_a_killed_inference_and_stops_on_sigint(
    launcher, tmp_path, monkeypatch
) -> None:
    # The bring-up's graph talks over UDP only while nodes respawn (shared memory can leave a
    # survivor of a kill -9 deaf to the restarted participant): so does this observer.
    monkeypatch.setenv("FASTDDS_BUILTIN_TRANSPORTS", "UDPv4")
    ros_node = SpinningNode("test_bringup_respawn")
    try:
        run_respawn_bringup(launcher, ros_node, tmp_path)
    finally:
        ros_node.close()


def run_respawn_bringup(launcher, ros_node, tmp_path) -> None:
    actions = ros_node.collect(ActionChunk, "oxygen/actions", RELIABLE_QOS)
    speech = ros_node.collect(SpeechToken, "oxygen/speech", SPEECH_QOS)
    diagnostics = ros_node.collect(DiagnosticArray, "/diagnostics", 50)
    proc = launcher.start(
        "oxygen_ros.bringup",
        args=[
            f"params_file:={params_file(tmp_path)}",
            "respawn_delay:=0.5",
            "--log-dir",
            str(tmp_path / "logs"),
        ],
    )
    wait_for(
        lambda: len(actions) >= 10 or not proc.alive(), 240, "actions via the bring-up", poll_s=0.2
    )
    assert proc.alive(), proc.log()
    wait_for(lambda: any(m.final for m in speech), 60, "a finished speech request")
    pids = child_pids(proc.log())
    assert set(pids) == {"sim_sensors", "perception", "inference", "viewer"}
    # The live view: the bring-up prints the viewer's URL, and its page is served.
    announced = re.compile(r"\[bringup\] live view: (http://localhost:\d+/\?url=\S+)")
    wait_for(lambda: announced.search(proc.log()), 60, "the live view's URL")
    with urllib.request.urlopen(announced.search(proc.log())[1], timeout=10) as page:
        assert page.status == 200 and b"<html" in page.read(4096).lower()
    assert bringup_status(diagnostics).get("restarts.inference") == "0"

    # The console view shows the action rate, the engine and the streamed speech (every 5 s
    # without a terminal; the engine's state comes from inference's /diagnostics).
    def console_shows_it() -> bool:
        log = proc.log()
        finished = [m.request_id for m in list(speech) if m.final]
        return "engine     ready" in log and any(request in log for request in finished)

    wait_for(console_shows_it, 60, "the console showing the engine ready and a finished request")
    log = proc.log()
    assert "actions" in log and "speech:" in log

    # kill -9 of inference: the bring-up restarts it, and the action stream comes back from
    # observations taken after the kill (the humanoid graph runs on the system clock).
    killed = time.time()
    os.kill(pids["inference"], signal.SIGKILL)
    restarted = re.compile(r"restarted inference \(pid (\d+), restart 1\)")
    wait_for(lambda: restarted.search(proc.log()) or not proc.alive(), 30, "the restart")
    assert proc.alive(), proc.log()
    assert "inference exited with code -9; restarting in 0.5 s" in proc.log()
    wait_for(
        lambda: any(time_to_seconds(m.observation_stamp) > killed for m in list(actions)),
        240,
        "actions from the restarted inference node",
        poll_s=0.2,
    )
    fresh = next(m for m in list(actions) if time_to_seconds(m.observation_stamp) > killed)
    assert fresh.sequence < max(m.sequence for m in list(actions))  # a new process's count
    wait_for(
        lambda: bringup_status(diagnostics).get("restarts.inference") == "1",
        15,
        "the restart on the bring-up's /diagnostics",
    )
    status = bringup_status(diagnostics)
    assert status["state.inference"] == "up" and status["restarts.perception"] == "0"
    new_pid = int(restarted.search(proc.log())[1])
    assert not gone(new_pid) and gone(pids["inference"])
    assert proc.stop(signal.SIGINT, timeout_s=30) == 0, proc.log()
    log = proc.log()
    assert "respawn on: FASTDDS_BUILTIN_TRANSPORTS=UDPv4" in log
    assert "exit codes {'sim_sensors': 0, 'perception': 0, 'inference': 0, 'viewer': 0}" in log
    assert all(gone(pid) for pid in [*pids.values(), new_pid])
    assert re.search(r"inference:\w+\(1 restarts\)", log), log  # the console's node line


def test_bringup_duration_and_sigterm_during_start_exit_zero(launcher, tmp_path) -> None:
    timed = launcher.start(
        "oxygen_ros.bringup",
        args=[
            f"params_file:={params_file(tmp_path)}",
            "--duration",
            "3",
            "view:=false",
            "--no-console",
            "--log-dir",
            str(tmp_path / "timed"),
        ],
        name="timed",
    )
    wait_for(lambda: not timed.alive(), 30, "the bring-up to end after --duration")
    assert timed.popen.returncode == 0, timed.log()
    assert "'inference': 0" in timed.log()
    terminated = launcher.start(
        "oxygen_ros.bringup",
        args=[
            f"params_file:={params_file(tmp_path)}",
            "view:=false",
            "--log-dir",
            str(tmp_path / "term"),
        ],
        name="terminated",
    )
    wait_for(lambda: len(child_pids(terminated.log())) == 3, 15, "children started")
    assert terminated.stop(signal.SIGTERM, timeout_s=30) == 0, terminated.log()
    assert all(gone(pid) for pid in child_pids(terminated.log()).values())
    # respawn:=false: a crash ends the bring-up (code 1) instead of a restart (the control of
    # the restart in test_bringup_streams_respawns_a_killed_inference_and_stops_on_sigint).
    fixed = launcher.start(
        "oxygen_ros.bringup",
        args=[
            f"params_file:={params_file(tmp_path)}",
            "respawn:=false",
            "view:=false",
            "--no-console",
            "--log-dir",
            str(tmp_path / "fixed"),
        ],
        name="fixed",
    )
    wait_for(lambda: len(child_pids(fixed.log())) == 3, 15, "children started")
    os.kill(child_pids(fixed.log())["perception"], signal.SIGKILL)
    wait_for(lambda: not fixed.alive(), 30, "the bring-up to end")
    assert fixed.popen.returncode == 1, fixed.log()
    assert "perception exited with code -9; stopping the graph" in fixed.log()
    assert "restart" not in fixed.log()
    assert all(gone(pid) for pid in child_pids(fixed.log()).values())


def test_bringup_refuses_unknown_argument(launcher) -> None:
    proc = launcher.start("oxygen_ros.bringup", args=["use_simulation:=true"], name="bad")
    wait_for(lambda: not proc.alive(), 15, "the bring-up to refuse")
    assert proc.popen.returncode == 2 and "unknown launch argument" in proc.log()


def test_namespaced_bringup_applies_each_nodes_yaml_section_and_the_overrides(
    launcher, ros_node, tmp_path
) -> None:
    """`namespace:=robot1`: every node lives under /robot1, reads its own `/**/<node>` YAML
    section (non-default values here, read back over each node's parameter service) and the
    launch overrides (the YAML asks for model_preset pi05, which cannot start here; the
    `model_preset:=tiny` argument must win, in perception and inference alike, for any action
    to flow)."""
    from rcl_interfaces.srv import GetParameters
    from rclpy.parameter import parameter_value_to_python

    from oxygen_ros import graph

    data = yaml.safe_load(params_file(tmp_path).read_text())
    expected = {
        "sim_sensors": {"joint_rate_hz": 20.0},
        "perception": {"observation_rate_hz": 20.0},
        "inference": {"action_rate_hz": 50.0, "narration_period_s": 0.0},
    }
    defaults = yaml.safe_load(PARAMS.read_text())
    for node, values in expected.items():
        for name, value in values.items():  # each value differs from the shipped YAML's
            assert graph.node_parameters(defaults, node)[name] != value
        data[f"/**/{node}"]["ros__parameters"].update(values)
    data["/**"]["ros__parameters"]["model_preset"] = "pi05"
    path = tmp_path / "namespaced.yaml"
    path.write_text(yaml.safe_dump(data))
    deep = QoSProfile(depth=1000, reliability=QoSReliabilityPolicy.RELIABLE)
    actions = ros_node.collect(ActionChunk, "/robot1/oxygen/actions", deep)
    proc = launcher.start(
        "oxygen_ros.bringup",
        args=[
            f"params_file:={path}",
            "namespace:=robot1",
            "model_preset:=tiny",
            "view:=false",
            "--no-console",
            "--log-dir",
            str(tmp_path / "logs"),
        ],
        name="namespaced",
    )
    wait_for(lambda: len(actions) >= 60 or not proc.alive(), 240, "actions on /robot1", poll_s=0.2)
    assert proc.alive(), proc.log()
    expected["perception"]["model_preset"] = "tiny"
    expected["inference"]["model_preset"] = "tiny"
    for node, values in expected.items():
        client = ros_node.node.create_client(GetParameters, f"/robot1/{node}/get_parameters")
        reply = call_service(client, GetParameters.Request(names=list(values)))
        got = dict(zip(values, map(parameter_value_to_python, reply.values), strict=True))
        assert got == values, node

    # The tick rate follows the inference section's action_rate_hz (50 Hz, not 70): ticks
    # counted over 3 s of this process's clock (a lagging reader stretches the span, so the
    # bound below 50 Hz is loose; 70 Hz would exceed the upper one).
    def ticks() -> int:
        return sum(m.trigger == ActionChunk.TRIGGER_TICK for m in list(actions))

    start, first = time.monotonic(), ticks()
    wait_for(lambda: time.monotonic() - start >= 3.0, 10, "3 s of ticks")
    rate = (ticks() - first) / (time.monotonic() - start)
    assert 40.0 <= rate <= 57.0, rate
    assert proc.stop(signal.SIGINT, timeout_s=30) == 0, proc.log()


@pytest.mark.parametrize(
    ("joints", "problem"),
    [
        ("[head_pan, head_roll]", "['head_roll'] are not in joint_names"),
        ("[]", "trajectory_group.head.joints=[] refused: must not be empty"),
    ],
)
def test_inference_refuses_bad_trajectory_groups_at_start(
    launcher, tmp_path, joints: str, problem: str
) -> None:
    proc = launcher.start(
        "oxygen_ros.nodes.inference.inference_node",
        ros_args=[
            "--params-file",
            str(params_file(tmp_path)),
            "-r",
            "__node:=inference",
            "-p",
            "inference:trajectory_groups:=[head]",
            "-p",
            "inference:trajectory_group.head.topic:=head_controller/joint_trajectory",
            "-p",
            f"inference:trajectory_group.head.joints:={joints}",
        ],
        name="bad_groups",
    )
    wait_for(lambda: not proc.alive(), 60, "the inference node to refuse its parameters")
    assert proc.popen.returncode == 2, proc.log()
    assert "invalid parameters" in proc.log() and problem in proc.log(), proc.log()
