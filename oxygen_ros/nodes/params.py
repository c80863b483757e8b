"""The nodes' ROS parameters: one table per node, declared and validated in one place.

Every parameter has a spec (type, default, description, whether it may change at run time and a
check that returns a reason). `config/humanoid.yaml` sets them (a test checks that every YAML
key is a declared parameter and that every declared parameter is in the YAML).

Invariants:
- A value is accepted only if it converts to the spec's type and passes its check; otherwise
  the set is refused with a reason naming the parameter and the old value is kept. At start-up
  a bad value from YAML or the command line raises `ParameterError` (the node exits non-zero
  with that reason) instead of running with a half-valid configuration.
- Parameters whose spec is not `runtime` are read-only after start-up: changing them needs a
  restart (the engine's compiled shapes, topics and paths depend on them).
- Integers are accepted for float parameters (`ros2 param set ... action_rate_hz 50`), and an
  empty list given on the command line (which ROS turns into "not set") reads as [].
- The model image size has one source, `model_preset` (`MODEL_SHARED`, declared by perception
  and inference alike): perception's output size is the preset's `image_resolution`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from oxygen_ros.engine.config import PRESET_NAMES
from oxygen_ros.nodes.fusion import FRAME_TRIGGERS

Check = Callable[[Any], str | None]


class ParameterError(ValueError):
    """Invalid parameter values at start-up."""


@dataclasses.dataclass(frozen=True)
class ParamSpec:
    """One parameter."""

    name: str
    default: Any
    description: str
    kind: str  # "float", "int", "bool", "str", "float_list", "str_list"
    runtime: bool = False  # may be changed while the node runs
    check: Check | None = None  # returns a reason when the (converted) value is invalid


def coerce(kind: str, value: Any) -> Any:
    """Converts a parameter value to `kind`; raises ValueError with a reason."""
    if kind == "float":
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"expected a number, got {value!r}")
        return float(value)
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"expected an integer, got {value!r}")
        return int(value)
    if kind == "bool":
        if not isinstance(value, bool):
            raise ValueError(f"expected true or false, got {value!r}")
        return value
    if kind == "str":
        if not isinstance(value, str):
            raise ValueError(f"expected a string, got {value!r}")
        return value
    if kind in ("float_list", "str_list"):
        if value is None:
            return []
        if isinstance(value, str | bytes) or not isinstance(value, Iterable):
            raise ValueError(f"expected a list, got {value!r}")
        items = list(value)
        item_kind = "float" if kind == "float_list" else "str"
        return [coerce(item_kind, v) for v in items]
    raise ValueError(f"unknown parameter kind {kind!r}")


# ------------------------------------------------------------------------------------ checks
def _bounded(check: Check, lo: float, hi: float, constraint: str) -> Check:
    """Marks `check` with the closed range its values lie in (the parameter descriptor's
    `floating_point_range` / `integer_range`, which `ros2 param describe` and rqt show and
    rclpy enforces on every set) and a human-readable constraint."""
    check.bounds = (lo, hi)  # type: ignore[attr-defined]
    check.constraint = constraint  # type: ignore[attr-defined]
    return check


def positive_rate(max_hz: float = 1000.0) -> Check:
    def check(v: float) -> str | None:
        if not (math.isfinite(v) and 0 < v <= max_hz):
            return f"must be a rate in (0, {max_hz:g}] Hz"
        return None

    return _bounded(check, 0.0, max_hz, f"a rate in (0, {max_hz:g}] Hz")


def period_or_zero(min_s: float = 0.05) -> Check:
    def check(v: float) -> str | None:
        if not math.isfinite(v) or v < 0 or 0 < v < min_s:
            return f"must be 0 (disabled) or a period >= {min_s:g} s"
        return None

    return check


def positive(v: float) -> str | None:
    return None if math.isfinite(v) and v > 0 else "must be > 0"


def non_negative(v: float) -> str | None:
    return None if math.isfinite(v) and v >= 0 else "must be >= 0"


def int_range(lo: int, hi: int) -> Check:
    def check(v: int) -> str | None:
        return None if lo <= v <= hi else f"must be in [{lo}, {hi}]"

    return _bounded(check, lo, hi, f"in [{lo}, {hi}]")


def float_range(lo: float, hi: float) -> Check:
    def check(v: float) -> str | None:
        return None if math.isfinite(v) and lo <= v <= hi else f"must be in [{lo:g}, {hi:g}]"

    return _bounded(check, lo, hi, f"in [{lo:g}, {hi:g}]")


def one_of(*choices: str) -> Check:
    def check(v: str) -> str | None:
        return None if v in choices else f"must be one of {', '.join(choices)}"

    check.constraint = "one of: " + ", ".join(repr(c) for c in choices)  # type: ignore[attr-defined]
    return check


def non_empty(v: Sequence) -> str | None:
    return None if len(v) > 0 else "must not be empty"


def unique_names(v: Sequence[str]) -> str | None:
    if not v:
        return "must not be empty"
    return unique_names_or_none(v)


def unique_names_or_none(v: Sequence[str]) -> str | None:
    """Like `unique_names`, but an empty list is allowed."""
    if len(set(v)) != len(v) or any(not s for s in v):
        return "names must be unique and non-empty"
    return None


def topic_name(v: str) -> str | None:
    if not v or v.endswith("/") or " " in v:
        return "must be a valid topic name"
    return None


def optional_topic_name(v: str) -> str | None:
    """A topic name, or '' (off)."""
    return topic_name(v) if v else None


# ---------------------------------------------------------------------------------- tables
SHARED: tuple[ParamSpec, ...] = (
    ParamSpec(
        "joint_names",
        [],
        "model joint order (state and action columns)",
        "str_list",
        check=unique_names,
    ),
    ParamSpec("frame_id", "base_link", "robot base frame of published messages", "str"),
    ParamSpec(
        "observation_topic",
        "oxygen/observation",
        "fused ObservationFrame topic",
        "str",
        check=topic_name,
    ),
    ParamSpec(
        "joint_state_topic",
        "joint_states",
        "sensor_msgs/JointState topic",
        "str",
        check=topic_name,
    ),
    ParamSpec(
        "camera_names",
        [],
        "cameras; each has cameras.<name>.* parameters",
        "str_list",
        check=lambda v: None if len(set(v)) == len(v) else "names must be unique",
    ),
    ParamSpec(
        "diagnostics_period_s",
        1.0,
        "period of /diagnostics messages",
        "float",
        runtime=True,
        check=period_or_zero(0.1),
    ),
)

SIM_SENSORS: tuple[ParamSpec, ...] = (
    ParamSpec(
        "camera_rate_hz",
        30.0,
        "synthetic camera rate",
        "float",
        runtime=True,
        check=positive_rate(200.0),
    ),
    ParamSpec(
        "joint_rate_hz",
        30.0,
        "synthetic joint state rate",
        "float",
        runtime=True,
        check=positive_rate(1000.0),
    ),
    ParamSpec(
        "motion_period_s",
        4.0,
        "period of the synthetic motion",
        "float",
        runtime=True,
        check=positive,
    ),
)
SIM_CAMERA: tuple[ParamSpec, ...] = (
    ParamSpec("topic", "", "image topic", "str", check=topic_name),
    ParamSpec(
        "encoding",
        "rgb8",
        "encoding the sim publishes",
        "str",
        check=one_of("rgb8", "bgr8", "rgba8", "bgra8", "mono8"),
    ),
    ParamSpec("width", 640, "sim image width", "int", check=int_range(1, 4096)),
    ParamSpec("height", 480, "sim image height", "int", check=int_range(1, 4096)),
)

# The ALOHA workcell simulator (workcell_sim_node). Rates are in simulated time.
WORKCELL_SIM: tuple[ParamSpec, ...] = (
    ParamSpec(
        "control_rate_hz",
        100.0,
        "control ticks per simulated second (command buffer -> actuator targets -> physics)",
        "float",
        check=positive_rate(500.0),
    ),
    ParamSpec(
        "joint_rate_hz",
        50.0,
        "JointState rate (sim time; also published on every camera tick)",
        "float",
        runtime=True,
        check=positive_rate(500.0),
    ),
    ParamSpec(
        "camera_rate_hz",
        10.0,
        "rate at which every camera is rendered (sim time)",
        "float",
        runtime=True,
        check=positive_rate(100.0),
    ),
    ParamSpec(
        "status_rate_hz",
        10.0,
        "EpisodeStatus rate (sim time; also published on every phase change and before each "
        "camera tick's images)",
        "float",
        runtime=True,
        check=positive_rate(100.0),
    ),
    ParamSpec(
        "real_time_factor",
        1.0,
        "simulated seconds per wall-clock second the loop aims for (0.25: four times slower)",
        "float",
        runtime=True,
        check=float_range(0.01, 10.0),
    ),
    ParamSpec(
        "chunk_max_age_s",
        1.5,
        "a command (chunk or trajectory) drives the robot at most this long after its first row "
        "(sim seconds); later rows are not executed and the joints hold",
        "float",
        check=positive,
    ),
    ParamSpec(
        "max_joint_speed",
        [],
        "per joint (joint_names order), units per second: how fast the servos follow a target "
        "(targets are rate limited like a servo's profile velocity; [] = no limit)",
        "float_list",
        check=lambda v: None if all(math.isfinite(x) and x > 0 for x in v) else "must be > 0",
    ),
    ParamSpec(
        "episode_time_limit_s",
        0.0,
        "time limit of new episodes in sim seconds (0: the task's own)",
        "float",
        runtime=True,
        check=non_negative,
    ),
    ParamSpec(
        "initial_seed",
        -1,
        "start an episode with this seed at start-up (-1: wait for a reset request)",
        "int",
        check=int_range(-1, 2**62),
    ),
    ParamSpec(
        "next_episode_after_s",
        0.0,
        "after an episode ends, start the next seed (the ended episode's + 1) this many sim "
        "seconds later (0: wait for a reset request)",
        "float",
        runtime=True,
        check=non_negative,
    ),
    ParamSpec("publish_instruction", True, "publish each episode's instruction", "bool"),
    ParamSpec(
        "test_pattern",
        False,
        "TEST ONLY: a coloured panel in front of each camera (top red, wrists green, blue)",
        "bool",
    ),
    ParamSpec("actions_topic", "oxygen/actions", "ActionChunk input", "str", check=topic_name),
    ParamSpec(
        "joint_trajectory_topic",
        "oxygen/joint_trajectory",
        "JointTrajectory input",
        "str",
        check=topic_name,
    ),
    ParamSpec(
        "joint_command_topic",
        "joint_commands",
        "JointState of the targets commanded at each control tick",
        "str",
        check=topic_name,
    ),
    ParamSpec(
        "instruction_topic",
        "oxygen/instruction",
        "std_msgs/String instruction output",
        "str",
        check=topic_name,
    ),
    ParamSpec(
        "episode_status_topic",
        "workcell/episode_status",
        "EpisodeStatus output",
        "str",
        check=topic_name,
    ),
    ParamSpec(
        "reset_service",
        "workcell/reset_episode",
        "ResetEpisode service",
        "str",
        check=topic_name,
    ),
)
WORKCELL_CAMERA: tuple[ParamSpec, ...] = (
    ParamSpec("topic", "", "image topic", "str", check=topic_name),
    ParamSpec("encoding", "rgb8", "the workcell renders rgb8", "str", check=one_of("rgb8")),
    ParamSpec("width", 224, "rendered image width", "int", check=int_range(1, 2048)),
    ParamSpec("height", 224, "rendered image height", "int", check=int_range(1, 2048)),
)

# The model both perception and inference serve: perception converts every image to the
# preset's `image_resolution`, the only size inference accepts. Both nodes declare it and the
# YAMLs set it once, in their `/**` section (a test checks), so the two cannot disagree.
MODEL_SHARED: tuple[ParamSpec, ...] = (
    ParamSpec(
        "model_preset",
        "tiny",
        "engine model preset; perception converts images to its image resolution",
        "str",
        check=one_of(*PRESET_NAMES),
    ),
)

# perception's `cube_state` (workcell_cubes.OBJECT_STATES), and those told the instructed cube
# (workcell_cubes.TARGET_KINDS); not imported from there, so params stay free of the perception
CUBE_STATES = ("positions", "poses", "reach", "target", "target_m")
TARGET_CUBE_STATES = ("target", "target_m")
PERCEPTION: tuple[ParamSpec, ...] = (
    *MODEL_SHARED,
    ParamSpec(
        "observation_rate_hz",
        30.0,
        "ObservationFrame rate",
        "float",
        runtime=True,
        check=positive_rate(200.0),
    ),
    ParamSpec(
        "frame_trigger",
        "joint_state",
        "when a frame is built: joint_state (as soon as a new joint-state snapshot completes, "
        "at most observation_rate_hz; the frame leaves right after its stamp) or timer (on a "
        "free-running timer at observation_rate_hz, with the newest snapshot)",
        "str",
        runtime=True,
        check=one_of(*FRAME_TRIGGERS),
    ),
    ParamSpec(
        "convert_on_arrival",
        True,
        "convert each camera image to the model resolution as it arrives (off the frame's "
        "critical path; costs conversions of images no frame uses when cameras are faster "
        "than frames) instead of when a frame uses it",
        "bool",
        runtime=True,
    ),
    ParamSpec(
        "max_skew_s",
        0.05,
        "window all stamps of a frame must fit in",
        "float",
        runtime=True,
        check=non_negative,
    ),
    ParamSpec(
        "stale_after_s",
        0.5,
        "a camera (or joint state) older than this is not used",
        "float",
        runtime=True,
        check=positive,
    ),
    ParamSpec(
        "future_tolerance_s",
        0.5,
        "stamps further in the future are rejected",
        "float",
        runtime=True,
        check=non_negative,
    ),
    ParamSpec(
        "slot_names",
        ["base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb"],
        "model image slots, in model order",
        "str_list",
        check=unique_names,
    ),
    ParamSpec(
        "max_image_dim", 8192, "larger input images are rejected", "int", check=int_range(1, 65535)
    ),
    ParamSpec(
        "cube_state_camera",
        "",
        "camera whose full-size images feed the workcell cube detector; the cubes' table "
        "positions follow the joints in each frame's state ('' = off)",
        "str",
    ),
    ParamSpec(
        "cube_state",
        "positions",
        "with cube_state_camera: 'positions' (x, y per cube) or 'poses' (x, y, z, sin and cos "
        "of 4 x yaw, moved x, y per cube; a cube in a gripper follows the hand's forward "
        "kinematics; needs the workcell's 14 joints in joint_names) or 'reach' (the poses, "
        "then per cube and arm sign(d) * sqrt(|d|) of the cube's centre minus the pinch point "
        "in metres; the same joints) or 'target' (the pose and offsets of the cube the newest "
        "instruction on task_instruction_topic names, alone; the same joints) or 'target_m' "
        "(the same with the offsets in metres)",
        "str",
        check=one_of(*CUBE_STATES),
    ),
    ParamSpec(
        "task_instruction_topic",
        "oxygen/current_instruction",
        "with cube_state_camera: the (latched) instruction in use, by default the inference "
        "node's; each one published starts a new task for the cube state (a fresh tracker fed "
        "only images taken after it) and, with cube_state 'target' or 'target_m', names its "
        "cube",
        "str",
        check=topic_name,
    ),
    ParamSpec(
        "episode_status_topic",
        "",
        "with cube_state_camera: the workcell simulator's (latched) EpisodeStatus; each new "
        "episode's reset starts a task for the cube state too, and a task starts no earlier "
        "than the newest reset, so an image from before a reset never enters it ('' = off)",
        "str",
        check=optional_topic_name,
    ),
    ParamSpec(
        "episode_status_wait_s",
        0.5,
        "with cube_state_camera and episode_status_topic: a frame whose cube image is newer "
        "than the newest status is skipped until a status at or after the image arrives (the "
        "simulator publishes one before each tick's images, so no image of an episode whose "
        "reset is not known yet enters the tracker), for at most this long of image time "
        "(0 = off)",
        "float",
        runtime=True,
        check=float_range(0.0, 10.0),
    ),
    ParamSpec(
        "reset_instruction_timeout_s",
        1.0,
        "with cube_state 'target' and episode_status_topic: after a reset whose episode names "
        "another cube than the current target, frames wait at most this long (node clock) for "
        "the episode's instruction, then go on with the current target (warned)",
        "float",
        check=float_range(0.0, 60.0),
    ),
)
PERCEPTION_CAMERA: tuple[ParamSpec, ...] = (
    ParamSpec("topic", "", "image topic", "str", check=topic_name),
    ParamSpec("slot", "", "model image slot this camera fills", "str", check=non_empty),
    ParamSpec(
        "encoding",
        "",
        "expected encoding ('' accepts every supported one)",
        "str",
        check=one_of("", "rgb8", "bgr8", "rgba8", "bgra8", "mono8"),
    ),
)

# Test-only faults the inference node can inject into its own frames (see `fault_injection`).
FAULT_INJECTIONS = ("", "engine_exception", "nan_chunk")
FRAME_PICKUPS = ("newest", "on_arrival")  # inference's `frame_pickup` (engine_loop.py)

INFERENCE: tuple[ParamSpec, ...] = (
    # engine
    *MODEL_SHARED,
    ParamSpec(
        "state_extra_names",
        [],
        "perceived state entries of the frame (e.g. perception's cube positions) that follow "
        "the joints in the model's state; empty: the checkpoint's own (its "
        "assets/<id>/state_layout.json), none without one",
        "str_list",
        check=unique_names_or_none,
    ),
    ParamSpec("checkpoint_dir", "", "openpi checkpoint dir ('' = random init)", "str"),
    ParamSpec("assets_id", "", "assets/<id>/norm_stats.json ('' = no normalisation)", "str"),
    ParamSpec("tokenizer_path", "", "SentencePiece model ('' = engine default)", "str"),
    ParamSpec(
        "action_space",
        "checkpoint",
        "what the model's actions are: checkpoint (its assets/<id>/action_space.json; absolute "
        "without one), absolute (joint targets), delta (delta_action_joints relative to the "
        "observation's joint state, openpi's DeltaActions/AbsoluteActions)",
        "str",
        check=one_of("checkpoint", "absolute", "delta"),
    ),
    ParamSpec(
        "delta_action_joints",
        [],
        "action_space delta: the joints whose actions are relative to the state",
        "str_list",
        check=unique_names_or_none,
    ),
    ParamSpec(
        "seed", 0, "parameter init and action noise seed", "int", check=int_range(0, 2**31 - 1)
    ),
    ParamSpec(
        "action_noise_scale",
        1.0,
        "the flow's starting noise is N(0, 1) times this (openpi: 1; 0: every chunk denoised "
        "from zero, deterministic)",
        "float",
        check=float_range(0.0, 1.0),
    ),
    ParamSpec(
        "scheduler_mode",
        "continuous",
        "isolated (prefill per task), shared_kv (one prefill, decode in frame) or continuous "
        "(one prefill, requests decode across frames)",
        "str",
        check=one_of("isolated", "shared_kv", "continuous"),
    ),
    ParamSpec(
        "scheduler_policy",
        "fixed",
        "continuous mode: fixed decode steps, deadline (frame budget) or to_completion",
        "str",
        check=one_of("fixed", "deadline", "to_completion"),
    ),
    ParamSpec(
        "decode_steps_per_frame",
        5,
        "decode steps per frame (fixed policy)",
        "int",
        check=int_range(0, 4096),
    ),
    ParamSpec(
        "actions_per_frame",
        7,
        "actions executed per chunk: frame budget = this / action_rate_hz (deadline policy)",
        "int",
        check=int_range(1, 4096),
    ),
    ParamSpec(
        "frame_deadline_s",
        0.0,
        "explicit frame budget of the deadline policy (0: from the rates)",
        "float",
        check=non_negative,
    ),
    ParamSpec(
        "cache_num_slots", 8, "concurrently decoding requests", "int", check=int_range(1, 256)
    ),
    ParamSpec(
        "cache_num_prefixes",
        8,
        "stored frame prefixes requests can decode from",
        "int",
        check=int_range(1, 256),
    ),
    ParamSpec(
        "cache_max_seq_len",
        64,
        "tail + generated tokens per slot",
        "int",
        check=int_range(8, 8192),
    ),
    ParamSpec(
        "subtask_max_tokens",
        16,
        "default max tokens of a subtask request",
        "int",
        check=int_range(1, 4096),
    ),
    ParamSpec(
        "narration_max_tokens",
        32,
        "default max tokens of a narration",
        "int",
        check=int_range(1, 4096),
    ),
    ParamSpec(
        "memory_max_tokens",
        32,
        "default max tokens of a memory entry",
        "int",
        check=int_range(1, 4096),
    ),
    ParamSpec(
        "warmup",
        True,
        "compile every engine code path before the first frame",
        "bool",
    ),
    ParamSpec(
        "warmup_masked_slots",
        [],
        "image slots that may be masked (a camera absent or stale): the warm-up compiles the "
        "prefill for every subset of them masked (a masked slot is not encoded); any other "
        "pattern compiles on first use, warned",
        "str_list",
        check=unique_names_or_none,
    ),
    ParamSpec(
        "autostart",
        True,
        "drive the lifecycle to active at start (configure: load and compile; activate: the "
        "action stream); false: wait for a lifecycle manager (change_state)",
        "bool",
    ),
    ParamSpec(
        "configure_timeout_s",
        600.0,
        "configure fails when the engine has not loaded and compiled within this time",
        "float",
        check=float_range(1.0, 3600.0),
    ),
    ParamSpec(
        "max_pending_requests",
        16,
        "language requests queued or running at most",
        "int",
        check=int_range(1, 1024),
    ),
    # actions
    ParamSpec(
        "action_rate_hz",
        70.0,
        "ActionChunk publish rate",
        "float",
        runtime=True,
        check=positive_rate(1000.0),
    ),
    ParamSpec(
        "action_thread_priority",
        0,
        "SCHED_FIFO priority of the action publisher (its own process; 0: normal; needs "
        "CAP_SYS_NICE)",
        "int",
        check=int_range(0, 99),
    ),
    ParamSpec(
        "action_dt_s",
        0.04,
        "seconds between action rows of a model chunk",
        "float",
        check=positive,
    ),
    ParamSpec(
        "action_time_offset_s",
        0.0,
        "row 0 time = observation stamp + this",
        "float",
        check=lambda v: None if math.isfinite(v) else "must be finite",
    ),
    ParamSpec(
        "max_chunk_age_s",
        2.0,
        "chunks from older observations are not published",
        "float",
        runtime=True,
        check=positive,
    ),
    ParamSpec(
        "chunk_transition",
        "blend",
        "how a new chunk takes over: rtc (real-time chunking: the engine denoises it to "
        "continue the previous chunk, then it replaces it), blend (over blend_steps rows) or "
        "replace (at once)",
        "str",
        check=one_of("rtc", "blend", "replace"),
    ),
    ParamSpec(
        "rtc_max_guidance",
        5.0,
        "rtc: cap of the guidance weight (the paper's beta; 0 = plain denoise)",
        "float",
        check=non_negative,
    ),
    ParamSpec(
        "blend_steps",
        3,
        "rows over which blend hands over",
        "int",
        runtime=True,
        check=int_range(0, 1000),
    ),
    ParamSpec("joint_position_lower", [], "per-joint lower limits ([] = none)", "float_list"),
    ParamSpec("joint_position_upper", [], "per-joint upper limits ([] = none)", "float_list"),
    ParamSpec("joint_max_velocity", [], "per-joint velocity limits ([] = none)", "float_list"),
    ParamSpec("publish_joint_trajectory", False, "also publish JointTrajectory", "bool"),
    ParamSpec(
        "trajectory_groups",
        [],
        "publish_joint_trajectory: one JointTrajectory per group (a ros2_control "
        "JointTrajectoryController each), configured by trajectory_group.<name>.* ([] = one "
        "message of every joint on joint_trajectory_topic)",
        "str_list",
        check=unique_names_or_none,
    ),
    ParamSpec(
        "watchdog_timeout_s",
        1.0,
        "no fresh observation used for this long: trip",
        "float",
        runtime=True,
        check=positive,
    ),
    ParamSpec(
        "watchdog_policy",
        "stop",
        "when tripped: stop publishing, or hold position",
        "str",
        runtime=True,
        check=one_of("stop", "hold"),
    ),
    ParamSpec(
        "stats_window_s",
        10.0,
        "diagnostics percentiles, minima and chunk rate are over the last this many seconds",
        "float",
        runtime=True,
        check=lambda v: None if math.isfinite(v) and 0 < v <= 600 else "must be in (0, 600] s",
    ),
    ParamSpec(
        "frame_pickup",
        "on_arrival",
        "which frame the engine starts when it becomes free: newest (the newest frame at once) "
        "or on_arrival (if the newest frame has already waited longer than "
        "frame_pickup_fresh_s, wait for the next one to arrive, at most 1.5 measured frame "
        "periods, then take the newest)",
        "str",
        runtime=True,
        check=one_of(*FRAME_PICKUPS),
    ),
    ParamSpec(
        "frame_pickup_fresh_s",
        0.001,
        "on_arrival: a frame that has waited at most this long is started at once",
        "float",
        runtime=True,
        check=float_range(0.0, 1.0),
    ),
    ParamSpec(
        "fault_injection",
        "",
        "TEST ONLY, keep '': engine_exception raises inside every frame (after Engine.step), "
        "nan_chunk puts a NaN into every model chunk; both exercise the fault paths",
        "str",
        runtime=True,
        check=one_of(*FAULT_INJECTIONS),
    ),
    # language
    ParamSpec("default_instruction", "", "task prompt until an instruction arrives", "str"),
    ParamSpec(
        "instruction_max_chars",
        400,
        "longer instructions are truncated",
        "int",
        check=int_range(1, 100_000),
    ),
    ParamSpec(
        "subtask_period_s",
        0.0,
        "subtask request period (0: only when a new instruction arrives)",
        "float",
        runtime=True,
        check=period_or_zero(),
    ),
    ParamSpec(
        "narration_period_s",
        2.0,
        "narration request period (0 disables)",
        "float",
        runtime=True,
        check=period_or_zero(),
    ),
    ParamSpec(
        "memory_period_s",
        5.0,
        "memory request period (0 disables)",
        "float",
        runtime=True,
        check=period_or_zero(),
    ),
    # memory
    ParamSpec(
        "memory_db_path",
        "~/.ros/oxygen_ros/memory.sqlite3",
        "SQLite memory file",
        "str",
        check=non_empty,
    ),
    ParamSpec(
        "memory_republish_count",
        20,
        "entries republished (and latched) on start",
        "int",
        check=int_range(1, 10_000),
    ),
    ParamSpec(
        "memory_query_max_entries",
        20,
        "QueryMemory default max_entries",
        "int",
        check=int_range(1, 10_000),
    ),
    # topics and services
    ParamSpec("actions_topic", "oxygen/actions", "ActionChunk topic", "str", check=topic_name),
    ParamSpec(
        "joint_trajectory_topic",
        "oxygen/joint_trajectory",
        "JointTrajectory topic",
        "str",
        check=topic_name,
    ),
    ParamSpec(
        "instruction_topic",
        "oxygen/instruction",
        "std_msgs/String instruction topic",
        "str",
        check=topic_name,
    ),
    ParamSpec(
        "emergency_stop_topic",
        "oxygen/emergency_stop",
        "std_msgs/Bool input: true stops motion at once (a hold, then nothing), false releases",
        "str",
        check=topic_name,
    ),
    ParamSpec(
        "emergency_stop_service",
        "oxygen/set_emergency_stop",
        "std_srvs/SetBool service: the same as the topic, with an answer",
        "str",
        check=topic_name,
    ),
    ParamSpec(
        "current_instruction_topic",
        "oxygen/current_instruction",
        "the instruction in use, latched for late joiners (std_msgs/String)",
        "str",
        check=topic_name,
    ),
    ParamSpec(
        "instruct_action",
        "oxygen/instruct",
        "oxygen_ros/action/Instruct server: an instruction run as a task (feedback, result, "
        "time limit, cancel holds)",
        "str",
        check=topic_name,
    ),
    ParamSpec(
        "task_status_topic",
        "",
        "oxygen_ros/EpisodeStatus topic whose success, rising while an Instruct goal runs, "
        "ends it SUCCEEDED, and whose new episodes' resets end the frames observed before "
        "them ('' = none: goals end by time limit, cancel or a newer one)",
        "str",
        check=optional_topic_name,
    ),
    ParamSpec("speech_topic", "oxygen/speech", "SpeechToken topic", "str", check=topic_name),
    ParamSpec("memory_topic", "oxygen/memory", "MemoryEntry topic", "str", check=topic_name),
    ParamSpec(
        "request_language_service",
        "oxygen/request_language",
        "RequestLanguage service",
        "str",
        check=topic_name,
    ),
    ParamSpec(
        "query_memory_service",
        "oxygen/query_memory",
        "QueryMemory service",
        "str",
        check=topic_name,
    ),
)


# One controller group of the inference node's JointTrajectory output: trajectory_group.<name>.*
TRAJECTORY_GROUP: tuple[ParamSpec, ...] = (
    ParamSpec(
        "topic",
        "",
        "the controller's JointTrajectory topic (e.g. left_arm_controller/joint_trajectory)",
        "str",
        check=topic_name,
    ),
    ParamSpec(
        "joints",
        [],
        "the controller's joints (a subset of joint_names, in no other group)",
        "str_list",
        check=unique_names,
    ),
)


def _prefixed(prefix: str, template: Sequence[ParamSpec]) -> tuple[ParamSpec, ...]:
    return tuple(dataclasses.replace(s, name=f"{prefix}.{s.name}") for s in template)


def trajectory_group_specs(group: str) -> tuple[ParamSpec, ...]:
    """The per-group parameters `trajectory_group.<group>.<field>`."""
    return _prefixed(f"trajectory_group.{group}", TRAJECTORY_GROUP)


def camera_specs(camera: str, template: Sequence[ParamSpec]) -> tuple[ParamSpec, ...]:
    """The per-camera parameters `cameras.<camera>.<field>`."""
    return _prefixed(f"cameras.{camera}", template)


def validate(spec: ParamSpec, value: Any) -> tuple[Any, str | None]:
    """Returns (converted value, None) or (None, reason)."""
    try:
        converted = coerce(spec.kind, value)
    except ValueError as exc:
        return None, f"{spec.name}: {exc}"
    if spec.check is not None:
        reason = spec.check(converted)
        if reason:
            return None, f"{spec.name}={converted!r} refused: {reason}"
    return converted, None


def descriptor(spec: ParamSpec, with_range: bool = True) -> Any:
    """The `ParameterDescriptor` of `spec`: description, read-only unless runtime, dynamic
    typing (integers are accepted for floats), the check's constraint as text and, for a
    bounded check, its closed range (a float range for floats, an integer range for ints)."""
    from rcl_interfaces.msg import FloatingPointRange, IntegerRange, ParameterDescriptor

    out = ParameterDescriptor(
        description=spec.description + ("" if spec.runtime else " (restart to change)"),
        read_only=not spec.runtime,
        dynamic_typing=True,
        additional_constraints=getattr(spec.check, "constraint", ""),
    )
    bounds = getattr(spec.check, "bounds", None)
    if with_range and bounds is not None:
        lo, hi = bounds
        if spec.kind == "float":
            out.floating_point_range = [
                FloatingPointRange(from_value=float(lo), to_value=float(hi), step=0.0)
            ]
        elif spec.kind == "int":
            out.integer_range = [IntegerRange(from_value=int(lo), to_value=int(hi), step=1)]
    return out


class NodeParameters:
    """Declares a node's parameters, validates them, and applies runtime changes.

    Attributes are not used: read values with `self[name]` (always validated and converted).
    """

    def __init__(
        self,
        node: Any,
        specs: Iterable[ParamSpec],
        dependent: Callable[[Mapping[str, Any]], Iterable[ParamSpec]] | None = None,
    ) -> None:
        """Declares every spec on `node` and validates the start-up values.

        Args:
            node: The rclpy node.
            specs: Its parameters.
            dependent: Given the validated values of `specs`, more specs to declare (for
                example `cameras.<name>.*` for every name in `camera_names`).

        Raises:
            ParameterError: Listing every invalid start-up value.
        """
        self._node = node
        self._specs: dict[str, ParamSpec] = {}
        self._values: dict[str, Any] = {}
        self._listeners: list[Callable[[dict[str, Any]], None]] = []
        errors = self._declare(specs)
        if dependent is not None and not errors:
            errors = self._declare(dependent(self._values))
        if errors:
            raise ParameterError("; ".join(errors))
        node.add_on_set_parameters_callback(self._on_set)
        node.add_post_set_parameters_callback(self._on_post_set)

    def _declare(self, specs: Iterable[ParamSpec]) -> list[str]:
        from rclpy.exceptions import InvalidParameterValueException

        errors = []
        node = self._node
        for spec in specs:
            self._specs[spec.name] = spec
            try:
                param = node.declare_parameter(spec.name, spec.default, descriptor(spec))
            except InvalidParameterValueException:  # outside the range: the check says why
                plain = descriptor(spec, with_range=False)
                param = node.declare_parameter(spec.name, spec.default, plain)
            value, reason = validate(spec, param.value)
            if reason:
                errors.append(reason)
            else:
                self._values[spec.name] = value
        return errors

    def __getitem__(self, name: str) -> Any:
        return self._values[name]

    def values(self) -> Mapping[str, Any]:
        return dict(self._values)

    def add_listener(self, callback: Callable[[dict[str, Any]], None]) -> None:
        """Calls `callback({name: value})` after accepted runtime changes."""
        self._listeners.append(callback)

    def _on_set(self, params: list) -> Any:
        from rcl_interfaces.msg import SetParametersResult

        for param in params:
            spec = self._specs.get(param.name)
            if spec is None:
                continue  # not ours (for example use_sim_time)
            if not spec.runtime:
                return SetParametersResult(
                    successful=False, reason=f"{param.name} is read-only: restart the node"
                )
            _, reason = validate(spec, param.value)
            if reason:
                return SetParametersResult(successful=False, reason=reason)
        return SetParametersResult(successful=True)

    def _on_post_set(self, params: list) -> None:
        changed = {}
        for param in params:
            spec = self._specs.get(param.name)
            if spec is None:
                continue
            value, reason = validate(spec, param.value)
            if reason is None:
                self._values[param.name] = value
                changed[param.name] = value
        if changed:
            for listener in self._listeners:
                listener(changed)


# ============================================================ expert_node (scripted expert)
# Kept at the end of the file as one block. Topics and cameras come from the shared section.
EXPERT_SHARED: tuple[ParamSpec, ...] = tuple(
    s
    for s in SHARED
    if s.name in ("frame_id", "joint_state_topic", "camera_names", "diagnostics_period_s")
)
EXPERT: tuple[ParamSpec, ...] = (
    ParamSpec(
        "publish_rate_hz",
        10.0,
        "ActionChunk publish rate (node clock: sim time under use_sim_time)",
        "float",
        runtime=True,
        check=positive_rate(200.0),
    ),
    ParamSpec(
        "horizon",
        50,
        "rows per ActionChunk (horizon x action_dt_s must stay below the sim's chunk_max_age_s)",
        "int",
        runtime=True,
        check=int_range(1, 10_000),
    ),
    ParamSpec(
        "action_dt_s",
        0.02,
        "seconds between ActionChunk rows",
        "float",
        runtime=True,
        check=positive,
    ),
    ParamSpec("actions_topic", "oxygen/actions", "ActionChunk output", "str", check=topic_name),
    ParamSpec(
        "subtask_topic",
        "oxygen/expert_subtask",
        "std_msgs/String output (latched): the plan's subtask label when it changes",
        "str",
        check=topic_name,
    ),
    ParamSpec(
        "episode_status_topic",
        "workcell/episode_status",
        "EpisodeStatus input (workcell_sim's output)",
        "str",
        check=topic_name,
    ),
    ParamSpec(
        "record_dir",
        "",
        "write one episode_<index>.hdf5 per episode here ('' = no recording)",
        "str",
    ),
    ParamSpec(
        "camera_rate_hz",
        10.0,
        "the recording's fps attribute: must equal workcell_sim's camera_rate_hz",
        "float",
        check=positive_rate(100.0),
    ),
)
EXPERT_CAMERA: tuple[ParamSpec, ...] = (
    ParamSpec("topic", "", "image topic (recorded)", "str", check=topic_name),
)
