"""The MLP policies of the diagnostics: fitted on feature rows (regression or flow matching),
acting on one observation's features (ROS-free; `privileged_policy` and `prefix_head` use it).

- `fit`: `fits` regression MLPs (`state_policy.train`, their mean acts) or one flow-matching
  velocity field (`train_flow`, sampled in Euler steps by `flow_sample`), inputs optionally
  reduced to the pi0.5 prompt's bins (`as_prompt_bins`), targets the arm joints relative to the
  state and the grippers absolute (openpi's delta mask), normalised;
- `Policy`: the fitted MLPs as a callable (features, joints) -> chunk in robot units;
- `action_error`: a policy's mean |chunk - label| on held-out rows.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from oxygen_ros.engine.checkpoint import Normalizer
from oxygen_ros.engine.prompts import NUM_STATE_BINS, discretize_state
from oxygen_ros.sim import robot
from oxygen_ros.training import data, norm_stats
from oxygen_ros.training.diagnostics import state_policy

HORIZON = 10


@dataclasses.dataclass
class Policy:
    """The fitted MLPs (their mean, `state_policy.ensemble`) on selected blocks."""

    members: list
    stats: dict[str, np.ndarray]
    columns: np.ndarray
    flow_steps: int = 0  # > 0: the MLP is a flow-matching velocity field (`train_flow`)
    noise_scale: float = 1.0  # the flow's starting noise times this (0: from zero)

    def __post_init__(self) -> None:
        import jax

        self._forward = jax.jit(state_policy.ensemble)
        self._sample = jax.jit(flow_sample, static_argnums=3)
        self._rng = np.random.default_rng(0)

    def __call__(self, features: np.ndarray, joints: np.ndarray) -> np.ndarray:
        s = self.stats
        x = features[self.columns]
        if "bin_low" in s:
            x = as_prompt_bins(x, s["bin_low"], s["bin_high"])
        x = (x - s["input_mean"]) / s["input_std"]
        x = x[None].astype(np.float32)
        if self.flow_steps:
            noise = self.noise_scale * self._rng.standard_normal((1, len(s["target_mean"])))
            noise = noise.astype(np.float32)
            out = np.asarray(self._sample(self.members[0], x, noise, self.flow_steps))[0]
        else:
            out = np.asarray(self._forward(self.members, x))[0]
        rows = (out * s["target_std"] + s["target_mean"]).reshape(HORIZON, robot.NUM_JOINTS)
        return np.asarray(
            Normalizer.absolute_actions(rows, joints, data.DELTA_ACTION_MASK), np.float64
        )


def flow_sample(params, observation, noise, steps: int):
    """Euler integration of the velocity field from noise (time 1) to actions (time 0), in
    `steps` equal steps, the direction openpi's flow matching integrates."""
    import jax.numpy as jnp

    x, dt = noise, -1.0 / steps
    for i in range(steps):
        t = jnp.full((len(x), 1), 1.0 + i * dt, x.dtype)
        x = x + dt * state_policy.mlp(params, jnp.concatenate([observation, x, t], axis=1))
    return x


def train_flow(
    batches,
    sizes: tuple[int, int],
    steps: int,
    lr: float,
    width: int,
    seed: int,
    draws: int = 1,
):
    """`state_policy.train`'s MLP and schedule as a velocity field v(obs, x_t, t) with the
    flow-matching loss: x_t = t noise + (1 - t) actions, target noise - actions, t drawn from
    Beta(1.5, 1) (openpi's choice) kept off 0; `draws` (noise, time) pairs per sample, the
    loss their mean (as `train --action-draws`)."""
    import jax
    import jax.numpy as jnp

    def flow_loss(params, xb, yb, key):
        xb, yb = jnp.repeat(xb, draws, axis=0), jnp.repeat(yb, draws, axis=0)
        noise_key, time_key = jax.random.split(key)
        noise = jax.random.normal(noise_key, yb.shape)
        t = jax.random.beta(time_key, 1.5, 1.0, (len(yb), 1)) * 0.999 + 0.001
        x_t = t * noise + (1 - t) * yb
        v = state_policy.mlp(params, jnp.concatenate([xb, x_t, t], axis=1))
        return jnp.mean((v - (noise - yb)) ** 2)

    obs_width, action_width = sizes
    widths = (obs_width + action_width + 1, action_width)
    params, _ = state_policy.train(batches, widths, steps, lr, width, seed, flow_loss)
    return params


