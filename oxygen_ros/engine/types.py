"""Request and result types shared by the engine and the ROS nodes.

Plain frozen dataclasses at the engine boundary: nodes build `Observation` and
`LanguageRequest`, the engine answers with `FrameResult`. Nothing here imports JAX, so the
nodes can convert messages to and from these types without touching the model.

Invariants:
- `RequestStatus` is ordered: `status >= RequestStatus.FINISHED_STOPPED` means finished, so
  "is it done" is one comparison.
- Token ids are PaliGemma SentencePiece ids (or ids of the project's small tokenizer, which
  keeps PaliGemma's special ids pad=0, eos=1, bos=2, unk=3).
- Actions leave the engine unnormalised, in robot units, with the model's padded action
  dimensions cut to the configured output dimension.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping

import numpy as np


class RequestKind(enum.Enum):
    """Language tasks that share the action prefix; each has its own prompt tail."""

    SUBTASK = "subtask"
    NARRATION = "narration"
    MEMORY = "memory"


class RequestStatus(enum.IntEnum):
    """Lifecycle of a language request; ordered so finished states compare >= FINISHED_STOPPED."""

    WAITING = 0
    RUNNING = 1
    FINISHED_STOPPED = 2  # sampled the end-of-sequence token
    FINISHED_LENGTH = 3  # reached its max_tokens
    FINISHED_ABORTED = 4  # aborted by the caller
    FINISHED_ERROR = 5  # failed inside the engine
    REFUSED = 6  # never admitted (for example its tail plus max_tokens exceed the cache)

    @property
    def finished(self) -> bool:
        return self >= RequestStatus.FINISHED_STOPPED


@dataclasses.dataclass(frozen=True)
class Observation:
    """One control frame's sensor input, in robot units."""

    images: Mapping[str, np.ndarray]  # slot name -> uint8 [h, w, 3]; resized with pad if needed
    image_masks: Mapping[str, bool]  # slot name -> valid; a missing slot is masked out
    state: np.ndarray  # float32 [n], raw (unnormalised) joint state
    prompt: str  # task instruction
    stamp: float  # seconds, observation time


@dataclasses.dataclass(frozen=True)
class LanguageRequest:
    """A language task to decode from the frame's shared prefix."""

    kind: RequestKind
    max_tokens: int | None = None  # None: the kind's default from `PromptConfig`
    temperature: float = 0.0  # 0: greedy; > 0: sampled with `seed`
    priority: int | None = None  # None: the kind's default; lower runs first
    request_id: str | None = None  # None: the engine assigns "<kind>-<counter>"
    seed: int = 0  # rng seed; token i uses fold_in(key(seed), i), independent of batching
    ignore_eos: bool = False  # True: only max_tokens stops it (benchmarks: fixed lengths)


@dataclasses.dataclass(frozen=True)
class AddResult:
    """Answer of `Engine.add_request`."""

    request_id: str  # the caller's id or the one the engine assigned
    accepted: bool  # queued (WAITING); False: REFUSED, see `reason`
    status: RequestStatus  # WAITING or REFUSED
    reason: str  # why it was refused; "" when accepted


@dataclasses.dataclass(frozen=True)
class RequestOutput:
    """Progress of one request in one frame."""

    request_id: str
    kind: RequestKind
    new_token_ids: tuple[int, ...]  # sampled this frame; the end-of-sequence token is not included
    text_delta: str  # text of new_token_ids given the tokens before them
    first_index: int  # index of new_token_ids[0] in the request's token stream
    status: RequestStatus
    text: str | None  # whole text, set only when finished
    error: str | None = None  # why it was refused or failed


@dataclasses.dataclass(frozen=True)
class ActionResult:
    """The frame's action chunk."""

    actions: np.ndarray  # float32 [A, J] unnormalised, model action dims cut to config
    observation_stamp: float  # Observation.stamp of the frame that produced it
    latency_s: float  # seconds from observation_stamp until the chunk was handed over, on the
    # engine's clock (the moment `on_actions` got it, or would have)


@dataclasses.dataclass(frozen=True)
class FrameTimings:
    """Wall-clock seconds spent in each phase of one frame (device work waited for)."""

    prefill_s: float  # prefix prefill(s), images + prompt (isolated: all of them)
    denoise_s: float  # flow-matching action denoising
    extend_s: float  # language tails of admitted requests: prefix store, extend, first ids
    decode_s: float  # batched decode steps, sampling and bookkeeping included
    language_s: float  # extend_s + decode_s + detokenisation
    total_s: float  # whole `step` call, host work included
    action_s: float = 0.0  # from the start of `step` until the chunk was handed over (input
    # preparation, prefill, denoise, action transforms): the frame's action path
    num_decode_steps: int = 0  # batched decode steps run in this frame
    mean_batch_size: float = 0.0  # mean active rows over those steps (0 without steps)


@dataclasses.dataclass(frozen=True)
class FrameResult:
    """Everything one `Engine.step` produced."""

    frame_index: int  # 0-based count of frames this engine ran
    actions: ActionResult | None
    outputs: tuple[RequestOutput, ...]
    timings: FrameTimings
    num_prefills: int  # prefix prefills run in this frame (1 in shared mode)


@dataclasses.dataclass(frozen=True)
class EngineStats:
    """Counters since the engine was built and gauges of now; observable without timing."""

    num_frames: int = 0
    num_prefills: int = 0  # prefix prefills (images + prompt)
    num_extends: int = 0  # batched language-tail prefills
    num_decode_steps: int = 0  # batched decode steps
    num_generated_tokens: int = 0  # ids sampled, end-of-sequence ids included
    num_compiles: int = 0  # XLA compilations in this process since the engine was built
    num_waiting: int = 0  # requests queued now
    num_running: int = 0  # requests holding a cache slot now
    num_admitted: int = 0
    num_refused: int = 0
    num_aborted: int = 0
    num_finished: int = 0  # finished in any way except refused
    slots_used: int = 0
    slots_total: int = 0
    prefixes_used: int = 0  # stored frame prefixes in use
    prefixes_total: int = 0
    cache_bytes_used: int = 0
    cache_bytes_total: int = 0  # fixed at construction
    last_timings: FrameTimings | None = None  # of the last frame; None before the first
