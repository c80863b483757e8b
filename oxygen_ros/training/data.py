"""Workcell demonstrations -> model-ready training arrays, exactly as the engine serves inputs.

One sample per recorded step t of a successful episode:
- images: each camera resized to the model resolution with openpi_client's `resize_with_pad`
  (PIL bilinear, what the perception node does at run time; the engine then gets the model
  resolution and does not resize again), in the model's slot order;
- prompt: openpi's pi0.5 prompt with the quantile-normalised joint state written into it
  (`prompts.tokenize_action_prompt`, the engine's own function);
- actions: the next `action_horizon` commanded targets action[t], action[t+1], ... (rows 1/fps
  apart; the last row repeats past the end of the episode), normalised with the same stats
  and zero-padded to the model's action dim (openpi's `PadStatesAndActions`);
- home prompt: the same prompt with the episode's first state (the robot at home) instead of
  step t's, which training swaps in for a fraction of samples (state dropout): then only the
  images and the instruction tell where the arms are and which arm acts;
- language: for each request kind, the engine's tail (`PromptConfig`) then the target text of
  the phase recorded at t (`sim.language.targets`) then EOS, packed into one block with a
  segment per kind; labels are the next ids, counted from the last tail token on.

Norm stats are openpi's (`normalize.RunningStats` over every state and every action row):
training/norm_stats.py.

Invariants:
- A sample's prompt/tail ids are what `Engine` would build for the same observation.
- Episodes are never split: a held-out episode contributes no sample to training.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import openpi.transforms as _transforms
from openpi_client import image_tools

from oxygen_ros.engine import prompts
from oxygen_ros.engine.checkpoint import Normalizer
from oxygen_ros.engine.checkpoint_assets import StateLayout
from oxygen_ros.engine.config import ModelConfig, PromptConfig
from oxygen_ros.engine.tokenizer import (
    BUNDLED_TOKENIZER_PATH,
    EOS_ID,
    STATE_BINS_TOKENIZER_PATH,
    Tokenizer,
)
from oxygen_ros.engine.types import Observation, RequestKind
from oxygen_ros.perception import workcell_cubes
from oxygen_ros.sim import language, recorder, robot, tasks

if TYPE_CHECKING:
    from oxygen_ros.sim.workcell import Workcell

logger = logging.getLogger("oxygen_ros.training")

# Workcell camera -> model image slot (the workcell profile's perception mapping).
SLOT_CAMERAS = {
    "base_0_rgb": "top",
    "left_wrist_0_rgb": "left_wrist",
    "right_wrist_0_rgb": "right_wrist",
}
LANGUAGE_KINDS = (RequestKind.SUBTASK, RequestKind.NARRATION, RequestKind.MEMORY)
# openpi's ALOHA delta mask: the 6 arm joints of each arm relative to the state, grippers
# absolute (robot.JOINT_NAMES: left arm, left gripper, right arm, right gripper).
DELTA_ACTION_MASK = _transforms.make_bool_mask(6, -1, 6, -1)
GRIPPER_ACTION_DIMS = tuple(
    arm * robot.JOINTS_PER_ARM + robot.JOINTS_PER_ARM - 1 for arm in range(len(robot.ARMS))
)  # each arm's gripper among the 14 action dimensions
# The preset whose prompt budget holds each object state (`workcell_cubes.OBJECT_STATES`)
# with the bundled tokenizer (reach: with the state-bins tokenizer, the only one it is sized
# for): the default for that state.
OBJECT_STATE_PRESETS = {
    "": "workcell",
    "positions": "workcell_objects",
    "poses": "workcell_poses",
    "reach": "workcell_reach_bins",
    "target": "workcell_target_bins",
    "target_m": "workcell_target_m_bins",
}
# Every workcell preset and the object state its prompt budget was sized for
# (workcell_poses_bins: the poses at one token per number, tokenizer.STATE_BINS_TOKENIZER_PATH).
PRESET_OBJECT_STATES = {
    **{preset: kind for kind, preset in OBJECT_STATE_PRESETS.items()},
    "workcell_poses_bins": "poses",
    "workcell_target_wide": "target",
}
# The tokenizer each preset's prompt budget was sized with (every other preset: the bundled one).
PRESET_TOKENIZERS = {
    "workcell_poses_bins": STATE_BINS_TOKENIZER_PATH,
    "workcell_reach_bins": STATE_BINS_TOKENIZER_PATH,
    "workcell_target_bins": STATE_BINS_TOKENIZER_PATH,
    "workcell_target_m_bins": STATE_BINS_TOKENIZER_PATH,
    "workcell_target_wide": STATE_BINS_TOKENIZER_PATH,
}


def preset_tokenizer(preset: str) -> os.PathLike:
    """The tokenizer `preset`'s prompt budget holds the longest prompt with."""
    return PRESET_TOKENIZERS.get(preset, BUNDLED_TOKENIZER_PATH)


