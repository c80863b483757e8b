"""The training diagnostics (oxygen_ros.training.diagnostics): the state probe's action space,
the state and privileged MLPs' features, fits and episodes, learner_vs_expert's bands,
prefix_head's features and the untrained checkpoint."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from oxygen_ros.training.diagnostics import mlp_policy, state_policy


def test_state_probe_reads_chunks_in_the_models_action_space() -> None:
    """Delta checkpoints: the state comes off the masked joints, so a model that ignores the
    state shows 0 there and one that keeps the target shows -shift; absolute: unchanged."""
    from oxygen_ros.training.diagnostics import state_probe as probe

    state = np.arange(14, dtype=np.float64)
    chunk = np.tile(state + 1.0, (3, 1))
    mask = (True,) * 6 + (False,) + (True,) * 6 + (False,)
    out = probe.model_space(chunk, state, mask)
    np.testing.assert_allclose(out[:, 0], 1.0)  # delta on an arm joint
    np.testing.assert_allclose(out[:, 6], state[6] + 1.0)  # gripper stays absolute
    np.testing.assert_array_equal(probe.model_space(chunk, state, ()), chunk)
    shifted = state.copy()
    shifted[2] += 0.2
    # Same absolute chunk for a shifted state (the target kept): response -1 on that joint.
    response = (probe.model_space(chunk, shifted, mask) - out)[-1, 2] / 0.2
    assert response == pytest.approx(-1.0)


def test_state_policy_features_targets_and_training() -> None:
    """diagnostics.state_policy: the instruction's words as one-hots (each word changes its
    group), the target cube picked out of the state by colour, delta targets that the policy
    turns back into the same absolute rows, a training loop that fits a known map, and the
    ensemble of `--fits` averaging its members."""
    import jax

    from oxygen_ros.engine.checkpoint import Normalizer
    from oxygen_ros.training import data
    from oxygen_ros.training.diagnostics import state_policy as sp

    base = sp.instruction_features("pick up the red cube")
    assert base.sum() == 4.0 and set(np.unique(base)) == {0.0, 1.0}
    for other in (
        "pick up the green cube",
        "pick up the red cube with the left arm",
        "move the red cube to the right",
    ):
        assert not np.array_equal(sp.instruction_features(other), base), other
    rng = np.random.default_rng(0)
    state = rng.normal(size=(4, 20)).astype(np.float32)
    words = np.stack([sp.instruction_features("pick up the green cube")] * 4)
    variant = sp.Variant(target=True, velocity=True)
    inputs = sp.raw_inputs(state, np.ones((4, 14), np.float32), np.zeros(4), words, variant)
    np.testing.assert_array_equal(inputs[:, 20:22], state[:, 16:18])  # green: the second cube
    np.testing.assert_array_equal(inputs[:, 22:], 1.0)  # then the velocities
    actions = rng.normal(size=(4, 10, 14)).astype(np.float32)
    delta = sp.targets(actions, state, sp.Variant()).reshape(4, 10, 14)
    back = Normalizer.absolute_actions(delta[0], state[0, :14], data.DELTA_ACTION_MASK)
    np.testing.assert_allclose(back, actions[0], atol=1e-6)
    assert not np.allclose(delta, actions)  # the arm joints were made relative

    x = rng.normal(size=(512, 8)).astype(np.float32)
    weights = rng.normal(size=(8, 3)).astype(np.float32)

    def batches(r):
        index = r.integers(0, len(x), 64)
        return x[index], np.tanh(x[index] @ weights)

    fitted, losses = sp.train(batches, (8, 3), 1001, 3e-3, 64, 0)
    assert losses[-1] < 0.1 * losses[0]
    # --fits: the policy's output is the members' mean (one member: that MLP's output).
    other = sp.init_mlp(jax.random.key(1), [8, 64, 64, 64, 3])
    np.testing.assert_allclose(sp.ensemble([fitted], x), sp.mlp(fitted, x), rtol=1e-6)
    mean = (np.asarray(sp.mlp(fitted, x)) + np.asarray(sp.mlp(other, x))) / 2
    np.testing.assert_allclose(sp.ensemble([fitted, other], x), mean, rtol=1e-5, atol=1e-6)
    assert not np.allclose(mean, sp.mlp(fitted, x), atol=1e-3)


def test_state_policy_pinch_features_are_the_workcells_pinch_to_cube_error() -> None:
    """--pinch: per arm, the named cube's tracked (x, y) minus the pinch point's and its height,
    equal (to 0.1 mm: the state is float32) to the workcell's pinch sites at those joints."""
    from oxygen_ros.sim import robot, tasks
    from oxygen_ros.sim.workcell import Workcell, WorkcellConfig
    from oxygen_ros.training.diagnostics import state_policy as sp

    cell = Workcell(WorkcellConfig(render=False))
    try:
        spec = tasks.sample_episode(0)
        cell.reset(robot.HOME, spec.objects)
        cell.set_targets(robot.HOME + 0.15)
        cell.step(0.5)
        joints = cell.joint_positions()
        pinch = {arm: cell.site_position(f"{arm}_pinch") for arm in robot.ARMS}
    finally:
        cell.close()
    cubes = np.array([0.1, -0.2, 0.3, 0.05, -0.1, 0.0])  # red, green, blue (x, y)
    state = np.concatenate([joints, cubes])[None].astype(np.float32)
    words = sp.instruction_features("pick up the blue cube")[None]
    out = sp.pinch_features(state, words)[0]
    for k, arm in enumerate(robot.ARMS):
        np.testing.assert_allclose(out[3 * k : 3 * k + 2], cubes[4:6] - pinch[arm][:2], atol=1e-4)
        np.testing.assert_allclose(out[3 * k + 2], pinch[arm][2], atol=1e-4)


