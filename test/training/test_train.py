"""End to end: training lowers the loss, writes an openpi-layout checkpoint the engine serves
unchanged, and is reproducible from its seed."""

from __future__ import annotations

import dataclasses
import json

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from openpi.shared import normalize

from oxygen_ros.engine import model_fns
from oxygen_ros.engine.checkpoint import (
    Normalizer,
    params_into_model,
)
from oxygen_ros.engine.checkpoint_assets import (
    StateLayout,
    load_narration_numbers,
    load_state_layout,
)
from oxygen_ros.engine.config import NormConfig, PromptConfig, get_model_config
from oxygen_ros.engine.engine import Engine
from oxygen_ros.engine.tokenizer import (
    BUNDLED_TOKENIZER_PATH,
    STATE_BINS_TOKENIZER_PATH,
    Tokenizer,
    resolve_tokenizer_path,
)
from oxygen_ros.engine.types import Observation
from oxygen_ros.nodes.common.image_conversion import resize_with_pad
from oxygen_ros.sim import recorder, robot
from oxygen_ros.training import bin_embeddings, data, norm_stats, train
from oxygen_ros.training.train_config import TrainConfig
from oxygen_ros.training.trainer import to_batch

pytestmark = pytest.mark.slow


def _config(demos_dir, out_dir, **overrides) -> TrainConfig:
    fields = dict(
        data_dir=str(demos_dir),
        out_dir=str(out_dir),
        steps=30,
        batch_size=4,
        warmup_steps=5,
        peak_lr=3e-3,
        heldout=1,
        eval_every=15,
        eval_samples=8,
        state_dropout=0.5,
    )
    fields.update(overrides)
    return TrainConfig(**fields)


def _recorded_observation(episode, step: int, resolution) -> Observation:
    """Step `step` of a recorded episode as the perception node would hand it to the engine."""
    return Observation(
        images={
            slot: resize_with_pad(episode.images[cam][step], *resolution)
            for slot, cam in data.SLOT_CAMERAS.items()
        },
        image_masks={slot: True for slot in data.SLOT_CAMERAS},
        state=episode.qpos[step],
        prompt=episode.instruction,
        stamp=0.0,
    )


@pytest.fixture(scope="module")
def trained(demos_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    final = train.train(_config(demos_dir, out))
    return out, final


def test_loss_falls_and_curves_are_written(trained) -> None:
    out, final = trained
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, 31))
    first = np.mean([r["language_loss"] for r in records[:3]])
    last = np.mean([r["language_loss"] for r in records[-3:]])
    assert last < 0.7 * first, (first, last)
    evaluated = [r for r in records if "val_action_loss" in r]
    assert [r["step"] for r in evaluated] == [15, 30]
    for key in ("val_subtask_exact", "val_narration_exact", "val_memory_exact"):
        assert 0.0 <= final[key] <= 1.0
    # One held-out episode: its first frame is right or wrong, and the split names its kind.
    assert final["val_first_arm"] in (0.0, 1.0)
    assert final["val_first_narration_exact"] in (0.0, 1.0)
    assert ("val_first_arm_named" in final) != ("val_first_arm_from_images" in final)
    assert "val_blind_action_loss" not in final  # no image dropout in this run
    assert (out / "loss_curve.png").stat().st_size > 10_000
    run = json.loads((out / "run.json").read_text())
    assert run["heldout_episodes"] == [1002] and 1002 not in run["train_episodes"]


