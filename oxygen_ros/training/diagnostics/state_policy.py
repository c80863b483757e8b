"""Diagnostic: can behaviour cloning on the workcell demonstrations act closed-loop at all,
given the state perfectly (no images, no digits)?

Every pi0.5 run so far fails closed-loop (docs/TRAINING.md), and the state probe shows that
the VLA ignores the state written in its prompt. This separates the two suspects:
- the data (one open-loop plan per episode, no corrections) cannot teach a closed-loop policy;
- the VLA cannot read its prompt's state.

A small MLP gets exactly what the VLA's prompt carries, as numbers: the 14 joints and the
cubes' (x, y) as the workcell's cube detector tracks them (normalised with the demonstrations'
mean and std), and the instruction's words as one-hots (template, colour, named arm, direction).
It regresses the same targets the VLA learns: the next `horizon` rows, arm joints relative to
the state (openpi's delta mask), grippers absolute, normalised. Then it drives
`training.rollout.run_episode` (the same physics, observation and chunk execution the VLA's
rollouts use) on held-out seeds. If this policy succeeds, the data suffices and the VLA's state
reading is the limit; if it fails, the data is.

Variants (flags) add to the inputs the joint velocities (`--velocity`), the time since the
episode began (`--time`: an oracle of a time-indexed plan's phase), the named cube's (x, y)
(`--target`), the named cube's initial yaw as an oracle (`--yaw`), per arm the named cube's
(x, y) minus the pinch point's (forward kinematics of the joints) and its height (`--pinch`),
drop the joints
(`--no-joints`), train on absolute targets (`--absolute`), or add noise to the training inputs'
arm joints with the delta targets taken from the noisy state (`--state-noise-rad`) or to the
grippers' (`--gripper-noise`). Results: docs/TRAINING.md (runs 12 to 15).

DAgger (`--dagger-rounds R`): after each fit, the MLP runs `--dagger-episodes` episodes on seeds
from `--dagger-seed-start` (never the evaluation's), every observation is labelled with the
feedback expert's chunk from that state (`training.dagger`, `--regrasp-m`; with `--beta` the
expert's chunk is executed instead of the MLP's at that share of frames), the rows join the
training set (`--dagger-share`: that share of every batch comes from them) and the MLP is
trained again from scratch; each round is evaluated on `--seeds`. `--expert reactive` labels
with the reactive expert (`sim/reactive_expert.py`) instead. `--fits N` fits N MLPs per round
on the same rows (seeds `--seed` to `--seed` + N - 1) and the policy acts on their mean output:
how much of a rate is the fit's seed (docs/TRAINING.md run 15).

`python -m oxygen_ros.training.diagnostics.state_policy --data DIR [DIR ...] --cache F.npz
[...] --seeds 0:10 --steps 5000 [variant flags] [--dagger-rounds 4] --out results.json` from
the repository root. Nothing here imports rclpy.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import glob
import itertools
import json
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

from oxygen_ros.engine.checkpoint import Normalizer
from oxygen_ros.engine.config import get_model_config
from oxygen_ros.perception import workcell_cubes
from oxygen_ros.sim import recorder, robot, tasks
from oxygen_ros.sim.kinematics import ArmKinematics
from oxygen_ros.sim.scene import COLOURS
from oxygen_ros.training import data, rollout

ARM_WORDS = (None, "left", "right")


def instruction_features(instruction: str) -> np.ndarray:
    """One-hots of what the instruction's words fix: template, colour, named arm, direction."""
    parsed = tasks.parse_instruction(instruction)
    parts = []
    for value, choices in (
        (parsed.template, tuple(tasks.TEMPLATES)),
        (parsed.colour, tuple(COLOURS)),
        (parsed.arm, ARM_WORDS),
        (parsed.direction, ARM_WORDS),
    ):
        hot = np.zeros(len(choices), np.float32)
        hot[choices.index(value)] = 1.0
        parts.append(hot)
    return np.concatenate(parts)