@pytest.fixture(scope="module")
def privileged():
    from oxygen_ros.training.diagnostics import privileged_policy

    return privileged_policy


def _block_offsets(privileged) -> dict[str, int]:
    """Where each block of `privileged_policy.all_blocks` starts."""
    widths = privileged.BLOCK_WIDTHS
    return dict(zip(widths, np.cumsum([0, *widths.values()])[:-1], strict=True))


def _block(privileged, x: np.ndarray, name: str) -> np.ndarray:
    """Block `name` of an `all_blocks` row, as float64."""
    first = _block_offsets(privileged)[name]
    return x[first : first + privileged.BLOCK_WIDTHS[name]].astype(np.float64)


def _move_seed() -> int:
    from oxygen_ros.sim import tasks

    return next(s for s in range(100) if tasks.sample_episode(s).action == "move")


def test_privileged_blocks_are_the_workcells_true_state(privileged) -> None:
    """diagnostics.privileged_policy: each block equals what the simulator says (cube height,
    yaw as (sin, cos) of 4 x yaw, goal and start minus the cube, pinch errors) and `columns`
    selects exactly the chosen blocks."""
    from oxygen_ros.sim import robot, tasks
    from oxygen_ros.sim.workcell import Workcell, WorkcellConfig

    spec = tasks.sample_episode(_move_seed())
    cell = Workcell(WorkcellConfig(render=False))
    try:
        cell.reset(robot.HOME, spec.objects)
        cell.set_targets(robot.HOME + 0.1)
        cell.step(0.3)
        x = privileged.all_blocks(cell, spec).astype(np.float64)
        cube = cell.object_pose(spec.target).position
        pinch = {arm: cell.site_position(f"{arm}_pinch") for arm in robot.ARMS}
        joints = cell.joint_positions()
    finally:
        cell.close()
    widths = privileged.BLOCK_WIDTHS
    offsets = _block_offsets(privileged)

    def block(name):
        return _block(privileged, x, name)

    np.testing.assert_allclose(block("base")[:14], joints, atol=1e-5)
    np.testing.assert_allclose(block("base")[14:16], cube[:2], atol=1e-6)
    np.testing.assert_allclose(block("z"), cube[2:], atol=1e-6)
    yaw = spec.objects[spec.target][2]
    np.testing.assert_allclose(block("yaw"), [np.sin(4 * yaw), np.cos(4 * yaw)], atol=1e-3)
    np.testing.assert_allclose(block("goal"), spec.goal_xy() - cube[:2], atol=1e-6)
    np.testing.assert_allclose(
        block("start"), np.array(spec.objects[spec.target][:2]) - cube[:2], atol=1e-6
    )
    for k, arm in enumerate(robot.ARMS):
        np.testing.assert_allclose(
            block("pinch3")[3 * k : 3 * k + 3], cube - pinch[arm], atol=1e-6
        )
        np.testing.assert_allclose(
            block("pinch2")[3 * k : 3 * k + 2], (cube - pinch[arm])[:2], atol=1e-6
        )
        np.testing.assert_allclose(block("pinch2")[3 * k + 2], pinch[arm][2], atol=1e-6)
    base = privileged.columns([])
    assert len(base) == widths["base"] + widths["pinch2"]
    with_yaw = privileged.columns(["yaw"])
    assert sorted(set(with_yaw) - set(base)) == [offsets["yaw"], offsets["yaw"] + 1]
    three = privileged.columns(["pinch3"])
    assert offsets["pinch2"] not in three and offsets["pinch3"] in three
    with pytest.raises(ValueError, match="unknown blocks"):
        privileged.columns(["colour"])


