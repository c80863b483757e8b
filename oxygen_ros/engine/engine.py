"""`Engine`: pi0.5 as a multi-task robot brain, one API for three execution modes.

Every frame (`Engine.step(observation, requests)`) prefills the observation, denoises the
action chunk from that prefix and serves language requests from the same kind of prefix;
`config.scheduler.mode` picks how:
- `isolated`: a separate prefix prefill per language request (openpi's way), each decoded to
  completion inside the frame;
- `shared_kv`: ONE prefill; every request is extended from it and decoded to completion
  inside the frame (OxyGen's unified KV cache);
- `continuous`: ONE prefill; waiting requests are admitted into cache slots (sharing one
  stored copy of this frame's prefix), then `k` batched decode steps (`fixed` policy) or as
  many as fit the frame budget (`deadline`) advance every active request, whichever frame
  it started in. Requests outlive frames; outputs stream per frame as token deltas.
All modes run on the same fixed-capacity `LanguageKVCache` through the `Runner`, so the
decode step and the tail extend compile once for 1..num_slots active requests.

Requests enter with `add_request` (bounded queue; refused with a reason when full) or as
`step`'s `requests` argument (added at the start of that frame); `abort` frees a slot at
once. `run_isolated` runs one isolated frame whatever the mode (the baseline).

Invariants:
- Exactly one prefix prefill per `step` in shared_kv/continuous mode, 1 + (admitted
  requests) in isolated mode; `stats().num_prefills` counts them.
- Actions never depend on language work (the action expert reads only the prefix), so every
  mode gives the isolated path's actions for the same observation and noise.
- Actions never wait for language work: `step(..., on_actions=f)` hands the chunk to `f` as
  soon as it is denoised, before the frame's tail extends, decode steps and detokenisation;
  `ActionResult.latency_s` is the observation stamp -> hand-off time on the engine's clock.
- A request's greedy tokens equal decoding it alone from the prefix of the frame it was
  admitted in: rows never interact and token i is sampled with index i.
- A request finishes in the frame it samples EOS or its last allowed id; EOS is never
  emitted, nothing after it is; per request the concatenation of `text_delta`s equals the
  final `text`, and `first_index` is the stream index of `new_token_ids[0]`.
- Every added request gets exactly one finished `RequestOutput` (stopped, length, aborted,
  error or refused), in the frame it finished or the next `step` after it was aborted or
  refused outside a frame.
- Without a checkpoint the model is randomly initialised and a warning says outputs are
  meaningless.
- Not thread-safe: one thread calls `add_request`, `abort`, `step` and `stats`.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import logging
import time
from collections.abc import Callable, Mapping, Sequence

import numpy as np
from openpi.shared import image_tools

from oxygen_ros.engine import compiles, prompts
from oxygen_ros.engine.checkpoint import Normalizer, NormStats, load_norm_stats, load_params
from oxygen_ros.engine.checkpoint_assets import load_delta_action_mask
from oxygen_ros.engine.chunk_guide import ChunkGuide
from oxygen_ros.engine.config import PALIGEMMA_VOCAB_SIZE, EngineConfig
from oxygen_ros.engine.detokenizer import IncrementalDetokenizer, find_anchor_id
from oxygen_ros.engine.kv_cache import KVCacheLayout, LanguageKVCache
from oxygen_ros.engine.model import Pi05Model, create_model, gemma_config
from oxygen_ros.engine.model_fns import JitModel, Prefix, PrefixInputs, valid_slots_of
from oxygen_ros.engine.requests import Request
from oxygen_ros.engine.runner import Runner
from oxygen_ros.engine.scheduler import (
    FrameCosts,
    FrameSchedule,
    FrameScheduler,
    RefuseReason,
)
from oxygen_ros.engine.tokenizer import Tokenizer, load_tokenizer
from oxygen_ros.engine.types import (
    ActionResult,
    AddResult,
    EngineStats,
    FrameResult,
    FrameTimings,
    LanguageRequest,
    Observation,
    RequestKind,
    RequestOutput,
    RequestStatus,
)

logger = logging.getLogger("oxygen_ros.engine")


@dataclasses.dataclass
class Counters:
    """Mutable counterparts of `EngineStats`, updated by the runner functions."""

    num_frames: int = 0
    num_prefills: int = 0
    num_extends: int = 0
    num_decode_steps: int = 0
    num_generated_tokens: int = 0


def observation_to_inputs(
    observation: Observation,
    image_keys: Sequence[str],
    resolution: tuple[int, int],
    tokenizer: Tokenizer,
    normalizer: Normalizer,
    max_token_len: int,
) -> PrefixInputs:
    """Robot observation -> batch-1 model inputs (openpi's pi0.5 input transforms).

    Images are resized with pad (openpi `resize_with_pad`) if needed, then mapped from uint8
    to [-1, 1]; a missing slot is a black image with mask False. The state is normalised and
    written into the prompt (pi0.5 discrete state).
    """
    images, masks = {}, {}
    for key in image_keys:
        image = observation.images.get(key)
        if image is None:
            image = np.zeros((*resolution, 3), np.uint8)
            valid = False
        else:
            valid = bool(observation.image_masks.get(key, True))
        image = np.asarray(image)
        if image.dtype != np.uint8:
            raise ValueError(f"image {key!r} must be uint8 [h, w, 3], got {image.dtype}")
        if image.shape[:2] != tuple(resolution):
            image = np.asarray(image_tools.resize_with_pad(image, *resolution))
        images[key] = (image.astype(np.float32) / 255.0 * 2.0 - 1.0)[None]
        masks[key] = np.array([valid])
    state = normalizer.normalize_state(np.asarray(observation.state, np.float32))
    tokens, token_mask = prompts.tokenize_action_prompt(
        tokenizer, observation.prompt, state, max_token_len
    )
    return PrefixInputs(images, masks, tokens[None], token_mask[None])


@dataclasses.dataclass
class _Live:
    """Engine-side state of a request not yet reported finished."""

    request: Request
    detokenizer: IncrementalDetokenizer
    order: int  # submission order; outputs of one frame are sorted by it


@dataclasses.dataclass
class _FramePhases:
    """Seconds and decode-step measurements accumulated during one frame."""

    prefill_s: float = 0.0
    denoise_s: float = 0.0
    extend_s: float = 0.0
    decode_s: float = 0.0
    extend_measured: bool = False
    decode_steps: list[tuple[int, float]] = dataclasses.field(default_factory=list)


_MODES = ("isolated", "shared_kv", "continuous")
_FINAL_STATUS_MEMORY = 1024  # finished ids whose status `request_status` still answers


class Engine:
    """pi0.5 frames with language requests: `add_request` / `abort` / `step` / `stats`."""

    def __init__(
        self,
        config: EngineConfig,
        *,
        model: Pi05Model | None = None,
        norm_stats: Mapping[str, NormStats] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """Builds the model (checkpoint or random init) and allocates the language cache.

        Args:
          config: the engine configuration (`config.scheduler.mode` picks the execution).
          model: use this model instead of loading or initialising one (tests, sharing).
          norm_stats: use these instead of the checkpoint's (None: the checkpoint's, if any).
          clock: seconds on the clock of `Observation.stamp` (a ROS node passes its own
            clock); `ActionResult.latency_s` is measured on it.
        """
        compiles.install()
        self._clock = clock
        self._compiles_at_start = compiles.num_compiles()
        self.config = config
        self.tokenizer = load_tokenizer(config)
        if model is None and config.checkpoint_dir is not None:
            model = load_params(config.checkpoint_dir, config.model)
            if norm_stats is None:
                norm_stats = load_norm_stats(config.checkpoint_dir, config.assets_id)
        elif model is None:
            logger.warning(
                "NO CHECKPOINT: %r is randomly initialised (seed %d); actions and text are "
                "meaningless",
                config.model.name,
                config.seed,
            )
            model = create_model(config.model, config.seed)
        if model.config != config.model:
            raise ValueError(f"model config {model.config} differs from {config.model}")
        self.normalizer = Normalizer(norm_stats, config.norm)
        self.delta_action_mask: tuple[bool, ...] = config.delta_action_mask or ()
        if config.delta_action_mask is None and config.checkpoint_dir is not None:
            self.delta_action_mask = load_delta_action_mask(
                config.checkpoint_dir, config.assets_id
            )
        self.model = JitModel(
            model, vocab_size=min(self.tokenizer.vocab_size, PALIGEMMA_VOCAB_SIZE)
        )
        llm = gemma_config(config.model.paligemma_variant)
        layout = KVCacheLayout.from_config(
            config.cache,
            prefix_len=config.model.prefix_len,
            num_layers=llm.depth,
            num_kv_heads=llm.num_kv_heads,
            head_dim=llm.head_dim,
            dtype=config.model.dtype,
        )
        self.cache = LanguageKVCache(layout)
        self.scheduler = FrameScheduler(config.scheduler, self.cache)
        self.runner = Runner(
            self.model,
            self.cache,
            extend_rows=config.extend_rows,
            max_tail_len=config.prompt.max_tail_len,
        )
        self._tails = {kind: self._tail_ids(kind) for kind in RequestKind}
        self._anchor_id = find_anchor_id(self.tokenizer.processor)
        self._counters = Counters()
        self._next_request = 0
        self._next_order = 0
        self._live: dict[str, _Live] = {}
        self._refused_early: list[tuple[int, RequestOutput]] = []  # never reached the queue
        self._final_status: collections.OrderedDict[str, RequestStatus] = collections.OrderedDict()
        self._last_timings: FrameTimings | None = None
        self._num_refused_early = 0
        self._prefill_patterns: set[tuple[str, ...]] = set()  # valid-slot sets compiled
        self._warmed_up = False
        self.chunk_guide = ChunkGuide(
            config.rtc,
            self.normalizer,
            self.delta_action_mask,
            config.model.action_horizon,
            config.model.action_dim,
        )

    def _tail_ids(self, kind: RequestKind) -> tuple[int, ...]:
        """A kind's tail ids; raises if it is empty or longer than max_tail_len."""
        tokens, mask = prompts.tokenize_tail(
            self.tokenizer, self.config.prompt.task(kind).tail, self.config.prompt.max_tail_len
        )
        return tuple(int(token) for token in tokens[mask])

    # ----------------------------------------------------------------------------------------
    # Properties and stats.

    @property
    def action_output_dim(self) -> int:
        if self.config.action_output_dim is not None:
            return self.config.action_output_dim
        return self.normalizer.action_dim or self.config.model.action_dim

    @property
    def mode(self) -> str:
        return self.config.scheduler.mode

    def stats(self) -> EngineStats:
        """Cumulative counters, gauges of now (queue, slots, bytes) and the last frame's times."""
        usage = self.cache.usage()
        scheduler = self.scheduler.stats()
        return EngineStats(
            **dataclasses.asdict(self._counters),
            num_compiles=compiles.num_compiles() - self._compiles_at_start,
            num_waiting=scheduler.num_waiting,
            num_running=scheduler.num_running,
            num_admitted=scheduler.num_admitted,
            num_refused=scheduler.num_refused + self._num_refused_early,
            num_aborted=scheduler.num_aborted,
            num_finished=scheduler.num_finished,
            slots_used=usage.num_allocated_slots,
            slots_total=self.cache.num_slots,
            prefixes_used=usage.num_used_prefixes,
            prefixes_total=self.cache.layout.num_prefixes,
            cache_bytes_used=usage.used_bytes,
            cache_bytes_total=usage.total_bytes,
            last_timings=self._last_timings,
        )

    def make_noise(self, frame_index: int) -> np.ndarray:
        """Deterministic action noise [1, A, J] for a frame (seeded by config.seed), times
        config.action_noise_scale."""
        shape = (1, self.config.model.action_horizon, self.config.model.action_dim)
        rng = np.random.default_rng([self.config.seed, frame_index])
        return self.config.action_noise_scale * rng.standard_normal(shape, dtype=np.float32)

    # ----------------------------------------------------------------------------------------
    # Requests.

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
        self._live[request_id] = _Live(state, detokenizer, order)
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

    # ----------------------------------------------------------------------------------------
    # Frames.

    def step(
        self,
        observation: Observation,
        requests: Sequence[LanguageRequest] = (),
        *,
        noise: np.ndarray | None = None,
        on_actions: Callable[[ActionResult], None] | None = None,
    ) -> FrameResult:
        """One control frame in `config.scheduler.mode`; `requests` are added first.

        `on_actions` receives the action chunk the moment it is denoised, before any language
        work of the frame (tail extends, decode steps, detokenisation), in the calling thread;
        an exception it raises propagates and the frame's language work does not run.

        Returns the action chunk (the object `on_actions` got), and one `RequestOutput` per
        request that made progress or finished (refused and aborted ones included), in
        submission order.
        """
        return self._frame(observation, requests, noise, self.mode, on_actions)

    def run_isolated(
        self,
        observation: Observation,
        requests: Sequence[LanguageRequest] = (),
        *,
        noise: np.ndarray | None = None,
        on_actions: Callable[[ActionResult], None] | None = None,
    ) -> FrameResult:
        """Baseline frame whatever the mode: a separate prefix prefill for the actions and for
        each request, each decoded to completion (`on_actions` as in `step`)."""
        return self._frame(observation, requests, noise, "isolated", on_actions)

    def warmup(self) -> int:
        """Compiles everything a frame uses (blank observation, a short request, and a frame
        per extend width the mode admits with).

        Counters, the cost model and the request bookkeeping are left as they were.

        Returns:
            XLA compilations it triggered.

        Raises:
            RuntimeError: requests are live (warm up before serving).
        """
        if self._live or self._refused_early:
            raise RuntimeError("warmup() needs an idle engine")
        before = compiles.num_compiles()
        saved = dataclasses.replace(self._counters)
        saved_next, saved_order = self._next_request, self._next_order
        model = self.config.model
        state_dim = (
            int(np.shape(self.normalizer.state_stats.mean)[-1])
            if self.normalizer.state_stats is not None
            else self.action_output_dim
        )
        observation = Observation(
            images={k: np.zeros((*model.image_resolution, 3), np.uint8) for k in model.image_keys},
            image_masks={k: True for k in model.image_keys},
            state=np.zeros((state_dim,), np.float32),
            prompt="warm up",
            stamp=0.0,
        )
        noise = np.zeros((1, model.action_horizon, model.action_dim), np.float32)
        # One short request (prefill, denoise, a one-row extend, decode steps), then, unless
        # requests are admitted one at a time (isolated), one frame per wider extend: that many
        # one-token requests admitted together.
        # Then the same with sampled requests: extends and decode steps compile a greedy and a
        # sampling variant (`sample_tokens`).
        widths = (1,) if self.mode == "isolated" else self.runner.extend_widths
        passes = [(width, hot) for hot in (0.0, 1.0) for width in widths]
        warmup_ids: list[str] = []
        for index, (width, temperature) in enumerate(passes):
            specs = [
                LanguageRequest(
                    RequestKind.SUBTASK,
                    max_tokens=2 if width == 1 else 1,
                    temperature=temperature,
                    request_id=f"__warmup_{index}_{i}__",
                    ignore_eos=True,
                )
                for i in range(width)
            ]
            warmup_ids += [spec.request_id for spec in specs]  # type: ignore[misc]
            self._frame(observation, specs, noise, self.mode)
            for _ in range(3):
                if not self._live:
                    break
                self._frame(observation, (), noise, self.mode)
            if self._live:
                for request_id in list(self._live):
                    self.abort(request_id)
                self._frame(observation, (), noise, self.mode)
        self._warm_masked_prefills(observation)
        self._warmed_up = True
        self._counters = saved
        self._next_request, self._next_order = saved_next, saved_order
        for request_id in warmup_ids:
            self._final_status.pop(request_id, None)
        self._last_timings = None
        # A fresh scheduler: no warm-up costs (compile times) in the deadline cost model.
        self.scheduler = FrameScheduler(self.config.scheduler, self.cache)
        self.chunk_guide.reset()  # warm-up chunks and latencies are not the robot's
        return compiles.num_compiles() - before

    def new_task(self) -> None:
        """A new task (instruction, or episode) begins with the next frame: real-time chunking
        does not continue the previous task's chunk."""
        self.chunk_guide.forget_chunk()

    def _frame(
        self,
        observation: Observation,
        requests: Sequence[LanguageRequest],
        noise: np.ndarray | None,
        mode: str,
        on_actions: Callable[[ActionResult], None] | None = None,
    ) -> FrameResult:
        if mode not in _MODES:
            raise ValueError(f"unknown mode {mode!r}")
        start = time.perf_counter()
        frame_index = self._counters.num_frames
        self._counters.num_frames += 1
        if noise is None:
            noise = self.make_noise(frame_index)
        expected = (1, self.config.model.action_horizon, self.config.model.action_dim)
        noise = np.asarray(noise, np.float32).reshape(expected)
        for request in requests:
            self.add_request(request, now=start)
        phases = _FramePhases()
        inputs = self.prepare_inputs(observation)
        prefill_start = time.perf_counter()
        prefix = self._prefill(inputs)
        phases.prefill_s += time.perf_counter() - prefill_start
        denoise_start = time.perf_counter()
        if self.config.rtc.enabled:
            guide = self.chunk_guide.plan(observation.stamp, observation.state)
            actions = self.runner.denoise_rtc(
                prefix,
                noise,
                guide.previous,
                guide.frozen_rows,
                guide.guided_rows,
                guide.max_guidance,
            )[0]
        else:
            actions = self.runner.denoise(prefix, noise)[0]
        phases.denoise_s = time.perf_counter() - denoise_start
        actions = self.normalizer.unnormalize_actions(actions)[:, : self.action_output_dim]
        actions = self.normalizer.absolute_actions(
            actions, observation.state, self.delta_action_mask
        )
        action_s = time.perf_counter() - start
        action_result = ActionResult(actions, observation.stamp, self._clock() - observation.stamp)
        if on_actions is not None:
            on_actions(action_result)
        self.chunk_guide.record(actions, observation.stamp, action_result.latency_s)
        num_prefills_before = self._counters.num_prefills - 1
        try:
            if mode == "continuous":
                schedule = self.scheduler.schedule(time.perf_counter())
                self._run_schedule(schedule, prefix, phases, deadline_start=start)
            else:
                self._run_to_completion(mode, inputs, prefix, phases)
        except Exception as exc:  # device or runner fault: end the running requests, go on
            logger.exception("language work failed in frame %d", frame_index)
            now = time.perf_counter()
            for request in self.scheduler.running_requests:
                self.scheduler.fail(request.request_id, f"{type(exc).__name__}: {exc}", now)
        detok_start = time.perf_counter()
        outputs = self._emit()
        end = time.perf_counter()
        steps = phases.decode_steps
        language_s = phases.extend_s + phases.decode_s + (end - detok_start)
        timings = FrameTimings(
            prefill_s=phases.prefill_s,
            denoise_s=phases.denoise_s,
            extend_s=phases.extend_s,
            decode_s=phases.decode_s,
            language_s=language_s,
            total_s=end - start,
            action_s=action_s,
            num_decode_steps=len(steps),
            mean_batch_size=sum(size for size, _ in steps) / len(steps) if steps else 0.0,
        )
        self._last_timings = timings
        measured = phases.prefill_s + phases.denoise_s + phases.extend_s + sum(s for _, s in steps)
        self.scheduler.observe_costs(
            FrameCosts(
                prefill_s=phases.prefill_s,
                denoise_s=phases.denoise_s,
                extend_s=phases.extend_s if phases.extend_measured else None,
                decode_step_s=tuple(steps),
                other_s=max(timings.total_s - measured, 0.0),
            )
        )
        num_prefills = self._counters.num_prefills - num_prefills_before
        return FrameResult(frame_index, action_result, outputs, timings, num_prefills)

    def prepare_inputs(self, observation: Observation) -> PrefixInputs:
        """The batch-1 model inputs of `observation` at this engine's model config."""
        model_config = self.config.model
        return observation_to_inputs(
            observation,
            model_config.image_keys,
            model_config.image_resolution,
            self.tokenizer,
            self.normalizer,
            model_config.max_token_len,
        )

    def _prefill(self, inputs: PrefixInputs) -> Prefix:
        """The prefix of the observation's valid image slots only (a masked camera is not
        encoded); a valid-slot pattern the warm-up did not compile compiles here, warned once."""
        slots = valid_slots_of(self.config.model.image_keys, inputs.image_masks)
        if slots not in self._prefill_patterns:
            self._prefill_patterns.add(slots)
            if self._warmed_up:
                logger.warning(
                    "compiling the prefill for valid image slots (%s) on first use: this frame "
                    "is late; list the slots that may be masked in warmup_masked_slots",
                    ", ".join(slots) or "none",
                )
        prefix = self.runner.prefill(inputs, slots)
        self._counters.num_prefills += 1
        return prefix

    def _warm_masked_prefills(self, observation: Observation) -> None:
        """Compiles the prefill for every subset of `warmup_masked_slots` masked."""
        masked_slots = self.config.warmup_masked_slots
        for count in range(1, len(masked_slots) + 1):
            for masked in itertools.combinations(masked_slots, count):
                masks = {key: key not in masked for key in observation.image_masks}
                inputs = self.prepare_inputs(dataclasses.replace(observation, image_masks=masks))
                self._prefill(inputs)

    def _run_to_completion(
        self, mode: str, inputs: PrefixInputs, prefix: Prefix, phases: _FramePhases
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
        phases: _FramePhases,
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
        touched: list[_Live] = []
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