@dataclasses.dataclass(frozen=True)
class Variant:
    """What the MLP sees and predicts."""

    velocity: bool = False  # the joint velocities follow the state
    time: bool = False  # seconds since the episode began (an oracle of the plan's phase)
    absolute: bool = False  # absolute targets instead of openpi's delta mask
    target: bool = False  # the named cube's (x, y), picked out of the state by its colour
    joints: bool = True  # the joint positions are inputs (False: the cubes only)
    state_noise_rad: float = 0.0  # training only: noise on the arm joints' input (the delta
    #   target is taken from the noisy state, so it steers back: DART's labels, synthetic)
    gripper_noise: float = 0.0  # training only: noise on the grippers' input (targets absolute)
    yaw: bool = False  # the named cube's yaw at the start as (sin 4 yaw, cos 4 yaw): an oracle
    #   of what the cube detector does not estimate (the grasp turns the wrist with it)
    pinch: bool = False  # per arm, the named cube's (x, y) minus the pinch point's (forward
    #   kinematics of the measured joints) and the pinch point's height: the error to servo on


@dataclasses.dataclass
class Stats:
    input_mean: np.ndarray
    input_std: np.ndarray
    target_mean: np.ndarray
    target_std: np.ndarray


@functools.cache
def _kinematics() -> dict[str, ArmKinematics]:
    from oxygen_ros.sim.workcell import Workcell, WorkcellConfig

    cell = Workcell(WorkcellConfig(render=False))
    return {arm: ArmKinematics(cell.model, arm) for arm in robot.ARMS}


def named_cube_xy(state: np.ndarray, instruction: np.ndarray) -> np.ndarray:
    """[N, 2] the tracked (x, y) of the cube the instruction names (by its colour one-hot)."""
    colour = np.argmax(instruction[:, len(tasks.TEMPLATES) : len(tasks.TEMPLATES) + 3], 1)
    first = robot.NUM_JOINTS + 2 * colour
    rows = np.arange(len(state))
    return np.stack([state[rows, first], state[rows, first + 1]], axis=1)


def pinch_features(state: np.ndarray, instruction: np.ndarray) -> np.ndarray:
    """[N, 6] per arm: the named cube's (x, y) minus the pinch point's, the pinch height."""
    cube = named_cube_xy(state, instruction)
    parts = []
    for arm, kin in _kinematics().items():
        joints = state[:, robot.arm_columns(arm)]
        pinch = np.stack([kin.forward(q)[0] for q in joints.astype(np.float64)])
        parts.append(np.concatenate([cube - pinch[:, :2], pinch[:, 2:]], axis=1))
    return np.concatenate(parts, axis=1).astype(np.float32)


def raw_inputs(
    state: np.ndarray,
    qvel: np.ndarray,
    elapsed: np.ndarray,
    instruction: np.ndarray,
    variant: Variant,
    yaw: np.ndarray | None = None,
) -> np.ndarray:
    """[N, F] inputs before normalisation: state, then what the variant adds (`yaw` [N]: the
    named cube's initial yaw, for the yaw variant)."""
    parts = [state if variant.joints else state[:, robot.NUM_JOINTS :]]
    if variant.yaw:
        parts.append(np.stack([np.sin(4 * yaw), np.cos(4 * yaw)], axis=1).astype(np.float32))
    if variant.target:
        parts.append(named_cube_xy(state, instruction))
    if variant.pinch:
        parts.append(pinch_features(state, instruction))
    if variant.velocity:
        parts.append(qvel)
    if variant.time:
        parts.append(np.asarray(elapsed, np.float32).reshape(-1, 1))
    return np.concatenate(parts, axis=1).astype(np.float32)


def targets(actions: np.ndarray, state: np.ndarray, variant: Variant) -> np.ndarray:
    """[N, A * 14] regression targets in robot units."""
    mask = () if variant.absolute else data.DELTA_ACTION_MASK
    return Normalizer.relative_actions(actions, state, mask).reshape(len(actions), -1)


def features(inputs: np.ndarray, instruction: np.ndarray, stats: Stats) -> np.ndarray:
    return np.concatenate(
        [(inputs - stats.input_mean) / stats.input_std, instruction], axis=-1
    ).astype(np.float32)


def init_mlp(key: jax.Array, sizes: list[int]) -> list[dict[str, jax.Array]]:
    params = []
    for fan_in, fan_out in itertools.pairwise(sizes):
        key, sub = jax.random.split(key)
        w = jax.random.normal(sub, (fan_in, fan_out)) * np.sqrt(2.0 / fan_in)
        params.append({"w": w, "b": jnp.zeros((fan_out,))})
    return params


def mlp(params: list[dict[str, jax.Array]], x: jax.Array) -> jax.Array:
    for layer in params[:-1]:
        x = jax.nn.gelu(x @ layer["w"] + layer["b"])
    return x @ params[-1]["w"] + params[-1]["b"]