def test_privileged_demonstrations_label_and_evaluate(privileged) -> None:
    """A demonstration's chunks are the expert's next commands (row k of step i is row 0 of
    step i + k) and it succeeds; an MLP fit on that episode's rows
    reproduces its chunks (turned back into absolute rows); in
    "label" mode with beta 1 the expert's own chunks succeed and every frame is labelled; a
    policy that holds the arms still (the negative control) fails in "eval" mode."""
    from oxygen_ros.sim.reactive_expert import ReactiveExpert
    from oxygen_ros.sim.workcell import Workcell, WorkcellConfig

    seed = _move_seed()
    cell = Workcell(WorkcellConfig(render=False))
    try:
        expert = ReactiveExpert(cell.model)
        demo, rows = privileged.run_episode(cell, expert, seed, "demo")
        assert demo.success
        chunks = rows["chunks"]
        n = len(chunks)
        assert rows["features"].shape == (n, sum(privileged.BLOCK_WIDTHS.values()))
        for k in range(1, privileged.HORIZON):
            np.testing.assert_array_equal(chunks[: n - k, k], chunks[k:, 0])
        assert not np.allclose(chunks[:-1, 0], chunks[1:, 0])  # the arm moves
        policy = privileged.fit(rows, privileged.columns(["z", "goal"]), 1500, 0, 1)
        got = np.stack(
            [
                policy(x, q.astype(np.float64))
                for x, q in zip(rows["features"], rows["joints"], strict=True)
            ]
        )
        # the fit's error is a small share of the chunks' spread about their mean
        assert np.abs(got - chunks).mean() < 0.1 * np.abs(chunks - chunks.mean(0)).mean()

        labelled, rows = privileged.run_episode(
            cell, expert, seed, "label", lambda x, q: None, 1.0, np.random.default_rng(0)
        )
        assert labelled.success and len(rows["chunks"]) == len(rows["features"]) > 10

        def still(x, q):
            return np.repeat(q[None], privileged.HORIZON, 0)

        held, rows = privileged.run_episode(cell, expert, seed, "eval", still)
        assert not held.success and held.furthest_stage == 0 and rows == {}
        # --execute-s: each chunk runs that long, so the policy is asked half as often at 0.2 s
        # as at the demonstrations' 0.1 s over the same time limit
        calls = {0.1: 0, 0.2: 0}
        for execute_s in calls:

            def counted(x, q, key=execute_s):
                calls[key] += 1
                return still(x, q)

            privileged.run_episode(cell, expert, seed, "eval", counted, execute_s=execute_s)
        assert calls[0.1] == pytest.approx(2 * calls[0.2], abs=1)
    finally:
        cell.close()


