"""The inference node's parameters (and its JointTrajectory groups' `trajectory_group.<name>.*`);
the shared ones are in `common/params.py`."""

from __future__ import annotations

import math

from oxygen_ros.nodes.common.parameters import (
    ParamSpec,
    float_range,
    int_range,
    non_empty,
    non_negative,
    one_of,
    optional_topic_name,
    period_or_zero,
    positive,
    positive_rate,
    prefixed,
    topic_name,
    unique_names,
    unique_names_or_none,
)
from oxygen_ros.nodes.common.params import MODEL_SHARED

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
    ParamSpec(
        "allow_random_weights",
        False,
        "without checkpoint_dir and outside simulation (use_sim_time false) the node stays "
        "inactive, as a random model moves a robot at random; true: activate anyway (a "
        "stand's plumbing test). Simulation (use_sim_time, or the bring-up's use_sim:=true) "
        "needs no checkpoint",
        "bool",
    ),
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


def trajectory_group_specs(group: str) -> tuple[ParamSpec, ...]:
    """The per-group parameters `trajectory_group.<group>.<field>`."""
    return prefixed(f"trajectory_group.{group}", TRAJECTORY_GROUP)
