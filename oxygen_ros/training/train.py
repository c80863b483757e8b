"""Trains the engine's `Pi05Model` on workcell demonstrations and writes an openpi checkpoint.

`python -m oxygen_ros.training.train --data <demos dir> --out <dir>` (scripts/train sets up
first). Steps, on 2 CPU cores:
1. Read the successful episodes; the `--heldout` episodes with the highest seeds are never
   trained on (evaluation only).
2. openpi norm stats of the training episodes (with `--init-from`, the starting checkpoint's,
   unless `--fresh-norm-stats`: `training_norm_stats`); samples tokenised as the engine serves
   them (training/data.py).
   With `--blind-state left_gripper,right_gripper`, those state dimensions' stats normalise
   every value to one bin (data.blind_norm_stats): the prompt carries nothing of them, at
   run time too, since the checkpoint's norm_stats.json carries the blinding.
3. AdamW (optax) with linear warm-up and cosine decay, global-norm clipping; loss = openpi's
   flow-matching action loss + `language_weight` x token cross-entropy (training/loss.py);
   with `--action-draws k`, each sample's action loss is the mean over k (noise, time) draws
   read against one prefix pass (held-out evaluations keep one draw, comparable across runs).
   With `--ema-decay d` (openpi's TrainConfig.ema_decay), an exponential moving average of the
   parameters is kept; evaluations and the checkpoint use it, as openpi saves its EMA params.
   With `--state-dropout p`, a fraction p of the samples in each batch carry their episode's
   first (home) joint state in the prompt instead of their own (training/data.py), so the arm
   that acts must be read from the instruction and the images, as on a first frame.
   With a tokenizer that has one piece per state bin (engine/tokenizer.
   STATE_BINS_TOKENIZER_PATH: the default `--tokenizer-path` of the presets sized for it,
   data.PRESET_TOKENIZERS), those value rows start in the bins' order
   (training/bin_embeddings.py) unless training resumes from a checkpoint; `--bin-frequencies
   0.5` starts them on one low Fourier frequency instead (nearly linear in the value) and
   `--freeze-bin-rows` keeps them as they start. With `--insulate-prefix` the action loss
   reaches only the action expert (loss.forward's insulate). `--narration-numbers words`
   trains the narration to say its numbers as words ("step two of four ..."; the digits'
   pieces are state-bin pieces, which `--freeze-bin-rows` leaves unable to tell apart at the
   tied output); unset, a run keeps its `--init-from` checkpoint's (else digits), and the
   checkpoint records it (`language.json`). With `--language-head-only` only the prefix LLM's
   language head trains (training/language_head.py: the last layer's queries, attention output
   and MLP, and the final norm), which no key or value the action expert reads depends on: the
   checkpoint says what it says differently and denoises every action bit for bit as its
   `--init-from` does.
4. Every `--eval-every` steps, on held-out samples: action loss, teacher-forced exact-match
   accuracy of each language kind, and the error of denoised actions (engine `prefill` +
   `denoise`, fixed noise) in radians; on the first frame of every held-out episode (robot at
   home: only the instruction and the images tell the arm), which arm the denoised chunk moves
   more against the arm the task needs, and the narration (it names the arm) exact match;
   with `--image-dropout`, the held-out action loss with every camera masked (what the prompt
   alone tells the model); logged to metrics.jsonl, plotted to loss_curve.png.
5. The checkpoint: `<out>/params` (orbax, openpi's {"params": tree}) and
   `<out>/assets/<assets_id>/norm_stats.json`, loaded by the engine through
   `checkpoint_dir` unchanged. Only the first `vocab_size` rows of the 257,152-row embedding
   are trained (the bundled tokenizer has no other ids); the rest are stored as zeros, which
   compress to almost nothing.

Reproducibility: one seed fixes init, batch order and every random draw; XLA on CPU is
deterministic for a fixed build, so the same data, seed and versions give the same params.

Invariant: nothing here imports rclpy.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import logging
import math
import pathlib
import shutil
import time
from collections.abc import Sequence

import flax.nnx as nnx
import h5py
import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
from openpi.shared import normalize

from oxygen_ros.engine import model_fns
from oxygen_ros.engine.checkpoint import Normalizer, load_norm_stats, load_params
from oxygen_ros.engine.checkpoint_assets import (
    NARRATION_NUMBERS,
    StateLayout,
    load_delta_action_mask,
    load_narration_numbers,
    save_delta_action_mask,
    save_narration_numbers,
    save_state_layout,
)
from oxygen_ros.engine.config import (
    EngineConfig,
    ModelConfig,
    NormConfig,
    PromptConfig,
    get_model_config,
)
from oxygen_ros.engine.model import Pi05Model, abstract_model, create_model
from oxygen_ros.engine.tokenizer import TOKENIZER_FILE, Tokenizer
from oxygen_ros.engine.types import RequestKind
from oxygen_ros.sim import recorder, robot
from oxygen_ros.training import bin_embeddings, fresh_demos
from oxygen_ros.training import data as _data
from oxygen_ros.training import loss as _loss

logger = logging.getLogger("oxygen_ros.training")

EMBEDDING_PATH = ("PaliGemma", "llm", "embedder", "input_embedding")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    data_dir: str
    out_dir: str
    preset: str = "workcell"
    steps: int = 4000
    batch_size: int = 32
    peak_lr: float = 1e-3
    end_lr: float = 2e-5
    warmup_steps: int = 200
    weight_decay: float = 1e-4
    clip_norm: float = 1.0
    language_weight: float = 0.25
    action_draws: int = 1  # (noise, time) draws per sample in training (loss.forward)
    # the action loss reaches only the action expert (loss.forward's insulate): the prefix
    # learns from the language targets alone
    insulate_prefix: bool = False
    # train only the prefix LLM's language head (training/language_head.py): the last layer's
    # queries, attention output, MLP and final norm, which no key or value the action expert
    # reads depends on, so every denoised action stays bit for bit the starting checkpoint's
    language_head_only: bool = False
    # the state-bin embedding rows' code at the start (bin_embeddings.smooth_bin_rows'
    # Fourier frequencies, comma-separated; "" = bin_embeddings.FREQUENCIES; "0.5": a quarter
    # circle, nearly linear in the value) and whether training keeps them as they start
    bin_frequencies: str = ""
    freeze_bin_rows: bool = False
    # how the narration target says its numbers (checkpoint_assets.NARRATION_NUMBERS); "" =
    # the init_from checkpoint's, or "digits" without one
    narration_numbers: str = ""
    # > 0: evaluate and save an exponential moving average of the parameters, updated after
    # every step (openpi's TrainConfig.ema_decay: 0.99 there); 0: the last step's parameters
    ema_decay: float = 0.0
    augment: bool = False
    heldout: int = 10  # episodes (highest seeds) kept out of training
    eval_every: int = 250
    eval_samples: int = 256
    seed: int = 0
    assets_id: str = "workcell"
    tokenizer_path: str = ""  # "" = the one the preset is sized for (data.preset_tokenizer)
    init_from: str = ""  # checkpoint to start from ("" = random init from `seed`)
    fresh_norm_stats: bool = False  # with init_from: new norm stats, not the checkpoint's
    min_norm_range: float = 0.0  # > 0: widen narrower state/action dims (widen_norm_stats)
    # > 0: the grippers' action quantiles this far apart (data.set_action_range; run 38's are
    # 0.8 apart, so 0.2667 triples their normalised values: nine times their squared error).
    gripper_action_range: float = 0.0
    early_steps: int = 0  # the first early_steps steps of each episode are drawn ...
    early_weight: float = 1.0  # ... this many times as often (the arm is still at home there)
    # "1:4,2:4": samples of phase index 1 and 2 (tasks.subtask_labels order: grasp, lift) are
    # drawn 4 times as often (times early_weight where both apply); "" = every phase alike
    stage_weights: str = ""
    state_dropout: float = 0.0  # fraction of samples whose prompt carries the home state
    object_state: str = ""  # state = joints + the cubes' positions or poses (or nothing)
    delta_actions: bool = False  # arm joints relative to the state (_data.DELTA_ACTION_MASK)
    image_dropout: float = 0.0  # fraction of samples whose camera images are all masked out
    blind_state: str = ""  # comma-separated state names normalised to one bin (blind_norm_stats)
    device_data: bool = False  # keep the training samples on the accelerator, gather there
    time_budget_s: float = 0.0  # > 0: end (evaluate, save) once training has run this long

    def __post_init__(self) -> None:
        if not self.tokenizer_path:
            object.__setattr__(self, "tokenizer_path", str(_data.preset_tokenizer(self.preset)))
        if self.steps < 2 or self.batch_size < 1 or self.eval_every < 1:
            raise ValueError("need steps >= 2, batch_size >= 1 and eval_every >= 1")
        if self.action_draws < 1:
            raise ValueError("need action_draws >= 1")
        if not 0.0 <= self.ema_decay < 1.0:
            raise ValueError("need 0 <= ema_decay < 1")
        if self.heldout < 1 or self.eval_samples < 1:
            raise ValueError("need heldout >= 1 episode and eval_samples >= 1")
        if self.min_norm_range < 0:
            raise ValueError("need min_norm_range >= 0")
        if self.gripper_action_range < 0:
            raise ValueError("need gripper_action_range >= 0")
        if self.early_steps < 0 or self.early_weight <= 0:
            raise ValueError("need early_steps >= 0 and early_weight > 0")
        parse_stage_weights(self.stage_weights)  # raises on a malformed --stage-weights
        if not 0.0 <= self.state_dropout < 1.0:
            raise ValueError("need 0 <= state_dropout < 1")
        if self.delta_actions and self.state_dropout > 0:
            raise ValueError(
                "state dropout puts the home state in the prompt: delta actions "
                "are relative to the real one"
            )
        if self.object_state not in _data.OBJECT_STATE_PRESETS:
            raise ValueError(f"object_state must be one of {tuple(_data.OBJECT_STATE_PRESETS)}")
        if self.object_state:  # without one, build_samples refuses a prompt the budget would cut
            _data.check_preset(self.preset, self.object_state)
        if not 0 < self.end_lr <= self.peak_lr:
            raise ValueError("need 0 < end_lr <= peak_lr")
        if self.device_data and self.state_dropout > 0:
            raise ValueError("state dropout swaps prompts on the host: not with device_data")
        if not 0.0 <= self.image_dropout <= 1.0:
            raise ValueError("need 0 <= image_dropout <= 1")
        if self.time_budget_s < 0:
            raise ValueError("need time_budget_s >= 0")
        if self.narration_numbers not in ("", *NARRATION_NUMBERS):
            raise ValueError(f"narration_numbers must be one of {NARRATION_NUMBERS}")
        if any(f <= 0 for f in self.bin_code):
            raise ValueError(f"bin frequencies must be > 0, got {self.bin_frequencies!r}")
        unknown = set(self.blinded_names) - set(_data.state_names(self.object_state))
        if unknown:
            raise ValueError(
                f"blind_state names {sorted(unknown)} are not in the state "
                f"{_data.state_names(self.object_state)}"
            )

    @property
    def stage_weight_map(self) -> dict[int, float]:
        """`stage_weights` as {phase index: weight}."""
        return parse_stage_weights(self.stage_weights)

    @property
    def bin_code(self) -> tuple[float, ...]:
        """The state-bin rows' Fourier frequencies (bin_embeddings.FREQUENCIES when unset)."""
        if not self.bin_frequencies:
            return bin_embeddings.FREQUENCIES
        return tuple(float(f) for f in self.bin_frequencies.split(","))

    @property
    def narration_style(self) -> str:
        """`narration_numbers`, or when unset the init_from checkpoint's (digits without)."""
        if self.narration_numbers:
            return self.narration_numbers
        return load_narration_numbers(self.init_from, None) if self.init_from else "digits"

    @property
    def blinded_names(self) -> tuple[str, ...]:
        """The state names `blind_state` lists."""
        return tuple(n.strip() for n in self.blind_state.split(",") if n.strip())


