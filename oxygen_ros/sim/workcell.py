"""The workcell's physics and cameras (ROS-free): MuJoCo state, position targets, rendering.

One `Workcell` owns one `MjModel`/`MjData` pair and one offscreen renderer. It knows nothing of
tasks or policies: a caller sets the episode's initial state (`reset`), sets 14-joint position
targets (`set_targets`), advances time (`step`) and reads joints, objects and images.

Invariants:
- `time` (seconds) never goes backwards, also across `reset`: it is the clock the sim node
  publishes on `/clock`, and ROS nodes must never see time jump back.
- Targets are clipped to the joint limits before they reach the actuators (`limits`).
- MuJoCo's warnings are logged (logger `oxygen_ros.sim`) instead of written to the working
  directory.
- Rendering uses the fast settings measured on these CPUs (no shadows, reflections, skybox or
  offscreen multisampling); `render` returns a fresh HxWx3 uint8 RGB array.
"""

from __future__ import annotations

import dataclasses
import logging

import mujoco
import numpy as np

from oxygen_ros.sim import robot
from oxygen_ros.sim.scene import SceneConfig, build_model

CAMERAS = ("top", "left_wrist", "right_wrist")
DIVERGENCE_WARNINGS = (
    mujoco.mjtWarning.mjWARN_BADQPOS,
    mujoco.mjtWarning.mjWARN_BADQVEL,
    mujoco.mjtWarning.mjWARN_BADQACC,
)
_log = logging.getLogger("oxygen_ros.sim")
# MuJoCo's warnings go to the log, not to a MUJOCO_LOG.TXT in the working directory.
mujoco.set_mju_user_warning(lambda message: _log.warning("MuJoCo: %s", message))


@dataclasses.dataclass(frozen=True)
class WorkcellConfig:
    """Scene and camera settings."""

    scene: SceneConfig = dataclasses.field(default_factory=SceneConfig)  # objects, pinch, pattern
    image_width: int = 224  # rendered image columns
    image_height: int = 224  # rendered image rows
    cameras: tuple[str, ...] = CAMERAS  # MJCF camera names that `render` accepts
    render: bool = True  # False: no renderer at all (physics-only rollouts)


@dataclasses.dataclass(frozen=True)
class ObjectPose:
    """Pose of a free object in the world frame."""

    position: np.ndarray  # [3] metres
    quaternion: np.ndarray  # [4] w, x, y, z


