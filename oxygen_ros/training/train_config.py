"""The training run's configuration: `TrainConfig` (what `python -m oxygen_ros.training.train`
takes as flags), checked when built, and its phase weights (`parse_stage_weights`)."""

from __future__ import annotations

import dataclasses
import math

from oxygen_ros.engine.checkpoint_assets import NARRATION_NUMBERS, load_narration_numbers
from oxygen_ros.training import bin_embeddings
from oxygen_ros.training import data as _data


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    data_dir: str
    out_dir: str
    preset: str = "workcell"
    steps: int = 4000
    batch_size: int = 32
    peak_lr: float = 1e-3
    end_lr: float = 2e-5
    warmup_steps: int = 200
    weight_decay: float = 1e-4
    clip_norm: float = 1.0
    language_weight: float = 0.25
    action_draws: int = 1  # (noise, time) draws per sample in training (loss.forward)
    # the action loss reaches only the action expert (loss.forward's insulate): the prefix
    # learns from the language targets alone
    insulate_prefix: bool = False
    # train only the prefix LLM's language head (training/language_head.py): the last layer's
    # queries, attention output, MLP and final norm, which no key or value the action expert
    # reads depends on, so every denoised action stays bit for bit the starting checkpoint's
    language_head_only: bool = False
    # the state-bin embedding rows' code at the start (bin_embeddings.smooth_bin_rows'
    # Fourier frequencies, comma-separated; "" = bin_embeddings.FREQUENCIES; "0.5": a quarter
    # circle, nearly linear in the value) and whether training keeps them as they start
    bin_frequencies: str = ""
    freeze_bin_rows: bool = False
    # how the narration target says its numbers (checkpoint_assets.NARRATION_NUMBERS); "" =
    # the init_from checkpoint's, or "digits" without one
    narration_numbers: str = ""
    # > 0: evaluate and save an exponential moving average of the parameters, updated after
    # every step (openpi's TrainConfig.ema_decay: 0.99 there); 0: the last step's parameters
    ema_decay: float = 0.0
    augment: bool = False
    heldout: int = 10  # episodes (highest seeds) kept out of training
    eval_every: int = 250
    eval_samples: int = 256
    seed: int = 0
    assets_id: str = "workcell"
    tokenizer_path: str = ""  # "" = the one the preset is sized for (data.preset_tokenizer)
    init_from: str = ""  # checkpoint to start from ("" = random init from `seed`)
    fresh_norm_stats: bool = False  # with init_from: new norm stats, not the checkpoint's
    min_norm_range: float = 0.0  # > 0: widen narrower state/action dims (widen_norm_stats)
    # > 0: the grippers' action quantiles this far apart (norm_stats.set_action_range; run 38's are
    # 0.8 apart, so 0.2667 triples their normalised values: nine times their squared error).
    gripper_action_range: float = 0.0
    early_steps: int = 0  # the first early_steps steps of each episode are drawn ...
    early_weight: float = 1.0  # ... this many times as often (the arm is still at home there)
    # "1:4,2:4": samples of phase index 1 and 2 (tasks.subtask_labels order: grasp, lift) are
    # drawn 4 times as often (times early_weight where both apply); "" = every phase alike
    stage_weights: str = ""
    state_dropout: float = 0.0  # fraction of samples whose prompt carries the home state
    object_state: str = ""  # state = joints + the cubes' positions or poses (or nothing)
    delta_actions: bool = False  # arm joints relative to the state (_data.DELTA_ACTION_MASK)
    image_dropout: float = 0.0  # fraction of samples whose camera images are all masked out
    blind_state: str = ""  # comma-separated state names normalised to one bin (blind_norm_stats)
    device_data: bool = False  # keep the training samples on the accelerator, gather there
    time_budget_s: float = 0.0  # > 0: end (evaluate, save) once training has run this long

    def __post_init__(self) -> None:
        if not self.tokenizer_path:
            object.__setattr__(self, "tokenizer_path", str(_data.preset_tokenizer(self.preset)))
        if self.steps < 2 or self.batch_size < 1 or self.eval_every < 1:
            raise ValueError("need steps >= 2, batch_size >= 1 and eval_every >= 1")
        if self.action_draws < 1:
            raise ValueError("need action_draws >= 1")
        if not 0.0 <= self.ema_decay < 1.0:
            raise ValueError("need 0 <= ema_decay < 1")
        if self.heldout < 1 or self.eval_samples < 1:
            raise ValueError("need heldout >= 1 episode and eval_samples >= 1")
        if self.min_norm_range < 0:
            raise ValueError("need min_norm_range >= 0")
        if self.gripper_action_range < 0:
            raise ValueError("need gripper_action_range >= 0")
        if self.early_steps < 0 or self.early_weight <= 0:
            raise ValueError("need early_steps >= 0 and early_weight > 0")
        parse_stage_weights(self.stage_weights)  # raises on a malformed --stage-weights
        if not 0.0 <= self.state_dropout < 1.0:
            raise ValueError("need 0 <= state_dropout < 1")
        if self.delta_actions and self.state_dropout > 0:
            raise ValueError(
                "state dropout puts the home state in the prompt: delta actions "
                "are relative to the real one"
            )
        if self.object_state not in _data.OBJECT_STATE_PRESETS:
            raise ValueError(f"object_state must be one of {tuple(_data.OBJECT_STATE_PRESETS)}")
        if self.object_state:  # without one, build_samples refuses a prompt the budget would cut
            _data.check_preset(self.preset, self.object_state)
        if not 0 < self.end_lr <= self.peak_lr:
            raise ValueError("need 0 < end_lr <= peak_lr")
        if self.device_data and self.state_dropout > 0:
            raise ValueError("state dropout swaps prompts on the host: not with device_data")
        if not 0.0 <= self.image_dropout <= 1.0:
            raise ValueError("need 0 <= image_dropout <= 1")
        if self.time_budget_s < 0:
            raise ValueError("need time_budget_s >= 0")
        if self.narration_numbers not in ("", *NARRATION_NUMBERS):
            raise ValueError(f"narration_numbers must be one of {NARRATION_NUMBERS}")
        if any(f <= 0 for f in self.bin_code):
            raise ValueError(f"bin frequencies must be > 0, got {self.bin_frequencies!r}")
        unknown = set(self.blinded_names) - set(_data.state_names(self.object_state))
        if unknown:
            raise ValueError(
                f"blind_state names {sorted(unknown)} are not in the state "
                f"{_data.state_names(self.object_state)}"
            )

    @property
    def stage_weight_map(self) -> dict[int, float]:
        """`stage_weights` as {phase index: weight}."""
        return parse_stage_weights(self.stage_weights)

    @property
    def bin_code(self) -> tuple[float, ...]:
        """The state-bin rows' Fourier frequencies (bin_embeddings.FREQUENCIES when unset)."""
        if not self.bin_frequencies:
            return bin_embeddings.FREQUENCIES
        return tuple(float(f) for f in self.bin_frequencies.split(","))

    @property
    def narration_style(self) -> str:
        """`narration_numbers`, or when unset the init_from checkpoint's (digits without)."""
        if self.narration_numbers:
            return self.narration_numbers
        return load_narration_numbers(self.init_from, None) if self.init_from else "digits"

    @property
    def blinded_names(self) -> tuple[str, ...]:
        """The state names `blind_state` lists."""
        return tuple(n.strip() for n in self.blind_state.split(",") if n.strip())


def parse_stage_weights(text: str) -> dict[int, float]:
    """'1:4,2:4' -> {1: 4.0, 2: 4.0} (phase index: weight); '' -> {}.

    Raises:
        ValueError: an item is not index:weight with a distinct index >= 0 and a weight > 0.
    """
    weights: dict[int, float] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        index, sep, weight = item.partition(":")
        try:
            key, value = int(index), float(weight)
        except ValueError:
            key, value = -1, 0.0
        if not sep or key < 0 or not 0 < value < math.inf or key in weights:
            raise ValueError(
                "stage_weights wants 'index:weight,...' with distinct indices >= 0 and "
                f"weights > 0, got {text!r}"
            )
        weights[key] = value
    return weights
