"""`Engine`: one control frame of pi0.5 with cross-task KV sharing (OxyGen's unified cache).

`Engine.step(observation, requests)` ("shared_kv"):
  1. prefill the prefix (images + pi0.5 prompt with the normalised state) ONCE;
  2. denoise the action chunk from that prefix (action expert; never sees text tails);
  3. for every language request: extend the same prefix with the request's tail (batched,
     one row per request) and decode to completion in fixed-capacity slot rows.

`Engine.run_isolated(observation, requests)` is the baseline openpi would run: a separate
prefix prefill for the action chunk and for every language request.

The runner logic is in small module functions (`observation_to_inputs`, `prepare_requests`,
`decode_to_completion`) so continuous batching across frames can reuse them.

Invariants:
- `stats().num_prefills` grows by exactly 1 per `step` and by 1 + len(requests) per
  `run_isolated`; it counts prefix prefills, nothing is inferred from timing.
- Actions from `step` equal those of `run_isolated` for the same observation and noise, and
  each request's tokens equal those of decoding it alone (rows never interact).
- Without a checkpoint the model is randomly initialised and a warning says outputs are
  meaningless.
- The end-of-sequence token finishes a request (FINISHED_STOPPED) and is not returned;
  max_tokens counts sampled tokens including that end token.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping, Sequence

import jax
import numpy as np
from openpi.shared import image_tools

from oxygen_ros.engine import prompts
from oxygen_ros.engine.checkpoint import (
    Normalizer,
    NormStats,
    load_norm_stats,
    load_params,
)
from oxygen_ros.engine.config import (
    PALIGEMMA_VOCAB_SIZE,
    CacheConfig,
    EngineConfig,
    PromptConfig,
)
from oxygen_ros.engine.model import Pi05Model, create_model
from oxygen_ros.engine.model_fns import JitModel, Prefix, PrefixInputs
from oxygen_ros.engine.tokenizer import Tokenizer, load_tokenizer
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

logger = logging.getLogger("oxygen_ros.engine")


@dataclasses.dataclass
class PreparedRequest:
    """A language request with its defaults resolved and its tail tokenised."""

    request_id: str
    request: LanguageRequest
    max_tokens: int
    tail_tokens: np.ndarray  # int32 [max_tail_len]
    tail_mask: np.ndarray  # bool [max_tail_len]
    error: str | None = None  # set when refused


@dataclasses.dataclass
class Decoded:
    """Result of decoding one request to completion."""

    token_ids: list[int]
    status: RequestStatus


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


def prepare_requests(
    requests: Sequence[LanguageRequest],
    prompt_config: PromptConfig,
    cache_config: CacheConfig,
    tokenizer: Tokenizer,
    first_id: int = 0,
) -> list[PreparedRequest]:
    """Resolves defaults, assigns ids "<kind>-<n>", tokenises tails, refuses what cannot fit."""
    prepared = []
    for offset, request in enumerate(requests):
        task = prompt_config.task(request.kind)
        request_id = request.request_id or f"{request.kind.value}-{first_id + offset}"
        max_tokens = task.max_tokens if request.max_tokens is None else request.max_tokens
        tail_tokens, tail_mask = prompts.tokenize_tail(
            tokenizer, task.tail, prompt_config.max_tail_len
        )
        needed = int(tail_mask.sum()) + max_tokens - 1
        error = None
        if max_tokens < 1:
            error = f"max_tokens must be >= 1, got {max_tokens}"
        elif needed > cache_config.max_seq_len:
            limit = cache_config.max_seq_len
            error = f"tail + max_tokens - 1 = {needed} exceeds cache max_seq_len={limit}"
        prepared.append(
            PreparedRequest(request_id, request, max_tokens, tail_tokens, tail_mask, error)
        )
    return prepared


def decode_to_completion(
    model: JitModel,
    store: Prefix,
    prefix_index: int,
    requests: Sequence[PreparedRequest],
    cache_config: CacheConfig,
    eos_id: int,
    counters: Counters,
) -> list[Decoded]:
    """Decodes requests (all reading stored prefix `prefix_index`) in waves of num_slots rows."""
    results: list[Decoded] = []
    slots = cache_config.num_slots
    for start in range(0, len(requests), slots):
        wave = requests[start : start + slots]
        results += _decode_wave(model, store, prefix_index, wave, cache_config, eos_id, counters)
    return results


def _decode_wave(
    model: JitModel,
    store: Prefix,
    prefix_index: int,
    wave: Sequence[PreparedRequest],
    cache_config: CacheConfig,
    eos_id: int,
    counters: Counters,
) -> list[Decoded]:
    slots, num = cache_config.num_slots, len(wave)
    tail_len = wave[0].tail_tokens.shape[0]
    tail_tokens = np.zeros((slots, tail_len), np.int32)
    tail_mask = np.zeros((slots, tail_len), bool)
    temperature = np.zeros((slots,), np.float32)
    seeds = np.zeros((slots,), np.int32)
    for row, request in enumerate(wave):
        tail_tokens[row], tail_mask[row] = request.tail_tokens, request.tail_mask
        temperature[row] = request.request.temperature
        seeds[row] = request.request.seed
    prefix_rows = np.full((slots,), prefix_index, np.int32)
    tail_k, tail_v, logits = model.extend(store, prefix_rows, tail_tokens, tail_mask)
    counters.num_extends += 1
    gen_k, gen_v = model.empty_gen_cache(slots, cache_config.max_seq_len)
    gen_k, gen_v = model.write_tail(gen_k, gen_v, np.arange(slots, dtype=np.int32), tail_k, tail_v)
    gen_len = tail_mask.sum(axis=1).astype(np.int32)
    active = np.arange(slots) < num
    tokens: list[list[int]] = [[] for _ in range(num)]
    status = [RequestStatus.RUNNING] * num
    while True:
        indices = np.array([len(t) for t in tokens] + [0] * (slots - num), np.int32)
        sampled = np.asarray(model.sample_tokens(logits, temperature, seeds, indices))
        for row in np.flatnonzero(active):
            token = int(sampled[row])
            counters.num_generated_tokens += 1
            if token == eos_id:
                status[row] = RequestStatus.FINISHED_STOPPED
                active[row] = False
                continue
            tokens[row].append(token)
            if len(tokens[row]) >= wave[row].max_tokens:
                status[row] = RequestStatus.FINISHED_LENGTH
                active[row] = False
        if not active.any():
            break
        feed = np.array([t[-1] if t else 0 for t in tokens] + [0] * (slots - num), np.int32)
        logits, gen_k, gen_v = model.decode_step(
            store, prefix_rows, gen_k, gen_v, gen_len, feed, active
        )
        counters.num_decode_steps += 1
        gen_len = gen_len + active.astype(np.int32)
    return [Decoded(t, s) for t, s in zip(tokens, status, strict=True)]


class Engine:
    """One frame at a time: shared prefill (`step`) or per-task prefill (`run_isolated`)."""

    def __init__(
        self,
        config: EngineConfig,
        *,
        model: Pi05Model | None = None,
        norm_stats: Mapping[str, NormStats] | None = None,
    ) -> None:
        """Builds the model from `config` (checkpoint or random init).

        Args:
          config: the engine configuration.
          model: use this model instead of loading or initialising one (tests, sharing).
          norm_stats: use these instead of the checkpoint's (None: the checkpoint's, if any).
        """
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
        self.model = JitModel(
            model, vocab_size=min(self.tokenizer.vocab_size, PALIGEMMA_VOCAB_SIZE)
        )
        self._counters = Counters()
        self._next_request = 0

    @property
    def action_output_dim(self) -> int:
        if self.config.action_output_dim is not None:
            return self.config.action_output_dim
        return self.normalizer.action_dim or self.config.model.action_dim

    def stats(self) -> EngineStats:
        return EngineStats(**dataclasses.asdict(self._counters))

    def make_noise(self, frame_index: int) -> np.ndarray:
        """Deterministic action noise [1, A, J] for a frame (seeded by config.seed)."""
        shape = (1, self.config.model.action_horizon, self.config.model.action_dim)
        rng = np.random.default_rng([self.config.seed, frame_index])
        return rng.standard_normal(shape, dtype=np.float32)

    def step(
        self,
        observation: Observation,
        requests: Sequence[LanguageRequest] = (),
        *,
        noise: np.ndarray | None = None,
    ) -> FrameResult:
        """One frame, shared prefix: one prefill, actions, then every request to completion."""
        start = time.perf_counter()
        frame_index, noise = self._begin_frame(noise)
        prepared = self._prepare(requests)
        prefix = self._prefill(observation)
        prefill_s = time.perf_counter() - start
        actions, denoise_s = self._actions(prefix, noise, observation, start)
        language_start = time.perf_counter()
        decoded = self._decode(prefix, [p for p in prepared if p.error is None])
        outputs = self._outputs(prepared, decoded)
        language_s = time.perf_counter() - language_start
        timings = FrameTimings(prefill_s, denoise_s, language_s, time.perf_counter() - start)
        return FrameResult(frame_index, actions, outputs, timings, num_prefills=1)

    def run_isolated(
        self,
        observation: Observation,
        requests: Sequence[LanguageRequest] = (),
        *,
        noise: np.ndarray | None = None,
    ) -> FrameResult:
        """Baseline: a separate prefix prefill for the actions and for each request."""
        start = time.perf_counter()
        frame_index, noise = self._begin_frame(noise)
        prepared = self._prepare(requests)
        prefix = self._prefill(observation)
        prefill_s = time.perf_counter() - start
        actions, denoise_s = self._actions(prefix, noise, observation, start)
        language_start = time.perf_counter()
        decoded: list[Decoded] = []
        num_prefills = 1
        for request in prepared:
            if request.error is None:
                decoded += self._decode(self._prefill(observation), [request])
                num_prefills += 1
        outputs = self._outputs(prepared, decoded)
        language_s = time.perf_counter() - language_start
        timings = FrameTimings(prefill_s, denoise_s, language_s, time.perf_counter() - start)
        return FrameResult(frame_index, actions, outputs, timings, num_prefills)

    def _begin_frame(self, noise: np.ndarray | None) -> tuple[int, np.ndarray]:
        frame_index = self._counters.num_frames
        self._counters.num_frames += 1
        if noise is None:
            noise = self.make_noise(frame_index)
        expected = (1, self.config.model.action_horizon, self.config.model.action_dim)
        noise = np.asarray(noise, np.float32).reshape(expected)
        return frame_index, noise

    def _prepare(self, requests: Sequence[LanguageRequest]) -> list[PreparedRequest]:
        prepared = prepare_requests(
            requests, self.config.prompt, self.config.cache, self.tokenizer, self._next_request
        )
        self._next_request += len(prepared)
        return prepared

    def _prefill(self, observation: Observation) -> Prefix:
        model_config = self.config.model
        inputs = observation_to_inputs(
            observation,
            model_config.image_keys,
            model_config.image_resolution,
            self.tokenizer,
            self.normalizer,
            model_config.max_token_len,
        )
        prefix = jax.block_until_ready(self.model.prefill(inputs))
        self._counters.num_prefills += 1
        return prefix

    def _actions(
        self, prefix: Prefix, noise: np.ndarray, observation: Observation, start: float
    ) -> tuple[ActionResult, float]:
        denoise_start = time.perf_counter()
        actions = np.asarray(self.model.denoise(prefix, noise))[0]
        denoise_s = time.perf_counter() - denoise_start
        actions = self.normalizer.unnormalize_actions(actions)[:, : self.action_output_dim]
        latency = time.perf_counter() - start
        return ActionResult(actions, observation.stamp, latency), denoise_s

    def _decode(self, prefix: Prefix, requests: Sequence[PreparedRequest]) -> list[Decoded]:
        if not requests:
            return []
        return decode_to_completion(
            self.model,
            prefix,
            0,
            requests,
            self.config.cache,
            self.tokenizer.eos_id,
            self._counters,
        )

    def _outputs(
        self, prepared: Sequence[PreparedRequest], decoded: Sequence[Decoded]
    ) -> tuple[RequestOutput, ...]:
        results = iter(decoded)
        outputs = []
        for request in prepared:
            kind: RequestKind = request.request.kind
            if request.error is not None:
                refused = RequestOutput(
                    request.request_id, kind, (), "", 0, RequestStatus.REFUSED, None, request.error
                )
                outputs.append(refused)
                continue
            result = next(results)
            text = self.tokenizer.decode(result.token_ids)
            ids = tuple(result.token_ids)
            outputs.append(
                RequestOutput(request.request_id, kind, ids, text, 0, result.status, text)
            )
        return tuple(outputs)
