"""Does a checkpoint read the state written in its prompt? (ROS-free; engine + workcell.)

pi0.5 writes the normalised state into the prompt as digits ("State: 220 71 76 ...;"); the
action expert sees it only through attention to those tokens. This probe puts the workcell
on the expert's path (the scripted plan executed for `--at-s` seconds of an episode), takes
one observation, and serves it through the engine several times with the same action noise
and the same images, changing only numbers in the state:
- each of the acting arm's six joints + `--joint-shift-rad`;
- the named cube's x + `--cube-shift-m` (with `--object-state`).
With `--object-state reach` (or `target`) each shifted state's hand-to-cube offsets are computed
again from its joints and cubes (`workcell_cubes.reach_offsets`), as perception would report
them.
With `--no-images` every camera is masked out (for checkpoints trained with image dropout).

It reports how much the chunk's last row changes *in the model's own action space* (the delta
for delta-action checkpoints, the target for absolute ones) on the shifted joint, divided by
the shift: 0 means the model's output does not depend on that number at all. The demonstrations
ask for about -1 on a shifted joint (the target stays where it is, so the delta shrinks by the
shift) and for a large change when the cube moves 5 cm. As the positive control that the
shift reached the model, it also counts the prompt tokens that differ from the unshifted
prompt (0 would mean the shift was lost in discretisation).

`python -m oxygen_ros.training.diagnostics.state_probe --checkpoint DIR [--object-state]
[--seeds 0:10] [--out F]` writes JSON and prints a table; the last line is
`state_probe joint_response=<median |response|> cube_response_rad=<median>`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import numpy as np

from oxygen_ros.engine import prompts
from oxygen_ros.engine.config import SchedulerConfig
from oxygen_ros.engine.engine import Engine
from oxygen_ros.perception import workcell_cubes
from oxygen_ros.sim import robot, tasks
from oxygen_ros.sim.workcell import Workcell, WorkcellConfig
from oxygen_ros.training import data
from oxygen_ros.training.rollout import ExpertPolicy, RolloutConfig, chunk_target, parse_seeds
from oxygen_ros.training.train import engine_config

ARM_JOINTS = 6  # per arm, before the gripper (robot.JOINT_NAMES)


def model_space(chunk: np.ndarray, state: np.ndarray, mask: tuple[bool, ...]) -> np.ndarray:
    """The chunk [A, 14] as the model produced it: minus the state on delta-masked joints."""
    out = np.array(chunk, np.float64)
    if mask:
        m = np.asarray(mask[: out.shape[1]], bool)
        out[:, m] -= state[: out.shape[1]][m]
    return out


def perceived(state: np.ndarray, object_state: str) -> np.ndarray:
    """`state` as perception would report it: with `reach` or a target state, the hand-to-cube
    offsets follow the (shifted) joints and cube poses; other states are returned unchanged."""
    if object_state not in ("reach", *workcell_cubes.TARGET_KINDS):
        return state
    joints, poses = state[: robot.NUM_JOINTS], state[robot.NUM_JOINTS :]
    width = len(workcell_cubes.POSE_FIELDS)  # the target's pose
    if object_state == "reach":
        width = len(workcell_cubes.POSE_STATE_NAMES)
    out = state.copy()
    out[robot.NUM_JOINTS + width :] = workcell_cubes.reach_offsets(
        poses[:width], joints, metres=object_state == "target_m"
    )
    return out


def on_path_observation(workcell: Workcell, spec, config: RolloutConfig, at_s: float):
    """The observation after the expert's plan ran `at_s` seconds from the episode's start."""
    expert = ExpertPolicy(config)
    workcell.reset(robot.HOME, spec.objects)
    start = workcell.time
    expert.reset(workcell, spec)
    cubes = workcell_cubes.object_state(
        config.object_state, data.target_of(config.object_state, spec)
    )
    ticks = round(config.execute_s * config.control_hz)
    while True:
        observation = data.observe(
            workcell, spec.instruction, config.resolution, cubes, workcell.time
        )
        if workcell.time - start >= at_s:
            return observation
        rows, _ = expert.act(workcell, observation)
        for tick in range(ticks):
            workcell.set_targets(chunk_target(rows, config.action_dt_s, tick / config.control_hz))
            workcell.step(1.0 / config.control_hz)


def probe_one(engine: Engine, observation, spec, args) -> dict:
    """Responses of one observation to each shift."""
    mask = engine.delta_action_mask
    noise = engine.make_noise(spec.seed)
    normalizer = engine.normalizer
    tokenizer = engine.tokenizer

    def serve(state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        shifted = dataclasses.replace(observation, state=state.astype(np.float32))
        chunk = np.asarray(engine.step(shifted, [], noise=noise).actions.actions)[:, :14]
        tokens, _ = prompts.tokenize_action_prompt(
            tokenizer,
            spec.instruction,
            normalizer.normalize_state(shifted.state),
            engine.config.model.max_token_len,
        )
        return model_space(chunk, shifted.state, mask), tokens

    base, base_tokens = serve(np.asarray(observation.state, np.float64))
    first = robot.arm_slice(spec.arm).start
    joints = []
    for j in range(ARM_JOINTS):
        state = np.asarray(observation.state, np.float64).copy()
        state[first + j] += args.joint_shift_rad
        out, tokens = serve(perceived(state, args.object_state))
        change = out[-1, first + j] - base[-1, first + j]
        joints.append(
            {
                "joint": robot.JOINT_NAMES[first + j],
                "response": float(change / args.joint_shift_rad),
                "prompt_tokens_changed": int((tokens != base_tokens).sum()),
            }
        )
    result = {"seed": spec.seed, "instruction": spec.instruction, "joints": joints}
    if args.object_state:
        names = workcell_cubes.object_state(args.object_state).names
        cube = (
            workcell_cubes.TARGET
            if args.object_state in workcell_cubes.TARGET_KINDS
            else spec.target
        )
        index = robot.NUM_JOINTS + list(names).index(f"{cube}.x")
        state = np.asarray(observation.state, np.float64).copy()
        state[index] += args.cube_shift_m
        out, tokens = serve(perceived(state, args.object_state))
        arm = slice(first, first + ARM_JOINTS)
        result["cube"] = {
            "largest_change_rad": float(np.abs(out[-1, arm] - base[-1, arm]).max()),
            "prompt_tokens_changed": int((tokens != base_tokens).sum()),
        }
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--checkpoint", required=True)
    data.add_object_state_argument(parser)
    parser.add_argument("--seeds", default="0:10")
    parser.add_argument("--at-s", type=float, default=1.5, help="sim seconds on the plan")
    parser.add_argument("--joint-shift-rad", type=float, default=0.2)
    parser.add_argument("--cube-shift-m", type=float, default=0.05)
    parser.add_argument(
        "--no-images", action="store_true", help="serve with every camera masked out"
    )
    parser.add_argument("--out", default="")
    args = parser.parse_args(argv)
    preset = data.model_preset(args.preset, args.object_state)
    engine = Engine(
        engine_config(args.checkpoint, preset=preset, scheduler=SchedulerConfig(mode="shared_kv"))
    )
    config = RolloutConfig(
        execute_s=0.1,
        object_state=args.object_state,
        speak=False,
        resolution=engine.config.model.image_resolution,
        preset=preset,
    )
    workcell = Workcell(WorkcellConfig())
    results = []
    try:
        for seed in parse_seeds(args.seeds):
            spec = tasks.sample_episode(seed)
            observation = on_path_observation(workcell, spec, config, args.at_s)
            if args.no_images:
                masks = dict.fromkeys(observation.image_masks, False)
                observation = dataclasses.replace(observation, image_masks=masks)
            results.append(probe_one(engine, observation, spec, args))
    finally:
        workcell.close()
    responses = np.array([j["response"] for r in results for j in r["joints"]])
    summary = {
        "joint_response_median_abs": float(np.median(np.abs(responses))),
        "joint_response_mean": float(responses.mean()),
        "joint_prompt_tokens_changed_min": min(
            j["prompt_tokens_changed"] for r in results for j in r["joints"]
        ),
    }
    if args.object_state:
        summary["cube_change_rad_median"] = float(
            np.median([r["cube"]["largest_change_rad"] for r in results])
        )
        summary["cube_prompt_tokens_changed_min"] = min(
            r["cube"]["prompt_tokens_changed"] for r in results
        )
    print(f"{'seed':>4}  {'joint responses (model space / shift; demos: about -1)':60} cube [rad]")
    for r in results:
        joints = " ".join(f"{j['response']:+.2f}" for j in r["joints"])
        cube = f"{r['cube']['largest_change_rad']:.3f}" if "cube" in r else "-"
        print(f"{r['seed']:>4}  {joints:60} {cube}")
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(
            json.dumps({"args": vars(args), "summary": summary, "seeds": results}, indent=1)
        )
    print(
        f"state_probe joint_response={summary['joint_response_median_abs']:.3f} "
        f"cube_response_rad={summary.get('cube_change_rad_median', float('nan')):.3f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
