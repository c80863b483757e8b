"""Test parent of an action process: starts one (`ActionProcess.start`, topic given as the first
argument), hands it a fresh chunk every 0.2 s, prints the child's pid, and runs until killed.
Lets a test kill the parent (kill -9) and watch the child."""

import sys
import time

import numpy as np

from oxygen_ros.engine.action_stream import StreamConfig
from oxygen_ros.nodes.inference.action_process import ActionProcess, ActionProcessConfig


def config(topic: str, **overrides) -> ActionProcessConfig:
    """A small configuration: two joints, 16 rows 0.04 s apart, ticks at 70 Hz."""
    values = dict(
        node_name="test_actions",
        namespace="/",
        actions_topic=topic,
        trajectory_groups=(),
        frame_id="base",
        joint_names=("a", "b"),
        horizon=16,
        stream=StreamConfig(dt=0.04, num_joints=2, max_chunk_age_s=5.0),
        params={
            "action_rate_hz": 70.0,
            "watchdog_timeout_s": 5.0,
            "watchdog_policy": "stop",
            "stats_window_s": 10.0,
        },
        priority=0,
        use_sim_time=False,
    )
    values.update(overrides)
    return ActionProcessConfig(**values)


def rows(value: float = 0.0) -> np.ndarray:
    out = np.full((16, 2), value, np.float32)
    out[:, 0] += np.arange(16) / 100
    return out


def main() -> None:
    process = ActionProcess.start(
        config(sys.argv[1]), on_reject=lambda r, m: None, on_watchdog=lambda t: None
    )
    print(process.popen.pid, flush=True)
    while True:
        process.link.hand_off(rows(), time.time() - 0.01, 0.01)
        time.sleep(0.2)


if __name__ == "__main__":
    main()