class Workcell:
    """Physics + cameras of the bimanual workcell."""

    def __init__(self, config: WorkcellConfig = WorkcellConfig()) -> None:
        self.config = config
        self.model = build_model(config.scene)
        self.data = mujoco.MjData(self.model)
        m = self.model
        self._arm_qpos = np.array([self._joint_qpos(n) for n in self._arm_joint_names()])
        self._arm_dof = np.array([self._joint_dof(n) for n in self._arm_joint_names()])
        self._left_finger = {
            a: self._joint_qpos(robot.mjcf_prefix(a) + "left_finger") for a in robot.ARMS
        }
        self._right_finger = {
            a: self._joint_qpos(robot.mjcf_prefix(a) + "right_finger") for a in robot.ARMS
        }
        self._finger_dof = {
            a: self._joint_dof(robot.mjcf_prefix(a) + "left_finger") for a in robot.ARMS
        }
        self._actuator = {
            mujoco.mj_id2name(m, mujoco.mjtObj.mjOBJ_JOINT, m.actuator_trnid[i, 0]): i
            for i in range(m.nu)
        }
        self._objects = {o.name: self._joint_qpos(f"{o.name}_joint") for o in config.scene.objects}
        self._object_dof = {
            o.name: self._joint_dof(f"{o.name}_joint") for o in config.scene.objects
        }
        self.lower, self.upper = self._limits()
        for name in config.cameras:
            if mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_CAMERA, name) < 0:
                raise ValueError(f"camera {name!r} is not in the scene")
        self.instabilities = 0  # physics divergences (MuJoCo reset the state), see `step`
        self._renderer: mujoco.Renderer | None = None
        if config.render:
            m.vis.quality.offsamples = 0
            # Near clipping plane at 2 % of the model extent (about 3 cm), not gym-aloha's 10 %:
            # the wrist cameras must see the fingers and what is between them.
            m.vis.map.znear = 0.02
            m.vis.global_.offwidth = max(m.vis.global_.offwidth, config.image_width)
            m.vis.global_.offheight = max(m.vis.global_.offheight, config.image_height)
            self._renderer = mujoco.Renderer(m, config.image_height, config.image_width)
            flags = self._renderer.scene.flags
            for flag in (
                mujoco.mjtRndFlag.mjRND_SHADOW,
                mujoco.mjtRndFlag.mjRND_REFLECTION,
                mujoco.mjtRndFlag.mjRND_SKYBOX,
            ):
                flags[flag] = False
        self.reset(robot.HOME, {})

    # ------------------------------------------------------------------ layout
    @staticmethod
    def _arm_joint_names() -> list[str]:
        return [robot.mjcf_prefix(a) + j for a in robot.ARMS for j in robot.ARM_JOINTS]

    def _joint_qpos(self, name: str) -> int:
        jid = mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_JOINT, name)
        if jid < 0:
            raise ValueError(f"joint {name!r} is not in the scene")
        return int(self.model.jnt_qposadr[jid])

    def _joint_dof(self, name: str) -> int:
        jid = mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_JOINT, name)
        return int(self.model.jnt_dofadr[jid])

    def _limits(self) -> tuple[np.ndarray, np.ndarray]:
        lower = np.zeros(robot.NUM_JOINTS)
        upper = np.ones(robot.NUM_JOINTS)
        for k, name in enumerate(self._arm_joint_names()):
            jid = mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_JOINT, name)
            arm = k // len(robot.ARM_JOINTS)
            col = arm * robot.JOINTS_PER_ARM + k % len(robot.ARM_JOINTS)
            lower[col], upper[col] = self.model.jnt_range[jid]
        return lower, upper

    def _arm_columns(self) -> np.ndarray:
        return np.array(
            [
                i
                for i in range(robot.NUM_JOINTS)
                if robot.JOINT_NAMES[i].split("_", 1)[1] != "gripper"
            ]
        )

    # ------------------------------------------------------------------ state
    @property
    def time(self) -> float:
        """Simulated seconds since the workcell was created (never reset)."""
        return float(self.data.time)

    @property
    def timestep(self) -> float:
        return float(self.model.opt.timestep)

    def reset(self, joints: np.ndarray, objects: dict[str, tuple[float, float, float]]) -> None:
        """Puts the robot at `joints` (14, at rest, targets equal) and each named object at
        (x, y, yaw) on the table; objects not named are parked on the table's far right corner,
        outside the top camera's view and the arms' reach. Time keeps running."""
        now = self.data.time
        mujoco.mj_resetData(self.model, self.data)
        self.data.time = now
        for index, (name, adr) in enumerate(self._objects.items()):
            half = next(o.half_size for o in self.config.scene.objects if o.name == name)
            x, y, yaw = objects.get(name, (0.56, 0.26 + 0.06 * index, 0.0))
            self.data.qpos[adr : adr + 3] = (x, y, half)
            self.data.qpos[adr + 3 : adr + 7] = (np.cos(yaw / 2), 0.0, 0.0, np.sin(yaw / 2))
        self._write_joints(np.asarray(joints, dtype=np.float64))
        self.set_targets(joints)
        mujoco.mj_forward(self.model, self.data)

    def _write_joints(self, q: np.ndarray) -> None:
        cols = self._arm_columns()
        self.data.qpos[self._arm_qpos] = q[cols]
        for arm in robot.ARMS:
            finger = robot.gripper_to_finger(q[robot.gripper_index(arm)])
            self.data.qpos[self._left_finger[arm]] = finger
            self.data.qpos[self._right_finger[arm]] = -finger

    def set_targets(self, q: np.ndarray) -> np.ndarray:
        """Sets the 14 position targets (clipped to the limits); returns what was applied."""
        q = np.clip(np.asarray(q, dtype=np.float64), self.lower, self.upper)
        for arm in robot.ARMS:
            prefix = robot.mjcf_prefix(arm)
            for j, joint in enumerate(robot.ARM_JOINTS):
                col = robot.arm_slice(arm).start + j
                self.data.ctrl[self._actuator[prefix + joint]] = q[col]
            finger = robot.gripper_to_finger(q[robot.gripper_index(arm)])
            self.data.ctrl[self._actuator[prefix + "left_finger"]] = finger
            self.data.ctrl[self._actuator[prefix + "right_finger"]] = -finger
        return q

    def step(self, duration_s: float) -> None:
        """Advances physics by `duration_s`, rounded to whole timesteps (at least one).

        If the physics diverged (MuJoCo then resets the state, time included), the time is put
        back where it would have been and `instabilities` counts it: the clock stays monotonic
        and the robot is back at its model's rest state, which the caller should treat as a
        failed episode."""
        steps = max(1, round(duration_s / self.model.opt.timestep))
        expected = self.data.time + steps * self.model.opt.timestep
        bad = self._divergences()
        mujoco.mj_step(self.model, self.data, nstep=steps)
        if self._divergences() != bad:
            self.instabilities += 1
            self.data.time = expected

    def _divergences(self) -> int:
        return sum(self.data.warning[w].number for w in DIVERGENCE_WARNINGS)

    def joint_positions(self) -> np.ndarray:
        """The 14 joints in `robot.JOINT_NAMES` order (gripper normalised)."""
        q = np.empty(robot.NUM_JOINTS)
        q[self._arm_columns()] = self.data.qpos[self._arm_qpos]
        for arm in robot.ARMS:
            q[robot.gripper_index(arm)] = robot.finger_to_gripper(
                self.data.qpos[self._left_finger[arm]]
            )
        return q

    def joint_velocities(self) -> np.ndarray:
        v = np.empty(robot.NUM_JOINTS)
        v[self._arm_columns()] = self.data.qvel[self._arm_dof]
        for arm in robot.ARMS:
            v[robot.gripper_index(arm)] = self.data.qvel[self._finger_dof[arm]] / (
                robot.FINGER_OPEN_M - robot.FINGER_CLOSED_M
            )
        return v

    def object_pose(self, name: str) -> ObjectPose:
        adr = self._objects[name]
        return ObjectPose(
            self.data.qpos[adr : adr + 3].copy(), self.data.qpos[adr + 3 : adr + 7].copy()
        )

    def object_names(self) -> tuple[str, ...]:
        return tuple(self._objects)

    def site_position(self, name: str) -> np.ndarray:
        return self.data.site(name).xpos.copy()

    def touching(self, geom_prefix: str, object_name: str) -> bool:
        """True when a geom whose name starts with `geom_prefix` touches `object_name`."""
        m, d = self.model, self.data
        target = mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_GEOM, object_name)
        for i in range(d.ncon):
            g1, g2 = d.contact[i].geom1, d.contact[i].geom2
            other = g2 if g1 == target else g1 if g2 == target else -1
            if other >= 0:
                name = mujoco.mj_id2name(m, mujoco.mjtObj.mjOBJ_GEOM, other) or ""
                if name.startswith(geom_prefix):
                    return True
        return False

    def physics_state(self) -> np.ndarray:
        """Full integration state (time, qpos, qvel, act, warm start, controls...): restoring it
        replays the simulation bit for bit (recording, alignment checks)."""
        size = mujoco.mj_stateSize(self.model, mujoco.mjtState.mjSTATE_INTEGRATION)
        state = np.empty(size)
        mujoco.mj_getState(self.model, self.data, state, mujoco.mjtState.mjSTATE_INTEGRATION)
        return state

    def set_physics_state(self, state: np.ndarray) -> None:
        mujoco.mj_setState(
            self.model,
            self.data,
            np.asarray(state, dtype=np.float64),
            mujoco.mjtState.mjSTATE_INTEGRATION,
        )
        mujoco.mj_forward(self.model, self.data)

    # ------------------------------------------------------------------ cameras
    def render(self, camera: str) -> np.ndarray:
        """An RGB image [H, W, 3] uint8 from `camera` at the current state."""
        if self._renderer is None:
            raise RuntimeError("this workcell was created with render=False")
        if camera not in self.config.cameras:
            raise ValueError(f"unknown camera {camera!r}; cameras: {self.config.cameras}")
        self._renderer.update_scene(self.data, camera=camera)
        return self._renderer.render()

    def close(self) -> None:
        """Frees the renderer's GL context (closing explicitly avoids EGL errors at exit)."""
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None
