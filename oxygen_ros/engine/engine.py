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

The engine's jobs, one file each: this file builds the engine and plans a frame (inputs,
prefill, denoise, actions handed off, then the language work and the frame's timings);
`inputs.py` turns an observation into the model's inputs; `language_path.py` (`LanguagePath`,
mixed in) holds the request API, the language work of a frame and the outputs; `warmup.py`
(`Warmup`, mixed in) compiles everything before serving.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from oxygen_ros.engine import compiles, prompts
from oxygen_ros.engine.checkpoint import Normalizer, NormStats, load_norm_stats, load_params
from oxygen_ros.engine.checkpoint_assets import load_delta_action_mask
from oxygen_ros.engine.chunk_guide import ChunkGuide
from oxygen_ros.engine.config import PALIGEMMA_VOCAB_SIZE, EngineConfig
from oxygen_ros.engine.detokenizer import find_anchor_id
from oxygen_ros.engine.inputs import observation_to_inputs
from oxygen_ros.engine.kv_cache import KVCacheLayout, LanguageKVCache
from oxygen_ros.engine.language_path import FramePhases, LanguagePath, LiveRequest
from oxygen_ros.engine.model import Pi05Model, create_model, gemma_config
from oxygen_ros.engine.model_fns import JitModel, Prefix, PrefixInputs, valid_slots_of
from oxygen_ros.engine.runner import Runner
from oxygen_ros.engine.scheduler import FrameCosts, FrameScheduler
from oxygen_ros.engine.tokenizer import load_tokenizer
from oxygen_ros.engine.types import (
    ActionResult,
    EngineStats,
    FrameResult,
    FrameTimings,
    LanguageRequest,
    Observation,
    RequestKind,
    RequestOutput,
    RequestStatus,
)
from oxygen_ros.engine.warmup import Warmup

logger = logging.getLogger("oxygen_ros.engine")


@dataclasses.dataclass
class Counters:
    """Mutable counterparts of `EngineStats`, updated by the runner functions."""

    num_frames: int = 0
    num_prefills: int = 0
    num_extends: int = 0
    num_decode_steps: int = 0
    num_generated_tokens: int = 0


_MODES = ("isolated", "shared_kv", "continuous")


class Engine(LanguagePath, Warmup):
    """pi0.5 frames with language requests: `add_request` / `abort` / `step` / `stats`
    (`add_request`, `abort`, `request_status`, `queue_position`: `LanguagePath`; `warmup`:
    `Warmup`)."""

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
        self._live: dict[str, LiveRequest] = {}
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
        phases = FramePhases()
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
