"""Stage two of training: the action expert alone, on a trained checkpoint's frozen prefix.

pi0.5's action expert reads the prefix LLM's key/value cache and nothing else of the
observation (`model_fns.action_velocity`). With the prefix frozen (the vision tower, embedding
and prefix LLM exactly as a trained checkpoint has them), that cache is a constant of each
training sample, so this stage computes it once with the engine's own prefill (with the
cameras and, for image dropout, with every camera masked), then trains only the expert's
leaves (the Gemma's `_1` weights, the action in/out projections and the time MLP) with
openpi's flow-matching loss (`loss.flow_inputs`, `loss.draw_velocities`, `loss.flow_loss`:
`Pi0.compute_loss`'s draws, target and mean square). A step costs the expert's forward and
backward only: no image tower, no prefix pass, no backward through either.

The expert may take a new shape (`expert_preset`: a preset with the same prefix LLM, vision
tower, prompt budget and horizon and another action expert, for example
`workcell_target_e256`), trained from its own initialisation; else the checkpoint's own expert
is fine-tuned (`reinit`: re-initialised). The output is an openpi-layout checkpoint the engine
serves through `checkpoint_dir` with `expert_preset`: the starting checkpoint's prefix leaves
bit for bit, the trained expert, and the starting checkpoint's assets (norm stats, tokenizer,
delta-action mask, state layout), so what it speaks is exactly what the starting checkpoint
speaks.

`python -P -m oxygen_ros.training.expert_stage --checkpoint DIR --data A,B --out DIR
[--expert-preset P] [--steps N] ...` from the repository root.

Invariant: nothing here imports rclpy.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import hashlib
import json
import logging
import pathlib
import time
from collections.abc import Sequence

import flax.nnx as nnx
import jax
import jax.numpy as jnp
import numpy as np
import optax

from oxygen_ros.engine import model_fns
from oxygen_ros.engine.checkpoint import Normalizer, load_norm_stats, load_params
from oxygen_ros.engine.checkpoint_assets import (
    load_delta_action_mask,
    load_narration_numbers,
    load_state_layout,
)
from oxygen_ros.engine.config import ModelConfig, PromptConfig, get_model_config
from oxygen_ros.engine.engine import Engine
from oxygen_ros.engine.model import Pi05Model, abstract_model, create_model
from oxygen_ros.engine.tokenizer import TOKENIZER_FILE
from oxygen_ros.training import data as _data
from oxygen_ros.training import evaluation as _evaluation
from oxygen_ros.training import loss as _loss
from oxygen_ros.training import train as _train
from oxygen_ros.training import trainer as _trainer
from oxygen_ros.training.train_config import TrainConfig

logger = logging.getLogger("oxygen_ros.training")

# The action expert's leaves outside the Gemma (pi0.5's action in/out projections and the
# time MLP that feeds adaRMS); inside it, every module of the second expert ends in "_1".
EXPERT_MODULES = ("action_in_proj", "action_out_proj", "time_mlp_in", "time_mlp_out")
LLM_PATH = ("PaliGemma", "llm")


@dataclasses.dataclass(frozen=True)
class StageConfig:
    checkpoint: str  # the trained checkpoint whose prefix is frozen
    data_dir: str  # demonstration directories, comma-separated (as train's)
    out_dir: str
    preset: str = "workcell_target_bins"  # the checkpoint's preset
    expert_preset: str = ""  # the served preset ("" = preset): same prefix, this expert
    reinit: bool = False  # a fresh expert even when its shape is the checkpoint's
    object_state: str = "target"
    heldout: int = 50  # held-out episodes (the highest seeds), as train's
    steps: int = 6000
    batch_size: int = 128
    action_draws: int = 4  # (noise, time) draws per row against its cache
    noise_scale: float = 1.0  # the flow's training noise times this (0: the path from zero)
    peak_lr: float = 1e-3
    end_lr: float = 2e-5
    warmup_steps: int = 200
    weight_decay: float = 1e-4
    clip_norm: float = 1.0
    image_dropout: float = 0.5  # share of rows read from the cache with every camera masked
    early_steps: int = 10  # as train's: the first steps of each episode drawn more often
    early_weight: float = 2.0
    eval_every: int = 1000
    seed: int = 0
    assets_id: str = "workcell"
    cache_dir: str = ""  # keep the prefix caches here and reuse them ("" = recompute)

    def __post_init__(self) -> None:
        if self.steps < 1 or self.batch_size < 1 or self.action_draws < 1:
            raise ValueError("steps, batch_size and action_draws must be >= 1")
        if not 0.0 <= self.image_dropout <= 1.0:
            raise ValueError(f"image_dropout must be in [0, 1], got {self.image_dropout}")
        if not 0.0 <= self.noise_scale <= 1.0:
            raise ValueError(f"noise_scale must be in [0, 1], got {self.noise_scale}")

    @property
    def served_preset(self) -> str:
        return self.expert_preset or self.preset


def is_expert_leaf(path: Sequence) -> bool:
    """Whether a model state leaf (its key path) belongs to the action expert."""
    names = _trainer.leaf_names(path)
    if names[:1] and names[0] in EXPERT_MODULES:
        return True
    return names[:2] == LLM_PATH and any(n.endswith("_1") for n in names[2:])


def check_expert_preset(prefix_config: ModelConfig, expert_config: ModelConfig) -> None:
    """Raises ValueError unless the two presets differ at most in the action expert."""
    same = dataclasses.replace(
        expert_config,
        name=prefix_config.name,
        action_expert_variant=prefix_config.action_expert_variant,
    )
    if same != prefix_config:
        raise ValueError(
            f"{expert_config.name!r} differs from {prefix_config.name!r} in more than the "
            "action expert; the frozen prefix needs the same prefix LLM, vision tower, "
            "prompt budget and horizon"
        )


def stage_model(trained: Pi05Model, expert_config: ModelConfig, reinit: bool, seed: int):
    """The model to train: `trained`'s prefix leaves, and its expert unless `reinit` or the
    expert's shape differs (then `expert_config`'s own initialisation from `seed`)."""
    if expert_config == trained.config and not reinit:
        return trained
    fresh = create_model(expert_config, seed=seed)
    source = dict(jax.tree_util.tree_flatten_with_path(nnx.state(trained))[0])
    graphdef, state = nnx.split(fresh)
    flat, treedef = jax.tree_util.tree_flatten_with_path(state)
    leaves = []
    for path, leaf in flat:
        if is_expert_leaf(path):
            leaves.append(leaf)
            continue
        kept = source[path]
        if np.shape(kept) != np.shape(leaf):
            raise ValueError(f"prefix leaf {jax.tree_util.keystr(path)} changed shape")
        leaves.append(kept)
    return nnx.merge(graphdef, jax.tree.unflatten(treedef, leaves))


@dataclasses.dataclass(frozen=True)
class _Statics:
    """What the jitted functions close over (everything but parameters and data)."""

    model_config: ModelConfig
    optimizer: _trainer.OptimizerSettings
    action_draws: int
    noise_scale: float = 1.0


class _StageFns:
    """Jitted step / losses / act for one `_Statics`, shared by every `ExpertTrainer` with it
    (a second run in the same process compiles nothing)."""

    def __init__(self, statics: _Statics) -> None:
        self.statics = statics
        self.graphdef, state = nnx.split(abstract_model(statics.model_config))
        flat, self.treedef = jax.tree_util.tree_flatten_with_path(state)
        self.expert = tuple(i for i, (path, _) in enumerate(flat) if is_expert_leaf(path))
        if not self.expert:
            raise ValueError("the model has no action expert leaves")
        self.schedule, self.optimizer = _trainer.make_optimizer(statics.optimizer)
        self.step = jax.jit(self._step, donate_argnums=(0, 1))
        self.losses = jax.jit(self._losses)
        self.act = jax.jit(self._act)

    def split(self, leaves: Sequence[jax.Array]) -> tuple[list, list]:
        """(expert leaves, every other leaf), each in tree order."""
        expert = set(self.expert)
        return [leaves[i] for i in self.expert], [
            x for i, x in enumerate(leaves) if i not in expert
        ]

    def model(self, params: Sequence[jax.Array], frozen: Sequence[jax.Array]) -> Pi05Model:
        expert = dict(zip(self.expert, params, strict=True))
        rest = iter(frozen)
        count = len(self.expert) + len(frozen)
        leaves = [expert[i] if i in expert else next(rest) for i in range(count)]
        return nnx.merge(self.graphdef, jax.tree.unflatten(self.treedef, leaves))

    def _losses(self, params, frozen, rng, prefix: model_fns.Prefix, actions):
        statics = self.statics
        _, x_t, u_t, time = _loss.flow_inputs(
            rng, actions, statics.action_draws, statics.noise_scale
        )
        v_t = _loss.draw_velocities(self.model(params, frozen), prefix, x_t, time)
        return _loss.flow_loss(v_t, u_t)

    def _step(self, params, opt_state, frozen, rng, prefix, actions):
        def objective(p):
            return jnp.mean(self._losses(p, frozen, rng, prefix, actions))

        loss, grads = jax.value_and_grad(objective)(params)
        updates, opt_state = self.optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        return params, opt_state, {"action_loss": loss, "grad_norm": optax.tree.norm(grads)}

    def _act(self, params, frozen, prefix, noise):
        model = self.model(params, frozen)
        return model_fns.denoise(model, prefix, noise, model.config.num_denoise_steps)


@functools.cache
def _stage_fns(statics: _Statics) -> _StageFns:
    return _StageFns(statics)


class ExpertTrainer:
    """The expert's leaves and optimiser state; every other leaf is a constant argument of
    the jitted step (never differentiated, never changed)."""

    def __init__(self, model: Pi05Model, config: StageConfig) -> None:
        self._fns = _stage_fns(
            _Statics(
                model.config,
                _trainer.OptimizerSettings.of(config),
                config.action_draws,
                config.noise_scale,
            )
        )
        leaves, treedef = jax.tree.flatten(nnx.state(model))
        if treedef != self._fns.treedef:
            raise ValueError(f"model state does not match the {model.config.name!r} tree")
        self.params, self.frozen = self._fns.split(leaves)
        self.schedule = self._fns.schedule
        self.opt_state = self._fns.optimizer.init(self.params)

    def step(self, rng: jax.Array, prefix: model_fns.Prefix, actions) -> dict[str, float]:
        self.params, self.opt_state, metrics = self._fns.step(
            self.params, self.opt_state, self.frozen, rng, prefix, actions
        )
        return {k: float(v) for k, v in metrics.items()}

    def losses(self, rng: jax.Array, prefix: model_fns.Prefix, actions) -> np.ndarray:
        """Per-row flow-matching loss [B, A] (no update)."""
        return np.asarray(self._fns.losses(self.params, self.frozen, rng, prefix, actions))

    def actions(self, prefix: model_fns.Prefix, noise) -> np.ndarray:
        """Denoised chunks [B, A, J] (normalised), the engine's denoise."""
        return np.asarray(self._fns.act(self.params, self.frozen, prefix, noise))

    def full_params(self) -> dict:
        return nnx.to_pure_dict(nnx.state(self._fns.model(self.params, self.frozen)))


