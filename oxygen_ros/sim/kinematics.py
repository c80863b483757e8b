"""Inverse kinematics of one ViperX arm of the workcell (ROS-free).

`ArmKinematics` owns its own `MjData` on the workcell's (shared, read-only) `MjModel`, so solving
never disturbs the simulation. It places the arm's pinch site (`<arm>_pinch`, between the
fingertips) at a position with a gripper orientation, by damped least squares on the site's
Jacobian (`mj_jacSite`), iterating from a seed.

Conventions (gripper frame = the `gripper_link` body frame, which the pinch site shares):
- x: the approach direction (from the wrist through the fingertips),
- y: the finger slide direction (the fingers close along it),
- z: x cross y.
`gripper_rotation(approach, finger_axis)` builds that frame in world coordinates.

Invariants:
- Only the six arm joints move; the fingers stay where the seed data has them.
- Every iterate is clipped to the MJCF joint limits, so solutions respect them.
- Deterministic: the same model, target and seed give the same joints.
"""

from __future__ import annotations

import dataclasses

import mujoco
import numpy as np

from oxygen_ros.sim import robot

# Orientation error [rad] counts like this many metres of position error in the solve.
ORIENTATION_WEIGHT_M = 0.1


@dataclasses.dataclass(frozen=True)
class IKResult:
    """Outcome of one solve."""

    q: np.ndarray  # [6] arm joints (waist .. wrist_rotate) [rad]
    position_error_m: float  # |pinch - target| at q
    orientation_error_rad: float  # rotation angle between the gripper frame and the target
    converged: bool  # both errors within the solve's tolerances
    iterations: int  # damped least-squares steps taken


def gripper_rotation(approach: np.ndarray, finger_axis: np.ndarray) -> np.ndarray:
    """World rotation [3, 3] of a gripper frame whose x is `approach` and whose y is
    `finger_axis` made orthogonal to it (columns are the frame's axes)."""
    x = np.asarray(approach, dtype=np.float64)
    x = x / np.linalg.norm(x)
    y = np.asarray(finger_axis, dtype=np.float64)
    y = y - x * (x @ y)
    norm = np.linalg.norm(y)
    if norm < 1e-9:
        raise ValueError("finger_axis must not be parallel to approach")
    y = y / norm
    return np.column_stack((x, y, np.cross(x, y)))


