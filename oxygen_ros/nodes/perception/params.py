"""The perception node's parameters (and its cameras' `cameras.<name>.*`); the shared ones are
in `common/params.py`."""

from __future__ import annotations

from oxygen_ros.nodes.common.parameters import (
    ParamSpec,
    float_range,
    int_range,
    non_empty,
    non_negative,
    one_of,
    optional_topic_name,
    positive,
    positive_rate,
    topic_name,
    unique_names,
)
from oxygen_ros.nodes.common.params import MODEL_SHARED
from oxygen_ros.nodes.perception.fusion import FRAME_TRIGGERS

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
# image_conversion.BYTES_PER_PIXEL's keys (a test keeps them equal; not imported, so params stay
# free of numpy and openpi_client)
RAW_ENCODINGS = (
    *("rgb8", "bgr8", "rgba8", "bgra8", "mono8"),
    *("uyvy", "yuv422", "yuyv", "yuv422_yuy2"),
)
TRANSPORTS = ("raw", "compressed")  # camera_input.TRANSPORTS
PERCEPTION_CAMERA: tuple[ParamSpec, ...] = (
    ParamSpec("topic", "", "image topic (image_transport's base topic)", "str", check=topic_name),
    ParamSpec("slot", "", "model image slot this camera fills", "str", check=non_empty),
    ParamSpec(
        "transport",
        "raw",
        "as image_transport's transports: raw (sensor_msgs/Image on topic) or compressed "
        "(sensor_msgs/CompressedImage, JPEG or PNG, on <topic>/compressed, image_transport's "
        "naming; decoded with Pillow)",
        "str",
        check=one_of(*TRANSPORTS),
    ),
    ParamSpec(
        "encoding",
        "",
        "expected encoding of a raw image, or the camera encoding a compressed image's format "
        "names ('' accepts every supported one; yuv422 is UYVY, yuv422_yuy2 YUYV, both BT.601 "
        "limited range)",
        "str",
        check=one_of("", *RAW_ENCODINGS),
    ),
    ParamSpec(
        "width",
        0,
        "with transport compressed: the width a decoded image must have (0 = any); a raw "
        "image's header gives its own size",
        "int",
        check=int_range(0, 65535),
    ),
    ParamSpec(
        "height",
        0,
        "with transport compressed: the height a decoded image must have (0 = any)",
        "int",
        check=int_range(0, 65535),
    ),
)
