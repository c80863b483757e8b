"""Runner: a schedule's admissions and decode steps on the cache equal solo decoding."""

from __future__ import annotations

import numpy as np
import pytest
from engine_factories import make_engine_config, make_observation

from oxygen_ros.engine import compiles
from oxygen_ros.engine.engine import Counters, Engine
from oxygen_ros.engine.kv_cache import LanguageKVCache
from oxygen_ros.engine.reference_decode import decode_to_completion, prepare_requests
from oxygen_ros.engine.requests import Request
from oxygen_ros.engine.runner import Runner, extend_widths
from oxygen_ros.engine.types import LanguageRequest, RequestKind, RequestStatus


@pytest.fixture(scope="module")
def engine(tiny_model) -> Engine:
    """Supplies the jitted model, tokenizer and cache layout (its own cache is not used)."""
    return Engine(make_engine_config(), model=tiny_model)


@pytest.fixture(scope="module")
def prefixes(engine):
    """Two frames' prefixes (different observations, so different kv)."""
    return [
        engine.runner.prefill(engine.prepare_inputs(make_observation(seed))) for seed in (21, 22)
    ]


def fresh_runner(engine: Engine, extend_rows: int | None = None) -> Runner:
    cache = LanguageKVCache(engine.cache.layout)
    rows = engine.config.extend_rows if extend_rows is None else extend_rows
    return Runner(
        engine.model, cache, extend_rows=rows, max_tail_len=engine.config.prompt.max_tail_len
    )


SPECS = {
    "narration": LanguageRequest(RequestKind.NARRATION, max_tokens=9, ignore_eos=True),
    "memory": LanguageRequest(RequestKind.MEMORY, max_tokens=7, temperature=0.7, seed=3),
    "subtask": LanguageRequest(RequestKind.SUBTASK, max_tokens=5),
}


def make_state(engine: Engine, name: str) -> Request:
    spec = SPECS[name]
    task = engine.config.prompt.task(spec.kind)
    return Request.from_language_request(
        spec,
        request_id=name,
        prompt_token_ids=engine._tails[spec.kind],
        default_max_tokens=task.max_tokens,
        default_priority=task.priority,
        eos_token_ids=() if spec.ignore_eos else (engine.tokenizer.eos_id,),
        arrival_time=0.0,
    )


def solo_tokens(engine: Engine, prefix, name: str) -> list[int]:
    """Independent reference: decode_to_completion on a one-prefix store of that frame."""
    (prepared,) = prepare_requests(
        [SPECS[name]], engine.config.prompt, engine.config.cache, engine.tokenizer
    )
    (decoded,) = decode_to_completion(
        engine.model,
        prefix,
        0,
        [prepared],
        engine.config.cache,
        engine.tokenizer.eos_id,
        Counters(),
    )
    return decoded.token_ids


def test_admit_and_decode_across_two_frame_prefixes_equal_solo_decoding(engine, prefixes):
    runner = fresh_runner(engine)
    cache = runner.cache
    valid_len = [int(np.asarray(p.mask).sum()) for p in prefixes]
    assert np.abs(np.asarray(prefixes[0].k) - np.asarray(prefixes[1].k)).max() > 1e-3
    live: dict[int, Request] = {}

    def admit(frame: int, names: list[str]) -> None:
        prefix_id = cache.reserve_prefix()
        pairs = [
            (cache.allocate_slot(prefix_id, name), make_state(engine, name)) for name in names
        ]
        first = runner.admit(prefixes[frame], prefix_id, pairs)
        for (slot, request), token in zip(pairs, first, strict=True):
            request.start(0.0)
            assert cache.slot_length(slot) == request.num_prompt_tokens
            assert cache.slot_position(slot) == valid_len[frame] + request.num_prompt_tokens
            if request.append_token(token, 0.0):
                live[slot] = request
            else:
                cache.free_slot(slot)
            results[request.request_id] = request

    def step() -> None:
        sampled = runner.decode_step(dict(live))
        assert sorted(sampled) == sorted(live)
        for slot, token in sampled.items():
            if not live[slot].append_token(token, 0.0):
                del live[slot]
                cache.free_slot(slot)

    results: dict[str, Request] = {}
    admit(0, ["narration", "memory"])  # two requests share frame 0's prefix row
    assert (cache.prefix_refcount(0), cache.num_used_prefixes) == (2, 1)
    step()
    step()
    admit(1, ["subtask"])  # a later frame: its own row, batched with the frame-0 rows
    assert cache.slot_prefix(2) == 1 and cache.prefix_refcount(1) == 1
    while live:
        step()
    assert results["narration"].output_token_ids == solo_tokens(engine, prefixes[0], "narration")
    assert results["memory"].output_token_ids == solo_tokens(engine, prefixes[0], "memory")
    assert results["subtask"].output_token_ids == solo_tokens(engine, prefixes[1], "subtask")
    assert results["narration"].status is RequestStatus.FINISHED_LENGTH
    assert len(results["narration"].output_token_ids) == 9
    assert cache.num_used_prefixes == 0 and cache.num_free_slots == cache.num_slots