LANGUAGE_BLOCK_LEN = 48  # packed tails + targets of the three kinds (longest: 43)


@dataclasses.dataclass
class Episodes:
    """Raw per-step arrays of several episodes (robot units), concatenated."""

    images: dict[str, np.ndarray]  # slot -> uint8 [N, h, w, 3] at the model resolution
    state: np.ndarray  # float32 [N, J] (+ the object part with object_state)
    actions: np.ndarray  # float32 [N, A, J]
    episode: np.ndarray  # int32 [N], index into `specs`
    stage: np.ndarray  # int32 [N], phase index of the recorded subtask
    specs: list[tasks.EpisodeSpec]  # one per episode
    seeds: list[int]  # episode seeds, one per episode

    def __len__(self) -> int:
        return int(self.state.shape[0])


@dataclasses.dataclass
class Samples:
    """Model-ready arrays (what one training step slices a batch from)."""

    images: dict[str, np.ndarray]  # slot -> uint8 [N, h, w, 3]
    tokens: np.ndarray  # int32 [N, max_token_len], pi0.5 prompt
    token_mask: np.ndarray  # bool [N, max_token_len]
    actions: np.ndarray  # float32 [N, A, action_dim], normalised and padded
    lang_tokens: np.ndarray  # int32 [N, Tl]: tail + target per kind, packed
    lang_mask: np.ndarray  # bool [N, Tl]: valid input tokens
    lang_segment: np.ndarray  # int32 [N, Tl]: index of the kind a token belongs to
    lang_index: np.ndarray  # int32 [N, Tl]: position of the token inside its segment
    lang_labels: np.ndarray  # int32 [N, Tl]: next id (target ids then EOS)
    lang_loss_mask: np.ndarray  # bool [N, Tl]: where labels count
    episode: np.ndarray  # int32 [N]
    stage: np.ndarray  # int32 [N]
    step: np.ndarray  # int32 [N]: index of the step inside its episode (0: the first frame)
    home_tokens: np.ndarray  # int32 [N, max_token_len]: the prompt with the episode's first
    home_token_mask: np.ndarray  # bool [N, max_token_len]   state (home), for state dropout

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    def take(self, index: np.ndarray) -> dict[str, object]:
        """Batch of rows `index` as a dict of arrays (images still uint8)."""
        out: dict[str, object] = {"images": {k: v[index] for k, v in self.images.items()}}
        for field in dataclasses.fields(self):
            if field.name != "images":
                out[field.name] = getattr(self, field.name)[index]
        return out


def chunk_indices(steps: int, horizon: int) -> np.ndarray:
    """[steps, horizon] step indices of each step's action chunk: the next `horizon` steps,
    the last step repeated past the episode's end."""
    return np.minimum(np.arange(steps)[:, None] + np.arange(horizon), steps - 1)


class NoEpisodesError(ValueError):
    """None of the given episode files is one to train on (all failed, none relabelled)."""


