"""The ALOHA bimanual ViperX (vx300s) as the rest of the project sees it: 14 joints.

gym-aloha's MJCF has 8 joints per arm (six revolute arm joints and two mirrored finger slides)
and 16 position actuators. The project's joint space, like ALOHA's own recordings, has 7 per
arm: the six arm joints in radians and one gripper value, normalised so 0 is closed and 1 is
open (linear in the finger travel `FINGER_CLOSED_M` .. `FINGER_OPEN_M`; both fingers follow it,
the right finger mirrored).

Invariants:
- `JOINT_NAMES` is the order of JointState, ActionChunk columns and HDF5 `qpos`/`action` for the
  workcell profile: left arm (waist .. wrist_rotate, gripper), then the right arm.
- Arm joint limits come from the MJCF (`joint_limits`); the gripper's are [0, 1].
"""

from __future__ import annotations

import numpy as np

ARMS = ("left", "right")
ARM_JOINTS = ("waist", "shoulder", "elbow", "forearm_roll", "wrist_angle", "wrist_rotate")
JOINTS_PER_ARM = len(ARM_JOINTS) + 1  # + gripper
JOINT_NAMES: tuple[str, ...] = tuple(
    f"{arm}_{joint}" for arm in ARMS for joint in (*ARM_JOINTS, "gripper")
)
NUM_JOINTS = len(JOINT_NAMES)  # 14

FINGER_CLOSED_M = 0.021  # left finger slide at gripper value 0 (MJCF range lower bound)
FINGER_OPEN_M = 0.057  # left finger slide at gripper value 1 (MJCF range upper bound)

# ALOHA's rest pose (gym-aloha's keyframe) per arm: arm joints [rad] and the gripper value.
HOME_ARM = (0.0, -0.96, 1.16, 0.0, -0.3, 0.0)
HOME_GRIPPER = (0.024 - FINGER_CLOSED_M) / (FINGER_OPEN_M - FINGER_CLOSED_M)
HOME: np.ndarray = np.array((*HOME_ARM, HOME_GRIPPER) * len(ARMS), dtype=np.float64)
HOME.flags.writeable = False


def mjcf_prefix(arm: str) -> str:
    """Name prefix of an arm's bodies, joints and geoms in gym-aloha's MJCF."""
    if arm not in ARMS:
        raise ValueError(f"arm must be one of {ARMS}, got {arm!r}")
    return f"vx300s_{arm}/"


def arm_slice(arm: str) -> slice:
    """Columns of `arm` in the 14-joint vector (arm joints then gripper)."""
    start = ARMS.index(arm) * JOINTS_PER_ARM
    return slice(start, start + JOINTS_PER_ARM)


def arm_columns(arm: str) -> np.ndarray:
    """Indices of `arm`'s six joints (without the gripper) in the 14-joint vector."""
    start = arm_slice(arm).start
    return np.arange(start, start + len(ARM_JOINTS))


def gripper_index(arm: str) -> int:
    return ARMS.index(arm) * JOINTS_PER_ARM + len(ARM_JOINTS)


def gripper_to_finger(value: float | np.ndarray) -> float | np.ndarray:
    """Normalised gripper value (0 closed, 1 open) -> left finger slide [m]."""
    return FINGER_CLOSED_M + np.asarray(value) * (FINGER_OPEN_M - FINGER_CLOSED_M)


def finger_to_gripper(position_m: float | np.ndarray) -> float | np.ndarray:
    """Left finger slide [m] -> normalised gripper value."""
    return (np.asarray(position_m) - FINGER_CLOSED_M) / (FINGER_OPEN_M - FINGER_CLOSED_M)