def test_privileged_prompt_bins_keep_what_the_prompt_keeps(privileged) -> None:
    """--prompt-bins: a value comes back as the centre of its prompt bin (within half a bin of
    it inside the range, the bin the engine's prompt writes), values below and above the
    range collapse onto bins -1 and 255, and two values in one bin come back equal."""
    from oxygen_ros.engine.prompts import discretize_state

    low, high = np.array([0.0, -1.0]), np.array([0.256, 1.0])
    x = np.array([[0.1004, 0.5], [0.1006, 0.5], [-3.0, 9.0], [0.2559, -0.9999]])
    got = mlp_policy.as_prompt_bins(x, low, high)
    half_bin = (high - low) / 256 / 2
    inside = (got[[0, 1, 3]] + 1) / 2 * (high - low) + low
    assert np.all(np.abs(inside - x[[0, 1, 3]]) <= half_bin + 1e-6)
    assert got[0, 0] == got[1, 0]  # one bin, one value
    bins = discretize_state((x - low) / (high - low) * 2 - 1)
    assert bins[2].tolist() == [-1, 255]
    np.testing.assert_allclose(got[2], [-1 - 1 / 256, 1 - 1 / 256], atol=1e-6)


def test_privileged_flow_head_learns_a_chunk_and_samples_it(privileged) -> None:
    """--flow-steps: the velocity field fit with the flow-matching loss on two observations
    with different targets samples each one's target from noise (well within the targets'
    distance), and an untrained field (the negative control) does not."""
    import jax
    import jax.numpy as jnp

    x = np.array([[1.0, 0.0], [0.0, 1.0]], np.float32)
    y = np.array([[1.0, -1.0, 0.5], [-1.0, 1.0, -0.5]], np.float32)

    def batches(rng):
        index = rng.integers(0, 2, 64)
        return x[index], y[index]

    def sampled(params):
        noise = np.random.default_rng(1).standard_normal((2, 3)).astype(np.float32)
        return np.asarray(mlp_policy.flow_sample(params, jnp.asarray(x), noise, 10))

    trained = mlp_policy.train_flow(batches, (2, 3), 600, 1e-3, 64, 0)
    untrained = state_policy.init_mlp(jax.random.key(0), [2 + 3 + 1, 64, 64, 64, 3])
    distance = np.abs(y[0] - y[1]).mean()
    assert np.abs(sampled(trained) - y).mean() < 0.1 * distance
    assert np.abs(sampled(untrained) - y).mean() > 0.3 * distance


def test_privileged_gripper_scale_weighs_only_the_grippers(privileged) -> None:
    """--gripper-scale F: the grippers' normalised targets are F times larger (their std
    divided by F), every other column's unchanged, and the policy still acts in robot units
    (a regression fit to one constant chunk gives it back either way)."""
    from oxygen_ros.sim import robot

    rng = np.random.default_rng(0)
    n, horizon = 64, privileged.HORIZON
    joints = np.tile(robot.HOME, (n, 1))
    chunk = np.tile(robot.HOME, (horizon, 1)) + 0.1
    chunks = np.repeat(chunk[None], n, axis=0) + 0.01 * rng.standard_normal((n, horizon, 14))
    rows = {"features": rng.standard_normal((n, 3)), "joints": joints, "chunks": chunks}
    cols = np.arange(3)
    plain = privileged.fit(rows, cols, 300, 0, 1, batch_size=32)
    scaled = privileged.fit(rows, cols, 300, 0, 1, batch_size=32, gripper_scale=3.0)
    ratio = plain.stats["target_std"] / scaled.stats["target_std"]
    grippers = np.arange(horizon * 14) % 7 == 6
    np.testing.assert_allclose(ratio[grippers], 3.0)
    np.testing.assert_allclose(ratio[~grippers], 1.0)
    for policy in (plain, scaled):
        acted = policy(rows["features"][0], joints[0])
        assert np.abs(acted - chunk).mean() < 0.02


