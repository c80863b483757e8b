"""Frozen engine configuration: model presets, prompts, cache, scheduler, one `EngineConfig`.

Presets (`get_model_config(name)`):
- `pi05`: the real pi0.5 model, openpi `gemma_2b` prefix LLM + `gemma_300m` action expert +
  SigLIP `So400m/14` at 224 px, bfloat16 (3.35e9 parameters).
- `tiny`: openpi's `dummy` Gemma for both experts + SigLIP `mu/14` at 224 px, float32
  (about 17e6 parameters, most of them the 257,152-row embedding). Same code paths, prefix
  length and action horizon (50) as `pi05`, so it exercises everything on a CPU in CI.
- `workcell`: the preset trained on the simulated workcell here (oxygen_ros.training): `dummy`
  Gemma x2 + SigLIP `mu/16` at 96 px (36 tokens per camera instead of 256), an 80-token
  prompt budget (the longest instruction + 14 three-digit joint states fit) and a horizon of
  10 actions (1 s at the demonstrations' 10 Hz). Same code paths as `pi05`; the prefix is 188
  tokens instead of 968, so a training step fits these CPUs.
- `workcell_objects`: `workcell` with a 104-token prompt budget, for a state that also carries
  the cubes' table positions as the workcell's cube detector sees them (prefix 212 tokens).
- `workcell_poses`: `workcell` with a 164-token prompt budget, for a state that also carries
  the cubes' poses (`perception/workcell_cubes.POSE_STATE_NAMES`, 21 numbers; prefix 272).
- `workcell_poses_bins`: the same state for the tokenizer with one piece per state bin
  (`tokenizer.STATE_BINS_TOKENIZER_PATH`): a 56-token prompt budget, prefix 164 tokens.
- `workcell_reach_bins`: the poses and each cube's offset from each hand
  (`workcell_cubes.REACH_STATE_NAMES`, 39 numbers) for the same tokenizer: a 74-token prompt
  budget, prefix 182 tokens.
- `workcell_target_bins`: only the instructed cube's pose and offsets from the hands
  (`workcell_cubes.TARGET_STATE_NAMES`, 13 numbers) for the same tokenizer: a 48-token prompt
  budget, prefix 156 tokens.
- `workcell_target_m_bins`: `workcell_target_bins` for the same state with the offsets in metres
  (`workcell_cubes.TARGET_METRES_STATE_NAMES`).
- `workcell_target_wide`: `workcell_target_bins` with both Gemma experts at width 256 (8 heads
  of 32, depth 4; `model.SMALL_GEMMA_VARIANTS`) instead of openpi's `dummy` (width 64).
- `workcell_target_e256`: `workcell_target_bins` with only the action expert at width 256
  (mlp 1024; dummy's depth 4 and 8 heads of 16, so it pairs with the `dummy` prefix LLM), the
  shape `training.expert_stage` trains on a `workcell_target_bins` checkpoint's prefix.

Invariants:
- Every config is a frozen, hashable dataclass; compiled model functions are cached per
  `ModelConfig` value.
- Both Gemma experts share depth, heads, kv heads and head dim (openpi requires it).
- The prefix length S is fixed per model config: image tokens of every slot + max_token_len.
- A language request fits a cache slot when its tail plus max_tokens - 1 fit `max_seq_len`
  (the last sampled token is never written to the cache).
- `CacheConfig` and `extend_rows` fix every language shape, so the engine compiles its decode
  step and tail extend once for any number (1..num_slots) of active requests.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
from typing import Literal

from oxygen_ros.engine.types import RequestKind

PRESET_NAMES = (
    "tiny",
    "workcell",
    "workcell_objects",
    "workcell_poses",
    "workcell_poses_bins",
    "workcell_reach_bins",
    "workcell_target_bins",
    "workcell_target_m_bins",
    "workcell_target_wide",
    "workcell_target_e256",
    "pi05",
)
PI05_IMAGE_KEYS = ("base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb")
PALIGEMMA_VOCAB_SIZE = 257_152  # rows of the tied embedding in every openpi Gemma variant


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Shapes and numerics of one pi0.5 model (everything that changes compiled code)."""

    name: str
    paligemma_variant: str = "gemma_2b"  # openpi gemma variant of the prefix LLM
    action_expert_variant: str = "gemma_300m"  # openpi gemma variant of the action expert
    vision_variant: str = "So400m/14"  # openpi siglip variant, "<size>/<patch>"
    image_resolution: tuple[int, int] = (224, 224)  # (height, width) the tower sees
    image_keys: tuple[str, ...] = PI05_IMAGE_KEYS  # camera slots, in prefix order
    action_dim: int = 32  # J: model action (and padded state) dimension
    action_horizon: int = 50  # A: actions per chunk
    num_denoise_steps: int = 10  # flow-matching Euler steps
    max_token_len: int = 200  # prompt token budget inside the prefix
    dtype: str = "bfloat16"  # compute dtype (activations and kv cache)
    param_dtype: str = "float32"  # dtype parameters are initialised or restored in

    @property
    def patch_size(self) -> int:
        return int(self.vision_variant.split("/")[1])

    @property
    def num_image_tokens(self) -> int:
        """Tokens one camera slot contributes to the prefix."""
        height, width = self.image_resolution
        return (height // self.patch_size) * (width // self.patch_size)

    @property
    def prefix_len(self) -> int:
        """S: fixed prefix length (all image slots + prompt budget)."""
        return len(self.image_keys) * self.num_image_tokens + self.max_token_len


def get_model_config(name: str) -> ModelConfig:
    """Returns the named preset (one of `PRESET_NAMES`)."""
    if name == "tiny":
        return ModelConfig(
            name="tiny",
            paligemma_variant="dummy",
            action_expert_variant="dummy",
            vision_variant="mu/14",
            dtype="float32",
            param_dtype="float32",
        )
    if name == "workcell_target_bins":
        # 14 joints + 13 numbers (the instructed cube's pose and offset from each hand), one
        # token each with the state-bins tokenizer: 48 tokens with the longest instruction.
        return dataclasses.replace(
            get_model_config("workcell"), name="workcell_target_bins", max_token_len=48
        )
    if name == "workcell_target_m_bins":
        # workcell_target_bins' shape for `workcell_cubes.TARGET_METRES_STATE_NAMES` (the same
        # 13 numbers, the offsets from the hands in metres): the same 48-token prompt budget.
        return dataclasses.replace(
            get_model_config("workcell_target_bins"), name="workcell_target_m_bins"
        )
    if name == "workcell_target_wide":
        # workcell_target_bins with both Gemma experts four times as wide (model.py's
        # `oxygen_w256`: width 256, 8 heads of 32, depth 4, instead of openpi's `dummy`).
        return dataclasses.replace(
            get_model_config("workcell_target_bins"),
            name="workcell_target_wide",
            paligemma_variant="oxygen_w256",
            action_expert_variant="oxygen_w256",
        )
    if name == "workcell_target_e256":
        # workcell_target_bins with only the action expert four times as wide (model.py's
        # `oxygen_e256`: width 256, dummy's heads), for training.expert_stage.
        return dataclasses.replace(
            get_model_config("workcell_target_bins"),
            name="workcell_target_e256",
            action_expert_variant="oxygen_e256",
        )
    if name == "workcell_reach_bins":
        # 14 joints + 39 numbers (the poses and each cube's offset from each hand), one token
        # each with the state-bins tokenizer: 74 tokens with the longest instruction.
        return dataclasses.replace(
            get_model_config("workcell"), name="workcell_reach_bins", max_token_len=74
        )
    if name == "workcell_poses_bins":
        # workcell_poses for a tokenizer with one piece per state bin
        # (tokenizer.STATE_BINS_TOKENIZER_PATH): the same 35 numbers, one token each, take 56
        # tokens with the longest instruction, so the prefix is 164 tokens instead of 272.
        return dataclasses.replace(
            get_model_config("workcell"), name="workcell_poses_bins", max_token_len=56
        )
    if name == "workcell_poses":
        # 14 joints + 21 cube pose numbers: 162 tokens with the longest instruction and every
        # number at three digits (4 tokens each with the bundled tokenizer).
        return dataclasses.replace(
            get_model_config("workcell"), name="workcell_poses", max_token_len=164
        )
    if name == "workcell_objects":
        # The state also carries the cubes' table positions (perception/workcell_cubes.py):
        # 20 numbers in the prompt need 102 tokens with the longest instruction.
        return dataclasses.replace(
            get_model_config("workcell"), name="workcell_objects", max_token_len=104
        )
    if name == "workcell":
        return ModelConfig(
            name="workcell",
            paligemma_variant="dummy",
            action_expert_variant="dummy",
            vision_variant="mu/16",
            image_resolution=(96, 96),
            action_horizon=10,
            max_token_len=80,
            dtype="float32",
            param_dtype="float32",
        )
    if name == "pi05":
        return ModelConfig(name="pi05", dtype="bfloat16", param_dtype="bfloat16")
    raise ValueError(f"unknown model preset {name!r}; known presets: {', '.join(PRESET_NAMES)}")


@dataclasses.dataclass(frozen=True)
class LanguageTaskConfig:
    """Defaults for one language task kind."""

    tail: str  # text appended after the shared prefix, tokenised without BOS
    max_tokens: int  # default max_tokens of a request of this kind
    priority: int  # default priority; lower runs first


@dataclasses.dataclass(frozen=True)
class PromptConfig:
    """Language task tails; the action prompt itself is openpi's pi0.5 format (prompts.py)."""

    subtask: LanguageTaskConfig = LanguageTaskConfig("\nSubtask: ", max_tokens=16, priority=0)
    narration: LanguageTaskConfig = LanguageTaskConfig("\nNarration: ", max_tokens=32, priority=1)
    memory: LanguageTaskConfig = LanguageTaskConfig("\nMemory: ", max_tokens=32, priority=2)
    max_tail_len: int = 16  # token budget of a tail; tails are padded to it

    def task(self, kind: RequestKind) -> LanguageTaskConfig:
        return {
            RequestKind.SUBTASK: self.subtask,
            RequestKind.NARRATION: self.narration,
            RequestKind.MEMORY: self.memory,
        }[kind]


@dataclasses.dataclass(frozen=True)
class CacheConfig:
    """Fixed capacity of the language KV cache (shapes of the compiled decode step)."""

    num_slots: int = 8  # B: rows of a decode step, i.e. concurrently decoding requests
    num_prefixes: int = 8  # P: stored prefixes (frames) language requests can read from
    max_seq_len: int = 64  # T: tail + generated tokens one slot holds


SCHEDULER_MODES = ("isolated", "shared_kv", "continuous")
SCHEDULER_POLICIES = ("fixed", "deadline", "to_completion")


@dataclasses.dataclass(frozen=True)
class SchedulerConfig:
    """How language work is spread over control frames (scheduler.py applies it).

    `mode` picks the execution (`Engine.step`):
    - `isolated`: openpi's way, a prefix prefill per task, each request decoded to completion
      inside the frame;
    - `shared_kv`: one prefill per frame, every request extended from it and decoded to
      completion inside the frame;
    - `continuous`: one prefill per frame; requests start in the frame they are admitted in
      and keep decoding in later frames from their own frame's stored prefix, batched with
      requests started in other frames; `policy` picks the decode steps per frame.
    `policy` (continuous mode): `fixed` runs `decode_steps_per_frame` steps (OxyGen's k),
    `deadline` as many as the measured costs predict fit `frame_budget_s`, `to_completion`
    finishes every active request in the frame. isolated/shared_kv always run to completion.
    """

    mode: Literal["isolated", "shared_kv", "continuous"] = "continuous"
    policy: Literal["fixed", "deadline", "to_completion"] = "fixed"
    decode_steps_per_frame: int = 5  # `fixed`: decode steps after each frame's actions (k)
    action_rate_hz: float = 70.0  # robot action rate; with actions_per_frame gives the budget
    actions_per_frame: int = 7  # actions executed per chunk before the next one is needed
    frame_deadline_s: float | None = None  # explicit frame budget; None: from the rates
    safety_margin: float = 0.1  # `deadline`: fraction of the budget kept free
    min_decode_steps_per_frame: int = 1  # `deadline`: floor, so language always progresses
    max_decode_steps_per_frame: int = 64  # `deadline`: ceiling
    cost_window: int = 16  # measured frames per running median of a component cost
    max_waiting: int = 32  # bound of the waiting queue; beyond it requests are refused
    max_admit_per_frame: int | None = None  # also the extend batch rows; None: num_slots

    def __post_init__(self) -> None:
        if self.mode not in SCHEDULER_MODES:
            raise ValueError(f"unknown scheduler mode {self.mode!r}; known: {SCHEDULER_MODES}")
        if self.policy not in SCHEDULER_POLICIES:
            raise ValueError(
                f"unknown scheduler policy {self.policy!r}; known: {SCHEDULER_POLICIES}"
            )
        if self.decode_steps_per_frame < 0:
            raise ValueError("decode_steps_per_frame must be >= 0")
        if self.action_rate_hz <= 0 or self.actions_per_frame < 1:
            raise ValueError("need action_rate_hz > 0 and actions_per_frame >= 1")
        if self.frame_deadline_s is not None and self.frame_deadline_s <= 0:
            raise ValueError("frame_deadline_s must be > 0 or None")
        if not 0 <= self.safety_margin < 1:
            raise ValueError("safety_margin must be in [0, 1)")
        if not 0 <= self.min_decode_steps_per_frame <= self.max_decode_steps_per_frame:
            raise ValueError("need 0 <= min_decode_steps_per_frame <= max_decode_steps_per_frame")
        if self.cost_window < 1:
            raise ValueError("cost_window must be >= 1")
        if self.max_waiting < 1:
            raise ValueError("max_waiting must be >= 1")
        if self.max_admit_per_frame is not None and self.max_admit_per_frame < 1:
            raise ValueError("max_admit_per_frame must be >= 1 or None")

    @property
    def frame_budget_s(self) -> float:
        """Seconds one frame may take: `frame_deadline_s`, else a chunk is needed every
        `actions_per_frame / action_rate_hz` seconds."""
        if self.frame_deadline_s is not None:
            return self.frame_deadline_s
        return self.actions_per_frame / self.action_rate_hz


@dataclasses.dataclass(frozen=True)
class RtcConfig:
    """Real-time chunking (`rtc.py`; Black, Galliker, Levine 2025): each chunk is denoised to
    continue the previous one instead of starting from scratch.

    The previous chunk's rows are aligned to the new observation by the stamps (rows are
    `row_dt_s` apart, row 0 at the observation stamp). The rows that run while the new chunk
    is being computed -- the measured delay: the largest observation -> hand-off latency of the
    last `delay_window` frames, in rows, rounded up -- are frozen to the previous chunk, the
    rest of the overlap is guided with decaying weights, the guidance weight capped at
    `max_guidance` (the paper's beta). The delay is measured, never configured.
    """

    enabled: bool = False
    row_dt_s: float = 0.04  # seconds between chunk rows (the inference node's action_dt_s)
    max_guidance: float = 5.0  # beta: cap of the guidance weight (the paper uses 5)
    delay_window: int = 8  # frames whose latencies give the delay estimate (their maximum)

    def __post_init__(self) -> None:
        if self.row_dt_s <= 0 or self.max_guidance < 0 or self.delay_window < 1:
            raise ValueError("need row_dt_s > 0, max_guidance >= 0 and delay_window >= 1")


@dataclasses.dataclass(frozen=True)
class NormConfig:
    """State/action normalisation with openpi norm stats (`assets/<id>/norm_stats.json`)."""

    use_quantiles: bool = True  # pi0.5 trains with quantile (q01/q99) normalisation
    state_key: str = "state"
    actions_key: str = "actions"


def default_tokenizer_path() -> pathlib.Path:
    """Where openpi caches the PaliGemma SentencePiece model."""
    home = os.environ.get("OPENPI_DATA_HOME", "~/.cache/openpi")
    return pathlib.Path(home).expanduser() / "big_vision" / "paligemma_tokenizer.model"


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """The one object an `Engine` is built from."""

    model: ModelConfig = dataclasses.field(default_factory=lambda: get_model_config("tiny"))
    prompt: PromptConfig = dataclasses.field(default_factory=PromptConfig)
    cache: CacheConfig = dataclasses.field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = dataclasses.field(default_factory=SchedulerConfig)
    norm: NormConfig = dataclasses.field(default_factory=NormConfig)
    checkpoint_dir: str | None = None  # openpi checkpoint (params/, assets/); None: random init
    assets_id: str | None = None  # assets/<assets_id>/norm_stats.json; None: no normalisation
    tokenizer_path: str | None = None  # None: default_tokenizer_path(), else the bundled model
    action_output_dim: int | None = None  # None: the norm stats' action dim, else model dim
    # Delta joint actions (openpi's DeltaActions mask: True dims are relative to the state).
    # None: the checkpoint's assets/<id>/action_space.json (absolute without it); (): absolute.
    delta_action_mask: tuple[bool, ...] | None = None
    rtc: RtcConfig = dataclasses.field(default_factory=RtcConfig)  # real-time chunking
    seed: int = 0  # parameter init and action noise
    # The flow's starting noise is N(0, 1) times this (openpi: 1; 0: every chunk is denoised
    # from zero, deterministic for a given observation).
    action_noise_scale: float = 1.0
    # Image slots that may be masked (a camera absent or stale): `Engine.warmup` compiles the
    # prefill for every subset of them masked (2^n valid-slot patterns), so serving never
    # compiles for them. A masked slot is not encoded at all (`model_fns.prefill`); any other
    # pattern compiles on first use, with a warning.
    warmup_masked_slots: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        unknown = set(self.warmup_masked_slots) - set(self.model.image_keys)
        if unknown:
            raise ValueError(
                f"warmup_masked_slots {sorted(unknown)} are not image slots of the model "
                f"({', '.join(self.model.image_keys)})"
            )
        if not 0.0 <= self.action_noise_scale <= 1.0:
            raise ValueError(
                f"action_noise_scale must be in [0, 1], got {self.action_noise_scale}"
            )
        needed = self.prompt.max_tail_len + max(
            self.prompt.task(kind).max_tokens for kind in RequestKind
        )
        if needed - 1 > self.cache.max_seq_len:
            raise ValueError(
                f"cache.max_seq_len={self.cache.max_seq_len} is too small for max_tail_len="
                f"{self.prompt.max_tail_len} plus the largest default max_tokens "
                f"(needs {needed - 1})"
            )
        if self.cache.num_slots < 1 or self.cache.num_prefixes < 1 or self.cache.max_seq_len < 1:
            raise ValueError("cache num_slots, num_prefixes and max_seq_len must be >= 1")

    @property
    def extend_rows(self) -> int:
        """Rows of one batched tail extend (fixed, so it compiles once)."""
        limit = self.scheduler.max_admit_per_frame
        return self.cache.num_slots if limit is None else min(limit, self.cache.num_slots)


def get_engine_config(preset: str = "tiny", **overrides: object) -> EngineConfig:
    """Returns an `EngineConfig` for a model preset, with top-level fields overridden."""
    return dataclasses.replace(EngineConfig(model=get_model_config(preset)), **overrides)
