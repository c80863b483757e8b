"""`FrameScheduler`: decides, once per control frame, who starts decoding and for how long.

Each frame the runner prefills the observation once and denoises the action chunk; language
requests decode from stored prefixes in a fixed-capacity cache. Per frame the scheduler:
1. admits waiting requests into cache slots (lowest `priority` value first, FIFO among equal
   priorities), all sharing one prefix row that the runner fills with this frame's prefix;
2. picks the number of batched decode steps: `to_completion` (every active request finishes
   this frame), `fixed` (OxyGen's k per frame) or `deadline` (as many as fit the frame budget,
   predicted from measured costs).

Invariants:
- The waiting queue never holds more than `max_waiting` requests; a request that cannot be
  queued is REFUSED with a reason, and a request that can never fit the cache is refused when
  it arrives.
- Every RUNNING request holds exactly one cache slot; a request leaves its slot the moment it
  finishes or is aborted (the cache releases the prefix row with its last slot).
- Admission is strictly by (priority, arrival order): a request is never admitted while a
  better-ranked one waits (all requests need the same one slot, so no skipping is needed).
- `num_decode_steps` never exceeds what the longest-remaining active request still needs.
- Every finished request (stopped, length, aborted, error, refused) is returned exactly once
  by `take_finished`.
- Pure Python over the cache's bookkeeping: no device work, no clock reads (callers pass
  `now`), not thread-safe.
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import enum
import math
import statistics
from collections.abc import Iterable

from oxygen_ros.engine.config import SchedulerConfig
from oxygen_ros.engine.kv_cache import Fit, LanguageKVCache
from oxygen_ros.engine.requests import Request
from oxygen_ros.engine.types import RequestStatus


class RefuseReason(enum.Enum):
    """Why `add_request` did not queue a request (also its `error` text)."""

    QUEUE_FULL = "waiting queue is full"
    DISPLACED = "displaced from the full waiting queue by a higher-priority request"
    TOO_LONG = "tail plus max_tokens exceed the cache slot length"
    DUPLICATE_ID = "a live request already has this id"


@dataclasses.dataclass(frozen=True)
class FrameSchedule:
    """What the runner does this frame (besides prefill and denoise, which always run)."""

    frame_index: int  # 0-based count of schedules made
    prefix_id: int | None  # reserved prefix row for this frame's prefix; None: no admissions
    admit_ids: tuple[str, ...]  # requests started this frame, in admission order
    admit_slots: tuple[int, ...]  # their cache slots, same order
    running_ids: tuple[str, ...]  # requests already decoding before this frame
    num_decode_steps: int  # batched decode steps after the admitted tails are extended
    decode_batch_size: int  # active requests when decoding starts (running + admitted)
    budget_s: float | None  # `deadline`: frame time planned for (margin applied), else None
    predicted_s: float | None  # `deadline`: predicted frame time, None while costs are unknown
    num_waiting: int  # requests still queued after admission


@dataclasses.dataclass(frozen=True)
class FrameCosts:
    """Seconds the runner measured in one frame (device work waited for)."""

    prefill_s: float  # shared prefix prefill
    denoise_s: float  # action denoising
    extend_s: float | None = None  # tail extend of admitted requests; None: none admitted
    decode_step_s: tuple[tuple[int, float], ...] = ()  # (active rows, seconds) per decode step
    other_s: float = 0.0  # the rest of the frame: host work, transfers, detokenization


@dataclasses.dataclass(frozen=True)
class SchedulerStats:
    """Counters and gauges for the stats topic."""

    num_waiting: int  # queued now
    num_running: int  # holding a slot now
    max_waiting: int  # queue bound
    num_admitted: int  # cumulative
    num_refused: int  # cumulative, refused on arrival or displaced
    num_aborted: int  # cumulative
    num_finished: int  # cumulative, any finished state except refused


class RunningMedian:
    """Median of the last `window` samples (robust to compile or GC outliers)."""

    def __init__(self, window: int) -> None:
        self._samples: collections.deque[float] = collections.deque(maxlen=window)

    def add(self, value: float) -> None:
        self._samples.append(value)

    @property
    def num_samples(self) -> int:
        return len(self._samples)

    def value(self) -> float | None:
        return statistics.median(self._samples) if self._samples else None


class CostModel:
    """Online per-component cost estimates from measured frames."""

    def __init__(self, window: int) -> None:
        self._window = window
        self.prefill = RunningMedian(window)
        self.denoise = RunningMedian(window)
        self.extend = RunningMedian(window)
        self.other = RunningMedian(window)
        self._decode_step: dict[int, RunningMedian] = {}

    def observe(self, costs: FrameCosts) -> None:
        self.prefill.add(costs.prefill_s)
        self.denoise.add(costs.denoise_s)
        self.other.add(costs.other_s)
        if costs.extend_s is not None:
            self.extend.add(costs.extend_s)
        for batch_size, seconds in costs.decode_step_s:
            if batch_size < 1:
                raise ValueError("a decode step has at least one active row")
            median = self._decode_step.setdefault(batch_size, RunningMedian(self._window))
            median.add(seconds)

    def decode_step_s(self, batch_size: int) -> float | None:
        """Estimated seconds of one decode step with `batch_size` active rows.

        Uses the smallest measured batch size >= `batch_size` (cost does not fall with more
        rows); otherwise extrapolates the largest measured one linearly; None if none.
        """
        measured = sorted(self._decode_step)
        if not measured:
            return None
        at_or_above = [size for size in measured if size >= batch_size]
        if at_or_above:
            return self._decode_step[at_or_above[0]].value()
        largest = measured[-1]
        estimate = self._decode_step[largest].value()
        assert estimate is not None
        return estimate * batch_size / largest


class FrameScheduler:
    """Admission, cancellation and per-frame decode steps over one `LanguageKVCache`."""

    def __init__(self, config: SchedulerConfig, cache: LanguageKVCache) -> None:
        self.config = config
        self.cache = cache
        self.costs = CostModel(config.cost_window)
        self._waiting: list[tuple[int, int, Request]] = []  # sorted by (priority, arrival seq)
        self._running: dict[str, Request] = {}  # admission order
        self._finished: list[Request] = []  # not yet taken
        self._arrival_seq = 0
        self._frame_index = 0
        self._num_admitted = 0
        self._num_refused = 0
        self._num_aborted = 0
        self._num_finished = 0

    # ----------------------------------------------------------------------------------------
    # Arrivals, cancellation, status.

    def add_request(self, request: Request, now: float) -> RefuseReason | None:
        """Queues a WAITING request.

        When the queue is full, a request that ranks strictly better than the worst waiting
        one displaces it (that one is refused); otherwise the newcomer is refused.

        Returns:
            None when queued, else why the newcomer was refused (it is then REFUSED and
            reported by `take_finished`).
        """
        if request.status != RequestStatus.WAITING:
            raise ValueError(f"request {request.request_id} is {request.status.name}")
        if self._is_live(request.request_id):
            return self._refuse(request, RefuseReason.DUPLICATE_ID, now)
        if (
            self.cache.can_admit(1, needs_new_prefix=False, seq_len=request.seq_len)
            is Fit.TOO_LONG
        ):
            return self._refuse(request, RefuseReason.TOO_LONG, now)
        if len(self._waiting) >= self.config.max_waiting:
            if not self._waiting or self._waiting[-1][0] <= request.priority:
                return self._refuse(request, RefuseReason.QUEUE_FULL, now)
            _, _, displaced = self._waiting.pop()
            self._refuse(displaced, RefuseReason.DISPLACED, now)
        bisect.insort(self._waiting, (request.priority, self._arrival_seq, request))
        self._arrival_seq += 1
        return None

    def abort(self, request_id: str, now: float) -> bool:
        """Cancels a waiting or running request; a running one frees its slot at once.

        Returns:
            Whether a live request with this id existed.
        """
        for index, (_, _, request) in enumerate(self._waiting):
            if request.request_id == request_id:
                del self._waiting[index]
                request.abort(now)
                self._num_aborted += 1
                self._finished.append(request)
                return True
        request = self._running.get(request_id)
        if request is None:
            return False
        request.abort(now)
        self._num_aborted += 1
        self._retire(request)
        return True

    def fail(self, request_id: str, error: str, now: float) -> None:
        """Marks a running request FINISHED_ERROR and frees its slot."""
        request = self._running[request_id]
        request.fail(error, now)
        self._retire(request)

    def status_of(self, request_id: str) -> RequestStatus | None:
        """Status of a request not yet taken by `take_finished`; None if unknown."""
        request = self.get_request(request_id)
        return None if request is None else request.status

    def queue_position(self, request_id: str) -> int | None:
        """0-based rank among waiting requests (0 is admitted next); None if not waiting."""
        for index, (_, _, request) in enumerate(self._waiting):
            if request.request_id == request_id:
                return index
        return None

    def get_request(self, request_id: str) -> Request | None:
        if request_id in self._running:
            return self._running[request_id]
        for _, _, request in self._waiting:
            if request.request_id == request_id:
                return request
        for request in self._finished:
            if request.request_id == request_id:
                return request
        return None

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def running_ids(self) -> tuple[str, ...]:
        return tuple(self._running)

    @property
    def running_requests(self) -> tuple[Request, ...]:
        """RUNNING requests, in admission order."""
        return tuple(self._running.values())

    @property
    def waiting_ids(self) -> tuple[str, ...]:
        """In admission order."""
        return tuple(request.request_id for _, _, request in self._waiting)

    def stats(self) -> SchedulerStats:
        return SchedulerStats(
            num_waiting=self.num_waiting,
            num_running=self.num_running,
            max_waiting=self.config.max_waiting,
            num_admitted=self._num_admitted,
            num_refused=self._num_refused,
            num_aborted=self._num_aborted,
            num_finished=self._num_finished,
        )

    # ----------------------------------------------------------------------------------------
    # The frame.

    def schedule(
        self, now: float, *, policy: str | None = None, max_admit: int | None = None
    ) -> FrameSchedule:
        """Admits waiting requests and plans this frame's decode steps.

        Admitted requests become RUNNING with a slot on a freshly reserved prefix row; the
        runner must write this frame's prefix into `prefix_id` and extend their tails.

        Args:
            now: seconds (admission time of the admitted requests).
            policy: overrides `config.policy` for this call (the engine's isolated and
                shared_kv frames use "to_completion").
            max_admit: overrides `config.max_admit_per_frame` for this call (isolated: 1).
        """
        running = list(self._running.values())
        admitted = self._admit(
            now, self.config.max_admit_per_frame if max_admit is None else max_admit
        )
        prefix_id = None
        admit_slots: list[int] = []
        if admitted:
            prefix_id = self.cache.reserve_prefix()
            for request in admitted:
                admit_slots.append(self.cache.allocate_slot(prefix_id, request.request_id))
        # The extend samples each admitted request's first id, so it needs one step fewer.
        num_needed = max(
            [request.num_remaining_tokens for request in running]
            + [request.num_remaining_tokens - 1 for request in admitted]
            + [0]
        )
        decode_batch_size = len(running) + len(admitted)
        budget_s, predicted_s = None, None
        policy = self.config.policy if policy is None else policy
        if policy == "to_completion":
            num_steps = num_needed
        elif policy == "fixed":
            num_steps = min(self.config.decode_steps_per_frame, num_needed)
        elif policy == "deadline":
            budget_s = self.config.frame_budget_s * (1.0 - self.config.safety_margin)
            num_steps = min(
                self._deadline_steps(budget_s, decode_batch_size, bool(admitted)), num_needed
            )
            predicted_s = self._predict_s(num_steps, decode_batch_size, bool(admitted))
        else:
            raise ValueError(f"unknown scheduler policy {policy!r}")
        schedule = FrameSchedule(
            frame_index=self._frame_index,
            prefix_id=prefix_id,
            admit_ids=tuple(request.request_id for request in admitted),
            admit_slots=tuple(admit_slots),
            running_ids=tuple(request.request_id for request in running),
            num_decode_steps=num_steps,
            decode_batch_size=decode_batch_size,
            budget_s=budget_s,
            predicted_s=predicted_s,
            num_waiting=self.num_waiting,
        )
        self._frame_index += 1
        return schedule

    def record_tokens(self, request_id: str, token_ids: Iterable[int], now: float) -> int:
        """Feeds sampled ids to a running request; frees its slot the moment it finishes.

        Returns:
            How many ids were consumed (ids after the stopping one are dropped).
        """
        request = self._running[request_id]
        num_consumed = request.append_token_ids(token_ids, now)
        if request.finished:
            self._retire(request)
        return num_consumed

    def observe_costs(self, costs: FrameCosts) -> None:
        """Updates the cost model with one frame's measured timings."""
        self.costs.observe(costs)

    def take_finished(self) -> list[Request]:
        """Drains the requests that finished (or were refused) since the last call."""
        finished, self._finished = self._finished, []
        return finished

    # ----------------------------------------------------------------------------------------

    def _admit(self, now: float, limit: int | None) -> list[Request]:
        num_admit = 0
        for _, _, request in self._waiting:
            if limit is not None and num_admit >= limit:
                break
            fit = self.cache.can_admit(
                num_admit + 1, needs_new_prefix=True, seq_len=request.seq_len
            )
            if fit is not Fit.OK:
                break
            num_admit += 1
        admitted = [request for _, _, request in self._waiting[:num_admit]]
        del self._waiting[:num_admit]
        for request in admitted:
            request.start(now)
            self._running[request.request_id] = request
        self._num_admitted += num_admit
        return admitted

    def _fixed_cost_s(self, has_admissions: bool) -> float | None:
        parts = [self.costs.prefill.value(), self.costs.denoise.value(), self.costs.other.value()]
        if has_admissions:
            parts.append(self.costs.extend.value())
        if any(part is None for part in parts):
            return None
        return math.fsum(part for part in parts if part is not None)

    def _predict_s(self, num_steps: int, batch_size: int, has_admissions: bool) -> float | None:
        fixed_s = self._fixed_cost_s(has_admissions)
        if fixed_s is None:
            return None
        if num_steps == 0:
            return fixed_s
        step_s = self.costs.decode_step_s(batch_size)
        return None if step_s is None else fixed_s + num_steps * step_s

    def _deadline_steps(self, budget_s: float, batch_size: int, has_admissions: bool) -> int:
        """Most decode steps whose predicted frame time fits `budget_s`, within the bounds.

        While a cost is still unmeasured the frame runs the floor, but at least one step so
        that the step cost gets measured.
        """
        config = self.config
        fixed_s = self._fixed_cost_s(has_admissions)
        step_s = self.costs.decode_step_s(max(batch_size, 1))
        if fixed_s is None or step_s is None:
            return max(config.min_decode_steps_per_frame, 1)
        if step_s <= 0:
            return config.max_decode_steps_per_frame
        # The epsilon keeps exact fits (e.g. 0.04 / 0.01) from rounding down a step.
        num_steps = math.floor((budget_s - fixed_s) / step_s + 1e-9)
        return min(
            max(num_steps, config.min_decode_steps_per_frame),
            config.max_decode_steps_per_frame,
        )

    def _retire(self, request: Request) -> None:
        del self._running[request.request_id]
        slot = self.cache.slot_of(request.request_id)
        if slot is not None:
            self.cache.free_slot(slot)
        if request.status != RequestStatus.FINISHED_ABORTED:
            self._num_finished += 1
        self._finished.append(request)

    def _refuse(self, request: Request, reason: RefuseReason, now: float) -> RefuseReason:
        request.refuse(reason.value, now)
        self._num_refused += 1
        self._finished.append(request)
        return reason

    def _is_live(self, request_id: str) -> bool:
        return request_id in self._running or self.queue_position(request_id) is not None
