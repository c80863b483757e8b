"""Training samples are what the engine serves: prompt ids, images, tails, targets, actions."""

from __future__ import annotations

import numpy as np
import pytest
from demo_episodes import SEEDS, STEPS, write_episode

from oxygen_ros.engine import prompts
from oxygen_ros.engine.checkpoint import Normalizer
from oxygen_ros.engine.config import NormConfig, PromptConfig, get_model_config
from oxygen_ros.engine.inputs import observation_to_inputs
from oxygen_ros.engine.tokenizer import (
    BUNDLED_TOKENIZER_PATH,
    EOS_ID,
    STATE_BINS_TOKENIZER_PATH,
    Tokenizer,
)
from oxygen_ros.engine.types import Observation, RequestKind
from oxygen_ros.nodes.common.image_conversion import resize_with_pad
from oxygen_ros.perception import workcell_cubes
from oxygen_ros.sim import language, recorder, robot, tasks
from oxygen_ros.training import data, norm_stats
from oxygen_ros.training.train import split_episodes
from oxygen_ros.training.train_config import TrainConfig

WORKCELL = get_model_config("workcell")


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer(BUNDLED_TOKENIZER_PATH)


@pytest.fixture(scope="module")
def built(demos_dir, tokenizer):
    episodes = data.load_episodes(recorder.list_episodes(demos_dir), WORKCELL)
    normalizer = Normalizer(norm_stats.compute_norm_stats(episodes, NormConfig()), NormConfig())
    samples = data.build_samples(episodes, WORKCELL, tokenizer, normalizer, PromptConfig())
    return episodes, normalizer, samples


def served_inputs(ep, t: int, state, config, tokenizer, normalizer):
    """The engine's model inputs for step t of a recorded episode, as perception would publish
    it (each camera resized to the model resolution) with `state`."""
    observation = Observation(
        images={
            slot: resize_with_pad(ep.images[cam][t], *config.image_resolution)
            for slot, cam in data.SLOT_CAMERAS.items()
        },
        image_masks={slot: True for slot in data.SLOT_CAMERAS},
        state=state,
        prompt=ep.instruction,
        stamp=0.0,
    )
    return observation_to_inputs(
        observation,
        config.image_keys,
        config.image_resolution,
        tokenizer,
        normalizer,
        config.max_token_len,
    )


