"""Continuous batching across frames: equality with solo decoding, no recompilation, bounded
memory, deadline steps, streaming and the public Engine API."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from engine_factories import (
    TEST_CACHE,
    make_engine_config,
    make_observation,
    make_request,
    record_decode_sizes,
)

from oxygen_ros.engine.config import SchedulerConfig
from oxygen_ros.engine.engine import Counters, Engine
from oxygen_ros.engine.reference_decode import decode_to_completion, prepare_requests
from oxygen_ros.engine.types import LanguageRequest, RequestKind, RequestStatus

FINISHED_RUNNING = (RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH)


def continuous_engine(tiny_model, **scheduler: object) -> Engine:
    scheduler.setdefault("mode", "continuous")
    scheduler.setdefault("policy", "fixed")
    scheduler.setdefault("decode_steps_per_frame", 3)
    config = make_engine_config(scheduler=SchedulerConfig(**scheduler))  # type: ignore[arg-type]
    return Engine(config, model=tiny_model)


@pytest.fixture(scope="module")
def reference(tiny_model):
    """Per frame seed: isolated actions and each spec's solo decoding from that frame's prefix.

    Solo decoding is `decode_to_completion` on a one-prefix store: a different code path
    (separate decode and sampling calls, its own gen cache) from the engine's runner.
    """
    engine = Engine(
        make_engine_config(scheduler=SchedulerConfig(mode="isolated")), model=tiny_model
    )
    memo: dict[object, object] = {}

    def actions(seed: int) -> np.ndarray:
        key = ("actions", seed)
        if key not in memo:
            result = engine.run_isolated(make_observation(seed), noise=engine.make_noise(seed))
            memo[key] = result.actions.actions
        return memo[key]  # type: ignore[return-value]

    def tokens(seed: int, spec: LanguageRequest) -> list[int]:
        key = ("tokens", seed, dataclasses.replace(spec, request_id=None))
        if key not in memo:
            prefix_key = ("prefix", seed)
            if prefix_key not in memo:
                memo[prefix_key] = engine.runner.prefill(
                    engine.prepare_inputs(make_observation(seed))
                )
            (prepared,) = prepare_requests(
                [spec], engine.config.prompt, engine.config.cache, engine.tokenizer
            )
            (decoded,) = decode_to_completion(
                engine.model,
                memo[prefix_key],
                0,
                [prepared],
                engine.config.cache,
                engine.tokenizer.eos_id,
                Counters(),
            )
            memo[key] = decoded.token_ids
        return memo[key]  # type: ignore[return-value]

    return actions, tokens


@dataclasses.dataclass
class Stream:
    """Everything the engine emitted for one request."""

    spec: LanguageRequest | None  # None: added before `run_frames`
    outputs: list = dataclasses.field(default_factory=list)  # (frame seed, RequestOutput)

    @property
    def token_ids(self) -> list[int]:
        return [t for _, output in self.outputs for t in output.new_token_ids]

    @property
    def first_frame(self) -> int:
        return self.outputs[0][0]


def run_frames(engine, plan, *, aborts=None, seed0=100, max_frames=40):
    """Steps frame seeds seed0, seed0 + 1, ... adding plan[i] in frame i until idle.

    Returns (streams by request id, per-frame results, frame seeds).
    """
    aborts = aborts or {}
    streams: dict[str, Stream] = {}
    results, seeds = [], []
    for frame in range(max_frames):
        specs = plan[frame] if frame < len(plan) else []
        for spec in specs:
            streams[spec.request_id] = Stream(spec)
        seed = seed0 + frame
        result = engine.step(make_observation(seed), specs, noise=engine.make_noise(seed))
        results.append(result)
        seeds.append(seed)
        for output in result.outputs:
            streams.setdefault(output.request_id, Stream(None)).outputs.append((seed, output))
        for request_id in aborts.get(frame, ()):
            assert engine.abort(request_id)
        stats = engine.stats()
        idle = stats.num_waiting == 0 and stats.num_running == 0
        if frame >= len(plan) and idle and (not aborts or frame > max(aborts)):
            break
    return streams, results, seeds


def check_stream(stream: Stream) -> None:
    """Streaming contract: contiguous indices, deltas add up to the text, one final output."""
    outputs = [output for _, output in stream.outputs]
    assert [o.status.finished for o in outputs] == [False] * (len(outputs) - 1) + [True]
    index = 0
    for output in outputs:
        assert output.first_index == index
        index += len(output.new_token_ids)
    final = outputs[-1]
    if final.status is not RequestStatus.REFUSED:
        assert "".join(o.text_delta for o in outputs) == final.text
    assert 1 not in stream.token_ids  # EOS is never emitted


def check_against_reference(streams, results, seeds, reference) -> None:
    actions, tokens = reference
    for seed, result in zip(seeds, results, strict=True):
        np.testing.assert_array_equal(result.actions.actions, actions(seed))
        assert result.num_prefills == 1
    for stream in streams.values():
        check_stream(stream)
        final = stream.outputs[-1][1]
        if final.status in FINISHED_RUNNING:
            # Tokens from the prefix of the frame it was admitted in (its first output).
            assert stream.token_ids == tokens(stream.first_frame, stream.spec)


def req(request_id: str, kind=RequestKind.NARRATION, **fields) -> LanguageRequest:
    return make_request(kind, request_id=request_id, **fields)


def test_staggered_arrivals_equal_solo_decoding_and_isolated_actions(tiny_model, reference):
    engine = continuous_engine(tiny_model, decode_steps_per_frame=3)
    plan = [
        [req("a", max_tokens=12), req("b", RequestKind.MEMORY, temperature=0.8, seed=5)],
        [req("c", RequestKind.SUBTASK, max_tokens=6)],
        [],
        [req("d", max_tokens=20, ignore_eos=True)],
    ]
    streams, results, seeds = run_frames(engine, plan)
    check_against_reference(streams, results, seeds, reference)
    assert [streams[r].first_frame - 100 for r in "abcd"] == [0, 0, 1, 3]
    # d ignores EOS: 1 id from its extend + 3 per frame -> finishes in its 7th frame.
    d = streams["d"]
    assert [len(o.new_token_ids) for _, o in d.outputs] == [4, 3, 3, 3, 3, 3, 1]
    assert d.outputs[-1][1].status is RequestStatus.FINISHED_LENGTH
    stats = engine.stats()
    assert (stats.num_frames, stats.num_prefills) == (len(results), len(results))
    assert (stats.slots_used, stats.prefixes_used, stats.cache_bytes_used) == (0, 0, 0)


def test_cancelled_requests_free_their_slot_at_once_and_others_are_unchanged(
    tiny_model, reference
):
    engine = continuous_engine(tiny_model, decode_steps_per_frame=2)
    long = {"max_tokens": 30, "ignore_eos": True}
    plan = [
        [req("x", **long), req("y", RequestKind.MEMORY, max_tokens=16, ignore_eos=True)],
        [req(f"f{i}", RequestKind.SUBTASK, **long) for i in range(3)],  # f2 waits: 4 slots
    ]
    engine.step(make_observation(100), plan[0], noise=engine.make_noise(100))
    engine.step(make_observation(101), plan[1], noise=engine.make_noise(101))
    assert engine.request_status("f2") is RequestStatus.WAITING
    assert engine.queue_position("f2") == 0
    assert engine.stats().slots_used == 4
    assert engine.abort("x")  # running: its slot is free before the next frame
    assert engine.stats().slots_used == 3
    assert engine.abort("f2")  # waiting: leaves the queue
    assert engine.stats().num_waiting == 0
    assert not engine.abort("x") and not engine.abort("nobody")
    streams, results, _ = run_frames(engine, [], seed0=102)
    finals = {o.request_id: o for r in results for o in r.outputs if o.status.finished}
    assert finals["x"].status is RequestStatus.FINISHED_ABORTED
    # x had 5 ids (1 extend + 2 steps in frame 100, 2 steps in 101) when it was aborted.
    assert finals["x"].new_token_ids == () and finals["x"].first_index == 5
    assert finals["f2"].status is RequestStatus.FINISHED_ABORTED
    assert finals["f2"].first_index == 0 and finals["f2"].text == ""
    assert engine.request_status("x") is RequestStatus.FINISHED_ABORTED
    # What was emitted before the abort is solo decoding's start; the others are unchanged.
    _, tokens = reference
    assert finals["x"].text == engine.tokenizer.decode(tokens(100, req("x", **long))[:5])
    for request_id in ("f0", "f1"):
        emitted = [t for _, o in streams[request_id].outputs for t in o.new_token_ids]
        solo = tokens(101, req(request_id, RequestKind.SUBTASK, **long))
        assert len(solo) == 30 and emitted == solo[3:]  # 3 ids came in frame 101
    emitted_y = [t for _, o in streams["y"].outputs for t in o.new_token_ids]
    assert (
        emitted_y == tokens(100, req("y", RequestKind.MEMORY, max_tokens=16, ignore_eos=True))[5:]
    )
    stats = engine.stats()
    assert (stats.num_aborted, stats.slots_used, stats.prefixes_used) == (2, 0, 0)


def test_more_requests_than_slots_wait_and_start_from_their_admission_frame(tiny_model, reference):
    engine = continuous_engine(tiny_model, decode_steps_per_frame=4, max_waiting=6)
    plan = [
        [req(f"p{i}", RequestKind.SUBTASK, max_tokens=5 + i) for i in range(6)],  # 4 run, 2 wait
        [req(f"q{i}", max_tokens=8) for i in range(5)],  # 2 + 5 > 6 waiting: q4 is refused
    ]
    streams, results, seeds = run_frames(engine, plan)
    check_against_reference(streams, results, seeds, reference)
    q4 = streams["q4"].outputs
    assert len(q4) == 1 and q4[0][1].status is RequestStatus.REFUSED
    assert q4[0][1].error == "waiting queue is full" and q4[0][0] == 101
    first_frames = {r: s.first_frame - 100 for r, s in streams.items() if r != "q4"}
    assert [first_frames[f"p{i}"] for i in range(4)] == [0, 0, 0, 0]
    assert min(first_frames[r] for r in ("p4", "p5", "q0", "q1", "q2", "q3")) >= 1
    assert max(first_frames.values()) >= 2  # waited more than one frame for a slot
    assert engine.stats().num_refused == 1


def test_no_recompilation_through_every_active_count(tiny_model) -> None:
    engine = continuous_engine(tiny_model, decode_steps_per_frame=2)
    engine.warmup()
    assert engine.stats().num_frames == 0  # warm-up leaves the counters alone
    sizes = record_decode_sizes(engine)
    before = engine.stats().num_compiles
    plan = [
        [req("a", RequestKind.NARRATION, max_tokens=16, ignore_eos=True)],
        [req("b", RequestKind.MEMORY, max_tokens=10, ignore_eos=True, temperature=0.9)],
        [req("c", RequestKind.SUBTASK, max_tokens=6, ignore_eos=True)],
        [req("d", RequestKind.NARRATION, max_tokens=5, ignore_eos=True, seed=2)],
    ]
    streams, _, _ = run_frames(engine, plan)
    assert sizes == [1, 1, 2, 2, 3, 3, 4, 4, 4, 3, 2, 1, 1, 1, 1]
    assert [len(streams[r].token_ids) for r in "abcd"] == [16, 10, 6, 5]
    assert engine.stats().num_compiles == before
    assert engine.stats().last_timings.num_decode_steps == 1


def test_memory_is_bounded_burst_queues_then_refuses(tiny_model) -> None:
    engine = continuous_engine(tiny_model, decode_steps_per_frame=8, max_waiting=6)
    layout = engine.cache.layout
    # 4 slots x (k and v: 4 layers x 64 x 1 kv head x 16 dims x 4 bytes)
    # + 4 prefixes x (k and v: 4 x 968 x 16 x 4 bytes + 968 mask bytes).
    total = 4 * 2 * 4 * 64 * 16 * 4 + 4 * (2 * 4 * 968 * 16 * 4 + 968)
    assert layout.total_bytes == total == engine.stats().cache_bytes_total
    results = [engine.add_request(req(f"r{i}", max_tokens=6, ignore_eos=True)) for i in range(9)]
    assert [r.accepted for r in results] == [True] * 6 + [False] * 3
    assert {r.reason for r in results[6:]} == {"waiting queue is full"}
    assert [r.status for r in results] == [RequestStatus.WAITING] * 6 + [RequestStatus.REFUSED] * 3
    assert [engine.queue_position(f"r{i}") for i in range(7)] == [0, 1, 2, 3, 4, 5, None]
    stats = engine.stats()
    assert (stats.num_waiting, stats.num_running, stats.num_refused) == (6, 0, 3)
    assert (stats.slots_used, stats.cache_bytes_used) == (0, 0)

    first = engine.step(make_observation(1))
    stats = engine.stats()
    # r0..r3 admitted in frame 0 (one prefix row), each 1 + 5 steps: all finish in it.
    assert [o.request_id for o in first.outputs] == [
        f"r{i}" for i in range(9) if i != 4 and i != 5
    ]
    assert [o.status for o in first.outputs[4:]] == [RequestStatus.REFUSED] * 3
    assert (stats.num_waiting, stats.num_running, stats.slots_used) == (2, 0, 0)
    assert (
        engine.queue_position("r4") == 0 and engine.request_status("r5") is RequestStatus.WAITING
    )
    second = engine.step(make_observation(2), [req("late", max_tokens=3, ignore_eos=True)])
    assert [o.request_id for o in second.outputs] == ["r4", "r5", "late"]
    stats = engine.stats()
    assert (stats.num_waiting, stats.num_running, stats.slots_used, stats.prefixes_used) == (
        0,
        0,
        0,
        0,
    )
    assert stats.cache_bytes_used == 0 and stats.cache_bytes_total == total
    cache = engine.cache
    assert [cache.prefix_refcount(p) for p in range(layout.num_prefixes)] == [0] * 4
    assert (stats.num_admitted, stats.num_finished, stats.num_refused) == (7, 7, 3)
    assert engine.request_status("r0") is RequestStatus.FINISHED_LENGTH


def test_deadline_policy_runs_fewer_steps_when_the_budget_is_tight(tiny_model) -> None:
    spec = {"max_tokens": 12, "ignore_eos": True}
    loose = continuous_engine(tiny_model, policy="deadline", frame_deadline_s=100.0)
    tight = continuous_engine(
        tiny_model, policy="deadline", frame_deadline_s=1e-4, min_decode_steps_per_frame=1
    )
    steps = {}
    for name, engine in (("loose", loose), ("tight", tight)):
        first = engine.step(make_observation(3), [req("a", **spec)])
        later = [engine.step(make_observation(4 + i)) for i in range(3)]
        steps[name] = [r.timings.num_decode_steps for r in (first, *later)]
    # Frame 1 probes one step (no step cost measured yet). Then loose runs all 10 left of
    # the 12 ids (1 from the extend), tight only the floor of 1 step per frame.
    assert steps == {"loose": [1, 10, 0, 0], "tight": [1, 1, 1, 1]}
    assert loose.request_status("a") is RequestStatus.FINISHED_LENGTH
    assert tight.request_status("a") is RequestStatus.RUNNING


def test_step_with_requests_keeps_the_shared_kv_call_working(tiny_model, tiny_config) -> None:
    """The nodes call `step(observation, requests)`; in continuous mode it streams."""
    engine = continuous_engine(tiny_model, decode_steps_per_frame=2)
    first = engine.step(make_observation(5), [make_request(max_tokens=4, ignore_eos=True)])
    (output,) = first.outputs
    assert (output.request_id, output.status, len(output.new_token_ids)) == (
        "subtask-0",
        RequestStatus.RUNNING,
        3,
    )
    (last,) = engine.step(make_observation(6)).outputs
    assert (last.first_index, len(last.new_token_ids), last.status) == (
        3,
        1,
        RequestStatus.FINISHED_LENGTH,
    )
    assert last.text == output.text_delta + last.text_delta
    shared = Engine(tiny_config, model=tiny_model)
    (done,) = shared.step(
        make_observation(5), [make_request(max_tokens=4, ignore_eos=True)]
    ).outputs
    assert done.new_token_ids == output.new_token_ids + last.new_token_ids
    assert done.status is RequestStatus.FINISHED_LENGTH and done.text == last.text


def test_invalid_and_duplicate_requests_are_refused_with_reasons(tiny_model) -> None:
    engine = continuous_engine(tiny_model)
    assert engine.add_request(req("a", max_tokens=4)).accepted
    duplicate = engine.add_request(req("a", max_tokens=4))
    zero = engine.add_request(req("z", max_tokens=0))
    too_long = engine.add_request(req("t", max_tokens=TEST_CACHE.max_seq_len))
    assert (duplicate.accepted, duplicate.reason) == (False, "a live request already has this id")
    assert zero.reason == "max_tokens must be >= 1, got 0"
    assert "exceeds cache max_seq_len=64" in too_long.reason
    outputs = engine.step(make_observation(7)).outputs
    assert [(o.request_id, o.status) for o in outputs][1:] == [
        ("a", RequestStatus.REFUSED),
        ("z", RequestStatus.REFUSED),
        ("t", RequestStatus.REFUSED),
    ]
    assert outputs[0].request_id == "a" and outputs[0].status is not RequestStatus.REFUSED
    assert engine.stats().num_refused == 3


def test_language_fault_ends_running_requests_and_keeps_the_actions(tiny_model) -> None:
    engine = continuous_engine(tiny_model, decode_steps_per_frame=2)

    def broken(running):
        raise RuntimeError("device lost")

    engine.runner.decode_step = broken  # type: ignore[method-assign]
    result = engine.step(make_observation(8), [req("a", max_tokens=6, ignore_eos=True)])
    assert result.actions is not None and result.actions.actions.shape == (50, 32)
    (output,) = result.outputs
    assert (output.status, output.error) == (
        RequestStatus.FINISHED_ERROR,
        "RuntimeError: device lost",
    )
    assert len(output.new_token_ids) == 1 and output.text == output.text_delta  # the extend's id
    stats = engine.stats()
    assert (stats.num_running, stats.slots_used, stats.prefixes_used) == (0, 0, 0)