def test_privileged_perceived_blocks_come_from_the_top_camera(privileged) -> None:
    """--perceived: the cube's (x, y) and yaw from the top camera are within the detector's
    error of the truth, its height is the table plane's, and the start is the first
    observation's position, kept after the cube has moved (the goal moves with it)."""
    from oxygen_ros.sim import robot, tasks
    from oxygen_ros.sim.workcell import Workcell, WorkcellConfig

    spec = tasks.sample_episode(_move_seed())

    def block(x, name):
        return _block(privileged, x, name)

    cell = Workcell(WorkcellConfig(cameras=("top",)))
    try:
        cell.reset(robot.HOME, spec.objects)
        perception = privileged.Perception("tracked")
        seen, true = (
            privileged.all_blocks(cell, spec, perception),
            privileged.all_blocks(cell, spec),
        )
        moved = dict(spec.objects)
        x, y, yaw = moved[spec.target]
        moved[spec.target] = (x + 0.03, y - 0.02, yaw + 0.3)
        cell.reset(robot.HOME, moved)
        seen2 = privileged.all_blocks(cell, spec, perception)
        true2 = privileged.all_blocks(cell, spec)
    finally:
        cell.close()
    xy = slice(14, 16)
    for s, t in ((seen, true), (seen2, true2)):
        assert np.abs(block(s, "base")[xy] - block(t, "base")[xy]).max() < 0.005
        assert np.abs(block(s, "yaw") - block(t, "yaw")).max() < 0.2  # 4 x yaw: 3 degrees
        assert block(s, "z")[0] == pytest.approx(tasks.CUBE_HALF_SIZE_M, abs=1e-3)
    np.testing.assert_allclose(block(seen, "start"), 0.0, atol=1e-9)
    start = block(seen, "base")[xy]
    np.testing.assert_allclose(block(seen2, "start"), start - block(seen2, "base")[xy], atol=1e-6)
    assert np.abs(block(seen2, "start") - [-0.03, 0.02]).max() < 0.005
    np.testing.assert_allclose(
        block(seen2, "goal") - block(seen2, "start"),
        spec.goal_xy() - spec.objects[spec.target][:2],
        atol=1e-6,
    )


def test_privileged_whole_views_keep_the_cube_under_a_descending_gripper(privileged) -> None:
    """--perception whole: while the reactive expert's gripper comes down over the cube, the
    tracked estimate follows the visible part (the positive control: more than 5 mm off), the
    whole-view estimate keeps the last whole view (within 3 mm and 5 degrees until the lift)."""
    from oxygen_ros.sim import robot, tasks
    from oxygen_ros.sim.reactive_expert import ReactiveExpert
    from oxygen_ros.sim.workcell import Workcell, WorkcellConfig

    spec = tasks.sample_episode(_move_seed())
    cell = Workcell(WorkcellConfig(cameras=("top",)))
    tracked_err, whole_err, whole_yaw_err = [], [], []
    try:
        expert = ReactiveExpert(cell.model)
        cell.reset(robot.HOME, spec.objects)
        expert.reset(cell, spec)
        seen = {kind: privileged.Perception(kind) for kind in privileged.PERCEPTIONS}
        for tick in range(250):
            pose = cell.object_pose(spec.target)
            if pose.position[2] > tasks.CUBE_HALF_SIZE_M + 0.003:
                break  # lifted
            if tick % 5 == 0:
                views = {k: p.see(cell, spec.target) for k, p in seen.items()}
                (tracked, _, _), (whole, yaw, _) = views["tracked"], views["whole"]
                tracked_err.append(np.linalg.norm(tracked[:2] - pose.position[:2]))
                whole_err.append(np.linalg.norm(whole[:2] - pose.position[:2]))
                true_yaw = privileged.yaw_of(pose.quaternion)
                whole_yaw_err.append(abs(np.sin(2 * (yaw - true_yaw))))  # modulo 90 degrees
            cell.set_targets(expert.command(cell))
            cell.step(0.02)
    finally:
        cell.close()
    assert len(whole_err) > 10
    # "inhand_whole" is "inhand" with the tracker before partial views moved an estimate
    # (whole views only, as "whole"); "inhand" follows partial views
    assert seen["inhand"].poses.follow_partial_views
    for kind in ("whole", "inhand_whole"):
        assert not seen[kind].poses.follow_partial_views
    # "whole" reads the images alone; the others take the hands' account of a held cube
    assert not seen["whole"].poses.hands
    assert (
        set(seen["inhand"].poses.hands) == set(seen["inhand_whole"].poses.hands) == set(robot.ARMS)
    )
    assert max(tracked_err) > 0.005
    assert max(whole_err) < 0.003
    assert max(whole_yaw_err) < np.sin(np.radians(10))