def leaf_names(path: Sequence) -> tuple[str, ...]:
    """A model state leaf's key path (from `tree_flatten_with_path`) as module/field names."""
    return tuple(str(getattr(k, "key", getattr(k, "name", k))) for k in path)


def embedding_leaf(model: Pi05Model) -> int:
    """Index of the tied embedding table among the flattened state leaves."""
    flat = jax.tree_util.tree_flatten_with_path(nnx.state(model))[0]
    for i, (path, _) in enumerate(flat):
        if leaf_names(path)[: len(EMBEDDING_PATH)] == EMBEDDING_PATH:
            return i
    raise KeyError(f"no {'/'.join(EMBEDDING_PATH)} leaf in the model state")


@dataclasses.dataclass(frozen=True)
class OptimizerSettings:
    """The optimiser of the runs here (`make_optimizer`); the fields of the same names of a
    TrainConfig or expert_stage.StageConfig (`of`)."""

    steps: int
    warmup_steps: int
    peak_lr: float
    end_lr: float
    weight_decay: float
    clip_norm: float

    @classmethod
    def of(cls, config) -> OptimizerSettings:
        return cls(**{f.name: getattr(config, f.name) for f in dataclasses.fields(cls)})


def make_optimizer(
    settings: OptimizerSettings,
) -> tuple[optax.Schedule, optax.GradientTransformation]:
    """(schedule, optimiser): warmup then cosine decay from `peak_lr` to `end_lr` over
    `steps`, AdamW with `weight_decay` after clipping the global norm at `clip_norm`."""
    warmup = min(settings.warmup_steps, settings.steps - 1)  # cosine needs >= 1 step
    schedule = optax.warmup_cosine_decay_schedule(
        0.0, settings.peak_lr, warmup, settings.steps, settings.end_lr
    )
    optimizer = optax.chain(
        optax.clip_by_global_norm(settings.clip_norm),
        optax.adamw(schedule, weight_decay=settings.weight_decay),
    )
    return schedule, optimizer