def test_checkpoint_is_served_by_the_engine_unchanged(trained, demos_dir) -> None:
    out, _ = trained
    path = recorder.list_episodes(demos_dir)[-1]
    episode = recorder.read_episode(path)
    engine = Engine(train.engine_config(str(out)))
    config = engine.config.model
    # No tokenizer_path: the engine takes the checkpoint's own tokenizer.
    assert engine.config.tokenizer_path is None
    own = out / "assets" / "workcell" / "tokenizer.model"
    assert resolve_tokenizer_path(engine.config) == own
    assert own.read_bytes() == BUNDLED_TOKENIZER_PATH.read_bytes()
    observation = _recorded_observation(episode, 4, config.image_resolution)
    noise = engine.make_noise(0)
    served = engine.step(observation, noise=noise).actions.actions
    assert served.shape == (config.action_horizon, 14)
    # The state it was trained on is recorded for the node that serves it: joints, no extras.
    layout = load_state_layout(out, "workcell")
    assert layout == StateLayout(robot.JOINT_NAMES, ()) == data.state_layout("")
    assert load_narration_numbers(out, "workcell") == "digits"
    assert (out / "assets" / "workcell" / "language.json").is_file()  # recorded, not assumed
    # Independently of the engine's loading path: orbax restore, openpi norm stats, the
    # model functions and the sample's own prompt give the same actions.
    with ocp.PyTreeCheckpointer() as checkpointer:
        params = checkpointer.restore(out / "params")["params"]
    table = params["PaliGemma"]["llm"]["embedder"]["input_embedding"]
    assert table.shape[0] == 257_152 and not np.asarray(table[640:]).any()
    assert np.abs(np.asarray(table[:640])).max() > 0
    model = params_into_model(params, config)
    stats = normalize.load(out / "assets" / "workcell")
    normalizer = Normalizer(stats, NormConfig())
    samples = data.build_samples(
        data.load_episodes([path], config),
        config,
        Tokenizer(BUNDLED_TOKENIZER_PATH),
        normalizer,
        PromptConfig(),
    )
    batch = to_batch(samples.take(np.array([4])), config.image_keys)
    inputs = model_fns.PrefixInputs(
        batch.images, batch.image_masks, batch.tokens, batch.token_mask
    )
    actions = model_fns.denoise(model, model_fns.prefill(model, inputs), noise, 10)
    expected = normalizer.unnormalize_actions(np.asarray(actions)[0, :, :14])
    np.testing.assert_allclose(served, expected, atol=1e-4)


