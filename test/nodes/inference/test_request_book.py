"""Request bookkeeping without a node: streamed outputs, the engine's and the node's own final
messages, exactly one final per accepted request (engine fault, supersede, shutdown, and a
shutdown racing the engine thread)."""

from __future__ import annotations

import collections
import threading

from oxygen_ros.engine.types import RequestKind, RequestOutput, RequestStatus
from oxygen_ros.nodes.inference.engine_bridge import LanguageQueue
from oxygen_ros.nodes.inference.request_book import RequestBook

NOW = 50.0  # the node clock: stamp of the node's own finals


class Sent:
    """The fake `send`: every SpeechToken the book would publish."""

    def __init__(self) -> None:
        self.messages: list[tuple[RequestOutput, float, float | None]] = []
        self.lock = threading.Lock()

    def __call__(self, output: RequestOutput, stamp: float, observation_stamp) -> None:
        with self.lock:
            self.messages.append((output, stamp, observation_stamp))

    def of(self, request_id: str) -> list[RequestOutput]:
        return [o for o, _, _ in self.messages if o.request_id == request_id]

    def finals(self) -> collections.Counter[str]:
        return collections.Counter(o.request_id for o, _, _ in self.messages if o.status.finished)


def make(max_pending: int = 8) -> tuple[RequestBook, Sent]:
    sent = Sent()
    return RequestBook(LanguageQueue(max_pending), sent, lambda: NOW), sent


def output(request_id, kind, ids, delta, first, status=RequestStatus.RUNNING, text=None):
    return RequestOutput(request_id, kind, tuple(ids), delta, first, status, text)


def submit_and_take(book: RequestBook, *kinds: RequestKind) -> list[str]:
    ids = [book.queue.submit(kind, origin="test").request_id for kind in kinds]
    requests = book.queue.take()
    book.admit(requests, 10.0, "pick the cup")
    return ids


def test_stream_then_engine_final_is_reported_once() -> None:
    book, sent = make()
    (rid,) = submit_and_take(book, RequestKind.NARRATION)
    kind = RequestKind.NARRATION
    assert book.on_output(output(rid, kind, [5, 6], "the cup", 0), 11.0, 10.5, "other") is None
    final = output(rid, kind, [7], " is red", 2, RequestStatus.FINISHED_STOPPED, "the cup is red")
    finished = book.on_output(final, 12.0, 11.5, "other")
    assert finished is not None and finished.succeeded
    assert (finished.origin, finished.observation_stamp, finished.prompt) == (
        "test",
        10.0,
        "pick the cup",
    )  # the frame it started from, not the frame it finished in
    assert [(o.first_index, s, obs) for o, s, obs in sent.messages] == [
        (0, 11.0, 10.0),
        (2, 12.0, 10.0),
    ]
    assert book.queue.num_in_flight == 0
    # A late duplicate of the final is counted, not sent.
    assert book.on_output(final, 13.0, 12.5, "") is None
    assert book.counters["outputs_not_in_flight"] == 1
    assert sent.finals() == {rid: 1}


def test_engine_fault_ends_every_in_flight_request_once_with_what_it_streamed() -> None:
    book, sent = make()
    a, b = submit_and_take(book, RequestKind.NARRATION, RequestKind.MEMORY)
    queued = book.queue.submit(RequestKind.SUBTASK).request_id  # not in flight: waits
    book.on_output(output(a, RequestKind.NARRATION, [5, 6], "ab", 0), 11.0, 10.5, "")
    failed = book.fail_in_flight("engine fault: RuntimeError: boom")
    assert [r.request_id for r in failed] == [a, b]
    finals = {o.request_id: o for o, _, _ in sent.messages if o.status.finished}
    assert finals[a].status == RequestStatus.FINISHED_ERROR
    assert (finals[a].first_index, finals[a].text) == (2, "ab")  # what the stream carried
    assert (finals[b].first_index, finals[b].text) == (0, "")
    assert finals[a].error == "engine fault: RuntimeError: boom"
    # The engine's later outputs of those requests are not sent.
    book.on_output(output(a, RequestKind.NARRATION, [9], "c", 2), 12.0, 11.5, "")
    book.on_output(
        output(b, RequestKind.MEMORY, [], "", 0, RequestStatus.FINISHED_LENGTH), 12, 11, ""
    )
    assert book.counters["outputs_not_in_flight"] == 2
    assert sent.finals() == {a: 1, b: 1}
    assert book.queue.num_queued == 1 and queued not in sent.finals()


def test_supersede_ends_queued_now_and_marks_in_flight_for_the_engine() -> None:
    book, sent = make()
    (running,) = submit_and_take(book, RequestKind.SUBTASK)
    queued = book.queue.submit(RequestKind.SUBTASK).request_id
    narration = book.queue.submit(RequestKind.NARRATION).request_id
    assert book.supersede(RequestKind.SUBTASK, "superseded by a new instruction") == [running]
    assert sent.finals() == {queued: 1}
    assert sent.of(queued)[0].status == RequestStatus.FINISHED_ABORTED
    assert sent.messages[0][1:] == (NOW, None)  # the node's stamp; it never reached a frame
    assert book.queue.take_aborts() == [running]
    # The engine reports the in-flight one aborted: that is its one final.
    aborted = output(running, RequestKind.SUBTASK, [], "", 0, RequestStatus.FINISHED_ABORTED)
    assert book.on_output(aborted, 11.0, 10.5, "").succeeded is False
    assert sent.finals() == {queued: 1, running: 1}
    assert [r.request_id for r in book.queue.take()] == [narration]


def test_shutdown_ends_queued_and_in_flight_once() -> None:
    book, sent = make()
    ids = submit_and_take(book, RequestKind.NARRATION, RequestKind.MEMORY)
    ids.append(book.queue.submit(RequestKind.SUBTASK).request_id)
    assert book.abort_all("node shutting down") == 3
    assert book.abort_all("node shutting down") == 0
    assert sent.finals() == dict.fromkeys(ids, 1)
    assert {o.status for o, _, _ in sent.messages} == {RequestStatus.FINISHED_ABORTED}


def test_every_accepted_request_ends_once_when_shutdown_races_the_engine_thread() -> None:
    book, sent = make(max_pending=64)
    ids = submit_and_take(book, *[RequestKind.NARRATION] * 40)
    started = threading.Event()

    def engine_thread() -> None:  # streams three tokens per request, then finishes it
        for step in range(4):
            for rid in ids:
                status = RequestStatus.FINISHED_LENGTH if step == 3 else RequestStatus.RUNNING
                book.on_output(
                    output(rid, RequestKind.NARRATION, [step], "x", step, status, "xxx"),
                    11,
                    10,
                    "",
                )
                started.set()

    thread = threading.Thread(target=engine_thread)
    thread.start()
    assert started.wait(5.0)
    book.abort_all("node shutting down")  # while the engine thread is mid-way
    thread.join(timeout=10.0)
    assert not thread.is_alive()
    assert sent.finals() == dict.fromkeys(ids, 1)
    for rid in ids:  # and the final is the request's last message
        assert [o.status.finished for o in sent.of(rid)][-1] is True