@dataclasses.dataclass(frozen=True)
class _Statics:
    """What the jitted functions close over: everything but parameters and data."""

    model_config: ModelConfig
    vocab_size: int
    optimizer: OptimizerSettings
    language_weight: float
    augment: bool
    action_draws: int
    insulate_prefix: bool = False
    language_head_only: bool = False


class _Compiled:
    """Jitted step / eval / act for one `_Statics` (shared by every Trainer with it, so a
    second run in the same process compiles nothing)."""

    def __init__(self, statics: _Statics) -> None:
        self.statics = statics
        abstract = abstract_model(statics.model_config)
        self.graphdef, state = nnx.split(abstract)
        leaves, self.treedef = jax.tree.flatten(state)
        self.embedding = embedding_leaf(abstract)
        self.full_rows = leaves[self.embedding].shape[0]
        self.schedule, self.optimizer = make_optimizer(statics.optimizer)
        # per leaf, the multiplier of its gradient and update (None: every leaf trains)
        self.mask = None
        if statics.language_head_only:
            # imported here: language_head reads this module's leaf_names
            from oxygen_ros.training import language_head

            self.mask = [jnp.asarray(m) for m in language_head.update_mask(abstract)]
        self.step = jax.jit(self._step, donate_argnums=(0, 1))
        self.ema = jax.jit(_ema_update, donate_argnums=(0,))
        self.eval = jax.jit(self._eval_losses)
        self.act = jax.jit(self._actions)

    def model(self, params: Sequence[jax.Array]) -> Pi05Model:
        """The model with `params`; embedding rows past the trained ones are zeros (never
        read: the tokenizer has no such ids, and logits cover the first vocab_size rows)."""
        leaves = list(params)
        table = leaves[self.embedding]
        rest = jnp.zeros((self.full_rows - table.shape[0], table.shape[1]), table.dtype)
        leaves[self.embedding] = jnp.concatenate([table, rest])
        return nnx.merge(self.graphdef, jax.tree.unflatten(self.treedef, leaves))

    def _losses(
        self, params, rng, batch: _loss.Batch, augment: bool, action_draws: int = 1
    ) -> _loss.Losses:
        return _loss.compute_losses(
            self.model(params),
            rng,
            batch,
            vocab_size=self.statics.vocab_size,
            augment=augment,
            action_draws=action_draws,
            insulate=self.statics.insulate_prefix,
        )

    def _step(self, params, opt_state, rng, batch: _loss.Batch):
        statics = self.statics

        def objective(p):
            losses = self._losses(p, rng, batch, statics.augment, statics.action_draws)
            total = _loss.total_loss(losses, batch.lang_loss_mask, statics.language_weight)
            return total, losses

        (total, losses), grads = jax.value_and_grad(objective, has_aux=True)(params)
        if self.mask is not None:  # the frozen leaves see no gradient, clip or weight decay
            grads = [g * m.astype(g.dtype) for g, m in zip(grads, self.mask, strict=True)]
        updates, opt_state = self.optimizer.update(grads, opt_state, params)
        if self.mask is not None:
            updates = [u * m.astype(u.dtype) for u, m in zip(updates, self.mask, strict=True)]
        params = optax.apply_updates(params, updates)
        tokens = jnp.maximum(jnp.sum(batch.lang_loss_mask), 1)
        metrics = {
            "loss": total,
            "action_loss": jnp.mean(losses.action),
            "language_loss": jnp.sum(losses.token_nll) / tokens,
            "grad_norm": optax.tree.norm(grads),
        }
        return params, opt_state, metrics

    def _eval_losses(self, params, rng, batch: _loss.Batch) -> _loss.Losses:
        return self._losses(params, rng, batch, False)

    def _actions(self, params, batch: _loss.Batch, noise: jax.Array) -> jax.Array:
        model = self.model(params)
        inputs = model_fns.PrefixInputs(
            batch.images, batch.image_masks, batch.tokens, batch.token_mask
        )
        prefix = model_fns.prefill(model, inputs)
        return model_fns.denoise(model, prefix, noise, model.config.num_denoise_steps)


@jax.jit
def _set_rows(table: jax.Array, ids: jax.Array, rows: jax.Array) -> jax.Array:
    return table.at[ids].set(rows)


def _ema_update(ema, params, decay):
    """decay x ema + (1 - decay) x params, leaf by leaf."""
    return jax.tree.map(lambda old, new: decay * old + (1 - decay) * new, ema, params)


@functools.cache
def _compiled(statics: _Statics) -> _Compiled:
    return _Compiled(statics)


