"""Request lifecycle and token ownership."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from oxygen_ros.engine.requests import Request
from oxygen_ros.engine.types import LanguageRequest, RequestKind, RequestStatus

EOS_ID = 1


def make_request(
    request_id: str = "r0",
    *,
    kind: RequestKind = RequestKind.SUBTASK,
    prompt_token_ids: tuple[int, ...] = (10, 11, 12),
    max_tokens: int = 4,
    priority: int = 0,
    arrival_time: float = 0.0,
) -> Request:
    return Request(
        request_id=request_id,
        kind=kind,
        prompt_token_ids=prompt_token_ids,
        max_tokens=max_tokens,
        priority=priority,
        arrival_time=arrival_time,
        eos_token_ids=frozenset({EOS_ID}),
    )


def running_request(**kwargs: object) -> Request:
    request = make_request(**kwargs)  # type: ignore[arg-type]
    request.start(now=1.0)
    return request


def test_status_is_ordered_so_finished_is_one_comparison() -> None:
    finished = [s for s in RequestStatus if s >= RequestStatus.FINISHED_STOPPED]
    assert finished == [
        RequestStatus.FINISHED_STOPPED,
        RequestStatus.FINISHED_LENGTH,
        RequestStatus.FINISHED_ABORTED,
        RequestStatus.FINISHED_ERROR,
        RequestStatus.REFUSED,
    ]


def test_new_request_waits_and_start_records_admission() -> None:
    request = make_request(arrival_time=0.5)
    assert request.status == RequestStatus.WAITING
    assert not request.finished
    request.start(now=2.0)
    assert request.status == RequestStatus.RUNNING
    assert request.admitted_time == 2.0


def test_eos_stops_and_is_never_emitted() -> None:
    request = running_request(max_tokens=10)
    assert request.append_token(5, now=2.0)
    assert request.append_token(6, now=3.0)
    assert not request.append_token(EOS_ID, now=4.0)
    assert request.status == RequestStatus.FINISHED_STOPPED
    assert request.output_token_ids == [5, 6]
    assert (request.first_token_time, request.last_token_time, request.finish_time) == (
        2.0,
        4.0,
        4.0,
    )
    with pytest.raises(ValueError, match="not RUNNING"):
        request.append_token(7, now=5.0)
    assert request.output_token_ids == [5, 6]


def test_max_tokens_finishes_with_length() -> None:
    request = running_request(max_tokens=2)
    assert request.append_token(5, now=2.0)
    assert not request.append_token(6, now=2.0)
    assert request.status == RequestStatus.FINISHED_LENGTH
    assert request.output_token_ids == [5, 6]
    assert request.num_remaining_tokens == 0


def test_eos_as_last_allowed_token_is_stopped_not_length() -> None:
    request = running_request(max_tokens=2)
    request.append_token(5, now=2.0)
    assert not request.append_token(EOS_ID, now=2.0)
    assert request.status == RequestStatus.FINISHED_STOPPED
    assert request.output_token_ids == [5]


def test_eos_as_first_token_gives_empty_output() -> None:
    request = running_request()
    assert not request.append_token(EOS_ID, now=2.0)
    assert request.output_token_ids == []
    assert request.first_token_time == 2.0


def test_append_token_ids_drops_everything_after_the_stop() -> None:
    request = running_request(max_tokens=10)
    assert request.append_token_ids([5, 6, EOS_ID, 7, 8], now=2.0) == 3
    assert request.output_token_ids == [5, 6]
    length_limited = running_request(max_tokens=2)
    assert length_limited.append_token_ids([5, 6, 7], now=2.0) == 2
    assert length_limited.output_token_ids == [5, 6]


def test_take_new_token_ids_hands_out_each_id_once() -> None:
    request = running_request(max_tokens=10)
    assert request.take_new_token_ids() == (0, ())
    request.append_token_ids([5, 6], now=2.0)
    assert request.take_new_token_ids() == (0, (5, 6))
    assert request.take_new_token_ids() == (2, ())
    request.append_token_ids([7, EOS_ID], now=3.0)
    assert request.take_new_token_ids() == (2, (7,))


def test_remaining_tokens_and_seq_len() -> None:
    request = running_request(prompt_token_ids=(1, 2, 3), max_tokens=5)
    assert request.seq_len == 3 + 5 - 1
    request.append_token(9, now=2.0)
    assert request.num_remaining_tokens == 4
    assert request.num_prompt_tokens == 3
    assert request.num_output_tokens == 1


def test_abort_waiting_and_running() -> None:
    waiting = make_request()
    waiting.abort(now=3.0)
    assert waiting.status == RequestStatus.FINISHED_ABORTED
    assert waiting.finish_time == 3.0
    running = running_request()
    running.append_token(5, now=2.0)
    running.abort(now=3.0)
    assert running.status == RequestStatus.FINISHED_ABORTED
    assert running.num_remaining_tokens == 0


def test_refuse_and_fail_record_the_reason() -> None:
    refused = make_request()
    refused.refuse("queue full", now=1.0)
    assert (refused.status, refused.error) == (RequestStatus.REFUSED, "queue full")
    failed = running_request()
    failed.fail("device error", now=2.0)
    assert (failed.status, failed.error) == (RequestStatus.FINISHED_ERROR, "device error")


@pytest.mark.parametrize(
    ("setup", "action"),
    [
        (lambda r: None, lambda r: r.fail("x", 1.0)),  # waiting cannot fail
        (lambda r: r.start(1.0), lambda r: r.refuse("x", 1.0)),  # running cannot be refused
        (lambda r: r.start(1.0), lambda r: r.start(1.0)),  # no double start
        (lambda r: r.abort(1.0), lambda r: r.abort(1.0)),  # finished never changes
        (lambda r: r.abort(1.0), lambda r: r.start(1.0)),
    ],
)
def test_invalid_transitions_raise(
    setup: Callable[[Request], None], action: Callable[[Request], None]
) -> None:
    request = make_request()
    setup(request)
    status = request.status
    with pytest.raises(ValueError, match="cannot go from"):
        action(request)
    assert request.status == status


def test_invalid_construction_raises() -> None:
    with pytest.raises(ValueError, match="max_tokens"):
        make_request(max_tokens=0)
    with pytest.raises(ValueError, match="prompt_token_ids"):
        make_request(prompt_token_ids=())


def test_from_language_request_uses_kind_defaults_unless_overridden() -> None:
    spec = LanguageRequest(kind=RequestKind.NARRATION, temperature=0.5, seed=7)
    request = Request.from_language_request(
        spec,
        request_id="narration-0",
        prompt_token_ids=[4, 5],
        default_max_tokens=32,
        default_priority=1,
        eos_token_ids=[EOS_ID],
        arrival_time=9.0,
    )
    assert (request.max_tokens, request.priority, request.kind) == (32, 1, RequestKind.NARRATION)
    assert (request.temperature, request.seed, request.arrival_time) == (0.5, 7, 9.0)
    assert request.prompt_token_ids == (4, 5)
    assert request.eos_token_ids == frozenset({EOS_ID})
    overridden = Request.from_language_request(
        LanguageRequest(kind=RequestKind.MEMORY, max_tokens=3, priority=0),
        request_id="m",
        prompt_token_ids=[4],
        default_max_tokens=32,
        default_priority=2,
        eos_token_ids=[EOS_ID],
        arrival_time=0.0,
    )
    assert (overridden.max_tokens, overridden.priority) == (3, 0)
