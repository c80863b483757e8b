"""Writes requirements.lock from the current venv: every wheel-installed distribution, pinned.

Run with the venv's python after installing or upgrading a package:
    .build/venv/bin/python scripts/freeze_lock.py
Distributions recorded as .egg-info are skipped: the ROS wheels embed egg-info metadata of
their inner packages (action_msgs, ...), which are not installable on their own.
"""

import importlib.metadata
from pathlib import Path

HEADER = (
    "# Full pinned closure, installed with `pip install --no-deps -r requirements.lock`\n"
    "# (scripts/setup.sh). Regenerate from a working venv with scripts/freeze_lock.py.\n"
)
SKIP = {"pip", "setuptools", "wheel", "uv"}  # pinned by scripts/setup.sh itself


def main() -> None:
    pins = set()
    for dist in importlib.metadata.distributions():
        if not str(getattr(dist, "_path", "")).endswith(".dist-info"):
            continue
        name, version = dist.metadata["Name"], dist.version
        if name.lower() in SKIP:
            continue
        pins.add(f"{name}=={version.removesuffix('+cpu')}")  # torch: the CPU wheel on disk
    lock = Path(__file__).resolve().parents[1] / "requirements.lock"
    lock.write_text(HEADER + "\n".join(sorted(pins, key=str.lower)) + "\n")
    print(f"wrote {len(pins)} pins to {lock}")


if __name__ == "__main__":
    main()
