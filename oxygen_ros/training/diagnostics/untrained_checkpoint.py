"""Diagnostic: an untrained checkpoint with a trained one's assets (ROS-free).

`prefix_head` asks whether an MLP can act from a checkpoint's prefix cache. Against a
trained prefix, the control is the prefix before any training: the preset's random
initialisation (`create_model(seed)`) with the state-bin embedding rows set as `train` sets
them before its first step (`bin_embeddings.with_smooth_bins`), optionally with other Fourier
frequencies (`--bin-frequencies 0.5`: a single quarter-circle, nearly a linear code of the
value). The assets (norm stats, tokenizer, delta-action mask, state layout) are the trained
checkpoint's, so the prompts, bins and actions are exactly those the trained one serves.

`python -P -m oxygen_ros.training.diagnostics.untrained_checkpoint --like DIR --preset P --out DIR
[--seed 0] [--bin-frequencies 0.5,1]` from the repository root. Nothing here imports rclpy.
"""

from __future__ import annotations

import argparse
import pathlib
from collections.abc import Sequence

import jax
import numpy as np
from flax import nnx

from oxygen_ros.engine.config import get_model_config
from oxygen_ros.engine.model import create_model
from oxygen_ros.training import bin_embeddings, expert_stage, train, trainer


def untrained_params(
    preset: str,
    tokenizer_path: str,
    seed: int,
    frequencies: tuple[float, ...] = bin_embeddings.FREQUENCIES,
) -> dict:
    """The preset's initial parameters (seed) with its state-bin rows as train starts them
    (`frequencies`: the Fourier frequencies of their code)."""
    from oxygen_ros.engine.tokenizer import Tokenizer

    model = create_model(get_model_config(preset), seed=seed)
    ids = bin_embeddings.bin_token_ids(Tokenizer(tokenizer_path))
    if ids is None:
        raise ValueError("the tokenizer has no single piece per state bin")
    graphdef, state = nnx.split(model)
    leaves, treedef = jax.tree.flatten(state)
    index = trainer.embedding_leaf(model)
    table = bin_embeddings.with_smooth_bins(np.asarray(leaves[index]), ids, seed, frequencies)
    leaves[index] = jax.numpy.asarray(table, leaves[index].dtype)
    model = nnx.merge(graphdef, jax.tree.unflatten(treedef, leaves))
    return nnx.to_pure_dict(nnx.state(model))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--like", required=True, help="the trained checkpoint whose assets")
    parser.add_argument("--preset", required=True, help="the trained checkpoint's preset")
    parser.add_argument("--out", required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--assets-id", default="workcell")
    parser.add_argument("--bin-frequencies", default="", help="e.g. 0.5 ('' = train's)")
    args = parser.parse_args(argv)
    config = expert_stage.StageConfig(
        checkpoint=args.like, data_dir="", out_dir="", assets_id=args.assets_id
    )
    assets = expert_stage.starting_assets(config)
    frequencies = bin_embeddings.FREQUENCIES
    if args.bin_frequencies:
        frequencies = tuple(float(f) for f in args.bin_frequencies.split(","))
    params = untrained_params(args.preset, assets["tokenizer_path"], args.seed, frequencies)
    train.save_checkpoint(pathlib.Path(args.out), params, **assets)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