class PrefixCache:
    """Every sample's prefix cache (the engine's prefill), sample-major on the host: keys and
    values [N, L, S, K, H] and mask [N, S], with the cameras (`seen`) and every camera masked
    (`blind`); `take` gathers one batch as a `model_fns.Prefix`."""

    def __init__(self, engine: Engine, samples: _data.Samples, batch_size: int = 64) -> None:
        self.seen = self._compute(engine, samples, batch_size, cameras=True)
        self.blind = self._compute(engine, samples, batch_size, cameras=False)

    ARRAYS = ("seen_k", "seen_v", "seen_mask", "blind_k", "blind_v", "blind_mask")

    def save(self, path: pathlib.Path, key: dict) -> None:
        """The arrays as one .npy each under `path`, with `key` (what they were computed
        from) in key.json."""
        path.mkdir(parents=True, exist_ok=True)
        for name, array in zip(self.ARRAYS, (*self.seen, *self.blind), strict=True):
            if name.endswith(("_k", "_v")):  # bfloat16 is no numpy dtype: its bits
                array = array.view(np.dtype(f"u{array.dtype.itemsize}"))
            np.save(path / f"{name}.npy", array)
        (path / "key.json").write_text(json.dumps(key, sort_keys=True))

    @classmethod
    def load(cls, path: pathlib.Path, key: dict, dtype) -> PrefixCache | None:
        """The cache `save` wrote for the same `key`; None if there is none."""
        if not (path / "key.json").is_file():
            return None
        if json.loads((path / "key.json").read_text()) != json.loads(json.dumps(key)):
            raise ValueError(f"{path} holds a prefix cache of other inputs; remove it")
        arrays = []
        for name in cls.ARRAYS:
            array = np.load(path / f"{name}.npy")
            arrays.append(array.view(dtype) if name.endswith(("_k", "_v")) else array)
        cache = cls.__new__(cls)
        cache.seen, cache.blind = tuple(arrays[:3]), tuple(arrays[3:])
        return cache

    @staticmethod
    def _compute(engine: Engine, samples: _data.Samples, batch_size: int, cameras: bool):
        if len(samples) == 0:
            raise ValueError("no samples to compute a prefix cache of")
        image_keys = engine.config.model.image_keys
        out: tuple[np.ndarray, ...] = ()  # filled in place: no second copy at the end
        for start in range(0, len(samples), batch_size):
            index = np.arange(start, min(start + batch_size, len(samples)))
            count = len(index)
            index = np.concatenate([index, np.repeat(index[-1:], batch_size - count)])
            batch = _trainer.to_batch(samples.take(index), image_keys)
            if not cameras:
                batch = _trainer.drop_images(batch, np.zeros(batch_size, bool))
            inputs = model_fns.PrefixInputs(
                batch.images, batch.image_masks, batch.tokens, batch.token_mask
            )
            prefix = engine.runner.model.prefill(inputs)  # one compiled shape
            parts = (
                np.moveaxis(np.asarray(prefix.k), 1, 0),
                np.moveaxis(np.asarray(prefix.v), 1, 0),
                np.asarray(prefix.mask),
            )
            if not out:
                out = tuple(np.empty((len(samples), *p.shape[1:]), p.dtype) for p in parts)
            for array, part in zip(out, parts, strict=True):
                array[start : start + count] = part[:count]
        return out

    def take(self, index: np.ndarray, blind: np.ndarray | None = None) -> model_fns.Prefix:
        """The rows `index`; where `blind` is true, the row's cache with the cameras masked."""
        parts = []
        for seen, masked in zip(self.seen, self.blind, strict=True):
            rows = seen[index]
            if blind is not None and blind.any():
                shape = (len(index),) + (1,) * (rows.ndim - 1)
                rows = np.where(blind.reshape(shape), masked[index], rows)
            parts.append(rows)
        k, v, mask = parts
        return model_fns.Prefix(
            jnp.asarray(np.moveaxis(k, 0, 1)), jnp.asarray(np.moveaxis(v, 0, 1)), jnp.asarray(mask)
        )

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for part in (self.seen, self.blind) for a in part)


