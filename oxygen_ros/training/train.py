"""Trains the engine's `Pi05Model` on workcell demonstrations and writes an openpi checkpoint.

`python -m oxygen_ros.training.train --data <demos dir> --out <dir>` (scripts/train sets up
first). Steps, on 2 CPU cores:
1. Read the successful episodes; the `--heldout` episodes with the highest seeds are never
   trained on (evaluation only).
2. openpi norm stats of the training episodes (with `--init-from`, the starting checkpoint's,
   unless `--fresh-norm-stats`: `training_norm_stats`); samples tokenised as the engine serves
   them (training/data.py).
   With `--blind-state left_gripper,right_gripper`, those state dimensions' stats normalise
   every value to one bin (norm_stats.blind_norm_stats): the prompt carries nothing of them, at
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

The run's pieces: `train_config.py` (`TrainConfig`), `trainer.py` (`Trainer`: the step, the
optimiser, the batches), `evaluation.py` (the held-out metrics, the curves) and
`norm_stats.py` (the norm stats a run trains with); this file splits the data, runs the loop,
writes the checkpoint and holds the command line.

Reproducibility: one seed fixes init, batch order and every random draw; XLA on CPU is
deterministic for a fixed build, so the same data, seed and versions give the same params.

Invariant: nothing here imports rclpy.
"""

import argparse
import dataclasses
import json
import logging
import pathlib
import shutil
import time
from collections.abc import Sequence

import h5py
import jax
import numpy as np
import orbax.checkpoint as ocp
from openpi.shared import normalize

from oxygen_ros.engine.checkpoint import Normalizer, load_params
from oxygen_ros.engine.checkpoint_assets import (
    StateLayout,
    save_delta_action_mask,
    save_narration_numbers,
    save_state_layout,
)
from oxygen_ros.engine.config import EngineConfig, NormConfig, PromptConfig, get_model_config
from oxygen_ros.engine.model import create_model
from oxygen_ros.engine.tokenizer import TOKENIZER_FILE, Tokenizer
from oxygen_ros.sim import recorder
from oxygen_ros.training import bin_embeddings, fresh_demos
from oxygen_ros.training import data as _data
from oxygen_ros.training.evaluation import (
    evaluate,
    evaluate_blind,
    evaluate_first_frames,
    plot_curves,
)
from oxygen_ros.training.norm_stats import training_norm_stats
from oxygen_ros.training.train_config import TrainConfig
from oxygen_ros.training.trainer import DeviceSamples, Trainer, drop_images, to_batch

logger = logging.getLogger("oxygen_ros.training")


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
