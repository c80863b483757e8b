"""The workcell scene: gym-aloha's table and two ViperX arms, plus the project's own objects.

The robot assets are loaded from the installed `gym_aloha` package (never copied into this
repository, and the package is never imported: its `__init__` needs gymnasium). The scene starts
from gym-aloha's joint-space transfer-cube scene (table, lights, cameras, both arms with their
position actuators), drops its single red box, and adds `SceneConfig.objects`: free cubes whose
poses each episode sets.

Invariants:
- The arms are gravity compensated (`gravcomp`): a position target is tracked without the
  steady droop a weak wrist actuator would otherwise have; what is commanded is what is reached.
- A `pinch` site per arm marks the point between the fingertips (`<arm>_pinch`): the point the
  scripted expert places on an object.
- With `test_pattern`, each camera looks at a panel of its own colour (top: red, left wrist:
  green, right wrist: blue) so tests can tell the camera streams apart by pixel colour.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import mujoco
import numpy as np

from oxygen_ros.sim.robot import ARMS, mjcf_prefix

BASE_SCENE = "bimanual_viperx_transfer_cube.xml"
OBJECT_MASS_KG = 0.05
TABLE_HALF_SIZE = (0.6096, 0.381, 0.015)  # gym-aloha's tabletop mesh; its top is at z = 0
TEST_PATTERN_COLOURS = {
    "top": (1.0, 0.0, 0.0, 1.0),
    "left_wrist": (0.0, 1.0, 0.0, 1.0),
    "right_wrist": (0.0, 0.0, 1.0, 1.0),
}


@dataclasses.dataclass(frozen=True)
class ObjectSpec:
    """A free cube on the table."""

    name: str  # body, joint ("<name>_joint") and geom name
    rgba: tuple[float, float, float, float]  # colour
    half_size: float = 0.02  # metres (a 4 cm cube, ALOHA's transfer-cube size)


COLOURS: dict[str, tuple[float, float, float, float]] = {
    "red": (0.9, 0.1, 0.1, 1.0),
    "green": (0.1, 0.75, 0.15, 1.0),
    "blue": (0.1, 0.2, 0.9, 1.0),
}
DEFAULT_OBJECTS = tuple(ObjectSpec(f"{c}_cube", rgba) for c, rgba in COLOURS.items())


@dataclasses.dataclass(frozen=True)
class SceneConfig:
    """What to build."""

    objects: tuple[ObjectSpec, ...] = DEFAULT_OBJECTS  # cubes on the table
    # Pinch site along the gripper link's x axis: the centre of a 4 cm cube grasped top-down
    # from the table with the fingertips 6 mm above it (measured: 0.140 in the gripper frame).
    pinch_offset_m: float = 0.14
    gravity_compensation: bool = True  # gravcomp on every arm body
    test_pattern: bool = False  # a coloured panel in front of each camera (tests)
    top_camera_fovy_deg: float = 50.0  # gym-aloha's 78 degrees shows the cubes as specks


def aloha_assets_dir() -> Path:
    """gym-aloha's `assets/` directory, found without importing the package."""
    spec = importlib.util.find_spec("gym_aloha")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the gym-aloha package is not installed (it ships the ALOHA robot assets); "
            "run scripts/setup.sh"
        )
    assets = Path(next(iter(spec.submodule_search_locations))) / "assets"
    if not (assets / BASE_SCENE).is_file():
        raise FileNotFoundError(f"{assets / BASE_SCENE} is missing from the gym-aloha package")
    return assets