def evaluate(
    trainer: ExpertTrainer,
    cache: PrefixCache,
    samples: _data.Samples,
    normalizer: Normalizer,
    robot_dim: int,
    batch_size: int = 256,
) -> dict[str, float]:
    """Held-out: flow loss (fixed draws), and the denoised chunks' error in robot units (as
    train's `val_action_mae_rad`) sampled from fixed noise, from zero, and blind from noise."""
    losses, errors = [], {"noise": [], "zero": [], "blind": []}
    key, noise_key = jax.random.split(jax.random.key(12345))
    for start in range(0, len(samples), batch_size):
        index = np.arange(start, min(start + batch_size, len(samples)))
        actions = jnp.asarray(samples.actions[index])
        prefix = cache.take(index)
        losses.append(trainer.losses(jax.random.fold_in(key, start), prefix, actions))
        noise = jax.random.normal(jax.random.fold_in(noise_key, start), actions.shape)
        want = normalizer.unnormalize_actions(np.asarray(actions)[..., :robot_dim])
        runs = {
            "noise": (prefix, noise),
            "zero": (prefix, jnp.zeros_like(noise)),
            "blind": (cache.take(index, np.ones(len(index), bool)), noise),
        }
        for name, (run_prefix, start_noise) in runs.items():
            got = trainer.actions(run_prefix, start_noise)[..., :robot_dim]
            errors[name].append(np.abs(normalizer.unnormalize_actions(got) - want).mean((1, 2)))
    result = {"val_action_loss": float(np.concatenate(losses).mean())}
    result["val_action_mae_rad"] = float(np.concatenate(errors["noise"]).mean())
    result["val_action_mae_rad_from_zero"] = float(np.concatenate(errors["zero"]).mean())
    result["val_blind_action_mae_rad"] = float(np.concatenate(errors["blind"]).mean())
    return result