class Trainer:
    """The trainable leaves (embedding cut to the tokenizer's rows), optimiser state, steps."""

    def __init__(self, config: TrainConfig, model: Pi05Model, vocab_size: int) -> None:
        self.config = config
        self.vocab_size = vocab_size
        self._fns = _compiled(
            _Statics(
                model.config, vocab_size, OptimizerSettings.of(config), config.language_weight,
                config.augment, config.action_draws, config.insulate_prefix,
                config.language_head_only,
            )
        )  # fmt: skip
        leaves, treedef = jax.tree.flatten(nnx.state(model))
        if treedef != self._fns.treedef:
            raise ValueError(f"model state does not match the {model.config.name!r} tree")
        leaves[self._fns.embedding] = leaves[self._fns.embedding][:vocab_size]
        self.params = leaves
        self.schedule = self._fns.schedule
        self.opt_state = self._fns.optimizer.init(self.params)
        # The average starts at the starting parameters (a copy: the step donates `params`).
        self.ema = [jnp.array(x, copy=True) for x in leaves] if config.ema_decay > 0 else None
        self._frozen: tuple[jax.Array, jax.Array] | None = None  # (row ids, their values)

    @property
    def served_params(self) -> list:
        """What is evaluated and saved: the moving average with `ema_decay`, else the last
        step's parameters."""
        return self.params if self.ema is None else self.ema

    def embedding(self) -> np.ndarray:
        """The trained rows of the tied embedding table [vocab_size, width]."""
        return np.asarray(self.params[self._fns.embedding])

    def replace_embedding(self, table: np.ndarray) -> None:
        """Sets the trained rows (same shape and dtype; before the first step)."""
        current = self.params[self._fns.embedding]
        if table.shape != current.shape:
            raise ValueError(f"embedding {table.shape} is not the trained {current.shape}")
        self.params[self._fns.embedding] = jnp.asarray(table, current.dtype)
        if self.ema is not None:
            self.ema[self._fns.embedding] = jnp.asarray(table, current.dtype)

    def freeze_rows(self, ids: np.ndarray) -> None:
        """Keep the embedding rows `ids` as they are now through every later step."""
        table = self.params[self._fns.embedding]
        self._frozen = (jnp.asarray(ids), jnp.take(table, jnp.asarray(ids), axis=0))

    def step(self, rng: jax.Array, batch: _loss.Batch) -> dict[str, float]:
        self.params, self.opt_state, metrics = self._fns.step(
            self.params, self.opt_state, rng, batch
        )
        if self._frozen is not None:
            ids, rows = self._frozen
            at = self._fns.embedding
            self.params[at] = _set_rows(self.params[at], ids, rows)
        if self.ema is not None:
            self.ema = self._fns.ema(self.ema, self.params, jnp.float32(self.config.ema_decay))
        return {k: float(v) for k, v in metrics.items()}

    def eval_losses(self, rng: jax.Array, batch: _loss.Batch) -> _loss.Losses:
        return self._fns.eval(self.served_params, rng, batch)

    def actions(self, batch: _loss.Batch, noise: jax.Array) -> jax.Array:
        """Denoised actions [B, A, J] (model units) with the engine's prefill + denoise."""
        return self._fns.act(self.served_params, batch, noise)

    def full_params(self) -> dict:
        """Pure dict of the whole model: trained rows, zeros for the unused embedding rows."""
        leaves = [np.asarray(x) for x in self.served_params]
        table = leaves[self._fns.embedding]
        full = np.zeros((self._fns.full_rows, table.shape[1]), table.dtype)
        full[: table.shape[0]] = table
        leaves[self._fns.embedding] = full
        return nnx.to_pure_dict(jax.tree.unflatten(self._fns.treedef, leaves))


def to_batch(rows: dict, image_keys: Sequence[str]) -> _loss.Batch:
    """Host batch (uint8 images) -> model batch (images in [-1, 1])."""
    images = {k: jnp.asarray(rows["images"][k], jnp.float32) / 127.5 - 1.0 for k in image_keys}
    size = rows["tokens"].shape[0]
    return _loss.Batch(
        images=images,
        image_masks={k: jnp.ones((size,), bool) for k in image_keys},
        tokens=jnp.asarray(rows["tokens"]),
        token_mask=jnp.asarray(rows["token_mask"]),
        actions=jnp.asarray(rows["actions"]),
        lang_tokens=jnp.asarray(rows["lang_tokens"]),
        lang_mask=jnp.asarray(rows["lang_mask"]),
        lang_segment=jnp.asarray(rows["lang_segment"]),
        lang_index=jnp.asarray(rows["lang_index"]),
        lang_labels=jnp.asarray(rows["lang_labels"]),
        lang_loss_mask=jnp.asarray(rows["lang_loss_mask"]),
    )


_ROW_FIELDS = (
    "tokens", "token_mask", "actions", "lang_tokens", "lang_mask", "lang_segment",
    "lang_index", "lang_labels", "lang_loss_mask",
)  # fmt: skip


class DeviceSamples:
    """The training samples' batch arrays resident on the default device; `batch(index)`
    gathers rows there (only the indices cross from the host), then converts them exactly
    as `to_batch` does on the host."""

    def __init__(self, samples: _data.Samples, image_keys: Sequence[str]) -> None:
        self._image_keys = tuple(image_keys)
        self._images = {k: jax.device_put(samples.images[k]) for k in self._image_keys}
        self._rows = {name: jax.device_put(getattr(samples, name)) for name in _ROW_FIELDS}
        self._gather = jax.jit(self._take)

    def _take(self, images, rows, index) -> _loss.Batch:
        taken = {name: value[index] for name, value in rows.items()}
        taken["images"] = {k: v[index] for k, v in images.items()}
        return to_batch(taken, self._image_keys)

    def batch(self, index: np.ndarray) -> _loss.Batch:
        return self._gather(self._images, self._rows, jnp.asarray(index, jnp.int32))


def drop_images(batch: _loss.Batch, keep: np.ndarray) -> _loss.Batch:
    """Image dropout: rows where `keep` is false have every camera masked out (their image
    tokens are padding that nothing attends to, as for a missing camera at run time), so the
    instruction and the state in the prompt are all those rows show."""
    masks = {k: jnp.logical_and(v, jnp.asarray(keep)) for k, v in batch.image_masks.items()}
    return batch._replace(image_masks=masks)


def training_norm_stats(
    config: TrainConfig,
    train_eps: _data.Episodes,
    norm: NormConfig,
    delta_mask: tuple[bool, ...],
) -> dict[str, normalize.NormStats]:
    """The norm stats a run trains with (and saves): openpi's statistics of the training
    episodes; with `init_from` (unless `fresh_norm_stats`) the starting checkpoint's own, so
    every state bin and action scale means to the fine-tuned model what it meant before (new
    data, for example DAgger's off-path rows, would otherwise move the 1-99 % quantiles that
    place the state bins).
    With `min_norm_range`, then widened (`data.widen_norm_stats`).
    With `blind_state`, those state dimensions then normalise to one bin (`data.blind_norm_stats`).
    With `gripper_action_range`, the grippers' action quantiles are set that far apart
    (`data.set_action_range`).

    Raises:
        ValueError: the starting checkpoint's stats do not fit these episodes' state or action
            width, or it was trained with another delta-action mask.
    """
    stats = _norm_stats_of(config, train_eps, norm, delta_mask)
    if config.min_norm_range > 0:
        stats, widened = _data.widen_norm_stats(stats, config.min_norm_range)
        logger.info("norm stats: widened to %g: %s", config.min_norm_range, widened)
    if config.blinded_names:
        names = _data.state_names(config.object_state)
        dims = [names.index(n) for n in config.blinded_names]
        stats = _data.blind_norm_stats(stats, norm.state_key, dims)
        logger.info("norm stats: state %s blinded", list(config.blinded_names))
    if config.gripper_action_range > 0:
        stats = _data.set_action_range(
            stats, norm.actions_key, _data.GRIPPER_ACTION_DIMS, config.gripper_action_range
        )
        logger.info("norm stats: gripper actions %g apart", config.gripper_action_range)
    return stats


