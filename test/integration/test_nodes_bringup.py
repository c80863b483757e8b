"""`python -m oxygen_ros.bringup`: starts the graph of oxygen_ros.graph, shows the console view,
and stops every child cleanly (exit 0) on SIGINT/SIGTERM or at the end of --duration."""

import os
import re
import signal
from pathlib import Path

import pytest
import yaml
from harness import wait_for

from oxygen_ros.msg import ActionChunk, SpeechToken
from oxygen_ros.nodes.runtime import RELIABLE_QOS, SPEECH_QOS

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
PARAMS = ROOT / "config" / "humanoid.yaml"
JAX_CACHE = Path(os.environ.get("OXYGEN_BUILD_DIR", ROOT / ".build")) / "jax_cache"


def params_file(tmp_path: Path) -> Path:
    """humanoid.yaml with the memory database in tmp_path (never the user's)."""
    data = yaml.safe_load(PARAMS.read_text())
    data["inference"]["ros__parameters"]["memory_db_path"] = str(tmp_path / "memory.sqlite3")
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


def test_bringup_streams_and_stops_on_sigint(launcher, ros_node, tmp_path) -> None:
    launcher.env.setdefault("JAX_COMPILATION_CACHE_DIR", str(JAX_CACHE))
    actions = ros_node.collect(ActionChunk, "oxygen/actions", RELIABLE_QOS)
    speech = ros_node.collect(SpeechToken, "oxygen/speech", SPEECH_QOS)
    proc = launcher.start(
        "oxygen_ros.bringup",
        args=[f"params_file:={params_file(tmp_path)}", "--log-dir", str(tmp_path / "logs")],
    )
    wait_for(
        lambda: len(actions) >= 10 or not proc.alive(), 240, "actions via the bring-up", poll_s=0.2
    )
    assert proc.alive(), proc.log()
    wait_for(lambda: any(m.final for m in speech), 60, "a finished speech request")
    pids = child_pids(proc.log())
    assert set(pids) == {"sim_sensors", "perception", "inference"}
    assert proc.stop(signal.SIGINT, timeout_s=30) == 0, proc.log()
    log = proc.log()
    assert "exit codes {'sim_sensors': 0, 'perception': 0, 'inference': 0}" in log, log
    assert all(gone(pid) for pid in pids.values())
    # The console view showed the action rate, the engine and the streamed speech.
    assert "actions" in log and "engine     ready" in log and "speech:" in log
    assert any(f"{m.request_id}" in log for m in speech if m.final)


def test_bringup_duration_and_sigterm_during_start_exit_zero(launcher, tmp_path) -> None:
    timed = launcher.start(
        "oxygen_ros.bringup",
        args=[
            f"params_file:={params_file(tmp_path)}",
            "--duration",
            "3",
            "--no-view",
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
        args=[f"params_file:={params_file(tmp_path)}", "--log-dir", str(tmp_path / "term")],
        name="terminated",
    )
    wait_for(lambda: len(child_pids(terminated.log())) == 3, 15, "children started")
    assert terminated.stop(signal.SIGTERM, timeout_s=30) == 0, terminated.log()
    assert all(gone(pid) for pid in child_pids(terminated.log()).values())


def test_bringup_refuses_unknown_argument(launcher) -> None:
    proc = launcher.start("oxygen_ros.bringup", args=["use_simulation:=true"], name="bad")
    wait_for(lambda: not proc.alive(), 15, "the bring-up to refuse")
    assert proc.popen.returncode == 2 and "unknown launch argument" in proc.log()
