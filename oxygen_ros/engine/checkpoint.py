"""openpi-layout checkpoints: orbax `params/` into `Pi05Model`, norm stats, normalisation.

Layout (as released by openpi, e.g. pi05_base / pi05_droid / pi05_libero):

    <checkpoint_dir>/params/                      orbax PyTree {"params": tree}
    <checkpoint_dir>/assets/<assets_id>/norm_stats.json
    <checkpoint_dir>/assets/<assets_id>/action_space.json   (optional, this project's)
    <checkpoint_dir>/assets/<assets_id>/state_layout.json   (optional, this project's)

Parameters restore through openpi's `restore_params` (a trailing "value" key from training
checkpoints is stripped there) and must match the model's tree exactly: every missing,
unexpected or mis-shaped path is reported by name. Norm stats load through openpi's
`normalize.load`; states are normalised and actions unnormalised with openpi's own
`Normalize` / `Unnormalize` transforms (quantile for pi0.5, configurable).

The action space: openpi trains some policies on delta joint actions (`DeltaActions` with a
joint mask: the masked action dims are relative to the observation's state) and serves them with
`AbsoluteActions` after unnormalising. openpi keeps the mask in its training config; a
checkpoint trained here records it in `action_space.json` ({"delta_action_mask": [bool, ...]})
so that serving it needs no extra setting. Without the file the actions are absolute.

Both files are read and written by `engine/checkpoint_assets.py` (standard library only, so
nodes import it without JAX), with the state layout (`state_layout.json`, what the
checkpoint's state vector holds).

Invariants:
- A checkpoint never loads partially: any mismatch raises `CheckpointError` before the
  model exists.
- Without norm stats the normaliser is the identity (random-init engines).
"""

from __future__ import annotations

import logging
import pathlib
from collections.abc import Mapping

import flax.nnx as nnx
import flax.traverse_util
import jax.numpy as jnp
import numpy as np
import openpi.models.model as _openpi_model
import openpi.shared.normalize as _normalize
import openpi.transforms as _transforms

from oxygen_ros.engine.checkpoint_assets import CheckpointError, assets_dir
from oxygen_ros.engine.config import ModelConfig, NormConfig
from oxygen_ros.engine.model import Pi05Model, abstract_model, param_shapes

logger = logging.getLogger("oxygen_ros.engine")

NormStats = _normalize.NormStats
_MAX_LISTED = 8


def load_params(checkpoint_dir: str | pathlib.Path, config: ModelConfig) -> Pi05Model:
    """Restores `<checkpoint_dir>/params` into a `Pi05Model` of `config` (param_dtype)."""
    params_dir = _params_dir(checkpoint_dir)
    try:
        params = _openpi_model.restore_params(
            params_dir, restore_type=np.ndarray, dtype=jnp.dtype(config.param_dtype)
        )
    except Exception as err:  # orbax raises many types; name the path and keep the cause
        raise CheckpointError(f"cannot restore orbax params from {params_dir}: {err}") from err
    return params_into_model(params, config, source=str(params_dir))


def params_into_model(
    params: Mapping, config: ModelConfig, *, source: str = "params"
) -> Pi05Model:
    """Puts a nested {"PaliGemma": {...}, ...} param dict into a model, checking the tree."""
    abstract = abstract_model(config)
    expected = param_shapes(abstract)
    got = {
        "/".join(str(k) for k in path): np.shape(value)
        for path, value in flax.traverse_util.flatten_dict(dict(params)).items()
    }
    problems = _tree_problems({k: shape for k, (shape, _) in expected.items()}, got)
    if problems:
        raise CheckpointError(
            f"{source} does not match the {config.name!r} model "
            f"({config.paligemma_variant} + {config.action_expert_variant}, "
            f"{config.vision_variant}):\n  " + "\n  ".join(problems)
        )
    graphdef, state = nnx.split(abstract)
    nnx.replace_by_pure_dict(
        state, _map_nested(params, lambda x: jnp.asarray(x, dtype=config.param_dtype))
    )
    return nnx.merge(graphdef, state)


def load_norm_stats(
    checkpoint_dir: str | pathlib.Path, assets_id: str | None
) -> dict[str, NormStats]:
    """Loads `<checkpoint_dir>/assets/<assets_id>/norm_stats.json` (openpi format).

    With `assets_id=None` the checkpoint's only assets directory is used.
    """
    directory = assets_dir(checkpoint_dir, assets_id)
    if not (directory / "norm_stats.json").is_file():
        raise FileNotFoundError(f"norm stats not found: {directory / 'norm_stats.json'}")
    return _normalize.load(directory)