def _norm_stats_of(
    config: TrainConfig,
    train_eps: _data.Episodes,
    norm: NormConfig,
    delta_mask: tuple[bool, ...],
) -> dict[str, normalize.NormStats]:
    if not config.init_from or config.fresh_norm_stats:
        return _data.compute_norm_stats(train_eps, norm)
    stats = load_norm_stats(config.init_from, None)
    for key, values in ((norm.state_key, train_eps.state), (norm.actions_key, train_eps.actions)):
        width = stats[key].mean.shape[-1] if key in stats else None
        if width != values.shape[-1]:
            raise ValueError(
                f"--init-from {config.init_from}: its {key!r} norm stats have width {width}, "
                f"these episodes {values.shape[-1]} (another object state?); "
                "--fresh-norm-stats computes new ones"
            )
    trained_mask = load_delta_action_mask(config.init_from, None)
    if tuple(trained_mask) != tuple(delta_mask):
        raise ValueError(
            f"--init-from {config.init_from} was trained with delta-action mask "
            f"{trained_mask or 'none'}, this run uses {delta_mask or 'none'} (--delta-actions)"
        )
    logger.info("norm stats: kept from %s", config.init_from)
    return stats


def parse_stage_weights(text: str) -> dict[int, float]:
    """'1:4,2:4' -> {1: 4.0, 2: 4.0} (phase index: weight); '' -> {}.

    Raises:
        ValueError: an item is not index:weight with a distinct index >= 0 and a weight > 0.
    """
    weights: dict[int, float] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        index, sep, weight = item.partition(":")
        try:
            key, value = int(index), float(weight)
        except ValueError:
            key, value = -1, 0.0
        if not sep or key < 0 or not 0 < value < math.inf or key in weights:
            raise ValueError(
                "stage_weights wants 'index:weight,...' with distinct indices >= 0 and "
                f"weights > 0, got {text!r}"
            )
        weights[key] = value
    return weights


def sampling_weights(
    step: np.ndarray,
    early_steps: int,
    early_weight: float,
    stage: np.ndarray | None = None,
    stage_weights: dict[int, float] | None = None,
) -> np.ndarray:
    """Probability of drawing each sample: early_weight for the first early_steps steps of
    each episode, times stage_weights[phase index] for the phases it names, 1 otherwise;
    normalised."""
    weights = np.where(step < early_steps, early_weight, 1.0)
    for index, weight in (stage_weights or {}).items():
        weights = np.where(stage == index, weights * weight, weights)
    return weights / weights.sum()


def save_checkpoint(
    out_dir: pathlib.Path,
    params: dict,
    norm_stats: dict,
    assets_id: str,
    tokenizer_path: str,
    delta_action_mask: tuple[bool, ...] = (),
    state_layout: StateLayout | None = None,
    narration_numbers: str = "digits",
) -> None:
    """openpi layout: <out>/params ({"params": tree}), <out>/assets/<id>/norm_stats.json, and
    the tokenizer it was trained with as <out>/assets/<id>/tokenizer.model (the engine uses
    it when no tokenizer_path is given); with delta actions, their mask as
    <out>/assets/<id>/action_space.json (the engine serves them back as absolute targets);
    the state's names as <out>/assets/<id>/state_layout.json (the inference node reads the
    perceived entries' names from it); how its narration says numbers as language.json."""
    params_dir = out_dir.resolve() / "params"
    if params_dir.exists():
        shutil.rmtree(params_dir)
    with ocp.PyTreeCheckpointer() as checkpointer:
        checkpointer.save(params_dir, {"params": params})
    normalize.save(out_dir / "assets" / assets_id, norm_stats)
    shutil.copyfile(tokenizer_path, out_dir / "assets" / assets_id / TOKENIZER_FILE)
    if delta_action_mask:
        save_delta_action_mask(out_dir / "assets" / assets_id, delta_action_mask)
    if state_layout is not None:
        save_state_layout(out_dir / "assets" / assets_id, state_layout)
    save_narration_numbers(out_dir / "assets" / assets_id, narration_numbers)


def split_episodes(paths: Sequence[pathlib.Path], heldout: int) -> tuple[list, list]:
    """(train, held-out) episode paths; held-out are the `heldout` highest seeds."""
    seeds = {}
    for path in paths:
        with h5py.File(path, "r") as f:
            seeds[path] = int(f.attrs["seed"])
    ordered = sorted(paths, key=lambda p: seeds[p])
    if heldout >= len(ordered):
        raise ValueError(f"--heldout {heldout} leaves no training episode of {len(ordered)}")
    return ordered[: len(ordered) - heldout], ordered[len(ordered) - heldout :]


@dataclasses.dataclass
class _HeldOutBatch:
    """One evaluated batch of held-out samples."""

    index: np.ndarray  # sample indices of the rows
    rows: dict  # the host rows (`Samples.take`)
    losses: _loss.Losses  # teacher-forced losses of the rows
    predicted: np.ndarray  # denoised chunks [B, A, robot_dim], robot units (as trained: deltas
    #   with delta actions), from fixed noise
    exact: dict[int, np.ndarray]  # language segment -> bool [B]: the whole target right


def _held_out_losses(
    trainer: Trainer,
    samples: _data.Samples,
    index: np.ndarray,
    image_keys: Sequence[str],
    batch_size: int,
    cameras: bool = True,
):
    """Teacher-forced losses on `index` batch by batch, each batch's flow-matching draws from
    its offset (so runs with and without `cameras` compare the same noise and times); yields
    (offset, sample indices, host rows, model batch, losses)."""
    for start in range(0, len(index), batch_size):
        chosen = index[start : start + batch_size]
        rows = samples.take(chosen)
        batch = to_batch(rows, image_keys)
        if not cameras:
            batch = drop_images(batch, np.zeros(len(chosen), bool))
        yield start, chosen, rows, batch, trainer.eval_losses(jax.random.key(start), batch)


