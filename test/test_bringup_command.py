"""The README's first command, `scripts/bringup`: what graph it brings up by default.

It is the workcell with the trained model (the one body with a trained brain on these
machines), one seed's episode after the other, while `python -m oxygen_ros.bringup` and
launch/humanoid.launch.py keep the humanoid profile as their default; a `profile:=` argument
given to the script wins. Checked through `--print`, which resolves the graph exactly as a
bring-up would and starts nothing.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from oxygen_ros import graph

ROOT = Path(__file__).resolve().parents[1]


def _printed(command: list[str]) -> dict[str, dict[str, str]]:
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    nodes: dict[str, dict[str, str]] = {}
    current = None
    for line in done.stdout.splitlines():
        if line and not line.startswith(" ") and ": oxygen_ros." in line:
            current = nodes.setdefault(line.split(":", 1)[0], {})
        elif current is not None and line.startswith("  "):
            key, _, value = line.strip().partition(" ")
            current[key] = value.strip()
    return nodes


def test_first_command_brings_up_the_workcell_with_the_trained_model() -> None:
    nodes = _printed(["bash", str(ROOT / "scripts" / "bringup"), "--print"])
    assert list(nodes) == ["workcell_sim", "perception", "inference", "viewer"], nodes
    params = Path(nodes["inference"]["params_file"])
    assert params.name == "workcell.yaml"
    section = graph.node_parameters(yaml.safe_load(params.read_text()), "inference")
    assert section["checkpoint_dir"].endswith("models/workcell_run76"), section
    assert "checkpoint_dir" not in nodes["inference"]["overrides"]  # the YAML's model
    # one episode after the other (the YAML's 0 waits for a reset request)
    assert nodes["workcell_sim"]["overrides"] == "{'next_episode_after_s': 3.0}"


def test_a_profile_argument_wins_and_the_module_default_stays_humanoid() -> None:
    script = _printed(["bash", str(ROOT / "scripts" / "bringup"), "profile:=humanoid", "--print"])
    module = _printed([sys.executable, "-P", "-m", "oxygen_ros.bringup", "--print"])
    for nodes in (script, module):
        assert list(nodes) == ["sim_sensors", "perception", "inference", "viewer"], nodes
        assert Path(nodes["inference"]["params_file"]).name == "humanoid.yaml"
