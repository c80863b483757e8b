"""Norm stats of the training data: openpi's statistics, and how a run changes them.

`compute_norm_stats` (openpi's `RunningStats` over every state and every action row);
`widen_norm_stats` (no dimension narrower than a floor), `blind_norm_stats` (state dimensions
normalised to one bin), `set_action_range` (the grippers' action quantiles set apart);
`training_norm_stats`: the stats a run trains with and saves (its data's, or with
`--init-from` the starting checkpoint's), with the run's changes applied.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
from openpi.shared import normalize

from oxygen_ros.engine.checkpoint import load_norm_stats
from oxygen_ros.engine.checkpoint_assets import load_delta_action_mask
from oxygen_ros.engine.config import NormConfig
from oxygen_ros.training import data as _data

if TYPE_CHECKING:
    from oxygen_ros.training.train_config import TrainConfig

logger = logging.getLogger("oxygen_ros.training")


def compute_norm_stats(
    episodes: _data.Episodes, norm: NormConfig
) -> dict[str, normalize.NormStats]:
    """openpi norm stats of the state and of every action row."""
    stats = {}
    for key, values in ((norm.state_key, episodes.state), (norm.actions_key, episodes.actions)):
        running = normalize.RunningStats()
        running.update(values.reshape(-1, values.shape[-1]))
        stats[key] = running.get_statistics()
    return stats


def widen_norm_stats(
    stats: dict[str, normalize.NormStats], min_range: float
) -> tuple[dict[str, normalize.NormStats], dict[str, list[int]]]:
    """`stats` with every dimension narrower than `min_range` widened to it about its centre:
    the 1-99 % quantiles to `min_range` apart, the standard deviation to `min_range` / 2.

    A dimension the data barely moves (the expert never rolls the forearm: its delta actions
    span 0.005 rad) otherwise turns a small departure into a huge normalised value (a 0.1 rad
    correction reads as 40 where the rest lie in [-1, 1]), and a few such rows then carry most
    of the loss. Returns the new stats and, per key, the dimensions widened."""
    out, widened = {}, {}
    for key, s in stats.items():
        q01, q99, narrow = widen_range(s.q01, s.q99, min_range)
        out[key] = normalize.NormStats(
            mean=np.asarray(s.mean),
            std=np.maximum(np.asarray(s.std), min_range / 2),
            q01=q01.astype(np.asarray(s.q01).dtype),
            q99=q99.astype(np.asarray(s.q99).dtype),
        )
        widened[key] = np.flatnonzero(narrow).tolist()
    return out, widened


def widen_range(
    low: np.ndarray, high: np.ndarray, min_range: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(low, high, narrow), float64: every range narrower than `min_range` widened to it about
    its centre (`narrow` marks those)."""
    low, high = np.asarray(low, np.float64), np.asarray(high, np.float64)
    narrow = (high - low) < min_range
    centre = (low + high) / 2
    return (
        np.where(narrow, centre - min_range / 2, low),
        np.where(narrow, centre + min_range / 2, high),
        narrow,
    )


def set_action_range(
    stats: dict[str, normalize.NormStats], key: str, dims: Sequence[int], width: float
) -> dict[str, normalize.NormStats]:
    """`stats` with `key`'s dimensions `dims` given 1-99 % quantiles `width` apart about their
    centre (and the standard deviation scaled alike). Narrower than the data's: those values
    normalise to larger numbers, so they weigh more in the flow-matching loss (a squared error
    over the normalised chunk) and stand further out of its unit noise. Idempotent: the width
    is set, not scaled, so fine-tuning a checkpoint trained this way keeps its stats."""
    s = stats[key]
    dims = list(dims)
    q01 = np.asarray(s.q01, np.float64).copy()
    q99 = np.asarray(s.q99, np.float64).copy()
    std = np.asarray(s.std, np.float64).copy()
    centre = (q01[dims] + q99[dims]) / 2
    std[dims] *= width / np.maximum(q99[dims] - q01[dims], 1e-12)
    q01[dims], q99[dims] = centre - width / 2, centre + width / 2
    dtype = np.asarray(s.q01).dtype
    ranged = normalize.NormStats(
        mean=np.asarray(s.mean),
        std=std.astype(dtype),
        q01=q01.astype(dtype),
        q99=q99.astype(dtype),
    )
    return {**stats, key: ranged}


# A blinded dimension's norm stats: centre BLIND_OFFSET below its data's 1 % quantile, half-range
# BLIND_HALF_RANGE, so every value within 2 of that quantile (a gripper reads 0..1) normalises
# into [0.001, 0.005] (either normalisation): one state bin (openpi's 256 over [-1, 1] are
# 0.0078 wide, bin 128 starts at 0), whatever the robot measures.
BLIND_OFFSET = 3.0
BLIND_HALF_RANGE = 1000.0


def blind_norm_stats(
    stats: dict[str, normalize.NormStats], key: str, dims: Sequence[int]
) -> dict[str, normalize.NormStats]:
    """`stats` with `key`'s dimensions `dims` normalised to one constant bin: the prompt the
    engine tokenises then carries nothing of them, at training and at run time alike (the
    checkpoint's norm_stats.json carries the blinding). For proprioception a policy should not
    copy (the measured gripper: a copycat learner closes it because the demonstrations' own
    gripper was closed a moment before). Idempotent: blinded dimensions stay as they are."""
    s = stats[key]
    dims = list(dims)
    q01 = np.asarray(s.q01, np.float64).copy()
    q99 = np.asarray(s.q99, np.float64).copy()
    mean = np.asarray(s.mean, np.float64).copy()
    std = np.asarray(s.std, np.float64).copy()
    # Already blinded (fine-tuning keeps the starting checkpoint's stats): left as they are, so
    # the bin the model learned stays the bin it is served.
    dims = [d for d in dims if not np.isclose(q99[d] - q01[d], 2 * BLIND_HALF_RANGE)]
    centre = q01[dims] - BLIND_OFFSET
    q01[dims], q99[dims] = centre - BLIND_HALF_RANGE, centre + BLIND_HALF_RANGE
    mean[dims], std[dims] = centre, BLIND_HALF_RANGE
    dtype = np.asarray(s.q01).dtype
    blinded = normalize.NormStats(
        mean=mean.astype(dtype),
        std=std.astype(dtype),
        q01=q01.astype(dtype),
        q99=q99.astype(dtype),
    )
    return {**stats, key: blinded}


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
    With `min_norm_range`, then widened (`widen_norm_stats`).
    With `blind_state`, those state dimensions then normalise to one bin (`blind_norm_stats`).
    With `gripper_action_range`, the grippers' action quantiles are set that far apart
    (`set_action_range`).

    Raises:
        ValueError: the starting checkpoint's stats do not fit these episodes' state or action
            width, or it was trained with another delta-action mask.
    """
    stats = _norm_stats_of(config, train_eps, norm, delta_mask)
    if config.min_norm_range > 0:
        stats, widened = widen_norm_stats(stats, config.min_norm_range)
        logger.info("norm stats: widened to %g: %s", config.min_norm_range, widened)
    if config.blinded_names:
        names = _data.state_names(config.object_state)
        dims = [names.index(n) for n in config.blinded_names]
        stats = blind_norm_stats(stats, norm.state_key, dims)
        logger.info("norm stats: state %s blinded", list(config.blinded_names))
    if config.gripper_action_range > 0:
        stats = set_action_range(
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
        return compute_norm_stats(train_eps, norm)
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
