"""Language request bookkeeping of the inference node (ROS-free): what each accepted request's
stream carried, and the one final message it ends with.

The node hands requests to the engine with the frame they start from (`admit`); every output
the engine reports goes through `on_output`, which sends it (the node's `send` builds and
publishes the SpeechToken) and says when a request finished.

Invariants:
- Every request the node accepted ends with exactly one final message: the engine's (it
  reported the request finished: stopped, length, aborted, failed or refused), or the node's
  own when it ends the request itself: superseded while queued (`supersede`), an engine fault
  (`fail_in_flight`) or shutdown (`abort_all`). The node's final carries the token count and
  text its stream already carried.
- Each ending first removes the request from the `LanguageQueue`; one that is no longer in
  flight is never ended again (its later engine outputs are counted, `outputs_not_in_flight`,
  and not sent).
- One lock serialises the sends of all threads, so no token message of a request follows its
  final one. `send` runs under it: it must not call back into the book.
- A token message carries the stamp of the observation its request started from.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
from collections.abc import Callable, Sequence

from oxygen_ros.engine.types import LanguageRequest, RequestKind, RequestOutput, RequestStatus
from oxygen_ros.nodes.inference.engine_bridge import LanguageQueue

SUCCESS = (RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH)

# send(output, stamp, observation_stamp): one SpeechToken; `stamp` is its header time (node
# clock seconds), `observation_stamp` the request's first frame (None: unknown).
SendFn = Callable[[RequestOutput, float, "float | None"], None]


@dataclasses.dataclass(frozen=True)
class Finished:
    """A request the engine reported finished (its final message is sent)."""

    output: RequestOutput  # the final output
    origin: str  # what asked for it ("subtask", "on_demand", ...; LanguageQueue.submit)
    observation_stamp: float  # stamp of the frame it started from
    prompt: str  # the task prompt of that frame

    @property
    def succeeded(self) -> bool:
        return self.output.status in SUCCESS


class RequestBook:
    """The node's side of every accepted request, from admission to its final message."""

    def __init__(self, queue: LanguageQueue, send: SendFn, clock: Callable[[], float]) -> None:
        """
        Args:
            queue: The node's request queue (the book ends requests through it).
            send: Builds and publishes one SpeechToken.
            clock: The node's clock, seconds: the stamp of the node's own final messages.
        """
        self.queue = queue
        self.counters: collections.Counter[str] = collections.Counter()
        self._send = send
        self._clock = clock
        self._lock = threading.Lock()
        # Request id -> (observation stamp, prompt) of the frame it was handed to the engine in.
        self._admitted: dict[str, tuple[float, str]] = {}
        # Request id -> (tokens, text) its stream carried so far.
        self._streamed: dict[str, tuple[int, str]] = {}

    def admit(
        self, requests: Sequence[LanguageRequest], observation_stamp: float, prompt: str
    ) -> None:
        """The requests go to the engine with the frame stamped `observation_stamp`."""
        with self._lock:
            for request in requests:
                self._admitted[request.request_id] = (observation_stamp, prompt)

    def on_output(
        self, output: RequestOutput, stamp: float, observation_stamp: float, prompt: str
    ) -> Finished | None:
        """Sends one engine output of the frame (`stamp`: the frame's publish time; the frame's
        observation stamp and prompt stand in for an unknown request's). Returns the request's
        `Finished` when this output ended it, else None."""
        request_id = output.request_id
        with self._lock:
            if not self.queue.is_in_flight(request_id):
                self.counters["outputs_not_in_flight"] += 1  # already ended by the node
                return None
            started, started_prompt = self._admitted.get(request_id, (observation_stamp, prompt))
            if not output.status.finished:
                self._send(output, stamp, started)
                count, text = self._streamed.get(request_id, (0, ""))
                self._streamed[request_id] = (
                    count + len(output.new_token_ids),
                    text + output.text_delta,
                )
                return None
            origin = self.queue.finish(request_id) or output.kind.value
            self._admitted.pop(request_id, None)
            self._streamed.pop(request_id, None)
            self._send(output, stamp, started)
        return Finished(output, origin, started, started_prompt)

    def supersede(self, kind: RequestKind, reason: str) -> list[str]:
        """Ends the queued requests of `kind` (aborted, with `reason`) and marks the in-flight
        ones for `Engine.abort` (their final comes from the engine). Returns the marked ids."""
        with self._lock:
            for request in self.queue.abort_queued(kind):
                self._end(request, RequestStatus.FINISHED_ABORTED, reason)
            return self.queue.abort_in_flight(kind)

    def fail_in_flight(self, reason: str) -> list[LanguageRequest]:
        """An engine fault: ends every in-flight request with an error and returns them (for
        `Engine.abort`); queued ones wait for the next frame."""
        with self._lock:
            failed = self.queue.fail_in_flight()
            for request in failed:
                self._end(request, RequestStatus.FINISHED_ERROR, reason)
            return failed

    def abort_all(self, reason: str) -> int:
        """Shutdown: ends every queued and in-flight request (aborted). Returns how many."""
        with self._lock:
            drained = self.queue.drain()
            for request in drained:
                self._end(request, RequestStatus.FINISHED_ABORTED, reason)
            return len(drained)

    def _end(self, request: LanguageRequest, status: RequestStatus, error: str) -> None:
        """The node's final message of `request` (lock held, already out of the queue)."""
        started = self._admitted.pop(request.request_id, (None, ""))[0]
        count, text = self._streamed.pop(request.request_id, (0, ""))
        output = RequestOutput(
            request.request_id, request.kind, (), "", count, status, text, error
        )
        self._send(output, self._clock(), started)