def load_episodes(
    paths: Sequence[str | os.PathLike],
    config: ModelConfig,
    fps: float | None = None,
    object_state: str = "",
) -> Episodes:
    """Reads successful episodes (and relabelled ones, successful or not: their labels are
    the expert's chunks, `recorder`'s `/action_chunk`) and builds per-step raw arrays at the
    model resolution.

    With `object_state` (`workcell_cubes.OBJECT_STATES`), each step's state is the joints
    followed by the cubes' table positions, poses, offsets from the hands (or the instructed
    cube's alone) that the workcell's perception finds in the recorded top-camera frames (at
    their recorded resolution, as perception sees them) and, past positions, the recorded
    joints, through the episode."""
    images: dict[str, list[np.ndarray]] = {slot: [] for slot in config.image_keys}
    state, actions, episode, stage = [], [], [], []
    specs, seeds = [], []
    for path in paths:
        ep = recorder.read_episode(path)
        if not ep.success and ep.action_chunk is None:
            logger.info("skipping failed episode %s", path)
            continue
        if fps is not None and abs(ep.fps - fps) > 1e-6:
            raise ValueError(f"{path}: recorded at {ep.fps} fps, expected {fps}")
        spec = tasks.sample_episode(ep.seed, ep.instruction)
        index = len(specs)
        specs.append(spec)
        seeds.append(ep.seed)
        steps = ep.qpos.shape[0]
        for slot in config.image_keys:
            frames = ep.images[SLOT_CAMERAS[slot]]
            resized = image_tools.resize_with_pad(frames, *config.image_resolution)
            images[slot].append(np.asarray(resized, np.uint8))
        joints = ep.qpos.astype(np.float32)
        if object_state:
            top = ep.images[workcell_cubes.CAMERA]
            target = target_of(object_state, spec)
            objects = workcell_cubes.episode_object_states(object_state, top, ep.qpos, target)
            joints = np.concatenate([joints, objects], axis=1)
        state.append(joints)
        if ep.action_chunk is not None:  # relabelled (DAgger): the expert's chunk per step
            if ep.action_chunk.shape[1] != config.action_horizon:
                raise ValueError(
                    f"{path}: chunks of {ep.action_chunk.shape[1]} rows, the model's horizon "
                    f"is {config.action_horizon}"
                )
            actions.append(ep.action_chunk.astype(np.float32))
        else:
            rows = chunk_indices(steps, config.action_horizon)
            actions.append(ep.action[rows].astype(np.float32))
        episode.append(np.full((steps,), index, np.int32))
        stage.append(np.array([language.stage_index(spec, s) for s in ep.subtasks], np.int32))
    if not specs:
        raise NoEpisodesError("no successful episodes to train on")
    return Episodes(
        images={k: np.concatenate(v) for k, v in images.items()},
        state=np.concatenate(state),
        actions=np.concatenate(actions),
        episode=np.concatenate(episode),
        stage=np.concatenate(stage),
        specs=specs,
        seeds=seeds,
    )


def _load_part(
    paths: Sequence[str | os.PathLike], config: ModelConfig, object_state: str
) -> Episodes | None:
    """One worker's share of `load_episode_groups` (None: no episode to train on)."""
    try:
        return load_episodes(paths, config, object_state=object_state)
    except NoEpisodesError:
        return None


def load_episode_groups(
    groups: Sequence[Sequence[str | os.PathLike]],
    config: ModelConfig,
    object_state: str = "",
    workers: int = 1,
) -> list[Episodes]:
    """`load_episodes` of each group of paths (for example the training and the held-out
    episodes), every group split into `workers` contiguous shares and all the shares read by
    one pool of `workers` processes (the object state's perception over every recorded top
    frame is the slow part), merged in order: per group the arrays one process gives."""
    if workers < 1:
        raise ValueError(f"need workers >= 1, got {workers}")
    groups = [list(g) for g in groups]
    if workers == 1 or all(len(g) < 2 for g in groups):
        return [load_episodes(g, config, object_state=object_state) for g in groups]
    import multiprocessing

    from oxygen_ros.sim import generate_demos

    jobs, owners = [], []
    for index, group in enumerate(groups):
        for first, count in generate_demos.split_range(len(group), workers):
            jobs.append((group[first : first + count], config, object_state))
            owners.append(index)
    # spawn: nothing (MuJoCo, XLA threads) is inherited from the parent.
    level = (logger.getEffectiveLevel(),)
    context = multiprocessing.get_context("spawn")
    with context.Pool(min(workers, len(jobs)), generate_demos.log_to_stderr, level) as pool:
        results = pool.starmap(_load_part, jobs, chunksize=1)
    loaded = []
    for index in range(len(groups)):
        parts = [r for r, o in zip(results, owners, strict=True) if o == index and r is not None]
        if not parts:
            raise NoEpisodesError("no successful episodes to train on")
        loaded.append(merge_episodes(parts))
    return loaded


def merge_episodes(parts: Sequence[Episodes]) -> Episodes:
    """Concatenates several `Episodes` (for example one per worker process) into one, in
    order; episode indices are renumbered into the merged `specs`."""
    if not parts:
        raise ValueError("no episodes to merge")
    offsets = np.cumsum([0] + [len(p.specs) for p in parts[:-1]])
    return Episodes(
        images={k: np.concatenate([p.images[k] for p in parts]) for k in parts[0].images},
        state=np.concatenate([p.state for p in parts]),
        actions=np.concatenate([p.actions for p in parts]),
        episode=np.concatenate(
            [p.episode + np.int32(offset) for p, offset in zip(parts, offsets, strict=True)]
        ),
        stage=np.concatenate([p.stage for p in parts]),
        specs=[spec for p in parts for spec in p.specs],
        seeds=[seed for p in parts for seed in p.seeds],
    )


