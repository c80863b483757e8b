"""How far is perception's instructed-cube pose from the simulator's, on recorded episodes?

Replays recorded episodes (`generate_demos` or `dagger` HDF5 files, which keep each frame's full
physics state) through the workcell's cube pose tracker (`perception.cube_poses.CubePoses`,
top camera and measured joints, as the perception node and training compute the state) once per
grasp window, and compares the instructed cube's estimate with the simulator's pose restored
from the recorded physics state, frame by frame:

- height error |z - z_true|, and the share of frames off by more than 1 cm: the lift the model
  reads (the stages change at 1 cm lifted, `sim.tasks.LIFT_STARTED_M`);
- xy error, and the share off by more than 1.5 cm (the move stage begins at 1.5 cm along);
- each split by what the simulator says: the episode's arm holds the cube (`tasks.evaluate`)
  with it lifted at least 1 cm, held lower, or not held.

Windows: `current` (`GraspConfig()`) and `before` (`GraspConfig.before_2026_12_03()`: held only
below `held_max`, the cube's centre at the pinch point's height).

`python benchmarks/perception_accuracy.py --data DIR [DIR ...] --episodes N --out X.json`
(after `source scripts/env.sh`) writes JSON and prints a summary table; the last line is
`perception_accuracy current_z_off=<share> before_z_off=<share> frames=<n>`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

Z_OFF_M = 0.01
XY_OFF_M = 0.015
WINDOWS = ("current", "before")


def grasp_window(name: str):
    from oxygen_ros.perception.cube_poses import GraspConfig

    return GraspConfig() if name == "current" else GraspConfig.before_2026_12_03()


def episode_errors(path: Path, cell) -> dict[str, np.ndarray]:
    """Per window, [T, 2] (xy error, z error) in metres; and "phase" [T] (0 not held, 1 held
    below 1 cm, 2 held and lifted)."""
    import h5py

    from oxygen_ros.perception import workcell_cubes
    from oxygen_ros.sim import robot, tasks

    with h5py.File(path, "r") as f:
        spec = tasks.sample_episode(int(f.attrs["seed"]), str(f.attrs["instruction"]))
        images = f["observations/images/top"][()]
        joints = f["observations/qpos"][()].astype(np.float64)
        states = f["observations/sim_state"][()]
    if states.shape[1] == 0:
        raise ValueError(f"{path} has no physics state")
    cell.reset(robot.HOME, spec.objects)
    truth, phase = [], []
    for state in states:
        cell.set_physics_state(state)
        truth.append(cell.object_pose(spec.target).position.copy())
        e = tasks.evaluate(cell, spec)
        phase.append(0 if not e.held else (2 if e.lift_m >= tasks.LIFT_STARTED_M else 1))
    truth = np.asarray(truth)
    out = {"phase": np.asarray(phase)}
    height, width = images.shape[1:3]
    for window in WINDOWS:
        poses = workcell_cubes.cube_poses(width, height, grasp_window(window))
        estimate = []
        for image, q in zip(images, joints, strict=True):
            pose = poses.update(image, q)[spec.target]
            estimate.append((*pose.xy, pose.z))
        estimate = np.asarray(estimate)
        out[window] = np.stack(
            [
                np.hypot(*(estimate[:, :2] - truth[:, :2]).T),
                np.abs(estimate[:, 2] - truth[:, 2]),
            ],
            axis=1,
        )
    return out


SUMMARY_KEYS = ("z_off_share", "xy_off_share", "z_err_p50_mm", "z_err_p90_mm", "xy_err_p50_mm")


def _group_summary(err: np.ndarray) -> dict:
    """Shares off and error percentiles of one group's (frames, [xy, z]) errors; None where the
    group has no frames."""
    if not len(err):
        return {"frames": 0, **dict.fromkeys(SUMMARY_KEYS)}
    return {
        "frames": len(err),
        "z_off_share": float(np.mean(err[:, 1] > Z_OFF_M)),
        "xy_off_share": float(np.mean(err[:, 0] > XY_OFF_M)),
        "z_err_p50_mm": float(1000 * np.median(err[:, 1])),
        "z_err_p90_mm": float(1000 * np.percentile(err[:, 1], 90)),
        "xy_err_p50_mm": float(1000 * np.median(err[:, 0])),
    }


def summary(errors: list[dict[str, np.ndarray]]) -> dict:
    phase = np.concatenate([e["phase"] for e in errors])
    groups = {"all": phase >= 0, "lifted": phase == 2, "held_low": phase == 1, "free": phase == 0}
    result = {}
    for window in WINDOWS:
        err = np.concatenate([e[window] for e in errors])
        result[window] = {group: _group_summary(err[mask]) for group, mask in groups.items()}
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", nargs="+", required=True, help="directories of HDF5 episodes")
    parser.add_argument("--episodes", type=int, default=0, help="the first N of each (0: all)")
    parser.add_argument("--out", default="")
    args = parser.parse_args(argv)
    from oxygen_ros.sim.workcell import Workcell, WorkcellConfig

    paths = []
    for directory in args.data:
        found = sorted(Path(directory).glob("*.hdf5"))
        paths += found[: args.episodes] if args.episodes else found
    if not paths:
        print("perception_accuracy: no episodes found", file=sys.stderr)
        return 2
    cell = Workcell(WorkcellConfig(render=False))
    try:
        errors = [episode_errors(p, cell) for p in paths]
    finally:
        cell.close()
    result = {"data": args.data, "episodes": len(paths), "summary": summary(errors)}
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"{'window':8} {'frames':>12} {'z off >1cm':>11} {'xy off >1.5cm':>14} {'z p90 mm':>9}")
    for window, groups in result["summary"].items():
        for group, s in groups.items():
            if not s["frames"]:
                continue
            print(
                f"{window:8} {group + ' ' + str(s['frames']):>12} {s['z_off_share']:>11.3f} "
                f"{s['xy_off_share']:>14.3f} {s['z_err_p90_mm']:>9.1f}"
            )
    current, before = (result["summary"][w]["all"] for w in WINDOWS)
    print(
        f"perception_accuracy current_z_off={current['z_off_share']:.4f} "
        f"before_z_off={before['z_off_share']:.4f} frames={current['frames']}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