def _held_out_batches(
    trainer: Trainer,
    samples: _data.Samples,
    index: np.ndarray,
    normalizer: Normalizer,
    robot_dim: int,
    image_keys: Sequence[str],
    batch_size: int,
    noise_seed: int,
):
    """Runs losses and denoising (the engine's prefill + denoise) on `index` batch by batch."""
    noise_key = jax.random.key(noise_seed)
    for start, chosen, rows, batch, losses in _held_out_losses(
        trainer, samples, index, image_keys, batch_size
    ):
        wrong = rows["lang_loss_mask"] & ~np.asarray(losses.token_correct)
        exact = {
            seg: ~(wrong & (rows["lang_segment"] == seg)).any(axis=1)
            for seg in range(len(_data.LANGUAGE_KINDS))
        }
        noise = jax.random.normal(
            jax.random.fold_in(noise_key, start), np.shape(rows["actions"]), jnp.float32
        )
        predicted = normalizer.unnormalize_actions(
            np.asarray(trainer.actions(batch, noise))[..., :robot_dim]
        )
        yield _HeldOutBatch(chosen, rows, losses, predicted, exact)


def evaluate(
    trainer: Trainer,
    samples: _data.Samples,
    index: np.ndarray,
    normalizer: Normalizer,
    robot_dim: int,
    image_keys: Sequence[str],
    batch_size: int,
) -> dict[str, float]:
    """Held-out metrics: action loss, per-kind exact match, denoised action error (rad)."""
    action, errors = [], []
    exact: dict[int, list[np.ndarray]] = {seg: [] for seg in range(len(_data.LANGUAGE_KINDS))}
    for out in _held_out_batches(
        trainer, samples, index, normalizer, robot_dim, image_keys, batch_size, 12345
    ):
        action.append(np.asarray(out.losses.action).mean(axis=-1))
        for seg, hits in out.exact.items():
            exact[seg].append(hits)
        want = normalizer.unnormalize_actions(np.asarray(out.rows["actions"])[..., :robot_dim])
        errors.append(np.abs(out.predicted - want).mean(axis=(1, 2)))
    result = {"val_action_loss": float(np.concatenate(action).mean())}
    for seg, kind in enumerate(_data.LANGUAGE_KINDS):
        result[f"val_{kind.value}_exact"] = float(np.concatenate(exact[seg]).mean())
    result["val_action_mae_rad"] = float(np.concatenate(errors).mean())
    return result


def evaluate_blind(
    trainer: Trainer,
    samples: _data.Samples,
    index: np.ndarray,
    image_keys: Sequence[str],
    batch_size: int,
) -> dict[str, float]:
    """Held-out action loss with every camera masked out (`drop_images`): what the instruction
    and the state in the prompt alone tell the model, for runs trained with image dropout."""
    action = [
        np.asarray(losses.action).mean(axis=-1)
        for *_, losses in _held_out_losses(
            trainer, samples, index, image_keys, batch_size, cameras=False
        )
    ]
    return {"val_blind_action_loss": float(np.concatenate(action).mean())}


def moved_arm(chunk: np.ndarray, state: np.ndarray) -> str:
    """The arm whose joints a chunk [A, J] (robot units) moves further from `state`, summed
    over the rows."""
    left, right = (
        np.abs(chunk[:, robot.arm_slice(a)] - state[robot.arm_slice(a)]).sum() for a in robot.ARMS
    )
    return robot.ARMS[0] if left > right else robot.ARMS[1]


def evaluate_first_frames(
    trainer: Trainer,
    samples: _data.Samples,
    episodes: _data.Episodes,
    normalizer: Normalizer,
    image_keys: Sequence[str],
    batch_size: int,
    delta_mask: tuple[bool, ...] = (),
) -> dict[str, float]:
    """On the first frame of every held-out episode: the fraction whose denoised chunk moves
    the task's arm more than the other (split by whether the instruction names the arm or
    only the images can tell), and the narration's teacher-forced exact match."""
    index = np.flatnonzero(samples.step == 0)
    robot_dim = episodes.actions.shape[-1]
    hits, narration, named = [], [], []
    narration_seg = _data.LANGUAGE_KINDS.index(RequestKind.NARRATION)
    for out in _held_out_batches(
        trainer, samples, index, normalizer, robot_dim, image_keys, batch_size, 54321
    ):
        narration.append(out.exact[narration_seg])
        for row, i in enumerate(out.index):
            spec = episodes.specs[int(samples.episode[i])]
            chunk = Normalizer.absolute_actions(out.predicted[row], episodes.state[i], delta_mask)
            hits.append(moved_arm(chunk, episodes.state[i]) == spec.arm)
            named.append(spec.template == "pick_with_arm")
    hits_, named_ = np.array(hits), np.array(named)
    result = {
        "val_first_arm": float(hits_.mean()),
        "val_first_narration_exact": float(np.concatenate(narration).mean()),
    }
    if (~named_).any():
        result["val_first_arm_from_images"] = float(hits_[~named_].mean())
    if named_.any():
        result["val_first_arm_named"] = float(hits_[named_].mean())
    return result


def smoothed(steps: Sequence, values: Sequence, window: int) -> tuple[np.ndarray, np.ndarray]:
    """A loss curve's running mean over `window` points (fewer if there are fewer), with the
    step each mean ends at."""
    values = np.asarray(values, dtype=float)
    window = min(window, len(values))
    if window == 0:
        return np.asarray(steps), values
    smooth = np.convolve(values, np.ones(window) / window, mode="valid")
    return np.asarray(steps)[len(values) - len(smooth) :], smooth