def observe(
    workcell: Workcell,
    instruction: str,
    resolution: tuple[int, int],
    cubes: workcell_cubes.CubeState | workcell_cubes.CubePoseState | None = None,
    stamp: float = 0.0,
) -> Observation:
    """What the perception node hands the engine for the workcell's current state: the three
    cameras resized to `resolution` as the perception node does, the joint state (then, with a
    `cubes` tracker, the cubes it finds in the full-size top image), the instruction."""
    rendered = {camera: workcell.render(camera) for camera in SLOT_CAMERAS.values()}
    state = workcell.joint_positions().astype(np.float32)
    if cubes is not None:
        top = rendered[workcell_cubes.CAMERA]
        state = np.concatenate([state, cubes.update(top, workcell.joint_positions())])
    return Observation(
        images={
            slot: np.asarray(image_tools.resize_with_pad(rendered[camera], *resolution))
            for slot, camera in SLOT_CAMERAS.items()
        },
        image_masks=dict.fromkeys(SLOT_CAMERAS, True),
        state=state.astype(np.float32),
        prompt=instruction,
        stamp=stamp,
    )


def first_frame(
    workcell: Workcell,
    spec: tasks.EpisodeSpec,
    resolution: tuple[int, int],
    object_state: str = "",
) -> Observation:
    """`observe` right after a reset to `spec` (robot at home; with `object_state`, a fresh
    cube tracker), stamped 0."""
    workcell.reset(robot.HOME, spec.objects)
    cubes = workcell_cubes.object_state(object_state, target_of(object_state, spec))
    return observe(workcell, spec.instruction, resolution, cubes)


def state_names(object_state: str) -> tuple[str, ...]:
    """The state's dimension names: the joints (`robot.JOINT_NAMES`), then the object part's
    (`workcell_cubes.OBJECT_STATES`; none without one)."""
    cubes = workcell_cubes.object_state(object_state) if object_state else None
    return (*robot.JOINT_NAMES, *(cubes.names if cubes is not None else ()))


def state_layout(object_state: str) -> StateLayout:
    """`state_names(object_state)` as a checkpoint records them
    (`checkpoint_assets.StateLayout`)."""
    return StateLayout(
        tuple(robot.JOINT_NAMES), state_names(object_state)[len(robot.JOINT_NAMES) :]
    )


def language_block(
    tokenizer: Tokenizer, prompt: PromptConfig, texts: dict[str, str], length: int
) -> dict[str, np.ndarray]:
    """Packs tail + target (+ EOS label) of every kind into one block of `length` tokens."""
    tokens = np.zeros((length,), np.int32)
    mask = np.zeros((length,), bool)
    segment = np.zeros((length,), np.int32)
    index = np.zeros((length,), np.int32)
    labels = np.zeros((length,), np.int32)
    loss_mask = np.zeros((length,), bool)
    at = 0
    for seg, kind in enumerate(LANGUAGE_KINDS):
        tail_tokens, tail_mask = prompts.tokenize_tail(
            tokenizer, prompt.task(kind).tail, prompt.max_tail_len
        )
        tail = [int(t) for t in tail_tokens[tail_mask]]
        target = tokenizer.encode(texts[kind.value])
        if len(target) + 1 > prompt.task(kind).max_tokens:
            raise ValueError(
                f"{kind.value} target {texts[kind.value]!r} needs {len(target) + 1} tokens with "
                f"EOS, more than max_tokens={prompt.task(kind).max_tokens}"
            )
        ids = tail + target
        end = at + len(ids)
        if end > length:
            raise ValueError(f"language block needs more than {length} tokens")
        tokens[at:end] = ids
        mask[at:end] = True
        segment[at:end] = seg
        index[at:end] = np.arange(len(ids))
        # After the last tail token the model must say the target, then EOS.
        first = at + len(tail) - 1
        labels[first:end] = [*target, EOS_ID]
        loss_mask[first:end] = True
        at = end
    return {
        "lang_tokens": tokens,
        "lang_mask": mask,
        "lang_segment": segment,
        "lang_index": index,
        "lang_labels": labels,
        "lang_loss_mask": loss_mask,
    }