def test_prompt_and_images_equal_the_engines_inputs(demos_dir, built, tokenizer) -> None:
    _, normalizer, samples = built
    paths = recorder.list_episodes(demos_dir)
    for i in (0, STEPS + 5, 3 * STEPS - 1):
        ep = recorder.read_episode(paths[i // STEPS])
        t = i % STEPS
        inputs = served_inputs(ep, t, ep.qpos[t], WORKCELL, tokenizer, normalizer)
        np.testing.assert_array_equal(samples.tokens[i], inputs.tokens[0])
        np.testing.assert_array_equal(samples.token_mask[i], inputs.token_mask[0])
        for slot in WORKCELL.image_keys:
            assert samples.images[slot][i].shape == (*WORKCELL.image_resolution, 3)
            as_model = samples.images[slot][i].astype(np.float32) / 255.0 * 2.0 - 1.0
            np.testing.assert_array_equal(as_model, inputs.images[slot][0])
    # The state really is in the prompt: two steps of one episode differ in their ids.
    assert not np.array_equal(samples.tokens[0], samples.tokens[1])


def test_actions_are_the_next_rows_normalised_and_padded(demos_dir, built) -> None:
    _, normalizer, samples = built
    ep = recorder.read_episode(recorder.list_episodes(demos_dir)[1])
    horizon = WORKCELL.action_horizon
    for t in (0, STEPS - 3, STEPS - 1):
        rows = np.minimum(np.arange(t, t + horizon), STEPS - 1)
        got = samples.actions[STEPS + t]
        assert got.shape == (horizon, WORKCELL.action_dim)
        np.testing.assert_allclose(
            normalizer.unnormalize_actions(got[:, :14]), ep.action[rows], atol=1e-5
        )
        assert not got[:, 14:].any()


def test_language_block_is_tail_then_target_then_eos(built, tokenizer) -> None:
    episodes, _, samples = built
    prompt = PromptConfig()
    for i in range(0, len(samples), 7):
        spec = episodes.specs[episodes.episode[i]]
        texts = language.targets(spec, int(episodes.stage[i]))
        tokens, mask = samples.lang_tokens[i], samples.lang_mask[i]
        for seg, kind in enumerate(data.LANGUAGE_KINDS):
            in_seg = mask & (samples.lang_segment[i] == seg)
            ids = tokens[in_seg]
            tail_tokens, tail_mask = prompts.tokenize_tail(
                tokenizer, prompt.task(kind).tail, prompt.max_tail_len
            )
            tail = list(tail_tokens[tail_mask])
            assert list(ids[: len(tail)]) == tail
            assert tokenizer.decode(list(ids[len(tail) :])) == texts[kind.value]
            np.testing.assert_array_equal(samples.lang_index[i][in_seg], np.arange(len(ids)))
            labels = samples.lang_labels[i][in_seg & samples.lang_loss_mask[i]]
            assert labels[-1] == EOS_ID
            assert tokenizer.decode(list(labels[:-1])) == texts[kind.value]
            # Labels start at the last tail token: the engine samples the first target id
            # from the logits of the tail's last token.
            first = np.flatnonzero(in_seg & samples.lang_loss_mask[i])[0]
            assert first == np.flatnonzero(in_seg)[len(tail) - 1]


def test_narration_numbers_as_words_change_the_narration_target_only(built, tokenizer) -> None:
    episodes, normalizer, samples = built
    words = data.build_samples(
        episodes, WORKCELL, tokenizer, normalizer, PromptConfig(), narration_numbers="words"
    )
    narration = data.LANGUAGE_KINDS.index(RequestKind.NARRATION)
    for i in range(0, len(samples), 5):
        spec = episodes.specs[episodes.episode[i]]
        said = language.targets(spec, int(episodes.stage[i]), "words")["narration"]
        labels = words.lang_labels[i][
            words.lang_loss_mask[i] & (words.lang_segment[i] == narration)
        ]
        assert tokenizer.decode(list(labels[:-1])) == said
        assert said.startswith("step ") and not any(c.isdigit() for c in said)
        for seg in range(len(data.LANGUAGE_KINDS)):
            if seg == narration:
                continue
            # the blocks are packed: a longer narration moves the kinds after it, unchanged
            ours, theirs = ((b.lang_segment[i] == seg) & b.lang_mask[i] for b in (words, samples))
            for name in ("lang_tokens", "lang_labels", "lang_loss_mask", "lang_index"):
                got, was = getattr(words, name)[i][ours], getattr(samples, name)[i][theirs]
                np.testing.assert_array_equal(got, was)
    np.testing.assert_array_equal(words.tokens, samples.tokens)


def test_stages_follow_the_recorded_subtasks(built) -> None:
    episodes, _, _ = built
    for index, spec in enumerate(episodes.specs):
        stages = episodes.stage[episodes.episode == index]
        assert stages[0] == 0 and np.all(np.diff(stages) >= 0)
        assert stages[-1] == len(tasks.subtask_labels(spec)) - 1


def test_heldout_split_takes_the_highest_seeds(demos_dir) -> None:
    train, heldout = split_episodes(recorder.list_episodes(demos_dir), 1)
    assert [recorder.read_episode(p).seed for p in heldout] == [max(SEEDS)]
    assert sorted(recorder.read_episode(p).seed for p in train) == sorted(SEEDS)[:-1]
    with pytest.raises(ValueError, match="leaves no training episode"):
        split_episodes(recorder.list_episodes(demos_dir), len(SEEDS))


def test_a_target_too_long_for_its_kind_is_refused(tokenizer) -> None:
    texts = {"subtask": "grasp the red cube " * 8, "narration": "n", "memory": "m"}
    with pytest.raises(ValueError, match=r"subtask target .* more than max_tokens=16"):
        data.language_block(tokenizer, PromptConfig(), texts, 200)


def test_early_steps_are_drawn_more_often() -> None:
    from oxygen_ros.training.train import sampling_weights

    step = np.array([0, 1, 2, 3, 0, 1, 2, 0, 1], np.int32)
    weights = sampling_weights(step, early_steps=2, early_weight=4.0)
    assert np.isclose(weights.sum(), 1.0)
    early = np.array([1, 1, 0, 0, 1, 1, 0, 1, 1], bool)
    np.testing.assert_allclose(weights[early] / weights[~early].max(), 4.0)
    np.testing.assert_allclose(sampling_weights(step, 0, 4.0), np.full(9, 1 / 9))


def test_stage_weights_multiply_the_named_phases_draws() -> None:
    from oxygen_ros.training.train import sampling_weights
    from oxygen_ros.training.train_config import parse_stage_weights

    step = np.array([0, 1, 2, 3, 0, 1, 2, 3], np.int32)
    stage = np.array([0, 0, 1, 2, 1, 1, 1, 3], np.int32)
    weights = sampling_weights(step, 1, 2.0, stage, parse_stage_weights("1:4, 2:3"))
    assert np.isclose(weights.sum(), 1.0)
    # per sample: early (x2) and phase weights multiply (sample 4: 2 x 4); phases 0, 3 keep 1
    expected = np.array([2, 1, 4, 3, 8, 4, 4, 1], np.float64)
    np.testing.assert_allclose(weights, expected / expected.sum())
    # the control: no phase weights draws as early_weight alone does
    np.testing.assert_allclose(
        sampling_weights(step, 1, 2.0, stage, {}), sampling_weights(step, 1, 2.0)
    )
    assert parse_stage_weights("") == {}
    for bad in ("1", "1:0", "1:-2", "x:2", "-1:2", "1:2,1:3", "1:nan", "1:inf"):
        with pytest.raises(ValueError, match="stage_weights"):
            parse_stage_weights(bad)


def test_state_dropout_swaps_in_the_episodes_home_prompt_only_where_drawn(built) -> None:
    _, _, samples = built
    np.testing.assert_array_equal(samples.step, np.tile(np.arange(STEPS), len(SEEDS)))
    for i in range(len(samples)):
        first = i - i % STEPS
        np.testing.assert_array_equal(samples.home_tokens[i], samples.tokens[first])
        np.testing.assert_array_equal(samples.home_token_mask[i], samples.token_mask[first])
    index = np.array([3, STEPS + 4, 2 * STEPS + 1])
    rows = samples.take(index)
    dropped = data.drop_state(rows, np.array([True, False, True]))
    np.testing.assert_array_equal(dropped["tokens"][0], samples.tokens[0])
    np.testing.assert_array_equal(dropped["tokens"][1], samples.tokens[STEPS + 4])
    np.testing.assert_array_equal(dropped["token_mask"][2], samples.token_mask[2 * STEPS])
    # The drawn rows really changed (their state differs from home) and `rows` is untouched.
    assert not np.array_equal(dropped["tokens"][0], rows["tokens"][0])
    np.testing.assert_array_equal(rows["tokens"], samples.tokens[index])
    for name in ("actions", "lang_tokens", "lang_labels"):
        np.testing.assert_array_equal(dropped[name], rows[name])


@pytest.mark.parametrize("kind", ["positions", "poses"])
def test_object_state_is_the_joints_then_the_tracked_cubes_and_served_alike(
    demos_dir, tokenizer, kind
) -> None:
    """The state the loader builds is the joints then the object part that the perception
    gives for the recorded frames (and, for poses, joints), and it tokenises as served: every
    number fits the preset's prompt."""
    from oxygen_ros.perception import workcell_cubes

    config = get_model_config(data.OBJECT_STATE_PRESETS[kind])
    paths = recorder.list_episodes(demos_dir)
    episodes = data.load_episodes(paths, config, object_state=kind)
    width = len(workcell_cubes.object_state(kind).names)
    assert width == {"positions": 6, "poses": 21}[kind]
    assert episodes.state.shape == (len(SEEDS) * STEPS, 14 + width)
    normalizer = Normalizer(norm_stats.compute_norm_stats(episodes, NormConfig()), NormConfig())
    samples = data.build_samples(episodes, config, tokenizer, normalizer, PromptConfig())
    ep = recorder.read_episode(paths[1])
    top = ep.images[workcell_cubes.CAMERA]
    if kind == "positions":
        cubes = workcell_cubes.episode_cube_states(top)
    else:
        cubes = workcell_cubes.episode_cube_pose_states(top, ep.qpos)
    np.testing.assert_array_equal(episodes.state[STEPS : 2 * STEPS, :14], ep.qpos)
    np.testing.assert_array_equal(episodes.state[STEPS : 2 * STEPS, 14:], cubes)
    t = 4
    inputs = served_inputs(ep, t, episodes.state[STEPS + t], config, tokenizer, normalizer)
    np.testing.assert_array_equal(samples.tokens[STEPS + t], inputs.tokens[0])
    # Every number fits: the prompt ends with the action marker, as the engine builds it.
    text = tokenizer.decode(
        [int(i) for i in samples.tokens[STEPS + t][samples.token_mask[STEPS + t]]]
    )
    numbers = text.split("State: ")[1].split(";")[0].split()
    assert text.endswith("Action: ") and len(numbers) == 14 + width


def test_target_state_is_each_episodes_instructed_cube_and_served_alike(tmp_path) -> None:
    """`object_state="target"`: each episode's state carries the cube its instruction names
    (the loader tells perception, as the node's instruction topic does): its pose and offsets
    are that cube's rows of the reach state, and the prompt holds every number."""
    from oxygen_ros.perception import workcell_cubes

    config = get_model_config(data.OBJECT_STATE_PRESETS["target"])
    for index, seed in enumerate((2, 4, SEEDS[0])):  # the red, blue and green cube named
        write_episode(tmp_path, index, seed)
    paths = recorder.list_episodes(tmp_path)
    target = data.load_episodes(paths, config, object_state="target")
    reach = data.load_episodes(paths, config, object_state="reach")
    fields, arms = len(workcell_cubes.POSE_FIELDS), len(robot.ARMS) * 3
    pose_width = len(workcell_cubes.POSE_STATE_NAMES)
    assert target.state.shape == (3 * STEPS, 14 + fields + arms)
    assert {spec.target for spec in target.specs} == set(workcell_cubes.CUBE_NAMES)
    for e, spec in enumerate(target.specs):
        rows = target.episode == e
        k = workcell_cubes.CUBE_NAMES.index(spec.target)
        objects = reach.state[rows, 14:]
        pose = objects[:, k * fields : (k + 1) * fields]
        offsets = objects[:, pose_width + k * arms : pose_width + (k + 1) * arms]
        np.testing.assert_array_equal(target.state[rows, :14], reach.state[rows, :14])
        np.testing.assert_array_equal(target.state[rows, 14 : 14 + fields], pose)
        np.testing.assert_allclose(target.state[rows, 14 + fields :], offsets, atol=1e-7)
    bins = Tokenizer(STATE_BINS_TOKENIZER_PATH)
    normalizer = Normalizer(norm_stats.compute_norm_stats(target, NormConfig()), NormConfig())
    samples = data.build_samples(target, config, bins, normalizer, PromptConfig())
    text = bins.decode([int(i) for i in samples.tokens[0][samples.token_mask[0]]])
    assert len(text.split("State: ")[1].split(";")[0].split()) == 14 + fields + arms


@pytest.mark.parametrize(
    ("preset", "tokenizer_path"),
    [
        ("workcell_objects", BUNDLED_TOKENIZER_PATH),
        ("workcell_poses", BUNDLED_TOKENIZER_PATH),
        ("workcell_poses_bins", STATE_BINS_TOKENIZER_PATH),
        ("workcell_reach_bins", STATE_BINS_TOKENIZER_PATH),
        ("workcell_target_bins", STATE_BINS_TOKENIZER_PATH),
        ("workcell_target_m_bins", STATE_BINS_TOKENIZER_PATH),
    ],
)
def test_the_presets_prompt_budget_holds_the_longest_prompt(preset, tokenizer_path) -> None:
    """A preset sized for an object state holds the longest instruction with every number of
    the state at its most tokens (with the tokenizer it is for), and not one number more (the
    budget is not padding)."""
    from oxygen_ros.perception import workcell_cubes

    tokenizer = Tokenizer(tokenizer_path)
    config = get_model_config(preset)
    kind = data.object_state_of(preset)
    width = 14 + len(workcell_cubes.object_state(kind).names)
    instructions = {tasks.sample_episode(seed).instruction for seed in range(500)}
    cost = {b: len(tokenizer.encode(f" {b}")) for b in prompts.STATE_VALUES}  # -1 too
    worst = max(cost, key=cost.get)
    value = (worst + 0.5) / (prompts.NUM_STATE_BINS / 2) - 1.0  # the centre of that bin

    def length(numbers: int) -> int:
        state = np.full(numbers, value)
        assert prompts.discretize_state(state)[0] == worst
        return max(
            len(tokenizer.encode(prompts.format_action_prompt(text, state), add_bos=True))
            for text in instructions
        )

    assert length(width) <= config.max_token_len < length(width + 1)


def test_training_samples_refuse_a_prompt_the_preset_would_cut(demos_dir, tokenizer) -> None:
    """The engine cuts a prompt longer than the budget (as openpi does); training refuses it,
    so a preset/tokenizer mismatch (the bins preset with the digit tokenizer) cannot train on
    a state with its last numbers cut off. The same episodes with the bins tokenizer (the
    control) build, every number in the prompt."""
    config = get_model_config("workcell_poses_bins")
    episodes = data.load_episodes(recorder.list_episodes(demos_dir), config, object_state="poses")
    normalizer = Normalizer(norm_stats.compute_norm_stats(episodes, NormConfig()), NormConfig())
    with pytest.raises(ValueError, match="prompt budget"):
        data.build_samples(episodes, config, tokenizer, normalizer, PromptConfig())
    bins = Tokenizer(STATE_BINS_TOKENIZER_PATH)
    samples = data.build_samples(episodes, config, bins, normalizer, PromptConfig())
    text = bins.decode([int(i) for i in samples.tokens[0][samples.token_mask[0]]])
    assert text.endswith("Action: ") and len(text.split("State: ")[1].split(";")[0].split()) == 35
    # The engine's serving path still cuts with a warning instead of failing a frame.
    state = normalizer.normalize_state(episodes.state[0])
    cut, mask = prompts.tokenize_action_prompt(
        tokenizer, episodes.specs[0].instruction, state, config.max_token_len
    )
    assert mask.all() and len(cut) == config.max_token_len


def test_a_checkpoints_preset_must_fit_its_object_state() -> None:
    """The evaluation tools take the preset a checkpoint was trained with; by default the
    object state's, and a preset sized for another state is refused."""
    assert data.model_preset("", "poses") == "workcell_poses"
    assert data.model_preset("workcell_poses_bins", "poses") == "workcell_poses_bins"
    assert data.model_preset("", "") == "workcell"
    with pytest.raises(ValueError, match="sized for"):
        data.model_preset("workcell_poses_bins", "positions")
    with pytest.raises(ValueError, match="sized for"):
        data.model_preset("workcell", "poses")
    assert data.model_preset("", "reach") == "workcell_reach_bins"
    assert data.model_preset("", "target") == "workcell_target_bins"
    with pytest.raises(ValueError, match="sized for"):
        data.model_preset("workcell_reach_bins", "target")
    # The target state in metres has its own preset (the same shape), so a checkpoint says
    # which offsets it reads.
    assert data.model_preset("", "target_m") == "workcell_target_m_bins"
    for preset, kind in (
        ("workcell_target_bins", "target_m"),
        ("workcell_target_m_bins", "target"),
    ):
        with pytest.raises(ValueError, match="sized for"):
            data.model_preset(preset, kind)
    # Training checks the same pairing, and takes the tokenizer the preset is sized for
    # unless told otherwise.
    config = TrainConfig("d", "o", preset="workcell_poses_bins", object_state="poses")
    assert config.tokenizer_path == str(STATE_BINS_TOKENIZER_PATH)
    assert TrainConfig("d", "o").tokenizer_path == str(BUNDLED_TOKENIZER_PATH)
    named = TrainConfig("d", "o", preset="workcell_poses_bins", tokenizer_path="x.model")
    assert named.tokenizer_path == "x.model"
    for preset, kind in (("workcell_poses_bins", "positions"), ("workcell", "poses")):
        with pytest.raises(ValueError, match="needs one of the presets"):
            TrainConfig("d", "o", preset=preset, object_state=kind)


def test_parallel_loading_gives_the_same_arrays(demos_dir) -> None:
    """`load_episode_groups` (two groups, as training and held-out episodes, each split over
    two processes of one pool) gives per group the arrays one process reads, object state
    and episode numbering included."""
    paths = recorder.list_episodes(demos_dir)
    assert len(paths) >= 3
    groups = (paths[:-1], paths[-1:])
    config = get_model_config("workcell_reach_bins")
    loaded = data.load_episode_groups(groups, config, object_state="reach", workers=2)
    assert len(loaded) == 2
    for group, two in zip(groups, loaded, strict=True):
        one = data.load_episodes(group, config, object_state="reach")
        assert len(set(two.episode.tolist())) == len(group)
        for field in ("state", "actions", "episode", "stage"):
            np.testing.assert_array_equal(getattr(two, field), getattr(one, field))
        for slot in config.image_keys:
            np.testing.assert_array_equal(two.images[slot], one.images[slot])
        assert two.seeds == one.seeds and two.specs == one.specs


def test_a_share_of_failed_episodes_is_dropped_when_loading_in_parallel(tmp_path) -> None:
    """Three episodes, the first two failed: two workers read [0, 1] and [2]; the first share
    adds nothing and the rest is read as one process reads it; with every episode failed the
    typed error comes back."""
    for index, seed in enumerate(SEEDS):
        write_episode(tmp_path, index, seed, success=index == 2)
    paths = recorder.list_episodes(tmp_path)
    config = get_model_config("workcell_reach_bins")
    with pytest.raises(data.NoEpisodesError):
        data.load_episodes(paths[:2], config)  # the failed share on its own
    (two,) = data.load_episode_groups([paths], config, workers=2)
    one = data.load_episodes(paths[2:], config)
    assert two.seeds == one.seeds == [SEEDS[2]]
    np.testing.assert_array_equal(two.state, one.state)
    with pytest.raises(data.NoEpisodesError):
        data.load_episode_groups([paths[:2]], config, workers=2)


def test_state_layout_names_what_each_object_state_appends() -> None:
    """What a checkpoint records of its state (`checkpoint_assets.StateLayout`): the 14
    joints, then the object state's names (none without one; the target state's 13)."""
    for kind, extra in (
        ("", ()),
        ("positions", workcell_cubes.STATE_NAMES),
        ("target", workcell_cubes.TARGET_STATE_NAMES),
        ("target_m", workcell_cubes.TARGET_METRES_STATE_NAMES),
    ):
        layout = data.state_layout(kind)
        assert layout.joint_names == robot.JOINT_NAMES
        assert layout.state_extra_names == extra
        assert layout.joint_names + layout.state_extra_names == data.state_names(kind)