def rotation_error(current: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Axis-angle vector [3] (world frame) that rotates `current` onto `target`."""
    quat_c, quat_t, diff = np.empty(4), np.empty(4), np.empty(3)
    mujoco.mju_mat2Quat(quat_c, current.reshape(9))
    mujoco.mju_mat2Quat(quat_t, target.reshape(9))
    mujoco.mju_subQuat(diff, quat_t, quat_c)  # in the current frame
    return current @ diff


class ArmKinematics:
    """Forward and inverse kinematics of one arm's pinch site."""

    def __init__(self, model: mujoco.MjModel, arm: str) -> None:
        self.arm = arm
        self.model = model
        self.data = mujoco.MjData(model)
        prefix = robot.mjcf_prefix(arm)
        joints = [model.joint(prefix + name) for name in robot.ARM_JOINTS]
        self._qpos = np.array([int(j.qposadr[0]) for j in joints])
        self._dof = np.array([int(j.dofadr[0]) for j in joints])
        self.lower = np.array([j.range[0] for j in joints])
        self.upper = np.array([j.range[1] for j in joints])
        self._site = model.site(f"{arm}_pinch").id
        for finger in ("left_finger", "right_finger"):  # keep the fingers plausible (unused)
            joint = model.joint(prefix + finger)
            self.data.qpos[joint.qposadr[0]] = np.mean(joint.range)
        self._jacp = np.zeros((3, model.nv))
        self._jacr = np.zeros((3, model.nv))
        mujoco.mj_kinematics(model, self.data)
        base = model.body(robot.mjcf_prefix(arm).rstrip("/"))
        self.base_position = self.data.xpos[base.id].copy()  # [3] arm base in the world
        self.base_rotation = self.data.xmat[base.id].reshape(3, 3).copy()  # [3, 3]

    def waist_towards(self, point: np.ndarray) -> float:
        """Waist angle that turns the arm's vertical plane through `point` (world [3])."""
        local = self.base_rotation.T @ (np.asarray(point, dtype=np.float64) - self.base_position)
        return float(np.arctan2(local[1], local[0]))

    def forward(self, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Pinch position [3] and gripper rotation [3, 3] at arm joints `q` [6]."""
        self.data.qpos[self._qpos] = q
        mujoco.mj_kinematics(self.model, self.data)
        mujoco.mj_comPos(self.model, self.data)  # cdof, which mj_jacSite reads
        site_rotation = self.data.site_xmat[self._site].reshape(3, 3).copy()
        return self.data.site_xpos[self._site].copy(), site_rotation

    def solve(
        self,
        position: np.ndarray,
        rotation: np.ndarray,
        seed: np.ndarray,
        *,
        max_iterations: int = 200,
        position_tolerance_m: float = 2e-4,
        orientation_tolerance_rad: float = 2e-3,
        damping: float = 1e-3,
        max_step_rad: float = 0.2,
    ) -> IKResult:
        """Arm joints that put the pinch site at `position` with gripper frame `rotation`.

        Args:
            position: target pinch position [3] in the world frame.
            rotation: target gripper frame [3, 3] (see `gripper_rotation`).
            seed: initial arm joints [6]; the solution is the one DLS reaches from here, so a
                seed near the intended configuration picks the branch (elbow up, no wrist flip).
            max_iterations: step limit.
            position_tolerance_m: convergence threshold on the position error.
            orientation_tolerance_rad: convergence threshold on the orientation error.
            damping: Levenberg-Marquardt damping (squared) of the least-squares step.
            max_step_rad: largest joint change per iteration (keeps steps in the linear zone).

        Returns:
            The best iterate (smallest weighted error) and whether it met the tolerances.
        """
        position = np.asarray(position, dtype=np.float64)
        rotation = np.asarray(rotation, dtype=np.float64)
        q = np.clip(np.asarray(seed, dtype=np.float64), self.lower, self.upper)
        weights = np.array([1.0] * 3 + [ORIENTATION_WEIGHT_M] * 3)
        best = (np.inf, q.copy(), np.inf, np.inf)
        iterations = 0
        while iterations < max_iterations:
            iterations += 1
            pos, rot = self.forward(q)
            err_p = position - pos
            err_r = rotation_error(rot, rotation)
            pos_norm, rot_norm = float(np.linalg.norm(err_p)), float(np.linalg.norm(err_r))
            cost = pos_norm + ORIENTATION_WEIGHT_M * rot_norm
            if cost < best[0]:
                best = (cost, q.copy(), pos_norm, rot_norm)
            if pos_norm < position_tolerance_m and rot_norm < orientation_tolerance_rad:
                break
            mujoco.mj_jacSite(self.model, self.data, self._jacp, self._jacr, self._site)
            jac = (
                np.vstack((self._jacp[:, self._dof], self._jacr[:, self._dof])) * weights[:, None]
            )
            err = np.concatenate((err_p, err_r)) * weights
            step = jac.T @ np.linalg.solve(jac @ jac.T + damping * np.eye(6), err)
            largest = np.max(np.abs(step))
            if largest > max_step_rad:
                step *= max_step_rad / largest
            q = np.clip(q + step, self.lower, self.upper)
        _, q_best, pos_err, rot_err = best
        return IKResult(
            q=q_best,
            position_error_m=pos_err,
            orientation_error_rad=rot_err,
            converged=pos_err < position_tolerance_m and rot_err < orientation_tolerance_rad,
            iterations=iterations,
        )
