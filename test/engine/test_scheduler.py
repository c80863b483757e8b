"""FrameScheduler admission, cancellation and decode-step policies, with fake costs."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oxygen_ros.engine.config import SchedulerConfig
from oxygen_ros.engine.kv_cache import KVCacheLayout, LanguageKVCache
from oxygen_ros.engine.requests import Request
from oxygen_ros.engine.scheduler import (
    CostModel,
    FrameCosts,
    FrameScheduler,
    RefuseReason,
    RunningMedian,
)
from oxygen_ros.engine.types import RequestKind, RequestStatus

EOS_ID = 1


def make_request(
    request_id: str,
    *,
    priority: int = 0,
    max_tokens: int = 4,
    num_prompt_tokens: int = 2,
    kind: RequestKind = RequestKind.SUBTASK,
) -> Request:
    return Request(
        request_id=request_id,
        kind=kind,
        prompt_token_ids=tuple(range(10, 10 + num_prompt_tokens)),
        max_tokens=max_tokens,
        priority=priority,
        arrival_time=0.0,
        eos_token_ids=frozenset({EOS_ID}),
    )


def make_scheduler(
    *, num_slots: int = 3, num_prefixes: int = 2, max_seq_len: int = 8, **config: object
) -> FrameScheduler:
    layout = KVCacheLayout(
        num_slots=num_slots,
        num_prefixes=num_prefixes,
        prefix_len=2,
        max_seq_len=max_seq_len,
        num_layers=1,
        num_kv_heads=1,
        head_dim=1,
    )
    config.setdefault("policy", "fixed")
    config.setdefault("decode_steps_per_frame", 2)
    config.setdefault("max_waiting", 4)
    return FrameScheduler(SchedulerConfig(**config), LanguageKVCache(layout))  # type: ignore[arg-type]


def add(scheduler: FrameScheduler, *requests: Request) -> None:
    for request in requests:
        assert scheduler.add_request(request, now=0.0) is None


def test_admission_is_by_priority_then_fifo_and_shares_one_prefix() -> None:
    scheduler = make_scheduler(num_slots=3, max_waiting=8)
    add(
        scheduler,
        make_request("memory-0", priority=2),
        make_request("narration-0", priority=1),
        make_request("memory-1", priority=2),
        make_request("subtask-0", priority=0),
        make_request("narration-1", priority=1),
    )
    assert scheduler.waiting_ids == (
        "subtask-0",
        "narration-0",
        "narration-1",
        "memory-0",
        "memory-1",
    )
    assert scheduler.queue_position("memory-1") == 4
    schedule = scheduler.schedule(now=1.0)
    assert schedule.admit_ids == ("subtask-0", "narration-0", "narration-1")
    assert schedule.admit_slots == (0, 1, 2)
    assert schedule.prefix_id == 0
    assert schedule.running_ids == ()
    assert schedule.num_waiting == 2
    cache = scheduler.cache
    assert cache.prefix_refcount(0) == 3
    assert [cache.slot_prefix(slot) for slot in schedule.admit_slots] == [0, 0, 0]
    assert scheduler.status_of("subtask-0") == RequestStatus.RUNNING
    assert scheduler.get_request("subtask-0").admitted_time == 1.0  # type: ignore[union-attr]
    assert scheduler.status_of("memory-0") == RequestStatus.WAITING
    assert scheduler.queue_position("memory-0") == 0


def test_later_frames_get_their_own_prefix_and_wait_for_slots() -> None:
    scheduler = make_scheduler(num_slots=3, num_prefixes=2)
    add(scheduler, make_request("a"), make_request("b"))
    first = scheduler.schedule(now=1.0)
    add(scheduler, make_request("c"), make_request("d"))
    second = scheduler.schedule(now=2.0)
    assert (first.prefix_id, first.admit_ids) == (0, ("a", "b"))
    assert (second.prefix_id, second.admit_ids, second.admit_slots) == (1, ("c",), (2,))
    assert second.running_ids == ("a", "b")
    assert second.decode_batch_size == 3
    assert scheduler.queue_position("d") == 0
    third = scheduler.schedule(now=3.0)  # no slot: nothing admitted, no prefix reserved
    assert (third.prefix_id, third.admit_ids, third.num_waiting) == (None, (), 1)
    assert scheduler.cache.num_used_prefixes == 2


def test_no_free_prefix_row_blocks_admission_until_a_frame_drains() -> None:
    scheduler = make_scheduler(num_slots=4, num_prefixes=1)
    add(scheduler, make_request("a", max_tokens=2))
    scheduler.schedule(now=1.0)
    add(scheduler, make_request("b"))
    assert scheduler.schedule(now=2.0).admit_ids == ()
    scheduler.record_tokens("a", [5, 6], now=2.5)  # finishes: prefix 0 is released
    assert scheduler.cache.num_used_prefixes == 0
    schedule = scheduler.schedule(now=3.0)
    assert (schedule.admit_ids, schedule.prefix_id, schedule.admit_slots) == (("b",), 0, (0,))


def test_max_admit_per_frame_limits_the_extend_batch() -> None:
    scheduler = make_scheduler(num_slots=3, max_admit_per_frame=2)
    add(scheduler, make_request("a"), make_request("b"), make_request("c"))
    assert scheduler.schedule(now=1.0).admit_ids == ("a", "b")
    assert scheduler.schedule(now=2.0).admit_ids == ("c",)


def test_full_queue_refuses_with_reason_and_status() -> None:
    scheduler = make_scheduler(max_waiting=2)
    add(scheduler, make_request("a", priority=1), make_request("b", priority=1))
    late = make_request("c", priority=1)
    assert scheduler.add_request(late, now=0.5) is RefuseReason.QUEUE_FULL
    assert late.status == RequestStatus.REFUSED
    assert late.error == RefuseReason.QUEUE_FULL.value
    assert late.finish_time == 0.5
    assert scheduler.num_waiting == 2
    assert scheduler.take_finished() == [late]
    assert scheduler.stats().num_refused == 1


def test_full_queue_lets_a_higher_priority_request_displace_the_worst() -> None:
    scheduler = make_scheduler(max_waiting=2)
    add(scheduler, make_request("memory", priority=2), make_request("narration", priority=1))
    subtask = make_request("subtask", priority=0)
    assert scheduler.add_request(subtask, now=0.0) is None
    assert scheduler.waiting_ids == ("subtask", "narration")
    (displaced,) = scheduler.take_finished()
    assert displaced.request_id == "memory"
    assert displaced.status == RequestStatus.REFUSED
    assert displaced.error == RefuseReason.DISPLACED.value


def test_too_long_and_duplicate_requests_are_refused_on_arrival() -> None:
    scheduler = make_scheduler(max_seq_len=8)
    fits = make_request("fits", num_prompt_tokens=3, max_tokens=6)  # 3 + 6 - 1 = 8
    too_long = make_request("long", num_prompt_tokens=3, max_tokens=7)
    assert scheduler.add_request(fits, now=0.0) is None
    assert scheduler.add_request(too_long, now=0.0) is RefuseReason.TOO_LONG
    assert scheduler.add_request(make_request("fits"), now=0.0) is RefuseReason.DUPLICATE_ID
    scheduler.schedule(now=1.0)
    assert scheduler.add_request(make_request("fits"), now=1.0) is RefuseReason.DUPLICATE_ID
    assert [r.request_id for r in scheduler.take_finished()] == ["long", "fits", "fits"]
    assert scheduler.status_of("fits") == RequestStatus.RUNNING


def test_abort_waiting_request_leaves_the_queue() -> None:
    scheduler = make_scheduler()
    add(scheduler, make_request("a"), make_request("b"))
    assert scheduler.abort("a", now=0.5)
    assert scheduler.waiting_ids == ("b",)
    (aborted,) = scheduler.take_finished()
    assert (aborted.request_id, aborted.status) == ("a", RequestStatus.FINISHED_ABORTED)
    assert not scheduler.abort("a", now=0.6)
    assert not scheduler.abort("unknown", now=0.6)


def test_abort_running_request_frees_its_slot_at_once() -> None:
    scheduler = make_scheduler(num_slots=2)
    add(scheduler, make_request("a"), make_request("b"))
    scheduler.schedule(now=1.0)
    add(scheduler, make_request("c"))
    cache = scheduler.cache
    assert cache.prefix_refcount(0) == 2
    assert scheduler.abort("a", now=1.5)
    assert cache.slot_of("a") is None
    assert cache.num_free_slots == 1
    assert cache.prefix_refcount(0) == 1
    schedule = scheduler.schedule(now=2.0)
    assert (schedule.admit_ids, schedule.admit_slots, schedule.prefix_id) == (("c",), (0,), 1)
    assert scheduler.abort("b", now=2.5)
    assert not cache.is_prefix_used(0)  # its last reader is gone
    assert [r.request_id for r in scheduler.take_finished()] == ["a", "b"]
    assert scheduler.stats().num_aborted == 2


def test_finished_requests_leave_their_slot_in_the_frame_they_finish() -> None:
    scheduler = make_scheduler(num_slots=2)
    add(scheduler, make_request("a", max_tokens=3), make_request("b", max_tokens=7))
    scheduler.schedule(now=1.0)
    assert scheduler.record_tokens("a", [5], now=1.1) == 1
    assert scheduler.record_tokens("b", [6, EOS_ID, 7], now=1.1) == 2
    assert scheduler.cache.slot_of("b") is None
    assert scheduler.running_ids == ("a",)
    assert scheduler.record_tokens("a", [8, 9, 10], now=1.2) == 2
    finished = scheduler.take_finished()
    assert [(r.request_id, r.status, r.output_token_ids) for r in finished] == [
        ("b", RequestStatus.FINISHED_STOPPED, [6]),
        ("a", RequestStatus.FINISHED_LENGTH, [5, 8, 9]),
    ]
    assert scheduler.take_finished() == []
    assert scheduler.cache.num_free_slots == 2
    assert scheduler.cache.num_used_prefixes == 0
    assert scheduler.status_of("a") is None
    stats = scheduler.stats()
    assert (stats.num_admitted, stats.num_finished, stats.num_running) == (2, 2, 0)


def test_fail_frees_the_slot() -> None:
    scheduler = make_scheduler()
    add(scheduler, make_request("a"))
    scheduler.schedule(now=1.0)
    scheduler.fail("a", "device error", now=1.5)
    (failed,) = scheduler.take_finished()
    assert (failed.status, failed.error) == (RequestStatus.FINISHED_ERROR, "device error")
    assert scheduler.cache.num_free_slots == 3


def test_fixed_policy_runs_k_steps_clipped_to_what_is_left() -> None:
    scheduler = make_scheduler(policy="fixed", decode_steps_per_frame=3)
    add(scheduler, make_request("a", max_tokens=6))
    first = scheduler.schedule(now=1.0)
    assert (first.num_decode_steps, first.decode_batch_size) == (3, 1)
    scheduler.record_tokens("a", [5, 6, 7, 8], now=1.1)  # extend token + 3 decode steps
    second = scheduler.schedule(now=2.0)
    assert second.num_decode_steps == 2  # 6 - 4 left
    assert second.budget_s is None and second.predicted_s is None


def test_new_request_needs_one_step_fewer_than_its_max_tokens() -> None:
    scheduler = make_scheduler(policy="to_completion")
    add(scheduler, make_request("one", max_tokens=1), make_request("two", max_tokens=2))
    assert scheduler.schedule(now=1.0).num_decode_steps == 1
    empty = make_scheduler(policy="to_completion")
    assert empty.schedule(now=1.0).num_decode_steps == 0


def test_to_completion_runs_the_longest_remaining_request() -> None:
    scheduler = make_scheduler(policy="to_completion", max_seq_len=16)
    add(scheduler, make_request("a", max_tokens=10))
    scheduler.schedule(now=1.0)
    scheduler.record_tokens("a", [5, 6], now=1.1)
    add(scheduler, make_request("b", max_tokens=12))
    schedule = scheduler.schedule(now=2.0)
    assert schedule.num_decode_steps == 11  # b: 12 - 1 (extend) > a: 10 - 2
    assert schedule.decode_batch_size == 2


def deadline_scheduler(**config: object) -> FrameScheduler:
    config.setdefault("policy", "deadline")
    config.setdefault("frame_deadline_s", 0.1)
    config.setdefault("safety_margin", 0.1)
    return make_scheduler(num_slots=4, max_seq_len=64, **config)


def steady_costs(*, extend_s: float | None = None, step_s: float = 0.004) -> FrameCosts:
    steps = tuple((size, step_s) for size in (1, 2, 3, 4))
    return FrameCosts(
        prefill_s=0.02, denoise_s=0.03, extend_s=extend_s, decode_step_s=steps, other_s=0.005
    )


def test_deadline_fits_steps_into_the_budget_from_measured_costs() -> None:
    scheduler = deadline_scheduler()
    scheduler.observe_costs(steady_costs(extend_s=0.01))
    add(scheduler, make_request("a", max_tokens=50))
    # Budget 0.09; fixed 0.02 + 0.03 + 0.005 + extend 0.01 = 0.065; (0.025 / 0.004) -> 6.
    first = scheduler.schedule(now=1.0)
    assert first.budget_s == pytest.approx(0.09)
    assert first.num_decode_steps == 6
    assert first.predicted_s == pytest.approx(0.065 + 6 * 0.004)
    # No admission: no extend; (0.09 - 0.055) / 0.004 = 8.75 -> 8.
    second = scheduler.schedule(now=2.0)
    assert second.num_decode_steps == 8
    assert second.predicted_s == pytest.approx(0.055 + 8 * 0.004)


def test_deadline_follows_changing_costs_through_the_running_median() -> None:
    scheduler = deadline_scheduler(cost_window=3)
    add(scheduler, make_request("a", max_tokens=50))
    scheduler.schedule(now=0.0)
    for _ in range(2):
        scheduler.observe_costs(steady_costs(step_s=0.005))
    assert scheduler.schedule(now=1.0).num_decode_steps == 7  # 0.035 / 0.005
    scheduler.observe_costs(steady_costs(step_s=0.035))  # one outlier does not move the median
    assert scheduler.schedule(now=2.0).num_decode_steps == 7
    scheduler.observe_costs(steady_costs(step_s=0.035))
    assert scheduler.schedule(now=3.0).num_decode_steps == 1


def test_deadline_probes_one_step_until_costs_are_measured() -> None:
    scheduler = deadline_scheduler(min_decode_steps_per_frame=0)
    add(scheduler, make_request("a", max_tokens=50))
    schedule = scheduler.schedule(now=1.0)
    assert (schedule.num_decode_steps, schedule.predicted_s) == (1, None)


def test_deadline_respects_floor_ceiling_and_remaining_tokens() -> None:
    over_budget = deadline_scheduler(min_decode_steps_per_frame=2)
    over_budget.observe_costs(dataclasses.replace(steady_costs(), denoise_s=0.2))
    add(over_budget, make_request("a", max_tokens=50))
    assert over_budget.schedule(now=1.0).num_decode_steps == 2

    capped = deadline_scheduler(max_decode_steps_per_frame=5)
    capped.observe_costs(steady_costs(extend_s=0.0, step_s=0.0001))
    add(capped, make_request("a", max_tokens=50))
    assert capped.schedule(now=1.0).num_decode_steps == 5

    short = deadline_scheduler()
    short.observe_costs(steady_costs(extend_s=0.0))
    add(short, make_request("a", max_tokens=3))
    assert short.schedule(now=1.0).num_decode_steps == 2


def test_cost_model_decode_lookup_rules() -> None:
    costs = CostModel(window=4)
    assert costs.decode_step_s(1) is None
    costs.observe(FrameCosts(0.0, 0.0, decode_step_s=((2, 0.010), (4, 0.012))))
    assert costs.decode_step_s(1) == 0.010  # smallest measured size at or above
    assert costs.decode_step_s(3) == 0.012
    assert costs.decode_step_s(8) == pytest.approx(0.024)  # linear beyond the largest
    with pytest.raises(ValueError, match="at least one active row"):
        costs.observe(FrameCosts(0.0, 0.0, decode_step_s=((0, 0.1),)))


def test_running_median_window() -> None:
    median = RunningMedian(window=3)
    assert median.value() is None
    for value in (5.0, 1.0, 3.0, 100.0):
        median.add(value)
    assert median.num_samples == 3
    assert median.value() == 3.0  # median of (1, 3, 100)


def test_frame_budget_from_action_rate_or_explicit_deadline() -> None:
    assert SchedulerConfig(action_rate_hz=50.0, actions_per_frame=5).frame_budget_s == 0.1
    assert SchedulerConfig(action_rate_hz=70.0, actions_per_frame=14).frame_budget_s == 0.2
    explicit = SchedulerConfig(action_rate_hz=50.0, actions_per_frame=5, frame_deadline_s=0.25)
    assert explicit.frame_budget_s == 0.25
    for bad in ({"action_rate_hz": 0.0}, {"actions_per_frame": 0}, {"mode": "batched"}):
        with pytest.raises(ValueError):
            SchedulerConfig(**bad)  # type: ignore[arg-type]


def test_deadline_budget_comes_from_the_action_rate() -> None:
    # 7 actions at 70 Hz: 0.1 s, minus the 10 % margin.
    scheduler = make_scheduler(
        num_slots=4, max_seq_len=64, policy="deadline", action_rate_hz=70.0, actions_per_frame=7
    )
    scheduler.observe_costs(steady_costs(extend_s=0.01))
    add(scheduler, make_request("a", max_tokens=50))
    schedule = scheduler.schedule(now=1.0)
    assert schedule.budget_s == pytest.approx(0.09)
    assert schedule.num_decode_steps == 6


def test_policy_and_admission_overrides_per_call() -> None:
    scheduler = make_scheduler(num_slots=3, policy="fixed", decode_steps_per_frame=1)
    add(scheduler, make_request("a", max_tokens=5), make_request("b", max_tokens=3))
    one = scheduler.schedule(now=1.0, policy="to_completion", max_admit=1)
    assert (one.admit_ids, one.num_decode_steps) == (("a",), 4)
    two = scheduler.schedule(now=1.0)
    assert (two.admit_ids, two.running_ids, two.num_decode_steps) == (("b",), ("a",), 1)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("policy", "greedy"),
        ("max_waiting", 0),
        ("max_admit_per_frame", 0),
        ("min_decode_steps_per_frame", 9),
        ("safety_margin", 1.0),
        ("frame_deadline_s", 0.0),
        ("cost_window", 0),
    ],
)
def test_config_validation(field: str, value: object) -> None:
    with pytest.raises(ValueError):
        SchedulerConfig(**{field: value, "max_decode_steps_per_frame": 8})  # type: ignore[arg-type]


def test_burst_queues_then_refuses_and_nothing_grows() -> None:
    scheduler = make_scheduler(num_slots=2, num_prefixes=2, max_waiting=3, policy="fixed")
    burst = [make_request(f"r{i}", max_tokens=2) for i in range(7)]
    reasons = [scheduler.add_request(request, now=0.0) for request in burst]
    assert reasons == [None, None, None] + [RefuseReason.QUEUE_FULL] * 4
    total_bytes = scheduler.cache.total_bytes
    for frame in range(6):
        schedule = scheduler.schedule(now=float(frame))
        for request_id in schedule.admit_ids + schedule.running_ids:
            scheduler.record_tokens(request_id, [5], now=float(frame))
        assert scheduler.cache.total_bytes == total_bytes
        assert scheduler.num_running <= 2 and scheduler.num_waiting <= 3
    statuses = [request.status for request in burst]
    assert statuses == [RequestStatus.FINISHED_LENGTH] * 3 + [RequestStatus.REFUSED] * 4
    assert len(scheduler.take_finished()) == 7
    assert scheduler.cache.usage().used_bytes == 0


def check_invariants(scheduler: FrameScheduler) -> None:
    cache = scheduler.cache
    slots = [cache.slot_of(request_id) for request_id in scheduler.running_ids]
    assert None not in slots and len(set(slots)) == len(slots)
    assert cache.num_free_slots == cache.num_slots - scheduler.num_running
    for prefix_id in range(cache.layout.num_prefixes):
        readers = [slot for slot in slots if cache.slot_prefix(slot) == prefix_id]  # type: ignore[arg-type]
        assert cache.prefix_refcount(prefix_id) == len(readers)
        assert cache.is_prefix_used(prefix_id) == bool(readers)
    assert scheduler.num_waiting <= scheduler.config.max_waiting
    assert cache.used_bytes == (
        cache.num_used_prefixes * cache.layout.prefix_row_bytes
        + scheduler.num_running * cache.layout.slot_bytes
    )


operations = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(0, 2), st.integers(1, 6)),  # priority, max_tokens
        st.tuples(st.just("abort"), st.integers(0, 30), st.just(0)),  # request number
        st.tuples(st.just("frame"), st.integers(0, 3), st.integers(0, 9)),  # steps, eos phase
    ),
    max_size=40,
)


@settings(max_examples=80, deadline=None)
@given(ops=operations, policy=st.sampled_from(["fixed", "to_completion"]))
def test_property_bookkeeping_stays_exact(ops: list[tuple[str, int, int]], policy: str) -> None:
    """Random arrivals, aborts and frames keep slots, refcounts and the queue consistent."""
    scheduler = make_scheduler(num_slots=3, num_prefixes=2, max_waiting=3, policy=policy)
    requests: list[Request] = []
    for now, (op, first, second) in enumerate(ops):
        if op == "add":
            request = make_request(f"r{len(requests)}", priority=first, max_tokens=second)
            requests.append(request)
            scheduler.add_request(request, now=float(now))
        elif op == "abort":
            scheduler.abort(f"r{first}", now=float(now))
        else:
            schedule = scheduler.schedule(now=float(now))
            waiting = [scheduler.get_request(i) for i in scheduler.waiting_ids]
            for admitted in schedule.admit_ids:  # nothing better-ranked was left waiting
                rank = scheduler.get_request(admitted)
                assert all(w.priority >= rank.priority for w in waiting)  # type: ignore[union-attr]
            for request_id in schedule.admit_ids:  # the extend samples one id each
                scheduler.record_tokens(request_id, [5], now=float(now))
            for step in range(schedule.num_decode_steps):
                for request_id in scheduler.running_ids:
                    token = EOS_ID if (step + second) % 7 == 0 else 6
                    scheduler.record_tokens(request_id, [token], now=float(now))
            if policy == "to_completion":
                assert scheduler.num_running == 0
        check_invariants(scheduler)
    finished = scheduler.take_finished()
    assert len({id(request) for request in finished}) == len(finished)
    assert all(request.finished for request in finished)
    live = set(scheduler.running_ids) | set(scheduler.waiting_ids)
    assert {r.request_id for r in requests if not r.finished} == live


@pytest.mark.parametrize(("deadline_s", "expected"), [(0.2, 31), (0.1, 8), (0.07, 2), (0.05, 1)])
def test_deadline_runs_fewer_steps_as_the_budget_tightens(deadline_s, expected) -> None:
    # Fixed 0.055 s (prefill 0.02 + denoise 0.03 + other 0.005), 0.004 s per step, 10 % margin:
    # floor((0.9 * deadline - 0.055) / 0.004), at least the floor of 1 step.
    scheduler = deadline_scheduler(frame_deadline_s=deadline_s)
    scheduler.observe_costs(steady_costs(extend_s=0.01))
    add(scheduler, make_request("a", max_tokens=60))
    scheduler.schedule(now=1.0)
    scheduler.record_tokens("a", [5], now=1.0)
    assert scheduler.schedule(now=2.0).num_decode_steps == expected