def test_same_seed_gives_the_same_parameters(trained, demos_dir, tmp_path) -> None:
    """Same config as the fixture's run (so nothing recompiles), another output directory."""

    def params(out) -> list[np.ndarray]:
        with ocp.PyTreeCheckpointer() as checkpointer:
            restored = checkpointer.restore(out / "params")["params"]
        return [np.asarray(x) for x in jax.tree.leaves(restored)]

    first = params(trained[0])
    train.train(_config(demos_dir, tmp_path / "again"))
    train.train(_config(demos_dir, tmp_path / "other", seed=1))
    again, other = params(tmp_path / "again"), params(tmp_path / "other")
    assert all(np.array_equal(x, y) for x, y in zip(first, again, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(first, other, strict=True))


def test_training_resumes_from_a_checkpoint(trained, demos_dir, tmp_path) -> None:
    out, _ = trained
    train.train(_config(demos_dir, tmp_path / "resumed", init_from=str(out)))

    def first_loss(directory) -> float:
        line = (directory / "metrics.jsonl").read_text().splitlines()[0]
        return json.loads(line)["language_loss"]

    fresh, resumed = first_loss(out), first_loss(tmp_path / "resumed")
    assert resumed < 0.7 * fresh, (fresh, resumed)
    assert json.loads((tmp_path / "resumed" / "run.json").read_text())["config"]["init_from"]


def test_fine_tuning_keeps_the_starting_checkpoints_norm_stats(trained, demos_dir) -> None:
    """With --init-from the state bins and action scales stay the ones the model learned (new
    data would move them); --fresh-norm-stats computes them from the new episodes."""
    out, _ = trained
    config = _config(demos_dir, out.parent / "unused", init_from=str(out))
    norm = NormConfig()
    one = data.load_episodes(
        recorder.list_episodes(demos_dir)[:1], get_model_config(config.preset)
    )
    saved = normalize.load(out / "assets" / config.assets_id)
    kept = norm_stats.training_norm_stats(config, one, norm, ())
    fresh = norm_stats.training_norm_stats(
        dataclasses.replace(config, fresh_norm_stats=True), one, norm, ()
    )
    for key in (norm.state_key, norm.actions_key):
        for field in ("mean", "std", "q01", "q99"):
            np.testing.assert_array_equal(getattr(kept[key], field), getattr(saved[key], field))
    # Positive control: one episode's own statistics are not the training set's.
    assert not np.allclose(fresh[norm.state_key].q99, saved[norm.state_key].q99)
    # --min-norm-range widens the kept stats' narrow dimensions, and only those (the floor: the
    # median state span, so that both kinds are there to check).
    spans = {k: saved[k].q99 - saved[k].q01 for k in (norm.state_key, norm.actions_key)}
    floor = float(np.median(spans[norm.state_key]))
    widened = norm_stats.training_norm_stats(
        dataclasses.replace(config, min_norm_range=floor), one, norm, ()
    )
    assert (spans[norm.state_key] < floor).any() and (spans[norm.state_key] > floor).any()
    for key, span in spans.items():
        new_span = widened[key].q99 - widened[key].q01
        np.testing.assert_allclose(new_span[span < floor], floor, rtol=1e-5)
        np.testing.assert_array_equal(new_span[span >= floor], span[span >= floor])
    # --blind-state: the named state dimensions move to one bin's stats, nothing else changes;
    # names outside the state are refused when the run is configured.
    blinded = norm_stats.training_norm_stats(
        dataclasses.replace(config, blind_state="right_gripper"), one, norm, ()
    )
    dim = robot.JOINT_NAMES.index("right_gripper")
    span = blinded[norm.state_key].q99 - blinded[norm.state_key].q01
    assert span[dim] == pytest.approx(2 * norm_stats.BLIND_HALF_RANGE)
    others = np.arange(len(span)) != dim
    np.testing.assert_array_equal(span[others], spans[norm.state_key][others])
    np.testing.assert_array_equal(blinded[norm.actions_key].q99, saved[norm.actions_key].q99)
    # --gripper-action-range: both grippers' action quantiles that far apart about their
    # centre, idempotent (a checkpoint trained so and fine-tuned again keeps them), nothing
    # else moved; a gripper value then normalises to a larger number.
    ranged = norm_stats.training_norm_stats(
        dataclasses.replace(config, gripper_action_range=0.25), one, norm, ()
    )
    actions, before = ranged[norm.actions_key], saved[norm.actions_key]
    grippers = list(data.GRIPPER_ACTION_DIMS)
    assert [robot.JOINT_NAMES[d] for d in grippers] == ["left_gripper", "right_gripper"]
    np.testing.assert_allclose((actions.q99 - actions.q01)[grippers], 0.25, rtol=1e-5)
    np.testing.assert_allclose(
        (actions.q99 + actions.q01)[grippers], (before.q99 + before.q01)[grippers], rtol=1e-5
    )
    others = np.ones(len(actions.q99), bool)
    others[grippers] = False
    np.testing.assert_array_equal(actions.q99[others], before.q99[others])
    np.testing.assert_array_equal(ranged[norm.state_key].q99, saved[norm.state_key].q99)
    again = norm_stats.set_action_range(ranged, norm.actions_key, grippers, 0.25)
    np.testing.assert_allclose(again[norm.actions_key].q01, actions.q01, rtol=1e-6)
    normalised = {
        name: (0.0 - s.q01[grippers]) / (s.q99[grippers] - s.q01[grippers]) * 2 - 1
        for name, s in (("before", before), ("ranged", actions))
    }
    assert (np.abs(normalised["ranged"]) > 2 * np.abs(normalised["before"])).all()
    with pytest.raises(ValueError, match="gripper_action_range"):
        dataclasses.replace(config, gripper_action_range=-1.0)
    with pytest.raises(ValueError, match="blind_state names"):
        dataclasses.replace(config, blind_state="right_gripper,right_grip")
    with pytest.raises(ValueError, match="delta-action mask"):
        norm_stats.training_norm_stats(config, one, norm, data.DELTA_ACTION_MASK)
    one.state = np.concatenate([one.state, one.state[..., :3]], axis=-1)  # another object state
    with pytest.raises(ValueError, match="width"):
        norm_stats.training_norm_stats(config, one, norm, ())


def _delta_bins_config(demos_dir, out, **overrides) -> TrainConfig:
    return _config(
        demos_dir, out, steps=4, eval_every=4, state_dropout=0.0, delta_actions=True,
        tokenizer_path=str(STATE_BINS_TOKENIZER_PATH), image_dropout=0.5, **overrides,
    )  # fmt: skip


@pytest.fixture(scope="module")
def one_step_bins(demos_dir, tmp_path_factory):
    """A run of the delta test's statics (nothing recompiles) that the time budget ends after
    its first step, whose learning rate is 0: the saved parameters are the starting ones."""
    out = tmp_path_factory.mktemp("bins")
    assert train.train(_delta_bins_config(demos_dir, out, time_budget_s=1e-9))["step"] == 1
    return out


def test_state_bin_rows_start_in_order(one_step_bins) -> None:
    """With a tokenizer that has one piece per state bin, training starts those embedding rows
    at bin_embeddings.smooth_bin_rows."""
    out = one_step_bins
    assert json.loads((out / "run.json").read_text())["smooth_bin_rows"] is True
    with ocp.PyTreeCheckpointer() as checkpointer:
        params = checkpointer.restore(out / "params")["params"]
    tokenizer = Tokenizer(STATE_BINS_TOKENIZER_PATH)
    table = np.asarray(params["PaliGemma"]["llm"]["embedder"]["input_embedding"])
    table = table[: tokenizer.vocab_size]
    # The other rows are the initial ones, so putting the bin rows in order again changes nothing.
    expected = bin_embeddings.with_smooth_bins(table, bin_embeddings.bin_token_ids(tokenizer), 0)
    np.testing.assert_allclose(table, expected, rtol=1e-5, atol=1e-7)


def test_frozen_bin_rows_keep_the_code_they_start_with(demos_dir, tmp_path) -> None:
    """--bin-frequencies 0.5 starts the state-bin rows at that code; --freeze-bin-rows keeps
    them there through steps that change the other rows. The control: the same steps without
    the freeze change the bin rows."""
    tokenizer = Tokenizer(STATE_BINS_TOKENIZER_PATH)
    ids = bin_embeddings.bin_token_ids(tokenizer)

    def table(name: str, **overrides) -> np.ndarray:
        out = tmp_path / name
        train.train(_delta_bins_config(demos_dir, out, bin_frequencies="0.5", **overrides))
        with ocp.PyTreeCheckpointer() as checkpointer:
            params = checkpointer.restore(out / "params")["params"]
        rows = np.asarray(params["PaliGemma"]["llm"]["embedder"]["input_embedding"])
        return rows[: tokenizer.vocab_size]

    start = table("start", time_budget_s=1e-9)  # one step at learning rate 0
    expected = bin_embeddings.with_smooth_bins(start, ids, 0, (0.5,))
    np.testing.assert_allclose(start, expected, rtol=1e-5, atol=1e-7)
    frozen = table("frozen", freeze_bin_rows=True)
    np.testing.assert_array_equal(frozen[ids], start[ids])
    others = np.setdiff1d(np.arange(len(start)), ids)
    assert np.abs(frozen[others] - start[others]).max() > 1e-6  # the steps trained the rest
    trained = table("trained")
    assert np.abs(trained[ids] - start[ids]).max() > 1e-6
    with pytest.raises(ValueError, match="frequencies"):
        TrainConfig(data_dir="d", out_dir="o", bin_frequencies="0.5,0")


def test_narration_numbers_are_trained_recorded_and_inherited(
    one_step_bins, demos_dir, tmp_path
) -> None:
    """--narration-numbers words: the first step's language loss differs from the digits' (the
    targets differ; everything else is the same run), the checkpoint records it, and a run
    fine-tuning from it keeps it unless told otherwise."""

    def first_loss(out) -> float:
        line = (out / "metrics.jsonl").read_text().splitlines()[0]
        return json.loads(line)["language_loss"]

    config = _delta_bins_config(
        demos_dir, tmp_path / "words", time_budget_s=1e-9, narration_numbers="words"
    )
    assert train.train(config)["step"] == 1
    assert first_loss(one_step_bins) != first_loss(tmp_path / "words")
    assert load_narration_numbers(one_step_bins, "workcell") == "digits"
    assert load_narration_numbers(tmp_path / "words", "workcell") == "words"
    child = dict(data_dir="d", out_dir="o", init_from=str(tmp_path / "words"))
    assert TrainConfig(**child).narration_style == "words"
    assert TrainConfig(**child, narration_numbers="digits").narration_style == "digits"
    assert TrainConfig(data_dir="d", out_dir="o").narration_style == "digits"
    with pytest.raises(ValueError, match="narration_numbers"):
        TrainConfig(data_dir="d", out_dir="o", narration_numbers="roman")


def test_delta_action_training_is_served_as_absolute_targets(demos_dir, tmp_path) -> None:
    """--delta-actions: chunks are learnt relative to the state with openpi's DeltaActions
    (norm stats of the deltas), the mask is written next to the norm stats, and the engine
    serves state + unnormalised delta on the arm joints (grippers stay absolute). Trained with
    the state-bins tokenizer, which the checkpoint carries and the engine then serves with, and
    image dropout, so the evaluation also reports the held-out action loss with every camera
    masked (same samples and noise; it differs once the action expert's gates have opened: at
    initialisation openpi's adaRMS gates are zero and the prefix does not reach the actions)."""
    out = tmp_path / "delta"
    final = train.train(_delta_bins_config(demos_dir, out))
    assert np.isfinite(final["val_blind_action_loss"])
    assert final["val_blind_action_loss"] != final["val_action_loss"]
    own = out / "assets" / "workcell" / "tokenizer.model"
    assert own.read_bytes() == STATE_BINS_TOKENIZER_PATH.read_bytes()
    assert json.loads((out / "assets" / "workcell" / "action_space.json").read_text()) == {
        "delta_action_mask": list(data.DELTA_ACTION_MASK)
    }
    path = recorder.list_episodes(demos_dir)[-1]
    episode = recorder.read_episode(path)
    model_config = train.engine_config(str(out)).model
    eps = data.load_episodes([path], model_config)
    deltas = Normalizer.relative_actions(eps.actions, eps.state, data.DELTA_ACTION_MASK)
    arm = np.array(data.DELTA_ACTION_MASK)
    np.testing.assert_allclose(
        deltas[:, :, arm] + eps.state[:, None, arm], eps.actions[:, :, arm], atol=1e-6
    )
    np.testing.assert_array_equal(deltas[:, :, ~arm], eps.actions[:, :, ~arm])
    stats = normalize.load(out / "assets" / "workcell")
    # The action stats describe deltas: small arm ranges around 0, the grippers' full travel.
    assert np.abs(stats["actions"].mean[arm]).max() < 0.2
    engine = Engine(train.engine_config(str(out)))
    assert engine.delta_action_mask == data.DELTA_ACTION_MASK
    observation = _recorded_observation(episode, 4, model_config.image_resolution)
    noise = engine.make_noise(0)
    served = engine.step(observation, noise=noise).actions.actions
    relative = Engine(train.engine_config(str(out), delta_action_mask=()))
    delta = relative.step(observation, noise=noise).actions.actions
    np.testing.assert_allclose(
        served, delta + np.where(arm, episode.qpos[4], 0.0), rtol=1e-5, atol=1e-5
    )


def test_delta_actions_refuse_state_dropout(demos_dir, tmp_path) -> None:
    with pytest.raises(ValueError, match="state dropout"):
        _config(demos_dir, tmp_path, delta_actions=True, state_dropout=0.3)


def test_device_data_trains_as_the_host_batches_do(trained, demos_dir, tmp_path) -> None:
    """The fixture's statics (nothing recompiles for the step); the time budget ends both runs
    after their first step, then they evaluate and save as at the end of a schedule (the
    fixture's run, without a budget, took all 30 steps: the control)."""

    def run(name: str, device_data: bool) -> tuple[list[dict], list[np.ndarray]]:
        out = tmp_path / name
        config = _config(
            demos_dir, out, state_dropout=0.0, device_data=device_data, time_budget_s=1e-9
        )
        final = train.train(config)
        assert final["step"] == 1
        records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        with ocp.PyTreeCheckpointer() as checkpointer:
            restored = checkpointer.restore(out / "params")["params"]
        return records, [np.asarray(x) for x in jax.tree.leaves(restored)]

    host_records, host_params = run("host", False)
    device_records, device_params = run("device", True)
    assert [r["step"] for r in host_records] == [1] == [r["step"] for r in device_records]
    assert "val_action_loss" in device_records[0]
    for key in ("loss", "action_loss", "language_loss"):
        assert device_records[0][key] == pytest.approx(host_records[0][key], rel=1e-5)
    for x, y in zip(host_params, device_params, strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-7)


def test_fit_to_deadline_keeps_time_for_compiling_and_a_guard(demos_dir, tmp_path) -> None:
    config = _config(demos_dir, tmp_path, steps=100_000)
    fitted = train.fit_to_deadline(config, left_s=1000.0, step_time_s=0.1)
    assert fitted.steps == 8500  # 15 % of 1000 s kept back
    assert fitted.time_budget_s == 970.0
    assert train.fit_to_deadline(config, left_s=200.0, step_time_s=1.0).steps == 140  # >= 60 s
    assert train.fit_to_deadline(_config(demos_dir, tmp_path), 1000.0, 0.1).steps == 30
    with pytest.raises(ValueError, match="no time left"):
        train.fit_to_deadline(config, left_s=60.0, step_time_s=0.1)


def test_deadline_counts_from_when_the_recorded_data_is_loaded(
    demos_dir, tmp_path, monkeypatch
) -> None:
    """`--deadline-unix` with `--data`: the steps fit the time left after loading (1000
    demonstrations took 11.5 min to load), not the time left at start-up."""
    clock = {"now": 1_000_000.0}
    monkeypatch.setattr(train.time, "time", lambda: clock["now"])
    load_split = train.load_split

    def slow_load(config, workers=1):
        clock["now"] += 400.0  # loading takes 400 s of the 1000 left at start-up
        return load_split(config, workers)

    fitted: list[TrainConfig] = []

    def fake_train(config, episodes):
        assert episodes is not None  # loaded once, before fitting
        fitted.append(config)
        return dict(
            step=config.steps,
            val_action_loss=0.0,
            val_subtask_exact=0.0,
            val_action_mae_rad=0.0,
            train_wall_s=0.0,
        )

    monkeypatch.setattr(train, "load_split", slow_load)
    monkeypatch.setattr(train, "train", fake_train)
    argv = ["--data", str(demos_dir), "--out", str(tmp_path), "--steps", "100000"]
    argv += ["--heldout", "1", "--deadline-unix", str(clock["now"] + 1000.0)]
    assert train.main([*argv, "--step-time-s", "1.0"]) == 0
    assert fitted[0].steps == 510  # 600 s left after loading, 15 % kept back
    assert fitted[0].time_budget_s == 570.0


def test_the_train_command_takes_the_object_states_preset_unless_given(
    tmp_path, monkeypatch
) -> None:
    """`--object-state poses` alone trains the poses' default preset; `--preset` picks another
    sized for the same state (the state-bins one) and refuses one sized for another."""
    configs: list[TrainConfig] = []

    def fake_train(config, episodes):
        configs.append(config)
        keys = ("val_action_loss", "val_subtask_exact", "val_action_mae_rad", "train_wall_s")
        return dict(step=config.steps, **dict.fromkeys(keys, 0.0))

    monkeypatch.setattr(train, "train", fake_train)
    argv = ["--data", str(tmp_path), "--out", str(tmp_path)]
    for extra, preset in (
        ([], "workcell"),
        (["--object-state", "poses"], "workcell_poses"),
        (["--object-state", "poses", "--preset", "workcell_poses_bins"], "workcell_poses_bins"),
        (["--object-state", "target"], "workcell_target_bins"),
        (["--object-state", "target", "--preset", "workcell_target_wide"], "workcell_target_wide"),
    ):
        assert train.main([*argv, *extra]) == 0
        assert configs[-1].preset == preset
    with pytest.raises(ValueError, match="sized for"):
        train.main([*argv, "--object-state", "positions", "--preset", "workcell_poses_bins"])