def build_spec(config: SceneConfig) -> mujoco.MjSpec:
    spec = mujoco.MjSpec.from_file(str(aloha_assets_dir() / BASE_SCENE))
    spec.delete(spec.body("box"))
    # Several contacts per convex mesh pair: with one, a grasped cube pivots about the finger
    # axis (tilts up to 26 degrees and slides ~1 cm in the fingers, measured); with several it
    # stays put (< 0.5 degrees, < 0.5 mm over 4 s held), at no measurable cost per step.
    spec.option.enableflags |= mujoco.mjtEnableBit.mjENBL_MULTICCD
    for key in list(spec.keys):  # its qpos has the box's free joint; episodes set the pose
        spec.delete(key)
    # The table top collides as a box: on the mesh (its convex hull) a resting cube sank 2.6 mm
    # and crept 0.3 mm in 3 s (measured); on the box it rests at its half size.
    table_mesh = spec.geom("table")
    table_mesh.contype, table_mesh.conaffinity = 0, 0
    spec.body("table").add_geom(
        name="table_top",
        type=mujoco.mjtGeom.mjGEOM_BOX,
        size=list(TABLE_HALF_SIZE),
        pos=[0.0, 0.0, -TABLE_HALF_SIZE[2]],
        group=3,  # collision only; the mesh is what cameras see
    )
    for obj in config.objects:
        body = spec.worldbody.add_body(name=obj.name, pos=[0.0, 0.5, obj.half_size])
        body.mass = OBJECT_MASS_KG
        body.ipos = [0.0, 0.0, 0.0]  # centre of mass at the body origin (not its position)
        inertia = OBJECT_MASS_KG * (2 * obj.half_size) ** 2 / 6.0  # solid cube
        body.inertia = [inertia] * 3
        body.explicitinertial = True  # the scene's compiler only counts geom groups 4-5
        body.add_freejoint(name=f"{obj.name}_joint")
        body.add_geom(
            name=obj.name,
            type=mujoco.mjtGeom.mjGEOM_BOX,
            size=[obj.half_size] * 3,
            rgba=list(obj.rgba),
            condim=4,
            friction=[1.0, 0.005, 0.0001],
            solref=[0.01, 1.0],
        )
    for arm in ARMS:
        prefix = mjcf_prefix(arm)
        gripper = spec.body(prefix + "gripper_link")
        gripper.add_site(
            name=f"{arm}_pinch",
            pos=[config.pinch_offset_m, 0.0, 0.0],
            size=[0.005] * 3,
            rgba=[0.0, 0.0, 0.0, 0.0],  # invisible: cameras must not see a marker
        )
        if config.gravity_compensation:
            for body in spec.bodies:
                if body.name.startswith(prefix):
                    body.gravcomp = 1.0
    next(c for c in spec.cameras if c.name == "top").fovy = config.top_camera_fovy_deg
    if config.test_pattern:
        _add_test_pattern(spec)
    return spec


def _add_test_pattern(spec: mujoco.MjSpec) -> None:
    panel = dict(type=mujoco.mjtGeom.mjGEOM_BOX, contype=0, conaffinity=0, group=0)
    top = spec.worldbody.add_body(name="test_pattern_top", pos=[0.0, 0.6, 0.55])
    top.add_geom(
        name="test_pattern_top",
        size=[1.0, 1.0, 0.001],
        rgba=list(TEST_PATTERN_COLOURS["top"]),
        **panel,
    )
    for arm in ARMS:
        # A cube on the wrist camera's line of sight, filling the middle of its narrow
        # (20 degree) view.
        gripper = spec.body(mjcf_prefix(arm) + "gripper_link")
        camera = next(c for c in spec.cameras if c.name == f"{arm}_wrist")
        focus = spec.body(mjcf_prefix(arm) + "camera_focus")
        ray = np.asarray(focus.pos) - np.asarray(camera.pos)
        centre = np.asarray(camera.pos) + 0.25 * ray / np.linalg.norm(ray)
        gripper.add_geom(
            name=f"test_pattern_{arm}_wrist",
            pos=centre.tolist(),
            size=[0.04] * 3,
            rgba=list(TEST_PATTERN_COLOURS[f"{arm}_wrist"]),
            **panel,
        )


def build_model(config: SceneConfig = SceneConfig()) -> mujoco.MjModel:
    """Compiles the scene. Rendering-quality settings are left to the renderer's owner."""
    return build_spec(config).compile()
