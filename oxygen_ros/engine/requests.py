"""`Request`: one language request's token state and lifecycle.

A request is created WAITING, becomes RUNNING when the scheduler admits it into a cache slot,
and ends in exactly one finished state (`RequestStatus` is ordered, so `status.finished` is one
comparison). It owns its tokens: the prompt tail decoded after the frame prefix, and the
generated ids.

Invariants:
- Transitions only go WAITING -> RUNNING -> FINISHED_*, WAITING -> FINISHED_ABORTED / REFUSED,
  or RUNNING -> FINISHED_ABORTED / FINISHED_ERROR; a finished request never changes again.
- `output_token_ids` never contains an end-of-sequence id and never grows after the request
  finished: nothing after EOS is emitted, and EOS itself is not part of the stream.
- `len(output_token_ids) <= max_tokens`; reaching `max_tokens` finishes with FINISHED_LENGTH
  unless the last token was EOS (then FINISHED_STOPPED, and the EOS is not counted).
- `take_new_token_ids` hands out every output id exactly once, in order.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

from oxygen_ros.engine.types import LanguageRequest, RequestKind, RequestStatus

_ALLOWED_TRANSITIONS: dict[RequestStatus, frozenset[RequestStatus]] = {
    RequestStatus.WAITING: frozenset(
        {RequestStatus.RUNNING, RequestStatus.FINISHED_ABORTED, RequestStatus.REFUSED}
    ),
    RequestStatus.RUNNING: frozenset(
        {
            RequestStatus.FINISHED_STOPPED,
            RequestStatus.FINISHED_LENGTH,
            RequestStatus.FINISHED_ABORTED,
            RequestStatus.FINISHED_ERROR,
        }
    ),
}


@dataclasses.dataclass(eq=False)
class Request:
    """A language request decoded from a shared frame prefix.

    Construct it WAITING (the default) and let the scheduler drive it; the mutating methods
    check the transition they make.
    """

    request_id: str  # unique among live requests
    kind: RequestKind
    prompt_token_ids: tuple[int, ...]  # tail ids decoded after the frame prefix (no BOS)
    max_tokens: int  # most ids this request may generate, EOS excluded
    priority: int  # lower runs first (admitted first when space is short)
    arrival_time: float  # seconds, when the caller submitted it (latency is measured from here)
    eos_token_ids: frozenset[int] = frozenset()  # ids that stop it; never emitted
    temperature: float = 0.0  # 0: greedy
    seed: int = 0  # sampling seed; token i uses fold_in(key(seed), i)
    status: RequestStatus = RequestStatus.WAITING
    output_token_ids: list[int] = dataclasses.field(default_factory=list)  # generated, no EOS
    error: str | None = None  # why it was refused or failed
    admitted_time: float | None = None  # seconds, when it got a cache slot
    first_token_time: float | None = None  # seconds, first generated id (EOS counts)
    last_token_time: float | None = None  # seconds, last generated id (EOS counts)
    finish_time: float | None = None  # seconds, when it reached a finished status
    num_taken_tokens: int = 0  # output ids already handed out by `take_new_token_ids`

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"request {self.request_id}: max_tokens must be >= 1")
        if not self.prompt_token_ids:
            raise ValueError(f"request {self.request_id}: prompt_token_ids must not be empty")
        self.prompt_token_ids = tuple(self.prompt_token_ids)
        self.eos_token_ids = frozenset(self.eos_token_ids)

    @classmethod
    def from_language_request(
        cls,
        spec: LanguageRequest,
        *,
        request_id: str,
        prompt_token_ids: Sequence[int],
        default_max_tokens: int,
        default_priority: int,
        eos_token_ids: Iterable[int],
        arrival_time: float,
    ) -> Request:
        """Builds a WAITING request from the caller's spec and the kind's defaults."""
        return cls(
            request_id=request_id,
            kind=spec.kind,
            prompt_token_ids=tuple(prompt_token_ids),
            max_tokens=default_max_tokens if spec.max_tokens is None else spec.max_tokens,
            priority=default_priority if spec.priority is None else spec.priority,
            arrival_time=arrival_time,
            eos_token_ids=frozenset(eos_token_ids),
            temperature=spec.temperature,
            seed=spec.seed,
        )

    @property
    def finished(self) -> bool:
        return self.status >= RequestStatus.FINISHED_STOPPED

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_remaining_tokens(self) -> int:
        """Ids it may still generate (0 once finished)."""
        return 0 if self.finished else self.max_tokens - self.num_output_tokens

    @property
    def seq_len(self) -> int:
        """Cache positions it needs at most: tail + max_tokens - 1 (the last id is never fed)."""
        return self.num_prompt_tokens + self.max_tokens - 1

    def start(self, now: float) -> None:
        """WAITING -> RUNNING: admitted into a cache slot."""
        self._move_to(RequestStatus.RUNNING, now)
        self.admitted_time = now

    def append_token(self, token_id: int, now: float) -> bool:
        """Records one generated id and applies the stop conditions.

        Args:
            token_id: the id sampled for this request.
            now: seconds, when it was sampled.

        Returns:
            Whether the request is still running afterwards.

        Raises:
            ValueError: the request is not running (ids after a stop are a runner bug).
        """
        if self.status != RequestStatus.RUNNING:
            raise ValueError(f"request {self.request_id} is {self.status.name}, not RUNNING")
        if self.first_token_time is None:
            self.first_token_time = now
        self.last_token_time = now
        if token_id in self.eos_token_ids:
            self._move_to(RequestStatus.FINISHED_STOPPED, now)
            return False
        self.output_token_ids.append(int(token_id))
        if self.num_output_tokens >= self.max_tokens:
            self._move_to(RequestStatus.FINISHED_LENGTH, now)
            return False
        return True

    def append_token_ids(self, token_ids: Iterable[int], now: float) -> int:
        """Appends ids in order until the request finishes.

        Returns:
            How many of `token_ids` were consumed; ids after the stopping one are dropped.
        """
        num_consumed = 0
        for token_id in token_ids:
            num_consumed += 1
            if not self.append_token(token_id, now):
                break
        return num_consumed

    def abort(self, now: float) -> None:
        """Cancels a waiting or running request."""
        self._move_to(RequestStatus.FINISHED_ABORTED, now)

    def refuse(self, reason: str, now: float) -> None:
        """Marks a waiting request as never admitted."""
        self._move_to(RequestStatus.REFUSED, now)
        self.error = reason

    def fail(self, error: str, now: float) -> None:
        """Marks a running request as failed inside the engine."""
        self._move_to(RequestStatus.FINISHED_ERROR, now)
        self.error = error

    def take_new_token_ids(self) -> tuple[int, tuple[int, ...]]:
        """Drains the output ids not handed out yet.

        Returns:
            (index of the first new id in the output stream, the new ids).
        """
        first_index = self.num_taken_tokens
        new_ids = tuple(self.output_token_ids[first_index:])
        self.num_taken_tokens = self.num_output_tokens
        return first_index, new_ids

    def _move_to(self, status: RequestStatus, now: float) -> None:
        if status not in _ALLOWED_TRANSITIONS.get(self.status, frozenset()):
            raise ValueError(
                f"request {self.request_id}: cannot go from {self.status.name} to {status.name}"
            )
        self.status = status
        if status.finished:
            self.finish_time = now