def ensemble(members: list[list[dict[str, jax.Array]]], x: jax.Array) -> jax.Array:
    """The mean output of MLPs fit on the same data and normalisation (`--fits`)."""
    return jnp.mean(jnp.stack([mlp(params, x) for params in members]), axis=0)


def squared_error(params, xb: jax.Array, yb: jax.Array, key: jax.Array) -> jax.Array:
    """The regression's loss (`key` unused)."""
    return jnp.mean((mlp(params, xb) - yb) ** 2)


def train(
    batches,
    sizes: tuple[int, int],
    steps: int,
    lr: float,
    width: int,
    seed: int,
    loss=squared_error,
) -> tuple[list[dict[str, jax.Array]], list[float]]:
    """`batches(rng)` -> (x, y) normalised; `sizes` (input, output) widths of the MLP;
    `loss(params, x, y, key)` with a fresh key every step (the squared error by default)."""
    key = jax.random.key(seed)
    params = init_mlp(key, [sizes[0], width, width, width, sizes[1]])
    schedule = optax.warmup_cosine_decay_schedule(0.0, lr, 200, steps, lr * 0.01)
    optimiser = optax.adamw(schedule, weight_decay=1e-4)
    opt_state = optimiser.init(params)

    @jax.jit
    def step(params, opt_state, xb, yb, key):
        value, grads = jax.value_and_grad(loss)(params, xb, yb, key)
        updates, opt_state = optimiser.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, value

    rng, step_key = np.random.default_rng(seed), jax.random.key(seed + 1)
    losses = []
    for i in range(steps):
        step_key, sub = jax.random.split(step_key)
        params, opt_state, loss_value = step(params, opt_state, *batches(rng), sub)
        if i % 500 == 0 or i == steps - 1:
            losses.append(float(loss_value))
            print(f"step {i:>6} loss {float(loss_value):.4f}", flush=True)
    return params, losses


class StatePolicy:
    """The MLP (or the mean of several, `ensemble`) as a rollout policy (speaks nothing)."""

    def __init__(self, members, stats: Stats, horizon: int, variant: Variant) -> None:
        self.params = members
        self.stats = stats
        self.horizon = horizon
        self.variant = variant
        self._instruction = None
        self._start = 0.0
        self._forward = jax.jit(ensemble)

    def reset(self, workcell, spec: tasks.EpisodeSpec) -> None:
        self._instruction = instruction_features(spec.instruction)
        self._start = workcell.time
        self._yaw = np.array([spec.objects[spec.target][2]])

    def act(self, workcell, observation):
        inputs = raw_inputs(
            observation.state[None],
            workcell.joint_velocities()[None].astype(np.float32),
            np.array([observation.stamp - self._start]),
            self._instruction[None],
            self.variant,
            self._yaw,
        )
        x = features(inputs, self._instruction[None], self.stats)
        out = np.asarray(self._forward(self.params, x))[0]
        rows = (out * self.stats.target_std + self.stats.target_mean).reshape(
            self.horizon, robot.NUM_JOINTS
        )
        mask = () if self.variant.absolute else data.DELTA_ACTION_MASK
        rows = Normalizer.absolute_actions(rows, observation.state[: robot.NUM_JOINTS], mask)
        return np.asarray(rows, np.float64), None


def load(paths: list[str], cache: str) -> dict[str, np.ndarray]:
    """Per step of the successful episodes in `paths`: `state` [N, 20] (joints, then the cube
    detector's tracked (x, y) as the VLA's object state), `qvel` [N, 14], `actions` [N, A, 14]
    (the next A commanded targets, the last repeated), `instruction` one-hots, `time` [N] (s
    since the episode began), `episode` [N]. From `cache` when it exists (written otherwise)."""
    if cache and Path(cache).exists():
        return dict(np.load(cache))
    horizon = get_model_config("workcell_objects").action_horizon
    parts: dict[str, list[np.ndarray]] = {}
    for index, path in enumerate(paths):
        ep = recorder.read_episode(path)
        if not ep.success:
            continue
        steps = ep.qpos.shape[0]
        cubes = workcell_cubes.episode_cube_states(ep.images[workcell_cubes.CAMERA])
        spec = tasks.sample_episode(ep.seed, ep.instruction)
        rows = data.chunk_indices(steps, horizon)
        for name, value in (
            ("state", np.concatenate([ep.qpos.astype(np.float32), cubes], axis=1)),
            ("qvel", ep.qvel.astype(np.float32)),
            ("actions", ep.action[rows].astype(np.float32)),
            ("instruction", np.repeat(instruction_features(ep.instruction)[None], steps, 0)),
            ("time", (ep.timestamps - ep.timestamps[0]).astype(np.float32)),
            ("episode", np.full((steps,), index, np.int32)),
            ("yaw", np.full((steps,), spec.objects[spec.target][2], np.float32)),
        ):
            parts.setdefault(name, []).append(value)
    out = {name: np.concatenate(values) for name, values in parts.items()}
    if cache:
        np.savez(cache, **out)
    return out