def build_samples(
    episodes: Episodes,
    config: ModelConfig,
    tokenizer: Tokenizer,
    normalizer: Normalizer,
    prompt: PromptConfig,
    block_len: int = LANGUAGE_BLOCK_LEN,
    narration_numbers: str = "digits",
) -> Samples:
    """Tokenises prompts and language targets and normalises actions for every step
    (`narration_numbers`: how the narration target says them, `sim.language.narration_text`)."""
    count = len(episodes)
    tokens = np.zeros((count, config.max_token_len), np.int32)
    token_mask = np.zeros((count, config.max_token_len), bool)
    starts = np.flatnonzero(np.r_[True, np.diff(episodes.episode) != 0])
    first = starts[np.searchsorted(starts, np.arange(count), side="right") - 1]
    blocks: dict[str, list[np.ndarray]] = {}
    cache: dict[tuple[int, int], dict[str, np.ndarray]] = {}
    for i in range(count):
        spec = episodes.specs[int(episodes.episode[i])]
        state = normalizer.normalize_state(episodes.state[i])
        tokens[i], token_mask[i] = prompts.tokenize_action_prompt(
            tokenizer, spec.instruction, state, config.max_token_len, truncate=False
        )
        key = (int(episodes.episode[i]), int(episodes.stage[i]))
        if key not in cache:
            texts = language.targets(spec, key[1], narration_numbers)
            cache[key] = language_block(tokenizer, prompt, texts, block_len)
        for name, value in cache[key].items():
            blocks.setdefault(name, []).append(value)
    actions = normalizer.normalize_actions(episodes.actions)
    padded = np.zeros((*actions.shape[:2], config.action_dim), np.float32)
    padded[..., : actions.shape[-1]] = actions
    return Samples(
        images=episodes.images,
        tokens=tokens,
        token_mask=token_mask,
        actions=padded,
        episode=episodes.episode,
        stage=episodes.stage,
        step=(np.arange(count) - first).astype(np.int32),
        home_tokens=tokens[first],
        home_token_mask=token_mask[first],
        **{name: np.stack(values) for name, values in blocks.items()},
    )


def drop_state(rows: dict[str, object], drop: np.ndarray) -> dict[str, object]:
    """State dropout: rows where `drop` is true get the prompt with their episode's first
    (home) state; the rest keep their own. Returns a new dict; `rows` is not changed."""
    out = dict(rows)
    for name in ("tokens", "token_mask"):
        out[name] = np.where(drop[:, None], rows[f"home_{name}"], rows[name])
    return out


def target_of(object_state: str, spec: tasks.EpisodeSpec) -> str | None:
    """The cube an object state source must be told about: the instructed one for
    `workcell_cubes.TARGET_KINDS` (as the perception node learns it from the instruction),
    None for the others."""
    return spec.target if object_state in workcell_cubes.TARGET_KINDS else None


def object_state_of(preset: str) -> str:
    """The object state a preset's prompt budget was sized for ("" for the others)."""
    return PRESET_OBJECT_STATES.get(preset, "")


def check_preset(preset: str, object_state: str) -> None:
    """Refuses a preset whose prompt budget was sized for another object state than
    `object_state` (ValueError naming the presets sized for it)."""
    if object_state_of(preset) != object_state:
        message = (
            f"preset {preset} was sized for the object state {object_state_of(preset)!r}, "
            f"not {object_state!r}"
        )
        presets = [p for p, k in PRESET_OBJECT_STATES.items() if k == object_state]
        if presets:
            message += f": object_state {object_state} needs one of the presets {presets}"
        raise ValueError(message)


def model_preset(preset: str, object_state: str) -> str:
    """The model preset of a checkpoint trained with `object_state`: `preset`, or that state's
    default (`OBJECT_STATE_PRESETS`) when empty (`check_preset` refuses a mismatch)."""
    preset = preset or OBJECT_STATE_PRESETS[object_state]
    check_preset(preset, object_state)
    return preset


def add_object_state_argument(parser: argparse.ArgumentParser) -> None:
    """`--object-state [positions|poses|reach|target|target_m]` (alone: positions; absent:
    none) and
    `--preset` (the checkpoint's model preset; empty: the object state's default, see
    `model_preset`)."""
    parser.add_argument(
        "--preset",
        default="",
        help="the model preset the checkpoint was trained with (default: the object "
        "state's, data.OBJECT_STATE_PRESETS; workcell_poses_bins for poses with the state-bins "
        "tokenizer)",
    )
    parser.add_argument(
        "--object-state",
        nargs="?",
        const="positions",
        default="",
        choices=[kind for kind in workcell_cubes.OBJECT_STATES if kind],
        help="what follows the joints in the state: the cubes' positions (the default when "
        "given alone), poses, poses and each cube's offset from each hand (reach), or the "
        "instructed cube's pose and offsets alone (target; target_m: the offsets in metres); "
        "preset: data.OBJECT_STATE_PRESETS",
    )