def test_learner_vs_expert_counts_closing_by_distance_on_free_frames() -> None:
    from oxygen_ros.training.diagnostics import learner_vs_expert as lve

    open_, shut = [0.8] * 10, [0.8, 0.8, 0.0] + [0.0] * 7  # row 2 closes

    def frame(learner, expert, *, pinch=0.1, held=False, stage="reach", deviation=0.1, off=0.0):
        return lve.Frame(0, 0.0, stage, held, pinch, 0.8, expert, learner, deviation, off)

    frames = [
        frame(shut, open_),  # approach: the learner closes
        frame(open_, open_, pinch=0.05, off=0.012),  # approach: neither; target 1.2 cm off
        frame(open_, shut, pinch=0.01, stage="grasp", deviation=0.3, off=0.03),  # the expert
        frame(shut, shut, pinch=0.01, stage="grasp", deviation=0.5),  # near: both
        frame(shut, open_, held=True, stage="lift", off=0.05),  # held: not counted
    ]
    summary = lve.summarise(frames, executed=3)
    assert summary["frames"] == 5 and summary["frames_not_held"] == 4
    bands = {(b["from_m"], b["to_m"]): b for b in summary["bands"]}
    assert bands[(0.0, 0.025)] == {
        "from_m": 0.0,
        "to_m": 0.025,
        "frames": 2,
        "learner_closes": 1,
        "expert_closes": 2,
        "target_off_1cm": 1,
        "target_off_2.5cm": 1,
    }
    assert bands[(0.08, 0.15)]["learner_closes"] == 1 and bands[(0.04, 0.08)]["frames"] == 1
    assert bands[(0.04, 0.08)]["target_off_1cm"] == 1
    assert bands[(0.04, 0.08)]["target_off_2.5cm"] == 0
    assert lve.summarise([frame(open_, open_)], executed=3)["bands"][3]["target_off_1cm"] == 0
    assert summary["approach_close"] == 1 / 2 and summary["approach_expert_close"] == 0.0
    assert summary["arm_deviation_rad_median"] == {"grasp": 0.4, "lift": 0.1, "reach": 0.1}
    # Executed rows decide: with two rows executed, row 2's closing is not executed.
    assert lve.summarise(frames, executed=2)["approach_close"] == 0.0