def plot_curves(records: list[dict], path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    trained = [r for r in records if "action_loss" in r]
    steps, smooth = _evaluation.smoothed(
        [r["step"] for r in trained], [r["action_loss"] for r in trained], 100
    )
    axes[0].plot(steps, smooth, label="train action_loss")
    val = [r for r in records if "val_action_loss" in r]
    axes[0].plot([r["step"] for r in val], [r["val_action_loss"] for r in val], "o-",
                 label="held-out action_loss")  # fmt: skip
    axes[0].set_yscale("log")
    axes[0].set_xlabel("step")
    axes[0].legend()
    for key in ("val_action_mae_rad", "val_action_mae_rad_from_zero", "val_blind_action_mae_rad"):
        axes[1].plot([r["step"] for r in val], [r[key] for r in val], "o-", label=key)
    axes[1].set_xlabel("step")
    axes[1].set_title("held-out denoised action error (rad, mean)")
    axes[1].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def load_samples(
    engine: Engine,
    data_dir: str,
    preset: str,
    object_state: str,
    heldout: int,
    workers: int,
    *,
    narration_numbers: str,
):
    """(train samples, held-out samples, (train episodes, held-out episodes)) of `data_dir`
    (train's split: the `heldout` highest seeds held out) as the engine's checkpoint trained
    on them: its delta-action mask, norm stats and tokenizer, and its narration's numbers
    (`starting_assets`)."""
    split = TrainConfig(
        data_dir=data_dir, out_dir="", preset=preset, object_state=object_state, heldout=heldout
    )
    episodes = _train.load_split(split, workers)
    samples = []
    for eps in episodes:
        eps.actions = Normalizer.relative_actions(eps.actions, eps.state, engine.delta_action_mask)
        samples.append(
            _data.build_samples(
                eps,
                engine.config.model,
                engine.tokenizer,
                engine.normalizer,
                PromptConfig(),
                narration_numbers=narration_numbers,
            )
        )
    return samples[0], samples[1], episodes


def prefix_digest(model: Pi05Model) -> str:
    """SHA-1 of every leaf the prefix cache depends on (all but the expert's), in tree order:
    checkpoints that differ only in the expert share their caches."""
    digest = hashlib.sha1()
    for path, leaf in jax.tree_util.tree_flatten_with_path(nnx.state(model))[0]:
        if not is_expert_leaf(path):
            digest.update(np.ascontiguousarray(np.asarray(leaf)).tobytes())
    return digest.hexdigest()


def prefix_cache(
    config: StageConfig, engine: Engine, digest: str, part: str, samples: _data.Samples
) -> PrefixCache:
    """The samples' prefix cache: kept under `config.cache_dir`/`part` when that is set (and
    read back from there when it was computed from the same prefix and data)."""
    key = {"prefix_sha1": digest, "part": part, "data_dir": config.data_dir,
           "heldout": config.heldout, "samples": len(samples),
           "object_state": config.object_state}  # fmt: skip
    path = pathlib.Path(config.cache_dir) / part if config.cache_dir else None
    dtype = jnp.dtype(engine.config.model.dtype)
    cache = PrefixCache.load(path, key, dtype) if path is not None else None
    if cache is None:
        cache = PrefixCache(engine, samples)
        if path is not None:
            cache.save(path, key)
    return cache


def run(config: StageConfig, workers: int = 1) -> dict:
    """The whole stage; returns the final record (also `final_metrics.json`)."""
    from tqdm import tqdm

    started = time.monotonic()
    out_dir = pathlib.Path(config.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    served = _train.engine_config(config.checkpoint, config.assets_id, config.preset)
    engine = Engine(served)
    expert_config = get_model_config(config.served_preset)
    check_expert_preset(served.model, expert_config)
    assets = starting_assets(config)
    train_s, held_s, (train_eps, held_eps) = load_samples(
        engine,
        config.data_dir,
        config.preset,
        config.object_state,
        config.heldout,
        workers,
        narration_numbers=assets["narration_numbers"],
    )
    trained = load_params(config.checkpoint, served.model)
    digest = prefix_digest(trained)
    train_cache, held_cache = (
        prefix_cache(config, engine, digest, name, samples)
        for name, samples in (("train", train_s), ("heldout", held_s))
    )
    for part in (train_s, held_s, train_eps, held_eps):
        part.images = {}  # only the prefill reads them; the long loop need not hold them
    logger.info(
        "prefix caches of %d + %d samples (%.0f MB) %.0f s after the start",
        len(train_s),
        len(held_s),
        (train_cache.nbytes + held_cache.nbytes) / 1e6,
        time.monotonic() - started,
    )
    trainer = ExpertTrainer(
        stage_model(trained, expert_config, config.reinit, config.seed), config
    )
    robot_dim = train_eps.actions.shape[-1]
    weights = _train.sampling_weights(train_s.step, config.early_steps, config.early_weight)
    rng = np.random.default_rng(config.seed)
    key = jax.random.key(config.seed)
    run_info = {
        "config": dataclasses.asdict(config),
        "train_samples": len(train_s),
        "heldout_samples": len(held_s),
        "heldout_episodes": [int(s) for s in held_eps.seeds],
        "expert_leaves": sum(int(np.size(p)) for p in trainer.params),
        "jax": jax.__version__,
    }
    (out_dir / "run.json").write_text(json.dumps(run_info, indent=1))
    # Step 0: the starting expert on the same held-out evaluation, the curve's baseline.
    records = [{"step": 0, **evaluate(trainer, held_cache, held_s, engine.normalizer, robot_dim)}]
    logger.info("step 0: %s", json.dumps(records[0]))
    metrics_path = out_dir / "metrics.jsonl"
    metrics_path.write_text(json.dumps(records[0]) + "\n")
    train_started = time.monotonic()
    for step in tqdm(range(1, config.steps + 1), desc="expert", mininterval=5.0):
        index = np.sort(rng.choice(len(train_s), config.batch_size, replace=False, p=weights))
        blind = rng.random(config.batch_size) < config.image_dropout
        prefix = train_cache.take(index, blind)
        metrics = trainer.step(
            jax.random.fold_in(key, step), prefix, jnp.asarray(train_s.actions[index])
        )
        record = {"step": step, "lr": float(trainer.schedule(step - 1)), **metrics}
        record["time_s"] = time.monotonic() - train_started
        if step % config.eval_every == 0 or step == config.steps:
            record.update(evaluate(trainer, held_cache, held_s, engine.normalizer, robot_dim))
            save(trainer, out_dir, assets)
            plot_curves([*records, record], out_dir / "loss_curve.png")
            logger.info("step %d: %s", step, json.dumps(record))
        records.append(record)
        with metrics_path.open("a") as f:
            f.write(json.dumps(record) + "\n")
    final = dict(records[-1])
    final["train_wall_s"] = time.monotonic() - train_started
    final["wall_s"] = time.monotonic() - started
    (out_dir / "final_metrics.json").write_text(json.dumps(final, indent=1))
    return final


def starting_assets(config: StageConfig) -> dict:
    """The starting checkpoint's assets, as `save` writes them beside each trained expert."""
    assets = pathlib.Path(config.checkpoint) / "assets" / config.assets_id
    return {
        "norm_stats": load_norm_stats(config.checkpoint, config.assets_id),
        "assets_id": config.assets_id,
        "tokenizer_path": str(assets / TOKENIZER_FILE),
        "delta_action_mask": load_delta_action_mask(config.checkpoint, config.assets_id),
        "state_layout": load_state_layout(config.checkpoint, config.assets_id),
        "narration_numbers": load_narration_numbers(config.checkpoint, config.assets_id),
    }


def save(trainer: ExpertTrainer, out_dir: pathlib.Path, assets: dict) -> None:
    """openpi layout: the params, and the starting checkpoint's assets unchanged."""
    _train.save_checkpoint(out_dir, trainer.full_params(), **assets)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    defaults = StageConfig(checkpoint="", data_dir="", out_dir="")
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--data", required=True, help="demonstration dirs, comma-separated")
    parser.add_argument("--out", required=True)
    parser.add_argument("--workers", type=int, default=2, help="episode readers")
    skip = {"checkpoint", "data_dir", "out_dir"}
    for field in dataclasses.fields(StageConfig):
        if field.name in skip:
            continue
        flag = "--" + field.name.replace("_", "-")
        default = getattr(defaults, field.name)
        if isinstance(default, bool):
            parser.add_argument(flag, action="store_true")
        else:
            parser.add_argument(flag, type=type(default), default=default)
    args = parser.parse_args(argv)
    # force: an import may already have given the root logger a handler (as train's main).
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", force=True)
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(StageConfig) if
              f.name not in skip}  # fmt: skip
    config = StageConfig(
        checkpoint=args.checkpoint, data_dir=args.data, out_dir=args.out, **values
    )
    print(json.dumps(run(config, args.workers), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