def as_prompt_bins(x: np.ndarray, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """`x` [..., F] as much as the pi0.5 prompt tells of it: quantile-normalised to [-1, 1]
    over (low, high) (openpi's q01, q99), cut into `prompts.discretize_state`'s 256 bins (-1
    below the range, 255 above it), each bin given back as its centre in normalised units."""
    return prompt_bin_centres((x - low) / (high - low) * 2.0 - 1.0)


def prompt_bin_centres(normalised: np.ndarray) -> np.ndarray:
    """Normalised values cut into `prompts.discretize_state`'s bins (-1 below the range, 255
    above it), each given back as its bin's centre in normalised units (float32)."""
    bins = discretize_state(normalised)
    return (-1.0 + (bins + 0.5) * 2.0 / NUM_STATE_BINS).astype(np.float32)


def fit(
    rows: dict[str, np.ndarray],
    cols: np.ndarray,
    steps: int,
    seed: int,
    fits: int,
    min_std: float = 1e-3,
    batch_size: int = 256,
    prompt_bins: bool = False,
    min_norm_range: float = 0.1,
    flow_steps: int = 0,
    flow_draws: int = 1,
    noise_scale: float = 1.0,
    gripper_scale: float = 1.0,
) -> Policy:
    """`fits` MLPs (seeds `seed`..) on the selected columns, their mean as the policy. Inputs
    are normalised by their std plus `min_std` (a floor: a column that barely varies in the
    demonstrations, such as the whole-view start minus the cube, would otherwise turn a
    2 mm error at run time into several standard deviations). With `prompt_bins` every input
    is first reduced to its pi0.5 prompt bin (`as_prompt_bins`, q01-q99 ranges widened to at
    least `min_norm_range` as `train --min-norm-range` widens them), in training and at run
    time alike. With `flow_steps` one MLP is fit as a flow-matching velocity field instead of
    a regression (`train_flow`) and acts by sampling in that many Euler steps.
    `gripper_scale` multiplies the grippers' normalised targets (their std divided by it): their
    share of the squared error, and for the flow their size against the unit noise."""
    x = rows["features"][:, cols]
    binning = {}
    if prompt_bins:
        low, high, _ = norm_stats.widen_range(
            np.quantile(x, 0.01, axis=0), np.quantile(x, 0.99, axis=0), min_norm_range
        )
        binning = {"bin_low": low.astype(x.dtype), "bin_high": high.astype(x.dtype)}
        x = as_prompt_bins(x, binning["bin_low"], binning["bin_high"])
    y = Normalizer.relative_actions(rows["chunks"], rows["joints"], data.DELTA_ACTION_MASK)
    y = y.reshape(len(y), -1)
    stats = {
        "input_mean": x.mean(0),
        "input_std": x.std(0) + min_std,
        "target_mean": y.mean(0),
        "target_std": (y.std(0) + 1e-3) / np.where(gripper_columns(y.shape[1]), gripper_scale, 1),
        **binning,
    }
    xn = ((x - stats["input_mean"]) / stats["input_std"]).astype(np.float32)
    yn = ((y - stats["target_mean"]) / stats["target_std"]).astype(np.float32)

    def batches(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        index = rng.integers(0, len(xn), batch_size)
        return xn[index], yn[index]

    members = []
    sizes = (xn.shape[1], yn.shape[1])
    for k in range(1 if flow_steps else fits):
        if flow_steps:
            params = train_flow(batches, sizes, steps, 1e-3, 512, seed + k, flow_draws)
        else:
            params, _ = state_policy.train(batches, sizes, steps, 1e-3, 512, seed + k)
        members.append([{name: np.asarray(v) for name, v in layer.items()} for layer in params])
    return Policy(members, stats, cols, flow_steps, noise_scale)


def gripper_columns(width: int) -> np.ndarray:
    """Which columns of a flattened chunk [A * 14] are gripper values."""
    return np.isin(np.arange(width) % robot.NUM_JOINTS, data.GRIPPER_ACTION_DIMS)


def action_error(policy: Policy, rows: dict[str, np.ndarray]) -> float:
    """Mean |chunk - label| over every row, joint and observation of `rows` (rad for the arm
    joints, the grippers' normalised travel), the policy's chunk as it would act."""
    pairs = zip(rows["features"], rows["joints"], strict=True)
    predicted = np.stack([policy(x, q.astype(np.float64)) for x, q in pairs])
    return float(np.abs(predicted - rows["chunks"]).mean())
