"""Reference decoder: language requests decoded alone, to completion, from one stored prefix.

The equality reference for the engine's batched and continuous serving (tests and
benchmarks), independent of the `Runner`, the `LanguageKVCache`, the scheduler and the
`Request` state machine: `prepare_requests` resolves defaults and tokenises tails with the
rules of `Engine.add_request`, and `decode_to_completion` extends them from stored prefix
`prefix_index` and decodes every request until it stops, in waves of `num_slots` rows, with
the `JitModel` functions on a private gen cache.

Invariants:
- Every row reads the same stored prefix; rows never interact, so a request's tokens do not
  depend on the other requests of its wave.
- Token i of a request is sampled with index i (`sample_tokens`), the engine's rule, so its
  tokens do not depend on batching or frames either.
- A request stops at EOS (never emitted, unless `ignore_eos`) or after `max_tokens` ids
  (`FINISHED_LENGTH`); results come back in request order.
- `prepare_requests` marks what cannot fit (`error` set) and drops nothing;
  `decode_to_completion` does not read `error`, so callers decode only accepted requests.
- Updates only `counters` (extends, decode steps, generated tokens) and its own buffers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from oxygen_ros.engine import prompts
from oxygen_ros.engine.config import CacheConfig, PromptConfig
from oxygen_ros.engine.kv_cache import write_tail_rows
from oxygen_ros.engine.model_fns import JitModel, Prefix
from oxygen_ros.engine.tokenizer import Tokenizer
from oxygen_ros.engine.types import LanguageRequest, RequestStatus

if TYPE_CHECKING:
    from oxygen_ros.engine.engine import Counters


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
    gen_k, gen_v = write_tail_rows(gen_k, gen_v, tail_k, tail_v, np.arange(slots, dtype=np.int32))
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
            if token == eos_id and not wave[row].request.ignore_eos:
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
