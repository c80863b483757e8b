"""The engine's language path: requests in, language work in a frame, outputs out.

`LanguagePath` is the part of `Engine` (engine.py) that serves language requests:
- requests: `add_request` (queued WAITING, or refused with a reason), `abort`,
  `request_status`, `queue_position`;
- a frame's language work on the frame's prefix: admission (prefix store, tail extend, first
  ids) and the schedule's decode steps (`_run_schedule`), waves run to completion for the
  isolated and shared_kv modes (`_run_to_completion`), the deadline policy's early stop
  (`_deadline_guard`);
- outputs: per request the new ids and text deltas of the frame, final ones flushed, refused
  ones included (`_emit`), and the final status of recently reported requests.
It reads the engine's configuration, tokenizer, cache, scheduler, runner and counters (built
by `Engine.__init__`); `Engine._frame` calls it after the actions are handed off.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from oxygen_ros.engine.detokenizer import IncrementalDetokenizer
from oxygen_ros.engine.model_fns import Prefix, PrefixInputs
from oxygen_ros.engine.requests import Request
from oxygen_ros.engine.scheduler import FrameSchedule, RefuseReason
from oxygen_ros.engine.types import (
    AddResult,
    LanguageRequest,
    RequestOutput,
    RequestStatus,
)

_FINAL_STATUS_MEMORY = 1024  # finished ids whose status `request_status` still answers


@dataclasses.dataclass
class LiveRequest:
    """Engine-side state of a request not yet reported finished."""

    request: Request
    detokenizer: IncrementalDetokenizer
    order: int  # submission order; outputs of one frame are sorted by it


@dataclasses.dataclass
class FramePhases:
    """Seconds and decode-step measurements accumulated during one frame."""

    prefill_s: float = 0.0
    denoise_s: float = 0.0
    extend_s: float = 0.0
    decode_s: float = 0.0
    extend_measured: bool = False
    decode_steps: list[tuple[int, float]] = dataclasses.field(default_factory=list)


class LanguagePath:
    """Language requests and the language work of a frame, mixed into `Engine`: its methods
    read the engine's attributes (`Engine.__init__`) and call its `_prefill`."""

    def add_request(self, request: LanguageRequest, now: float | None = None) -> AddResult:
        """Queues a language request (WAITING) or refuses it with a reason.

        Refused when the bounded queue is full (a better-priority newcomer displaces the
        worst waiting request instead, which is then refused), when its tail plus max_tokens
        can never fit a cache slot, when max_tokens < 1, or when a live request has its id.
        Its final `RequestOutput` (REFUSED) comes with the next `step`.

        Args:
            request: the request; `request_id` None gets "<kind>-<n>".
            now: seconds on `time.perf_counter`'s clock (arrival time); None: now.
        """
        now = time.perf_counter() if now is None else now
        request_id = request.request_id or f"{request.kind.value}-{self._next_request}"
        self._next_request += 1
        order = self._next_order
        self._next_order += 1
        task = self.config.prompt.task(request.kind)
        max_tokens = task.max_tokens if request.max_tokens is None else request.max_tokens
        if max_tokens < 1:
            return self._refuse_early(
                request, request_id, order, f"max_tokens must be >= 1, got {max_tokens}"
            )
        if request_id in self._live:
            return self._refuse_early(request, request_id, order, RefuseReason.DUPLICATE_ID.value)
        state = Request.from_language_request(
            request,
            request_id=request_id,
            prompt_token_ids=self._tails[request.kind],
            default_max_tokens=task.max_tokens,
            default_priority=task.priority,
            eos_token_ids=() if request.ignore_eos else (self.tokenizer.eos_id,),
            arrival_time=now,
        )
        reason = self.scheduler.add_request(state, now)
        if reason is RefuseReason.TOO_LONG:
            state.error = (
                f"{reason.value}: tail + max_tokens - 1 = {state.seq_len} exceeds cache "
                f"max_seq_len={self.cache.max_seq_len}"
            )
        detokenizer = IncrementalDetokenizer(self.tokenizer.processor, anchor_id=self._anchor_id)
        self._live[request_id] = LiveRequest(state, detokenizer, order)
        return AddResult(request_id, reason is None, state.status, state.error or "")

    def abort(self, request_id: str) -> bool:
        """Cancels a waiting or running request; a running one frees its slot at once.

        Its final output (FINISHED_ABORTED, with the text emitted so far) comes with the next
        `step`. Returns whether a waiting or running request had this id.
        """
        return self.scheduler.abort(request_id, time.perf_counter())

    def request_status(self, request_id: str) -> RequestStatus | None:
        """Status of a live request, or the final status of a recently reported one."""
        live = self._live.get(request_id)
        if live is not None:
            return live.request.status
        return self._final_status.get(request_id)

    def queue_position(self, request_id: str) -> int | None:
        """0-based rank of a WAITING request (0 is admitted next); None if not waiting."""
        return self.scheduler.queue_position(request_id)

    def _run_to_completion(
        self, mode: str, inputs: PrefixInputs, prefix: Prefix, phases: FramePhases
    ) -> None:
        """isolated / shared_kv: waves until nothing waits; every wave runs to completion."""
        max_admit = 1 if mode == "isolated" else None
        while True:
            schedule = self.scheduler.schedule(
                time.perf_counter(), policy="to_completion", max_admit=max_admit
            )
            if not schedule.admit_ids and not schedule.running_ids:
                break
            wave_prefix = prefix
            if schedule.admit_ids and mode == "isolated":
                prefill_start = time.perf_counter()
                wave_prefix = self._prefill(inputs)
                phases.prefill_s += time.perf_counter() - prefill_start
            self._run_schedule(schedule, wave_prefix, phases, deadline_start=None)
            if self.scheduler.num_waiting == 0:
                break

    def _run_schedule(
        self,
        schedule: FrameSchedule,
        prefix: Prefix,
        phases: FramePhases,
        *,
        deadline_start: float | None,
    ) -> None:
        """Admission (prefix store, extend, first ids) then the schedule's decode steps."""
        scheduler, counters = self.scheduler, self._counters
        if schedule.admit_ids:
            assert schedule.prefix_id is not None
            extend_start = time.perf_counter()
            admitted = [
                (slot, scheduler.get_request(request_id))
                for request_id, slot in zip(schedule.admit_ids, schedule.admit_slots, strict=True)
            ]
            first_ids = self.runner.admit(prefix, schedule.prefix_id, admitted)  # type: ignore[arg-type]
            now = time.perf_counter()
            for request_id, token in zip(schedule.admit_ids, first_ids, strict=True):
                scheduler.record_tokens(request_id, [token], now)
            counters.num_extends += self.runner.num_extends(len(admitted))
            counters.num_generated_tokens += len(first_ids)
            phases.extend_s += now - extend_start
            phases.extend_measured = True
        guard = self._deadline_guard(deadline_start)
        for step in range(schedule.num_decode_steps):
            running = {
                self.cache.slot_of(request.request_id): request
                for request in scheduler.running_requests
            }
            if not running:
                break
            if guard is not None and guard(step, len(running)):
                break
            step_start = time.perf_counter()
            sampled = self.runner.decode_step(running)  # type: ignore[arg-type]
            now = time.perf_counter()
            for slot, token in sampled.items():
                scheduler.record_tokens(running[slot].request_id, [token], now)
            counters.num_decode_steps += 1
            counters.num_generated_tokens += len(sampled)
            phases.decode_steps.append((len(running), now - step_start))
            phases.decode_s += time.perf_counter() - step_start

    def _deadline_guard(self, start: float | None) -> Callable[[int, int], bool] | None:
        """`deadline` policy: stops decoding early when the clock says the next step would
        overrun the budget (after the floor of steps); None for other policies."""
        config = self.config.scheduler
        if start is None or config.policy != "deadline":
            return None
        budget = start + config.frame_budget_s * (1.0 - config.safety_margin)
        costs = self.scheduler.costs

        def stop(step: int, batch_size: int) -> bool:
            if step < config.min_decode_steps_per_frame:
                return False
            step_s = costs.decode_step_s(batch_size) or 0.0
            other_s = costs.other.value() or 0.0
            return time.perf_counter() + step_s + other_s > budget

        return stop

    def _refuse_early(
        self, request: LanguageRequest, request_id: str, order: int, reason: str
    ) -> AddResult:
        output = RequestOutput(
            request_id, request.kind, (), "", 0, RequestStatus.REFUSED, None, reason
        )
        self._refused_early.append((order, output))
        self._num_refused_early += 1
        self._remember(request_id, RequestStatus.REFUSED)
        return AddResult(request_id, False, RequestStatus.REFUSED, reason)

    def _emit(self) -> tuple[RequestOutput, ...]:
        """This frame's outputs: new ids and text deltas per request, final ones flushed."""
        touched: list[LiveRequest] = []
        for request in self.scheduler.take_finished():
            live = self._live.get(request.request_id)
            if live is not None and live.request is request:
                touched.append(live)
        touched += [self._live[r.request_id] for r in self.scheduler.running_requests]
        outputs = list(self._refused_early)
        self._refused_early = []
        for live in touched:
            request = live.request
            first_index, new_ids = request.take_new_token_ids()
            finished = request.finished
            if not new_ids and not finished:
                continue
            delta = live.detokenizer.feed(new_ids) if new_ids else ""
            text = None
            if finished:
                delta += live.detokenizer.flush()
                if request.status is not RequestStatus.REFUSED:
                    text = live.detokenizer.text
                del self._live[request.request_id]
                self._remember(request.request_id, request.status)
            output = RequestOutput(
                request.request_id,
                request.kind,
                new_ids,
                delta,
                first_index,
                request.status,
                text,
                request.error,
            )
            outputs.append((live.order, output))
        outputs.sort(key=lambda pair: pair[0])
        return tuple(output for _, output in outputs)

    def _remember(self, request_id: str, status: RequestStatus) -> None:
        self._final_status[request_id] = status
        self._final_status.move_to_end(request_id)
        while len(self._final_status) > _FINAL_STATUS_MEMORY:
            self._final_status.popitem(last=False)
