"""One training step and the parameters it updates: `Trainer`, and the batches it takes.

`Trainer` keeps the trainable leaves (the tied embedding cut to the tokenizer's rows), the
optimiser state (`make_optimizer`: AdamW with warm-up and cosine decay after global-norm
clipping) and, with `ema_decay`, their moving average; its jitted step, held-out losses and
denoised actions are compiled once per setting (`_Compiled`) and shared by every trainer with
it. `to_batch` turns host rows into the model's batch, `DeviceSamples` gathers them on the
accelerator, `drop_images` masks every camera of some rows (image dropout).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import flax.nnx as nnx
import jax
import jax.numpy as jnp
import numpy as np
import optax

from oxygen_ros.engine import model_fns
from oxygen_ros.engine.config import ModelConfig
from oxygen_ros.engine.model import Pi05Model, abstract_model
from oxygen_ros.training import data as _data
from oxygen_ros.training import loss as _loss
from oxygen_ros.training.train_config import TrainConfig

EMBEDDING_PATH = ("PaliGemma", "llm", "embedder", "input_embedding")


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
