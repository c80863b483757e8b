"""Finds coloured cubes in a calibrated camera image and places them on the table (ROS-free).

A classical perception module: per colour, the pixels whose dominant channel is that colour's
and whose saturation (max - min channel) is high form the cube's blob; the blob's centroid is
cast as a ray from the calibrated pinhole camera and intersected with the horizontal plane at
the cube's centre height. The output is the cube's (x, y) on the table in the world frame.
`yaws` also estimates each cube's yaw modulo 90 degrees (a square's symmetry): the blob's
pixels are placed on the same plane and the phase of their fourth circular moment about the
centre, sum |r|^4 exp(4 i phi), is 4 (yaw + 45 degrees) for a square (its corners are furthest).

The workcell's table, arms and grippers are grey (saturation near 0) and each cube is one of
three saturated colours (`sim.scene.COLOURS`), so a fixed threshold separates them; on the
rendered 224 x 224 top image a cube covers about 190 pixels.

Camera model (MuJoCo's convention): the camera looks along its frame's -z axis, +y is up in
the image and +x right; `rotation` maps camera-frame vectors to the world (`cam_xmat`), and
the focal length in pixels is (height / 2) / tan(fovy / 2). Pixel (u, v) has its centre at
(u + 0.5, v + 0.5), v counted downwards.

Invariants:
- `detect` never raises on a well-formed image: a colour with too few pixels is None (not
  seen: out of view, occluded, or not there), never a guess.
- A blob's centroid is the mean of its pixel centres; its table position is exact for a flat
  marker at `plane_z` (tested against `project`), and within the side faces' parallax for a
  cube (measured in the tests).
- Nothing here imports rclpy or MuJoCo's renderer; `PinholeCamera.from_mujoco` only reads a
  model and data that the caller has forwarded.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np

# max - min channel (0-255). Measured on the workcell's top camera: 0 everywhere without cubes,
# and no pixel between 25 and 60 in a recorded episode's 86 frames (cube pixels reach 188).
MIN_SATURATION = 60
MIN_PIXELS = 12  # fewer pixels of a colour: not seen


@dataclasses.dataclass(frozen=True)
class PinholeCamera:
    """A calibrated camera: pose in the world, vertical field of view, image size."""

    position: np.ndarray  # [3] world position of the optical centre
    rotation: np.ndarray  # [3, 3] camera-to-world; columns: image right, image up, backwards
    fovy_deg: float
    width: int
    height: int

    @property
    def focal_px(self) -> float:
        return (self.height / 2.0) / np.tan(np.radians(self.fovy_deg) / 2.0)

    @classmethod
    def from_mujoco(cls, model, data, name: str, width: int, height: int) -> PinholeCamera:
        """The named camera of a forwarded MuJoCo model/data, rendered at width x height."""
        camera = data.camera(name)
        return cls(
            position=np.array(camera.xpos, dtype=np.float64),
            rotation=np.array(camera.xmat, dtype=np.float64).reshape(3, 3),
            fovy_deg=float(model.camera(name).fovy[0]),
            width=int(width),
            height=int(height),
        )

    def ray(self, u: float, v: float) -> np.ndarray:
        """World direction (unit) of the ray through pixel coordinates (u, v)."""
        f = self.focal_px
        local = np.array([(u - self.width / 2.0) / f, -(v - self.height / 2.0) / f, -1.0])
        direction = self.rotation @ local
        return direction / np.linalg.norm(direction)

    def project(self, point: np.ndarray) -> tuple[float, float]:
        """Pixel coordinates (u, v) of a world point in front of the camera."""
        local = self.rotation.T @ (np.asarray(point, np.float64) - self.position)
        if local[2] >= 0:
            raise ValueError(f"{point} is behind the camera")
        f = self.focal_px
        return (
            self.width / 2.0 + f * local[0] / -local[2],
            self.height / 2.0 - f * local[1] / -local[2],
        )

    def on_plane_many(self, u: np.ndarray, v: np.ndarray, plane_z: float) -> np.ndarray:
        """[N, 2] world (x, y) where the rays through pixels (u[i], v[i]) meet z = plane_z;
        NaN where a ray never does."""
        f = self.focal_px
        local = np.stack(
            [(u - self.width / 2.0) / f, -(v - self.height / 2.0) / f, -np.ones_like(u)], axis=1
        )
        direction = local @ self.rotation.T
        with np.errstate(divide="ignore", invalid="ignore"):
            t = (plane_z - self.position[2]) / direction[:, 2]
        t = np.where(np.isfinite(t) & (t > 0), t, np.nan)
        return (self.position[None, :] + t[:, None] * direction)[:, :2]

    def on_plane(self, u: float, v: float, plane_z: float) -> np.ndarray | None:
        """World (x, y) where the ray through (u, v) meets z = plane_z (None: it never does)."""
        direction = self.ray(u, v)
        if abs(direction[2]) < 1e-9:
            return None
        t = (plane_z - self.position[2]) / direction[2]
        if t <= 0:
            return None
        return (self.position + t * direction)[:2]


@dataclasses.dataclass(frozen=True)
class Blob:
    """The pixels of one colour: count and centroid (pixel-centre coordinates)."""

    pixels: int
    u: float
    v: float


class CubeDetector:
    """Colour blobs -> table positions for a fixed set of named colours."""

    def __init__(
        self,
        camera: PinholeCamera,
        colours: Mapping[str, tuple[float, ...]],
        plane_z: float,
        min_saturation: int = MIN_SATURATION,
        min_pixels: int = MIN_PIXELS,
    ) -> None:
        """
        Args:
            camera: the calibrated camera the images come from.
            colours: name -> RGB(A) in [0, 1]; each colour's dominant channel must differ.
            plane_z: height (m) of the cubes' centres, where rays meet them.
        """
        self.camera = camera
        self.plane_z = float(plane_z)
        self.min_saturation = int(min_saturation)
        self.min_pixels = int(min_pixels)
        self.channels = {name: int(np.argmax(rgb[:3])) for name, rgb in colours.items()}
        if len(set(self.channels.values())) != len(self.channels):
            raise ValueError(f"colours need distinct dominant channels, got {self.channels}")

    def blobs(self, image: np.ndarray) -> dict[str, Blob | None]:
        """Per colour, its blob in an RGB uint8 image [H, W, 3] (None: too few pixels)."""
        return self.blobs_of(self.pixels(image))

    def blobs_of(
        self, per_colour: Mapping[str, tuple[np.ndarray, np.ndarray] | None]
    ) -> dict[str, Blob | None]:
        """`blobs` from the image's `pixels`."""
        out: dict[str, Blob | None] = {}
        for name, pixels in per_colour.items():
            if pixels is None:
                out[name] = None
            else:
                rows, cols = pixels
                out[name] = Blob(
                    int(rows.size), float(cols.mean() + 0.5), float(rows.mean() + 0.5)
                )
        return out

    def yaws(self, image: np.ndarray) -> dict[str, float | None]:
        """Per colour, the cube's yaw modulo 90 degrees, in radians in [-pi/4, pi/4) (None: not
        seen, or a blob without a square's fourfold shape)."""
        return self.yaws_of(self.pixels(image))

    def yaws_of(
        self, per_colour: Mapping[str, tuple[np.ndarray, np.ndarray] | None]
    ) -> dict[str, float | None]:
        """`yaws` from the image's `pixels`."""
        out: dict[str, float | None] = {}
        for name, pixels in per_colour.items():
            out[name] = None
            if pixels is None:
                continue
            rows, cols = pixels
            points = self.camera.on_plane_many(cols + 0.5, rows + 0.5, self.plane_z)
            points = points[np.all(np.isfinite(points), axis=1)]
            if len(points) < self.min_pixels:
                continue
            r = points - points.mean(axis=0)
            moment = np.sum((r[:, 0] + 1j * r[:, 1]) ** 4)
            if abs(moment) <= 1e-12 * np.sum(np.sum(r**2, axis=1) ** 2):
                continue  # round: no orientation
            yaw = (np.angle(moment) - np.pi) / 4.0
            out[name] = float((yaw + np.pi / 4) % (np.pi / 2) - np.pi / 4)
        return out

    def pixels(self, image: np.ndarray) -> dict[str, tuple[np.ndarray, np.ndarray] | None]:
        """Per colour, (rows, cols) of its pixels (None: too few)."""
        if image.shape != (self.camera.height, self.camera.width, 3):
            raise ValueError(
                f"image {image.shape} does not match the camera "
                f"({self.camera.height}, {self.camera.width}, 3)"
            )
        pixels = image.astype(np.int16)
        saturated = (pixels.max(axis=-1) - pixels.min(axis=-1)) >= self.min_saturation
        dominant = pixels.argmax(axis=-1)
        out: dict[str, tuple[np.ndarray, np.ndarray] | None] = {}
        for name, channel in self.channels.items():
            rows, cols = np.nonzero(saturated & (dominant == channel))
            out[name] = None if rows.size < self.min_pixels else (rows, cols)
        return out

    def place(self, blob: Blob | None) -> np.ndarray | None:
        """A blob's cube on the table: world (x, y), or None (no blob, or no ray to the plane)."""
        return None if blob is None else self.camera.on_plane(blob.u, blob.v, self.plane_z)

    def detect(self, image: np.ndarray) -> dict[str, np.ndarray | None]:
        """Per colour, the cube's world (x, y) on the table, or None when not seen."""
        return {name: self.place(blob) for name, blob in self.blobs(image).items()}


class CubeTracker:
    """The last table position at which each cube was seen: a cube hidden for a while (in a
    gripper's shadow, held up against a camera) keeps the position it was last seen at; a cube
    never seen since `reset` is at `default_xy`."""

    def __init__(self, names: tuple[str, ...], default_xy: tuple[float, float]) -> None:
        self.names = tuple(names)
        self.default_xy = np.asarray(default_xy, np.float64)
        self.reset()

    def reset(self) -> None:
        self._last = {name: self.default_xy.copy() for name in self.names}
        self.seen = dict.fromkeys(self.names, False)

    def update(self, detections: Mapping[str, np.ndarray | None]) -> np.ndarray:
        """Takes one image's detections; returns [x0, y0, x1, y1, ...] in `names` order."""
        for name in self.names:
            found = detections.get(name)
            if found is not None:
                self._last[name] = np.asarray(found, np.float64)
                self.seen[name] = True
        return np.concatenate([self._last[name] for name in self.names])