class Normalizer:
    """State in, actions out, with openpi's transforms; identity without stats."""

    def __init__(self, norm_stats: Mapping[str, NormStats] | None, config: NormConfig) -> None:
        self._config = config
        self.state_stats = None if norm_stats is None else norm_stats.get(config.state_key)
        self.action_stats = None if norm_stats is None else norm_stats.get(config.actions_key)
        if norm_stats is not None and (self.state_stats is None or self.action_stats is None):
            raise CheckpointError(
                f"norm stats need {config.state_key!r} and {config.actions_key!r}, "
                f"got {sorted(norm_stats)}"
            )
        self._normalize = _transforms.Normalize(
            None if self.state_stats is None else {"state": self.state_stats},
            use_quantiles=config.use_quantiles,
        )
        self._normalize_actions = _transforms.Normalize(
            None if self.action_stats is None else {"actions": self.action_stats},
            use_quantiles=config.use_quantiles,
        )
        self._unnormalize = _transforms.Unnormalize(
            None if self.action_stats is None else {"actions": self.action_stats},
            use_quantiles=config.use_quantiles,
        )

    @property
    def action_dim(self) -> int | None:
        """Robot action dimension from the stats (None without stats)."""
        return None if self.action_stats is None else int(np.shape(self.action_stats.mean)[-1])

    def normalize_state(self, state: np.ndarray) -> np.ndarray:
        """Raw state [n] -> normalised state [n] (quantile: q01..q99 -> -1..1)."""
        return np.asarray(self._normalize({"state": np.asarray(state, np.float32)})["state"])

    def normalize_actions(self, actions: np.ndarray) -> np.ndarray:
        """Robot actions [..., J] -> model units (what training regresses)."""
        out = self._normalize_actions({"actions": np.asarray(actions, np.float32)})["actions"]
        return np.asarray(out, np.float32)

    @staticmethod
    def relative_actions(
        actions: np.ndarray, state: np.ndarray, delta_mask: tuple[bool, ...]
    ) -> np.ndarray:
        """Absolute actions [..., A, J] (robot units) -> delta, with openpi's `DeltaActions`:
        the raw `state` [..., >= J] is subtracted on the masked dims (a new array; the identity
        for an empty mask). The inverse of `absolute_actions`."""
        if not delta_mask:
            return np.array(actions, np.float32)
        data = {"state": np.asarray(state, np.float32), "actions": np.array(actions, np.float32)}
        return np.asarray(_transforms.DeltaActions(delta_mask)(data)["actions"], np.float32)

    @staticmethod
    def absolute_actions(
        actions: np.ndarray, state: np.ndarray, delta_mask: tuple[bool, ...]
    ) -> np.ndarray:
        """Delta actions [A, J] (robot units) -> absolute, with openpi's `AbsoluteActions`: the
        raw `state` is added on the masked dims (identity for an empty mask). The inverse of
        `relative_actions`."""
        if not delta_mask:
            return np.asarray(actions, np.float32)
        data = {"state": np.asarray(state, np.float32), "actions": np.array(actions, np.float32)}
        return np.asarray(_transforms.AbsoluteActions(delta_mask)(data)["actions"], np.float32)

    def unnormalize_actions(self, actions: np.ndarray) -> np.ndarray:
        """Model actions [..., J] -> robot units; dims beyond the stats pass through."""
        out = self._unnormalize({"actions": np.asarray(actions, np.float32)})["actions"]
        return np.asarray(out, np.float32)


def _params_dir(checkpoint_dir: str | pathlib.Path) -> pathlib.Path:
    root = pathlib.Path(checkpoint_dir).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(f"checkpoint directory does not exist: {root}")
    params_dir = root / "params"
    if not params_dir.is_dir():
        raise FileNotFoundError(f"checkpoint has no orbax params directory: {params_dir}")
    return params_dir


def _tree_problems(
    expected: Mapping[str, tuple[int, ...]], got: Mapping[str, tuple[int, ...]]
) -> list[str]:
    missing = sorted(set(expected) - set(got))
    unexpected = sorted(set(got) - set(expected))
    shapes = sorted(k for k in set(expected) & set(got) if tuple(got[k]) != tuple(expected[k]))
    problems = []
    problems += [f"missing: {k} {expected[k]}" for k in missing[:_MAX_LISTED]]
    problems += [f"unexpected: {k} {got[k]}" for k in unexpected[:_MAX_LISTED]]
    problems += [
        f"shape: {k} expected {expected[k]}, got {tuple(got[k])}" for k in shapes[:_MAX_LISTED]
    ]
    hidden = len(missing) + len(unexpected) + len(shapes) - len(problems)
    if hidden > 0:
        problems.append(f"... and {hidden} more")
    return problems


def _map_nested(tree: Mapping, fn):
    return {k: _map_nested(v, fn) if isinstance(v, Mapping) else fn(v) for k, v in tree.items()}