def test_prefix_head_reads_the_prompts_cache_right_aligned() -> None:
    """diagnostics.prefix_head on the shipped checkpoint: an observation's features are its
    prompt's keys and values as the engine's jitted prefill makes them (a batch of two gives
    each row what it gives alone), right-aligned: zero padding in front, as many places as the
    prompt is shorter, the prompt's tokens after it. The state features are the instruction's
    words, then the prompt's bins."""
    import openpi.models.gemma as gemma

    from oxygen_ros.engine import prompts
    from oxygen_ros.engine.config import SchedulerConfig
    from oxygen_ros.engine.engine import Engine
    from oxygen_ros.engine.types import Observation
    from oxygen_ros.resources import resolve_path
    from oxygen_ros.training.diagnostics import prefix_head as head
    from oxygen_ros.training.train import engine_config

    checkpoint = str(resolve_path("package://oxygen_ros/models/workcell_run38"))
    config = engine_config(
        checkpoint, preset="workcell_target_bins", scheduler=SchedulerConfig(mode="shared_kv")
    )
    engine = Engine(config)
    model = config.model
    state = np.asarray(engine.normalizer.state_stats.mean, np.float32)
    texts = ("pick up the red cube with the right arm", "pick up the red cube")
    inputs = []
    for text in texts:
        image = np.zeros((*model.image_resolution, 3), np.uint8)
        observation = Observation(
            images=dict.fromkeys(model.image_keys, image),
            image_masks=dict.fromkeys(model.image_keys, False),
            state=state,
            prompt=text,
            stamp=0.0,
        )
        prepared = engine.prepare_inputs(observation)
        inputs.append((np.asarray(prepared.tokens), np.asarray(prepared.token_mask)))
    tokens = np.concatenate([t for t, _ in inputs])
    masks = np.concatenate([m for _, m in inputs])
    both = head.cache_features(engine, tokens, masks)
    alone = np.stack([head.cache_features(engine, t, m)[0] for t, m in inputs])
    np.testing.assert_allclose(both, alone, atol=1e-5)
    length = model.max_token_len
    layers = gemma.get_config(model.paligemma_variant).depth
    lengths = masks.sum(axis=1)
    assert lengths[0] > lengths[1]  # the longer instruction
    for row, n in zip(both, lengths, strict=True):
        places = np.abs(row.reshape(layers, length, -1)).sum(axis=(0, 2))
        assert not places[: length - n].any()
        assert (places[length - n :] > 0).all()
    # --layers: the same places of the chosen layers only, in the order asked.
    per_layer = both.reshape(len(both), layers, -1)
    chosen = head.cache_features(engine, tokens, masks, (layers - 1, 0))
    np.testing.assert_allclose(chosen, per_layer[:, [layers - 1, 0]].reshape(len(both), -1))
    words = head.state_policy.instruction_features(texts[1])
    features = head.state_features(engine, state[None], [texts[1]], "bins")[0]
    np.testing.assert_array_equal(features[: len(words)], words)
    bins = prompts.discretize_state(engine.normalizer.normalize_state(state))
    np.testing.assert_allclose(
        features[len(words) :], -1.0 + (bins + 0.5) * 2.0 / prompts.NUM_STATE_BINS, atol=1e-6
    )


def test_prefix_head_feature_stats_floor_the_std_and_count_the_flat_features() -> None:
    """--min-std: the MLP divides each feature by its std plus the floor, so a feature the
    training data never moves is divided by the floor alone (and counted), one that moves by
    about its own spread."""
    from oxygen_ros.training.diagnostics import prefix_head as head

    rng = np.random.default_rng(0)
    features = np.stack([np.full(500, 0.25), rng.normal(0.0, 0.5, 500)], axis=1)
    for floor in (1e-3, 0.05):
        stats = head.feature_stats(features, floor)
        np.testing.assert_allclose(stats["mean"], features.mean(0))
        assert stats["std"][0] == pytest.approx(floor)
        assert stats["std"][1] == pytest.approx(features[:, 1].std() + floor)
        assert features[:, 1].std() == pytest.approx(0.5, rel=0.1)
        assert stats["below_min_std"].tolist() == [True, False]