def fit(
    arrays: dict[str, np.ndarray],
    trainable: np.ndarray,
    variant: Variant,
    args,
    relabelled: np.ndarray | None = None,
):
    """Trains the MLP on the rows `trainable`; returns (params, stats, losses, seconds). With
    `args.dagger_share` and a `relabelled` row mask, that share of each batch is drawn from the
    relabelled rows (the rest from the others); otherwise rows are drawn uniformly."""
    inputs = raw_inputs(
        arrays["state"],
        arrays["qvel"],
        arrays["time"],
        arrays["instruction"],
        variant,
        arrays.get("yaw"),
    )
    y_raw = targets(arrays["actions"], arrays["state"], variant)
    stats = Stats(
        input_mean=inputs[trainable].mean(0),
        input_std=inputs[trainable].std(0) + 1e-3,
        target_mean=y_raw[trainable].mean(0),
        target_std=y_raw[trainable].std(0) + 1e-3,
    )
    training = np.flatnonzero(trainable)
    share = getattr(args, "dagger_share", None)
    if share is not None and relabelled is not None and relabelled[trainable].any():
        pools = (np.flatnonzero(trainable & ~relabelled), np.flatnonzero(trainable & relabelled))
        counts = (args.batch_size - round(share * args.batch_size), round(share * args.batch_size))
    else:
        pools, counts = (training,), (args.batch_size,)
    arm_dims = np.flatnonzero(data.DELTA_ACTION_MASK)
    grippers = np.array([robot.gripper_index(arm) for arm in robot.ARMS])

    def batches(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        index = np.concatenate(
            [pool[rng.integers(0, len(pool), n)] for pool, n in zip(pools, counts, strict=True)]
        )
        state = arrays["state"][index].copy()
        if variant.state_noise_rad > 0:
            state[:, arm_dims] += rng.normal(0, variant.state_noise_rad, (len(index), 12))
        if variant.gripper_noise > 0:
            state[:, grippers] += rng.normal(0, variant.gripper_noise, (len(index), 2))
        inputs = raw_inputs(
            state,
            arrays["qvel"][index],
            arrays["time"][index],
            arrays["instruction"][index],
            variant,
            arrays["yaw"][index] if "yaw" in arrays else None,
        )
        y = (targets(arrays["actions"][index], state, variant) - stats.target_mean) / (
            stats.target_std
        )
        return features(inputs, arrays["instruction"][index], stats), y.astype(np.float32)

    started = time.monotonic()
    params, losses = train(
        batches,
        (inputs.shape[1] + arrays["instruction"].shape[1], y_raw.shape[1]),
        args.steps,
        args.lr,
        args.width,
        args.seed,
    )
    return params, stats, losses, time.monotonic() - started


def heldout_error(members, stats, arrays, rows, variant, horizon) -> dict[str, float]:
    """Open-loop error of the chunk on `rows` (robot units)."""
    sub = {name: value[rows] for name, value in arrays.items()}
    inputs = raw_inputs(
        sub["state"], sub["qvel"], sub["time"], sub["instruction"], variant, sub.get("yaw")
    )
    x = features(inputs, sub["instruction"], stats)
    predicted = np.asarray(ensemble(members, x)) * stats.target_std + stats.target_mean
    error = np.abs(predicted - targets(sub["actions"], sub["state"], variant))
    error = error.reshape(-1, horizon, robot.NUM_JOINTS)
    return {
        "first_row_mean_abs_rad": float(error[:, 0].mean()),
        "chunk_mean_abs_rad": float(error.mean()),
        "chunk_max_joint_p90_rad": float(np.percentile(error.max(axis=(1, 2)), 90)),
    }


def evaluate(policy, workcell, seeds: list[int], config: rollout.RolloutConfig):
    """Closed-loop episodes of `policy` on `seeds` (printed as they end)."""
    results = []
    for seed in seeds:
        e = rollout.run_episode(policy, workcell, seed, config)
        results.append(e)
        print(
            f"seed {seed:>4} {e.instruction:45} success={e.success!s:5} "
            f"stage={e.furthest_stage}/{e.num_stages - 1} "
            f"closest={1000 * e.min_pinch_distance_m:.0f}mm first_arm={e.moved_arms[0]} "
            f"({e.arm})",
            flush=True,
        )
    return results


def collect(policy, workcell, seeds, config, beta, regrasp_m, first_episode, expert_kind):
    """DAgger: runs `policy` on `seeds`, labels every observation with the feedback expert's
    chunk (`training.dagger`); returns the rows as `load` returns them and the episodes."""
    from oxygen_ros.training import dagger

    expert = dagger.make_labeller(expert_kind, workcell, regrasp_m)
    labels = dagger.Labels()
    labelling = dagger.LabellingPolicy(policy, expert, labels, beta=beta, seed=first_episode)
    episodes = evaluate(labelling, workcell, seeds, config)
    out = labels.arrays()
    specs = {seed: tasks.sample_episode(seed) for seed in seeds}
    episode_of = {seed: first_episode + i for i, seed in enumerate(seeds)}
    out["instruction"] = np.stack(
        [instruction_features(specs[s].instruction) for s in out["seed"]]
    )
    out["yaw"] = np.array([specs[s].objects[specs[s].target][2] for s in out["seed"]], np.float32)
    out["episode"] = np.array([episode_of[s] for s in out["seed"]], np.int32)
    del out["seed"]
    return out, episodes


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", required=True, nargs="+", help="directories of episode_*.hdf5")
    parser.add_argument(
        "--cache",
        nargs="*",
        default=[],
        help="per --data directory: npz of its arrays (made if absent)",
    )
    parser.add_argument("--heldout", type=int, default=50, help="last N episodes: error only")
    parser.add_argument("--seeds", default="0:20", help="closed-loop rollout seeds")
    parser.add_argument("--steps", type=int, default=20000)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--fits", type=int, default=1, help="MLPs per round (seeds from --seed), outputs averaged"
    )
    parser.add_argument("--execute-s", type=float, default=0.1)
    parser.add_argument("--velocity", action="store_true")
    parser.add_argument("--time", action="store_true")
    parser.add_argument("--absolute", action="store_true")
    parser.add_argument("--target", action="store_true")
    parser.add_argument("--no-joints", action="store_true")
    parser.add_argument("--state-noise-rad", type=float, default=0.0)
    parser.add_argument("--gripper-noise", type=float, default=0.0)
    parser.add_argument("--yaw", action="store_true")
    parser.add_argument("--pinch", action="store_true")
    parser.add_argument("--dagger-rounds", type=int, default=0, help="DAgger iterations")
    parser.add_argument("--dagger-episodes", type=int, default=40, help="learner episodes each")
    parser.add_argument("--dagger-seed-start", type=int, default=5000)
    parser.add_argument("--beta", type=float, default=0.0, help="chance a frame runs the expert")
    parser.add_argument("--regrasp-m", type=float, default=0.03, help="expert's lost-grasp limit")
    parser.add_argument(
        "--expert", choices=("feedback", "reactive"), default="feedback", help="DAgger labeller"
    )
    parser.add_argument(
        "--dagger-cache", default="", help="npz: the DAgger rows (saved each round)"
    )
    parser.add_argument(
        "--dagger-init", nargs="*", default=[], help="npz of earlier DAgger rows (--dagger-cache)"
    )
    parser.add_argument(
        "--dagger-share", type=float, default=None, help="share of each batch from DAgger rows"
    )
    parser.add_argument("--out", default="")
    args = parser.parse_args(argv)
    variant = Variant(
        velocity=args.velocity,
        time=args.time,
        absolute=args.absolute,
        target=args.target,
        joints=not args.no_joints,
        state_noise_rad=args.state_noise_rad,
        gripper_noise=args.gripper_noise,
        yaw=args.yaw,
        pinch=args.pinch,
    )
    horizon = get_model_config("workcell_objects").action_horizon

    if args.cache and len(args.cache) != len(args.data):
        parser.error("give one --cache per --data directory (or none)")
    started = time.monotonic()
    parts = [
        load(sorted(glob.glob(str(Path(d) / "episode_*.hdf5"))), cache)
        for d, cache in zip(args.data, args.cache or [""] * len(args.data), strict=True)
    ]
    offsets = np.cumsum([0] + [int(p["episode"].max()) + 1 for p in parts[:-1]])
    for part, offset in zip(parts, offsets, strict=True):
        part["episode"] = part["episode"] + offset
    arrays = {name: np.concatenate([p[name] for p in parts]) for name in parts[0]}
    load_s = time.monotonic() - started
    episodes = np.unique(arrays["episode"])
    test = np.isin(arrays["episode"], episodes[-args.heldout :])
    print(f"{(~test).sum()} training samples, {test.sum()} held out, loaded in {load_s:.0f} s")

    from oxygen_ros.sim.workcell import Workcell, WorkcellConfig

    rollout_config = rollout.RolloutConfig(
        execute_s=args.execute_s, object_state="positions", speak=False
    )
    workcell = Workcell(WorkcellConfig())
    rounds = []
    demo_rows = len(test)  # the DAgger rows follow
    for path in args.dagger_init:
        earlier = dict(np.load(path))
        earlier["episode"] = (
            earlier["episode"] - earlier["episode"].min() + arrays["episode"].max() + 1
        )
        arrays = {name: np.concatenate([arrays[name], earlier[name]]) for name in arrays}
        test = np.concatenate([test, np.zeros(len(earlier["state"]), bool)])
        print(f"{len(earlier['state'])} DAgger rows from {path}")
    try:
        for round_index in range(args.dagger_rounds + 1):
            relabelled = np.arange(len(test)) >= demo_rows
            members, losses, train_s = [], [], 0.0
            for member in range(args.fits):  # same data and stats, seeds seed, seed + 1, ...
                member_args = argparse.Namespace(**{**vars(args), "seed": args.seed + member})
                params, stats, member_losses, seconds = fit(
                    arrays, ~test, variant, member_args, relabelled
                )
                members.append(params)
                losses.append(member_losses)
                train_s += seconds
            losses = losses[0] if args.fits == 1 else losses
            heldout = heldout_error(members, stats, arrays, test, variant, horizon)
            print(f"round {round_index}: {(~test).sum()} samples, held out {heldout}", flush=True)
            policy = StatePolicy(members, stats, horizon, variant)
            results = evaluate(policy, workcell, rollout.parse_seeds(args.seeds), rollout_config)
            summary = rollout.summarise(results)
            print(json.dumps({"round": round_index, **summary}), flush=True)
            record = {
                "round": round_index,
                "samples": int((~test).sum()),
                "train_s": train_s,
                "losses": losses,
                "heldout": heldout,
                "summary": summary,
                "episodes": [dataclasses.asdict(e) for e in results],
            }
            rounds.append(record)
            if round_index == args.dagger_rounds:
                break
            first = args.dagger_seed_start + round_index * args.dagger_episodes
            seeds = list(range(first, first + args.dagger_episodes))
            collect_started = time.monotonic()
            new, visited = collect(
                policy,
                workcell,
                seeds,
                rollout_config,
                args.beta,
                args.regrasp_m,
                int(arrays["episode"].max()) + 1,
                args.expert,
            )
            record["collected"] = {
                "seeds": [first, first + args.dagger_episodes],
                "rows": len(new["state"]),
                "learner_success_rate": rollout.summarise(visited)["success_rate"],
                "collect_s": time.monotonic() - collect_started,
            }
            print(f"collected {record['collected']}", flush=True)
            arrays = {name: np.concatenate([arrays[name], new[name]]) for name in arrays}
            test = np.concatenate([test, np.zeros(len(new["state"]), bool)])
            if args.dagger_cache:
                np.savez(
                    args.dagger_cache,
                    **{n: v[demo_rows:] for n, v in arrays.items()},
                )
            if args.out:
                Path(args.out).write_text(
                    json.dumps({"args": vars(args), "rounds": rounds}, indent=1)
                )
    finally:
        workcell.close()
    print(json.dumps({"variant": dataclasses.asdict(variant), **rounds[-1]["summary"]}))
    if args.out:
        Path(args.out).write_text(
            json.dumps({"args": vars(args), "load_s": load_s, "rounds": rounds}, indent=1)
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
