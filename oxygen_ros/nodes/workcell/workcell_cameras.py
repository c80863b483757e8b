"""The workcell's cameras at their configured sizes (ROS-free), with render timing.

`Workcell` owns one renderer of its configured image size; a camera configured at another size
gets a renderer of its own here, with the same fast settings (no shadows, reflections or
skybox; the model-level settings are the Workcell's). Every image is HxWx3 uint8 RGB.

Invariants:
- Renderers hold a GL context that is current to the thread that created them: create, use
  and close a `CameraRig` (and its `Workcell`) in one thread.
- `take_render_ms()` returns the mean render time per camera since the previous call.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Mapping

import mujoco
import numpy as np

from oxygen_ros.sim.workcell import Workcell

FAST_FLAGS_OFF = (
    mujoco.mjtRndFlag.mjRND_SHADOW,
    mujoco.mjtRndFlag.mjRND_REFLECTION,
    mujoco.mjtRndFlag.mjRND_SKYBOX,
)


class CameraRig:
    """Renders named cameras of a `Workcell`, each at its own (width, height)."""

    def __init__(self, workcell: Workcell, sizes: Mapping[str, tuple[int, int]]) -> None:
        self.workcell = workcell
        self.sizes = dict(sizes)
        own = (workcell.config.image_width, workcell.config.image_height)
        self._extra: dict[tuple[int, int], mujoco.Renderer] = {}
        visual = workcell.model.vis.global_
        for size in set(self.sizes.values()) - {own}:
            width, height = size
            visual.offwidth = max(visual.offwidth, width)
            visual.offheight = max(visual.offheight, height)
            renderer = mujoco.Renderer(workcell.model, height, width)
            for flag in FAST_FLAGS_OFF:
                renderer.scene.flags[flag] = False
            self._extra[size] = renderer
        self._own = own
        self._ms: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0])

    def render(self, camera: str) -> np.ndarray:
        """An RGB image [height, width, 3] uint8 of `camera` at the current state."""
        started = time.perf_counter()
        size = self.sizes[camera]
        if size == self._own:
            image = self.workcell.render(camera)
        else:
            renderer = self._extra[size]
            renderer.update_scene(self.workcell.data, camera=camera)
            image = renderer.render()
        stats = self._ms[camera]
        stats[0] += (time.perf_counter() - started) * 1e3
        stats[1] += 1
        return image

    def take_render_ms(self) -> dict[str, float]:
        """Mean milliseconds per render of each camera rendered since the last call."""
        out = {name: total / count for name, (total, count) in self._ms.items() if count}
        self._ms.clear()
        return out

    def close(self) -> None:
        for renderer in self._extra.values():
            renderer.close()
        self._extra.clear()
