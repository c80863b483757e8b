"""Diagnostic: does the VLA's prefix carry what an MLP needs to act? (ROS-free; engine + workcell.)

Run 45 left two suspects for the gap between the VLA (28 % of held-out episodes) and an MLP on
the same prompt bins, sample budget and flow head (71-78 %): the transformer over the prompt
(does its key/value cache still hold the state precisely enough?) and the action expert that
reads it. This diagnostic splits them. It serves a checkpoint's prefix exactly as the engine does
(`model_fns.prefill`, every camera masked: the line's checkpoints act as well blind), takes the
key/value cache of the prompt's tokens (every layer, right-aligned so the state's tokens and the
prompt's end sit at fixed places whatever the instruction's length) as the features, and fits
`state_policy`'s MLP (3 x 512, regression) from them to the demonstrations' normalised action
chunks, in place of the action expert. Reported: the held-out action error in the units of
`train`'s `val_action_mae_rad` (the VLA's own is in its run.json), and the closed loop on
held-out seeds through `training.rollout` (blind, 0.2 s per chunk).

`--features state` (the normalised state the prompt is written from) or `bins` (as much as the
prompt keeps of it: each number's bin) fits the same MLP on the same samples from the numbers
instead: the baseline. `--flow-steps N --flow-draws K` fits the MLP as a flow-matching velocity
field sampled from noise in N steps instead (`mlp_policy.train_flow`), as the action
expert is trained and sampled (`--noise-scale 0`: from zero). `--features linear` reads the raw
state with the target state's hand-to-cube offsets back in metres (the state stores sign(d) *
sqrt(|d|)). `--min-std` is added to each feature's std where the MLP normalises its inputs (a
feature the data never moves is divided by it alone; the report counts them).

If the MLP on the cache acts about as well as the MLP on the bins, the prefix holds the state
and the action expert is what falls short; if it acts as badly as the VLA, the prefix does.

`python -P -m oxygen_ros.training.diagnostics.prefix_head --checkpoint DIR --data A,B --heldout 50
--seeds 0:120 --out F.json` from the repository root. Nothing here imports rclpy.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from oxygen_ros.engine import model_fns
from oxygen_ros.engine.config import SchedulerConfig
from oxygen_ros.engine.engine import Engine
from oxygen_ros.perception import workcell_cubes
from oxygen_ros.sim import robot
from oxygen_ros.training import data, expert_stage, rollout
from oxygen_ros.training.diagnostics import mlp_policy, state_policy
from oxygen_ros.training.train import engine_config

FEATURES = ("cache", "state", "bins", "linear")


def cache_features(
    engine: Engine,
    tokens: np.ndarray,
    token_mask: np.ndarray,
    layers: Sequence[int] | None = None,
) -> np.ndarray:
    """[B, F] float32: the prefix's keys and values at the prompt's tokens, at `layers` (None:
    every layer), with the valid tokens right-aligned in `max_token_len` places (padding
    zero); cameras masked."""
    import jax.numpy as jnp

    model_config = engine.config.model
    batch = len(tokens)
    shape = (batch, *model_config.image_resolution, 3)
    images = {k: jnp.zeros(shape, jnp.float32) for k in model_config.image_keys}
    masks = {k: jnp.zeros((batch,), bool) for k in model_config.image_keys}
    inputs = model_fns.PrefixInputs(images, masks, jnp.asarray(tokens), jnp.asarray(token_mask))
    prefix = engine.runner.model.prefill(inputs)  # the engine's jitted prefill, batch B
    length = tokens.shape[1]
    k = np.asarray(prefix.k)[:, :, -length:]  # [L, B, T, K, H]: the prompt's places
    v = np.asarray(prefix.v)[:, :, -length:]
    if layers is not None:
        k, v = k[list(layers)], v[list(layers)]
    kv = np.concatenate([k, v], axis=-1)  # [L, B, T, K, 2H]
    kv = np.moveaxis(kv, 1, 0).reshape(batch, kv.shape[0], length, -1)  # [B, L, T, F]
    out = np.zeros_like(kv)
    for b, n in enumerate(token_mask.sum(axis=1)):
        out[b, :, length - n :] = kv[b, :, :n]
    return out.reshape(batch, -1).astype(np.float32)


def state_features(
    engine: Engine, states: np.ndarray, instructions: Sequence[str], kind: str
) -> np.ndarray:
    """[B, F] float32: the instruction's words (`state_policy.instruction_features`) and the
    normalised state (`state`), or as much as the prompt keeps of it (`bins`: each of its 256
    bins as the bin's centre, -1 below the range)."""
    normalised = engine.normalizer.normalize_state(np.asarray(states, np.float32))
    if kind == "linear":  # the raw state, each hand-to-cube offset back in metres
        normalised = linear_offsets(np.asarray(states, np.float32))
    if kind == "bins":
        normalised = mlp_policy.prompt_bin_centres(normalised)
    words = {text: state_policy.instruction_features(text) for text in set(instructions)}
    return np.concatenate(
        [np.stack([words[text] for text in instructions]), normalised], axis=1
    ).astype(np.float32)


def linear_offsets(states: np.ndarray) -> np.ndarray:
    """`states` [B, D] of the target object state with its hand-to-cube offsets (stored as
    sign(d) * sqrt(|d|), `workcell_cubes.reach_offsets`) turned back into metres d; the rest
    unchanged."""
    names = data.state_names(workcell_cubes.TARGET)
    if states.shape[1] != len(names):
        raise ValueError(f"linear features read the target state ({len(names)} numbers)")
    out = np.array(states, np.float32)
    for i, name in enumerate(names):
        if name.rsplit(".", 1)[-1] in workcell_cubes.REACH_FIELDS:
            out[:, i] = out[:, i] * np.abs(out[:, i])
    return out


def features_of(
    engine: Engine,
    samples: data.Samples,
    eps: data.Episodes,
    kind: str,
    batch_size: int = 64,
    layers: Sequence[int] | None = None,
) -> np.ndarray:
    if kind != "cache":
        instructions = [eps.specs[int(e)].instruction for e in eps.episode]
        return state_features(engine, eps.state, instructions, kind)
    parts = []
    for start in range(0, len(samples), batch_size):
        part = slice(start, start + batch_size)
        tokens, mask = samples.tokens[part], samples.token_mask[part]
        if len(tokens) < batch_size:  # one compiled shape: pad the last batch
            pad = batch_size - len(tokens)
            tokens = np.concatenate([tokens, np.repeat(tokens[-1:], pad, axis=0)])
            mask = np.concatenate([mask, np.repeat(mask[-1:], pad, axis=0)])
        parts.append(cache_features(engine, tokens, mask, layers)[: len(samples.tokens[part])])
    return np.concatenate(parts)


def feature_stats(features: np.ndarray, min_std: float) -> dict[str, np.ndarray]:
    """The MLP's input normalisation: per feature the mean and the std plus `min_std` (a
    feature the training data barely moves is divided by about `min_std`, so a small departure
    from it in the closed loop is magnified up to 1 / min_std), and which features have a
    spread below `min_std`."""
    spread = features.std(0)
    return {"mean": features.mean(0), "std": spread + min_std, "below_min_std": spread < min_std}


@dataclasses.dataclass
class CacheHead:
    """The MLP on the prefix cache, acting as a rollout policy (reset/act)."""

    engine: Engine
    params: list
    stats: dict[str, np.ndarray]
    kind: str = "cache"  # what the MLP reads: cache, state or bins (FEATURES)
    flow_steps: int = 0  # > 0: the MLP is a flow-matching velocity field sampled from noise
    noise_scale: float = 1.0  # the flow's starting noise times this (0: from zero)
    layers: tuple[int, ...] | None = None  # the cache's layers it reads (None: every layer)

    def reset(self, workcell, spec) -> None:
        pass

    def predict(self, features: np.ndarray) -> np.ndarray:
        """Normalised chunks [B, A, 14] for features [B, F]."""
        import jax.numpy as jnp

        x = jnp.asarray((features - self.stats["mean"]) / self.stats["std"], jnp.float32)
        if self.flow_steps:
            width = len(self.params[-1]["b"])
            noise = self.noise_scale * self._rng.standard_normal((len(features), width))
            noise = noise.astype(np.float32)
            y = np.asarray(mlp_policy.flow_sample(self.params, x, noise, self.flow_steps))
        else:
            y = np.asarray(state_policy.mlp(self.params, x))
        return y.reshape(len(features), -1, robot.NUM_JOINTS)

    def __post_init__(self) -> None:
        self._rng = np.random.default_rng(0)

    def act(self, workcell, observation) -> tuple[np.ndarray, None]:
        if self.kind == "cache":
            inputs = self.engine.prepare_inputs(observation)
            tokens, mask = np.asarray(inputs.tokens), np.asarray(inputs.token_mask)
            features = cache_features(self.engine, tokens, mask, self.layers)
        else:
            features = state_features(
                self.engine, observation.state[None], [observation.prompt], self.kind
            )
        chunk = self.predict(features)[0]
        normalizer = self.engine.normalizer
        rows = normalizer.unnormalize_actions(chunk)
        rows = normalizer.absolute_actions(rows, observation.state, self.engine.delta_action_mask)
        return np.asarray(rows, np.float64)[:, : robot.NUM_JOINTS], None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--preset", default="workcell_target_bins")
    parser.add_argument("--object-state", default="target")
    parser.add_argument("--data", required=True, help="demonstration dirs, comma-separated")
    parser.add_argument("--heldout", type=int, default=50)
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--min-std",
        type=float,
        default=1e-3,
        help="added to each feature's std: a feature the data barely moves is divided by it",
    )
    parser.add_argument("--features", choices=FEATURES, default="cache")
    parser.add_argument("--flow-steps", type=int, default=0, help="> 0: a flow head (openpi's)")
    parser.add_argument("--flow-draws", type=int, default=1, help="(noise, time) per sample")
    parser.add_argument("--noise-scale", type=float, default=1.0, help="0: sample from zero")
    parser.add_argument("--layers", default="", help="cache layers read, e.g. 0,1 ('' = all)")
    parser.add_argument("--seeds", default="0:120", help="closed-loop seeds ('' = none)")
    parser.add_argument("--workers", type=int, default=2, help="episode readers")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    started = time.monotonic()
    served = engine_config(
        args.checkpoint, preset=args.preset, scheduler=SchedulerConfig(mode="shared_kv")
    )
    engine = Engine(served)
    # As train does: arm joints relative to the state (the checkpoint's delta mask).
    train_s, held_s, (train_eps, heldout_eps) = expert_stage.load_samples(
        engine, args.data, args.preset, args.object_state, args.heldout, args.workers
    )
    layers = tuple(int(x) for x in args.layers.split(",")) if args.layers else None
    x_train = features_of(engine, train_s, train_eps, args.features, layers=layers)
    x_held = features_of(engine, held_s, heldout_eps, args.features, layers=layers)
    print(f"features {x_train.shape} in {time.monotonic() - started:.0f} s", flush=True)
    y_train = train_s.actions[..., : robot.NUM_JOINTS].reshape(len(train_s), -1)
    stats = feature_stats(x_train, args.min_std)
    xn = ((x_train - stats["mean"]) / stats["std"]).astype(np.float32)

    def batches(rng: np.random.Generator):
        index = rng.integers(0, len(xn), args.batch_size)
        return xn[index], y_train[index]

    sizes = (xn.shape[1], y_train.shape[1])
    if args.flow_steps:
        params = mlp_policy.train_flow(
            batches, sizes, args.steps, 1e-3, 512, args.seed, args.flow_draws
        )
    else:
        params, _ = state_policy.train(batches, sizes, args.steps, 1e-3, 512, args.seed)
    head = CacheHead(
        engine, params, stats, args.features, args.flow_steps, args.noise_scale, layers
    )
    normalizer = engine.normalizer
    predicted = normalizer.unnormalize_actions(head.predict(x_held))
    want = normalizer.unnormalize_actions(held_s.actions[..., : robot.NUM_JOINTS])
    report = {
        "args": vars(args),
        "features": int(x_train.shape[1]),
        "train_samples": len(train_s),
        "heldout_samples": len(held_s),
        "heldout_action_mae_rad": float(np.abs(predicted - want).mean()),
        # features whose spread in the training data is below the floor: a departure on
        # them in the closed loop is magnified by up to 1 / min_std
        "features_below_min_std": int(stats["below_min_std"].sum()),
    }
    print(report, flush=True)
    if args.seeds:
        cfg = rollout.RolloutConfig(
            execute_s=0.2,
            object_state=args.object_state,
            preset=args.preset,
            blind=True,
            speak=False,
            resolution=served.model.image_resolution,
        )
        from oxygen_ros.sim.workcell import Workcell, WorkcellConfig

        workcell = Workcell(WorkcellConfig())
        episodes = []
        try:
            for seed in rollout.parse_seeds(args.seeds):
                episodes.append(rollout.run_episode(head, workcell, seed, cfg))
                print(rollout.episode_line(seed, episodes[-1]), flush=True)
        finally:
            workcell.close()
        report["summary"] = rollout.summarise(episodes)
        report["successful_seeds"] = [e.seed for e in episodes if e.success]
        print(report["summary"], flush=True)
    report["wall_s"] = time.monotonic() - started
    Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