def test_prefix_head_linear_features_turn_the_offsets_back_into_metres() -> None:
    """--features linear: the target state's hand-to-cube offsets, stored as sign(d) *
    sqrt(|d|) (`workcell_cubes.reach_offsets`), come back as d in metres; every other number
    (joints, the cube's pose) is left as it is, and a state of another layout is refused."""
    from oxygen_ros.perception import workcell_cubes
    from oxygen_ros.training import data
    from oxygen_ros.training.diagnostics import prefix_head as head

    names = data.state_names(workcell_cubes.TARGET)
    rng = np.random.default_rng(1)
    d = rng.uniform(-0.3, 0.3, (4, len(names))).astype(np.float32)
    offset = np.array([n.rsplit(".", 1)[-1] in workcell_cubes.REACH_FIELDS for n in names])
    assert offset.sum() == 3 * 2  # dx, dy, dz per arm
    stored = np.where(offset, np.sign(d) * np.sqrt(np.abs(d)), d).astype(np.float32)
    got = head.linear_offsets(stored)
    np.testing.assert_allclose(got[:, offset], d[:, offset], rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(got[:, ~offset], stored[:, ~offset])
    with pytest.raises(ValueError, match="target state"):
        head.linear_offsets(stored[:, :-1])


def test_untrained_checkpoint_is_the_initialisation_with_a_trained_ones_assets(tmp_path) -> None:
    """Every leaf is the preset's initialisation for the seed except the state-bin rows, which
    are bin_embeddings' code with the frequencies asked (the control: another code differs);
    the assets are the trained checkpoint's, byte for byte."""
    import jax
    import orbax.checkpoint as ocp
    from flax import nnx

    from oxygen_ros.engine.config import get_model_config
    from oxygen_ros.engine.model import create_model
    from oxygen_ros.engine.tokenizer import TOKENIZER_FILE, Tokenizer
    from oxygen_ros.resources import resolve_path
    from oxygen_ros.training import bin_embeddings, trainer
    from oxygen_ros.training.diagnostics import untrained_checkpoint as tool

    like = Path(resolve_path("package://oxygen_ros/models/workcell_run38"))
    preset = "workcell_target_bins"
    outs = {}
    for name, freqs in (("linear", "0.5"), ("default", "")):
        outs[name] = tmp_path / name
        args = ["--like", str(like), "--preset", preset, "--out", str(outs[name]), "--seed", "3"]
        assert tool.main([*args, "--bin-frequencies", freqs] if freqs else args) == 0
    with ocp.PyTreeCheckpointer() as checkpointer:
        got = {k: checkpointer.restore(p / "params")["params"] for k, p in outs.items()}
    init = nnx.to_pure_dict(nnx.state(create_model(get_model_config(preset), seed=3)))
    ids = bin_embeddings.bin_token_ids(Tokenizer(str(like / "assets/workcell" / TOKENIZER_FILE)))
    flat = {k: dict(jax.tree_util.tree_flatten_with_path(v)[0]) for k, v in got.items()}
    for path, leaf in jax.tree_util.tree_flatten_with_path(init)[0]:
        mine = np.asarray(flat["linear"][path])
        if trainer.leaf_names(path)[: len(trainer.EMBEDDING_PATH)] != trainer.EMBEDDING_PATH:
            np.testing.assert_array_equal(mine, np.asarray(leaf))
            continue
        others = np.setdiff1d(np.arange(len(mine)), ids)
        np.testing.assert_array_equal(mine[others], np.asarray(leaf)[others])
        norm = float(np.mean(np.linalg.norm(np.asarray(leaf)[others], axis=1)))
        want = bin_embeddings.smooth_bin_rows(mine.shape[1], norm, 3, (0.5,))
        np.testing.assert_allclose(mine[ids], want, rtol=1e-5, atol=1e-6)
        default = np.asarray(flat["default"][path])[ids]
        assert np.abs(default - mine[ids]).max() > 1e-3
    for name in ("norm_stats.json", TOKENIZER_FILE, "action_space.json", "state_layout.json"):
        for out in outs.values():
            assert (out / "assets/workcell" / name).read_bytes() == (
                like / "assets/workcell" / name
            ).read_bytes()