def plot_curves(records: list[dict], path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train = [r for r in records if "loss" in r]
    val = [r for r in records if "val_action_loss" in r]
    fig, axes = plt.subplots(1, 4, figsize=(20, 4))
    steps = [r["step"] for r in train]
    for key in ("loss", "action_loss", "language_loss"):
        smooth_steps, smooth = smoothed(steps, [r[key] for r in train], 50)
        axes[0].plot(smooth_steps, smooth, label=f"train {key}")
    axes[0].plot(
        [r["step"] for r in val],
        [r["val_action_loss"] for r in val],
        "o-",
        label="held-out action_loss",
    )
    blind = [r for r in val if "val_blind_action_loss" in r]
    if blind:
        axes[0].plot(
            [r["step"] for r in blind],
            [r["val_blind_action_loss"] for r in blind],
            "s--",
            label="held-out action_loss, cameras masked",
        )
    axes[0].set_yscale("log")
    axes[0].set_xlabel("step")
    axes[0].legend()
    for kind in _data.LANGUAGE_KINDS:
        key = f"val_{kind.value}_exact"
        axes[1].plot([r["step"] for r in val], [r[key] for r in val], "o-", label=key)
    axes[1].set_ylim(0, 1.02)
    axes[1].set_xlabel("step")
    axes[1].set_title("held-out teacher-forced exact match")
    axes[1].legend()
    axes[2].plot([r["step"] for r in val], [r["val_action_mae_rad"] for r in val], "o-")
    axes[2].set_xlabel("step")
    axes[2].set_title("held-out denoised action error (rad, mean)")
    for key in (
        "val_first_arm",
        "val_first_arm_from_images",
        "val_first_arm_named",
        "val_first_narration_exact",
    ):
        points = [(r["step"], r[key]) for r in val if key in r]
        if points:
            axes[3].plot(*zip(*points, strict=True), "o-", label=key)
    axes[3].axhline(0.5, color="grey", linestyle=":", label="chance (2 arms)")
    axes[3].set_ylim(0, 1.02)
    axes[3].set_xlabel("step")
    axes[3].set_title("held-out first frames (robot at home)")
    axes[3].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def load_split(config: TrainConfig, workers: int = 1) -> tuple[_data.Episodes, _data.Episodes]:
    """(train, held-out) episodes of `config.data_dir` (held-out: the highest seeds), read by
    one pool of `workers` processes."""
    model_config = get_model_config(config.preset)
    paths = [p for d in config.data_dir.split(",") for p in recorder.list_episodes(d)]
    train_paths, heldout_paths = split_episodes(paths, config.heldout)
    started = time.monotonic()
    train_eps, heldout_eps = _data.load_episode_groups(
        (train_paths, heldout_paths), model_config, config.object_state, workers
    )
    logger.info(
        "read %d episode files in %.0f s with %d worker(s)",
        len(paths),
        time.monotonic() - started,
        workers,
    )
    return train_eps, heldout_eps


def train(
    config: TrainConfig, episodes: tuple[_data.Episodes, _data.Episodes] | None = None
) -> dict:
    """Runs the whole training; returns the final metrics. `episodes`: (train, held-out)
    arrays already loaded (for example by `fresh_demos`); by default `load_split(config)`."""
    from tqdm import tqdm

    out_dir = pathlib.Path(config.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model_config = get_model_config(config.preset)
    prompt = PromptConfig()
    norm = NormConfig()
    tokenizer = Tokenizer(config.tokenizer_path)
    started = time.monotonic()
    train_eps, heldout_eps = episodes if episodes is not None else load_split(config)
    delta_mask = _data.DELTA_ACTION_MASK if config.delta_actions else ()
    for episodes in (train_eps, heldout_eps):
        episodes.actions = Normalizer.relative_actions(
            episodes.actions, episodes.state, delta_mask
        )
    norm_stats = training_norm_stats(config, train_eps, norm, delta_mask)
    normalizer = Normalizer(norm_stats, norm)
    narration = config.narration_style
    train_samples = _data.build_samples(
        train_eps, model_config, tokenizer, normalizer, prompt, narration_numbers=narration
    )
    heldout_samples = _data.build_samples(
        heldout_eps, model_config, tokenizer, normalizer, prompt, narration_numbers=narration
    )
    logger.info(
        "data: %d train samples (%d episodes), %d held-out samples (%d episodes, seeds %s) "
        "ready %.0f s after train() began",
        len(train_samples),
        len(train_eps.specs),
        len(heldout_samples),
        len(heldout_eps.specs),
        heldout_eps.seeds,
        time.monotonic() - started,
    )
    robot_dim = train_eps.actions.shape[-1]  # the state may carry more (object positions)
    if config.init_from:
        model = load_params(config.init_from, model_config)
    else:
        model = create_model(model_config, seed=config.seed)
    trainer = Trainer(config, model, tokenizer.vocab_size)
    bins = bin_embeddings.bin_token_ids(tokenizer)
    smooth_bins = bins is not None and not config.init_from
    if smooth_bins:
        table = trainer.embedding()
        trainer.replace_embedding(
            bin_embeddings.with_smooth_bins(table, bins, config.seed, config.bin_code)
        )
        logger.info("the tokenizer has one piece per state bin: their rows start in order")
    if config.freeze_bin_rows:
        if bins is None:
            raise ValueError("freeze_bin_rows needs a tokenizer with one piece per state bin")
        trainer.freeze_rows(bins)
        logger.info("the state-bin rows stay as they start")
    rng = np.random.default_rng(config.seed)
    eval_index = np.random.default_rng(config.seed + 1).permutation(len(heldout_samples))
    eval_index = np.sort(eval_index[: config.eval_samples])
    key = jax.random.key(config.seed)
    records: list[dict] = []
    metrics_path = out_dir / "metrics.jsonl"
    metrics_path.write_text("")
    run = {
        "config": dataclasses.asdict(config),
        "train_episodes": [int(s) for s in train_eps.seeds],
        "heldout_episodes": [int(s) for s in heldout_eps.seeds],
        "train_samples": len(train_samples),
        "smooth_bin_rows": smooth_bins,
        "narration_numbers": narration,
        "jax": jax.__version__,
    }
    (out_dir / "run.json").write_text(json.dumps(run, indent=1))
    bar = tqdm(range(1, config.steps + 1), desc="train", mininterval=5.0)
    weights = sampling_weights(
        train_samples.step,
        config.early_steps,
        config.early_weight,
        train_samples.stage,
        config.stage_weight_map,
    )
    if config.stage_weights:
        drawn = {
            int(k): round(float(weights[train_samples.stage == k].sum()), 3)
            for k in np.unique(train_samples.stage)
        }
        logger.info("share of draws per phase index (--stage-weights): %s", drawn)
    on_device = (
        DeviceSamples(train_samples, model_config.image_keys) if config.device_data else None
    )
    train_started = time.monotonic()
    for step in bar:
        index = np.sort(
            rng.choice(len(train_samples), size=config.batch_size, replace=False, p=weights)
        )
        if on_device is not None:
            batch = on_device.batch(index)
        else:
            rows = train_samples.take(index)
            if config.state_dropout > 0:
                drop = rng.random(config.batch_size) < config.state_dropout
                rows = _data.drop_state(rows, drop)
            batch = to_batch(rows, model_config.image_keys)
        if config.image_dropout > 0:
            batch = drop_images(batch, rng.random(config.batch_size) >= config.image_dropout)
        metrics = trainer.step(jax.random.fold_in(key, step), batch)
        record = {"step": step, "lr": float(trainer.schedule(step - 1)), **metrics}
        record["time_s"] = time.monotonic() - train_started
        out_of_time = (
            config.time_budget_s > 0 and time.monotonic() - train_started > config.time_budget_s
        )
        if step % config.eval_every == 0 or step == config.steps or out_of_time:
            record.update(
                evaluate(
                    trainer,
                    heldout_samples,
                    eval_index,
                    normalizer,
                    robot_dim,
                    model_config.image_keys,
                    config.batch_size,
                )
            )
            if config.image_dropout > 0:
                record.update(
                    evaluate_blind(
                        trainer,
                        heldout_samples,
                        eval_index,
                        model_config.image_keys,
                        config.batch_size,
                    )
                )
            record.update(
                evaluate_first_frames(
                    trainer,
                    heldout_samples,
                    heldout_eps,
                    normalizer,
                    model_config.image_keys,
                    config.batch_size,
                    delta_mask,
                )
            )
            record["wall_s"] = time.monotonic() - train_started
            save_checkpoint(
                out_dir,
                trainer.full_params(),
                norm_stats,
                config.assets_id,
                config.tokenizer_path,
                delta_mask,
                _data.state_layout(config.object_state),
                narration,
            )
            plot_curves([*records, record], out_dir / "loss_curve.png")
            logger.info("step %d: %s", step, json.dumps(record))
        records.append(record)
        with metrics_path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        bar.set_postfix(
            loss=f"{metrics['loss']:.4f}", act=f"{metrics['action_loss']:.4f}", refresh=False
        )
        if out_of_time:
            logger.info("time budget of %.0f s reached at step %d", config.time_budget_s, step)
            break
    final = dict(records[-1])
    final["train_wall_s"] = time.monotonic() - train_started
    (out_dir / "final_metrics.json").write_text(json.dumps(final, indent=1))
    return final


def fit_to_deadline(config: TrainConfig, left_s: float, step_time_s: float) -> TrainConfig:
    """`config` with at most as many steps as fit in `left_s` seconds at `step_time_s` each,
    keeping about 15 % of the time (at least a minute) for compiling and evaluating, and a
    time budget 30 s short of `left_s` as the guard if the step time was optimistic."""
    fit = int(max(left_s - max(60.0, 0.15 * left_s), 0.0) / step_time_s)
    if fit < 2:
        raise ValueError(f"no time left to train: {left_s:.0f} s at {step_time_s} s a step")
    return dataclasses.replace(
        config, steps=min(config.steps, fit), time_budget_s=max(left_s - 30.0, 1.0)
    )


def engine_config(
    checkpoint_dir: str, assets_id: str = "workcell", preset: str = "workcell", **overrides
) -> EngineConfig:
    """EngineConfig that serves a checkpoint written here (its own tokenizer)."""
    return dataclasses.replace(
        EngineConfig(model=get_model_config(preset)),
        checkpoint_dir=checkpoint_dir,
        assets_id=assets_id,
        **overrides,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    fields = {f.name: f for f in dataclasses.fields(TrainConfig)}
    parser.add_argument(
        "--data", default="", help="directory of recorded HDF5 episodes (several: a,b)"
    )
    parser.add_argument("--out", required=True, help="checkpoint / log directory")
    parser.add_argument(
        "--generate",
        action="append",
        default=[],
        metavar="START:COUNT[:NOISE_RAD[:EXPERT]]",
        help="instead of --data: generate these seeds' demonstrations in memory "
        "(training/fresh_demos.py); repeatable",
    )
    parser.add_argument(
        "--generate-heldout",
        default="",
        metavar="START:COUNT",
        help="with --generate: the held-out episodes' seeds (--heldout is then ignored)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="worker processes that generate (--generate) or read (--data) the episodes",
    )
    parser.add_argument(
        "--deadline-unix",
        type=float,
        default=0.0,
        help="with --step-time-s: once the data is ready, lower --steps so that the schedule "
        "ends by this wall-clock time (seconds since the epoch; the steps used are in run.json)",
    )
    parser.add_argument(
        "--step-time-s", type=float, default=0.0, help="measured seconds per training step"
    )
    _data.add_object_state_argument(parser)
    for name, field in fields.items():
        if name in ("data_dir", "out_dir", "object_state", "preset"):
            continue
        flag = "--" + name.replace("_", "-")
        if field.type in ("bool", bool):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=field.default)
        else:
            kind = {"int": int, "float": float, "str": str}[str(field.type)]
            parser.add_argument(flag, type=kind, default=field.default)
    args = vars(parser.parse_args(argv))
    generate = [fresh_demos.DemoSet.parse(t) for t in args.pop("generate")]
    heldout_set = args.pop("generate_heldout")
    workers = args.pop("workers")
    deadline, step_time = args.pop("deadline_unix"), args.pop("step_time_s")
    if bool(generate) == bool(args["data"]) or bool(generate) != bool(heldout_set):
        parser.error("give --data, or --generate with --generate-heldout")
    args["preset"] = _data.model_preset(args["preset"], args["object_state"])
    config = TrainConfig(data_dir=args.pop("data"), out_dir=args.pop("out"), **args)
    # force: an import (absl, via orbax) has already put a WARNING-level handler on the root
    # logger, which would make basicConfig a no-op and hide the data and evaluation lines.
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", force=True)
    episodes = None
    if generate:
        model_config = get_model_config(config.preset)
        started = time.monotonic()
        split = []
        for sets in (generate, [fresh_demos.DemoSet.parse(heldout_set)]):
            eps, failed = fresh_demos.generate_episodes(
                sets, model_config, workers, object_state=config.object_state
            )
            logger.info(
                "generated %d episodes (%d failed: %s)", len(eps.specs), len(failed), failed
            )
            split.append(eps)
        logger.info("generation took %.0f s with %d workers", time.monotonic() - started, workers)
        episodes = (split[0], split[1])
    if deadline > 0 and step_time > 0:
        if episodes is None:  # the time left counts from when the data is ready
            episodes = load_split(config, workers)
        left = deadline - time.time()
        config = fit_to_deadline(config, left, step_time)
        logger.info("%.0f s left: training %d steps", left, config.steps)
    if episodes is None and workers > 1:  # else train() reads them in this process
        episodes = load_split(config, workers)
    final = train(config, episodes)
    print(
        "trained steps={step} val_action_loss={val_action_loss:.4f} "
        "val_subtask_exact={val_subtask_exact:.3f} val_action_mae_rad={val_action_mae_rad:.4f} "
        "wall_s={train_wall_s:.0f}".format(**final)
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
