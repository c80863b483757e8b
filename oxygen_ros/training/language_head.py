"""The language head: the prefix LLM's leaves that shape the spoken tokens and nothing the
action expert reads.

pi0.5's action expert attends to the prefix LLM's keys and values at every layer
(`model_fns.action_velocity`). Layer l's keys and values are computed from the residual
stream entering layer l (its `pre_attention_norm`, then `kv_einsum`), so they depend on layers
0..l-1 and on layer l's `pre_attention_norm` and `kv_einsum`, never on what layer l computes
after them. In the last layer that is the queries (`q_einsum`), the attention's output
projection (`attn_vec_einsum`), the MLP and its norm (`pre_ffw_norm`); after the last layer
comes `final_norm`, which only the logits read. Those leaves are the language head: training
them changes what the model says and leaves every action it denoises bit for bit as it was.

The tied embedding is not part of it: its rows are the prompt's input embeddings too.

`update_mask(model)` gives, per flattened state leaf, the multiplier a training step applies
to its gradient and update (`TrainConfig.language_head_only`): 1 on the head, 0 elsewhere;
for the leaves stacked over layers, a [depth, 1, ...] array that is 1 on the last layer only.

Invariant: nothing here imports rclpy.
"""

from __future__ import annotations

import flax.nnx as nnx
import jax
import numpy as np

from oxygen_ros.training.trainer import leaf_names

LLM = ("PaliGemma", "llm")
# The prefix LLM's (not the action expert's "_1") per-layer leaves of the head, under "layers".
LAST_LAYER_LEAVES = (
    ("attn", "q_einsum"),
    ("attn", "attn_vec_einsum"),
    ("mlp", "gating_einsum"),
    ("mlp", "linear"),
    ("pre_ffw_norm",),
)
FINAL_NORM = ("final_norm",)


def _head_part(names: tuple[str, ...]) -> str:
    """The head part of a leaf: "final" (final norm), "last_layer" (stacked) or "" (none)."""
    if names[: len(LLM)] != LLM:
        return ""
    rest = names[len(LLM) :]
    if rest[: len(FINAL_NORM)] == FINAL_NORM:
        return "final"
    if rest[:1] == ("layers",) and any(
        rest[1 : 1 + len(leaf)] == leaf for leaf in LAST_LAYER_LEAVES
    ):
        return "last_layer"
    return ""


def update_mask(model: nnx.Module) -> list[np.ndarray]:
    """Per flattened state leaf (`jax.tree.flatten(nnx.state(model))` order), the multiplier
    of its gradient and update: ones on the language head, zeros elsewhere (module docstring).
    Shapes broadcast against the leaf: () for whole leaves, [depth, 1, ...] for stacked ones."""
    masks = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(nnx.state(model))[0]:
        part = _head_part(leaf_names(path))
        shape = np.shape(leaf)
        if part == "last_layer":
            rows = np.zeros((shape[0],) + (1,) * (len(shape) - 1), np.float32)
            rows[-1] = 1.0
            masks.append(rows)
        else:
            masks.append(np.float32(1.0 if part == "final" else 0.0))
    if not any(np.any(m) for m in masks):
        raise ValueError("the model has no prefix LLM language head leaves")
    return masks


def head_leaf_names(model: nnx.Module) -> list[str]:
    """The '/'-joined paths of the leaves the mask trains (any part of), for logs and tests."""
    flat = jax.tree_util.tree_flatten_with_path(nnx.state(model))[0]
    return ["/".join(leaf_names(p)) for p, _ in flat if _head_part(leaf_names(p))]