def test_more_admissions_than_extend_rows_run_in_chunks(engine, prefixes) -> None:
    runner = fresh_runner(engine, extend_rows=1)
    cache = runner.cache
    prefix_id = cache.reserve_prefix()
    names = ["narration", "memory", "subtask"]
    pairs = [(cache.allocate_slot(prefix_id, name), make_state(engine, name)) for name in names]
    assert runner.num_extends(3) == 3 and fresh_runner(engine).num_extends(3) == 1
    first = runner.admit(prefixes[1], prefix_id, pairs)
    expected = [solo_tokens(engine, prefixes[1], name)[0] for name in names]
    assert first == expected
    assert cache.active_slots() == [0, 1, 2]


def test_decode_compiles_once_for_every_active_count(engine, prefixes) -> None:
    runner = fresh_runner(engine)
    cache = runner.cache
    live: dict[int, Request] = {}
    counts = []
    for round_index in range(2):  # the first round may compile; the second must not
        before = compiles.num_compiles()
        for count in range(1, cache.num_slots + 1):
            prefix_id = cache.reserve_prefix()
            name = "narration"
            slot = cache.allocate_slot(prefix_id, f"{name}-{round_index}-{count}")
            request = make_state(engine, name)
            request.request_id = f"{name}-{round_index}-{count}"
            (token,) = runner.admit(prefixes[count % 2], prefix_id, [(slot, request)])
            request.start(0.0)
            request.append_token(token, 0.0)
            live[slot] = request
            sampled = runner.decode_step(dict(live))
            counts.append(len(sampled))
            for slot_id, sampled_token in sampled.items():
                live[slot_id].append_token(sampled_token, 0.0)
        for slot in sorted(live):
            del live[slot]
            cache.free_slot(slot)
            if live:
                counts.append(len(runner.decode_step(dict(live))))
        if round_index == 1:
            assert compiles.num_compiles() == before
    assert counts == [1, 2, 3, 4, 3, 2, 1] * 2
    assert cache.num_used_prefixes == 0


def test_runner_rejects_inconsistent_calls(engine, prefixes) -> None:
    runner = fresh_runner(engine)
    cache = runner.cache
    prefix_id = cache.reserve_prefix()
    slot = cache.allocate_slot(prefix_id, "narration")
    request = make_state(engine, "narration")
    with pytest.raises(RuntimeError, match="active slots"):
        runner.decode_step({slot: request})  # allocated but its tail is not written yet
    runner.admit(prefixes[0], prefix_id, [(slot, request)])
    with pytest.raises(ValueError, match="not a fresh slot"):
        runner.admit(prefixes[0], prefix_id, [(slot, request)])
    with pytest.raises(RuntimeError, match="no id to feed"):
        runner.decode_step({slot: request})
    with pytest.raises(ValueError):
        Runner(engine.model, cache, extend_rows=0, max_tail_len=4)


def test_extend_widths_are_powers_of_two_then_extend_rows() -> None:
    assert extend_widths(1) == (1,)
    assert extend_widths(4) == (1, 2, 4)
    assert extend_widths(6) == (1, 2, 4, 6)
    assert extend_widths(8) == (1, 2, 4, 8)


def test_an_admission_extends_at_the_smallest_width_that_holds_it(engine, prefixes) -> None:
    runner = fresh_runner(engine, extend_rows=4)
    cache = runner.cache
    extend = runner.model.extend
    rows_seen: list[int] = []

    class Spy:  # the runner's model with extend's batch rows recorded
        def __getattr__(self, name):
            return getattr(engine.model, name)

        def extend(self, store, prefix_index, tail_tokens, tail_mask):
            rows_seen.append(tail_tokens.shape[0])
            return extend(store, prefix_index, tail_tokens, tail_mask)

    runner.model = Spy()
    names = ["narration", "memory", "subtask"]
    for frame, group in enumerate((names[:1], names)):  # 1 request, then 3 together
        prefix_id = cache.reserve_prefix()
        pairs = [
            (cache.allocate_slot(prefix_id, f"{name}-{frame}"), make_state(engine, name))
            for name in group
        ]
        first = runner.admit(prefixes[frame], prefix_id, pairs)
        # The same first ids as each request decoded alone (padding rows change nothing).
        assert first == [solo_tokens(engine, prefixes[frame], name)[0] for name in group]
    assert rows_seen == [1, 4]  # the fixed width was 4 for both before
    assert [runner.extend_width(n) for n in (1, 2, 3, 4)] == [1, 2, 4, 4]
    with pytest.raises(ValueError):
        runner.extend_width(5)
