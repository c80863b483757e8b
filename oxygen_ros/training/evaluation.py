"""Held-out evaluation during training, and the loss curves.

Every `--eval-every` steps `train.train` records, on held-out samples: the teacher-forced
action loss and exact match of each language kind, and the error of denoised actions (the
engine's prefill + denoise from fixed noise) in radians (`evaluate`); with image dropout the
action loss with every camera masked (`evaluate_blind`); on the first frame of every held-out
episode, which arm the chunk moves more against the arm the task needs (`moved_arm`) and the
narration's exact match (`evaluate_first_frames`). `plot_curves` draws loss_curve.png.
"""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from oxygen_ros.engine.checkpoint import Normalizer
from oxygen_ros.engine.types import RequestKind
from oxygen_ros.sim import robot
from oxygen_ros.training import data as _data
from oxygen_ros.training import loss as _loss
from oxygen_ros.training.trainer import Trainer, drop_images, to_batch


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
