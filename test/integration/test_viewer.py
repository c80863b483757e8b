"""viewer_node as a real process over DDS: the test publishes frames, joints, actions and text;
headless Chromium opens the node's URL and its screenshot shows the camera panels filled; bad
input is counted in the node's diagnostics and never stops it serving."""

import math
import os
import re
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from diagnostic_msgs.msg import DiagnosticArray
from harness import ProcessLauncher, SpinningNode, newest_status, wait_for
from sensor_msgs.msg import Image, JointState
from std_msgs.msg import String

from oxygen_ros.msg import ActionChunk, MemoryEntry, ObservationFrame, SpeechToken
from oxygen_ros.nodes.common.runtime import (
    LATCHED_QOS,
    OBSERVATION_QOS,
    RELIABLE_QOS,
    SENSOR_QOS,
    SPEECH_QOS,
    latched_qos,
)
from oxygen_ros.nodes.viewer.browser import CHROMIUM, Browser, png_to_rgb

pytestmark = [pytest.mark.integration, pytest.mark.slow]

JOINTS = ["left_a", "left_b", "right_a", "right_b"]
SLOTS = ["base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb"]
# The published slot images: red and green cameras, the third slot masked.
RED, GREEN = (220, 30, 30), (30, 190, 50)
SIZE = 96
PAGE_TIMEOUT_S = 90.0  # the web viewer's wasm loads in 15-50 s under the software rasterizer
OVERRIDES = f"""
/**:
  ros__parameters:
    joint_names: {JOINTS}
    observation_topic: t_observation
    joint_state_topic: t_joints
    diagnostics_period_s: 0.3
viewer:
  ros__parameters:
    actions_topic: t_actions
    instruction_topic: t_instruction
    current_instruction_topic: t_current_instruction
    speech_topic: t_speech
    memory_topic: t_memory
    episode_status_topic: ""
    image_rate_hz: 10.0
    server_memory_limit: 64MiB
"""


def camera(colour) -> Image:
    rgb = np.zeros((SIZE, SIZE, 3), np.uint8)
    rgb[:] = colour
    rgb[SIZE // 3 : 2 * SIZE // 3, SIZE // 3 : 2 * SIZE // 3] = 255  # not uniform
    return Image(height=SIZE, width=SIZE, encoding="rgb8", step=3 * SIZE, data=rgb.tobytes())


def good_frame(stamp) -> ObservationFrame:
    msg = ObservationFrame(
        image_names=SLOTS,
        images=[camera(RED), camera(GREEN), camera((0, 0, 0))],
        image_valid=[True, True, False],
        joint_names=JOINTS,
        joint_positions=[0.0] * 4,
    )
    msg.header.stamp = stamp
    return msg


class Graph:
    """Publishes what the graph would from the test process, 10 Hz from a thread of its own."""

    PERIOD_S = 0.1

    def __init__(self, node) -> None:
        self.node = node
        self.frames = node.create_publisher(ObservationFrame, "t_observation", OBSERVATION_QOS)
        self.joints = node.create_publisher(JointState, "t_joints", SENSOR_QOS)
        self.actions = node.create_publisher(ActionChunk, "t_actions", RELIABLE_QOS)
        self.speech = node.create_publisher(SpeechToken, "t_speech", SPEECH_QOS)
        self.instruction = node.create_publisher(String, "t_instruction", LATCHED_QOS)
        self.current = node.create_publisher(String, "t_current_instruction", LATCHED_QOS)
        self.memory = node.create_publisher(MemoryEntry, "t_memory", latched_qos(20))
        self.good = threading.Event()  # publishing the good stream
        self.good.set()
        self.ticks = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.PERIOD_S):
            if self.good.is_set():
                self.tick()

    def stamp(self):
        return self.node.get_clock().now().to_msg()

    def tick(self) -> None:
        stamp, t = self.stamp(), 0.1 * self.ticks
        self.ticks += 1
        self.frames.publish(good_frame(stamp))
        joints = JointState(name=JOINTS, position=[math.sin(t), 0.5, math.cos(t), -0.5])
        joints.header.stamp = stamp
        self.joints.publish(joints)
        self.actions.publish(self.chunk([math.sin(t + 0.3), 0.4, math.cos(t + 0.3), -0.4] * 2))
        if self.ticks % 10 == 1:
            request = f"subtask-{self.ticks}"
            for index, word in enumerate(("lift ", "the ", "red ", "cube")):
                msg = SpeechToken(request_id=request, token_index=index, text_delta=word)
                msg.token_ids = [index]
                msg.header.stamp = stamp
                self.speech.publish(msg)
            self.speech.publish(
                SpeechToken(
                    request_id=request,
                    token_index=4,
                    final=True,
                    status=1,
                    text="lift the red cube",
                )
            )

    def chunk(self, actions) -> ActionChunk:
        msg = ActionChunk(joint_names=JOINTS, horizon=len(actions) // 4, actions=actions, dt=0.1)
        msg.header.stamp = self.stamp()
        return msg

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)


@pytest.fixture(scope="module")
def viewer(tmp_path_factory):
    """The viewer node (free ports), the test's publishers and a /diagnostics collector."""
    workdir = tmp_path_factory.mktemp("viewer")
    override = workdir / "override.yaml"
    override.write_text(OVERRIDES)
    launcher = ProcessLauncher(env=dict(os.environ), workdir=workdir)
    node = SpinningNode("test_viewer")
    diagnostics = node.collect(DiagnosticArray, "/diagnostics", 10)
    process = launcher.start(
        "oxygen_ros.nodes.viewer.viewer_node", ros_args=["--params-file", str(override)]
    )
    graph = Graph(node.node)
    try:
        wait_for(lambda: "view: " in process.log() or not process.alive(), 30, "the URL line")
        match = re.search(r"view: (http://\S+)", process.log())
        assert match, process.log()
        graph.instruction.publish(String(data="lift the red cube"))
        graph.current.publish(String(data="lift the red cube"))
        for entry_id in (7, 8, 7):  # a republished entry is shown once
            entry = MemoryEntry(entry_id=entry_id, kind="memory", text="the red cube is up")
            entry.header.stamp.sec = 1  # made in an earlier run
            graph.memory.publish(entry)
        yield process, match.group(1), graph, diagnostics
    finally:
        graph.close()
        launcher.stop_all()
        node.close()


def status(diagnostics) -> dict[str, str]:
    return newest_status(diagnostics, "viewer")


def count(diagnostics, key: str) -> int:
    return int(status(diagnostics).get(key, "0"))


def colour_pixels(rgb: np.ndarray, colour, tolerance: int = 40) -> np.ndarray:
    return (np.abs(rgb.astype(int) - colour) <= tolerance).all(axis=2)


def masked_pixels(rgb: np.ndarray) -> np.ndarray:
    """The MASKED picture's stripes (greys 110 and 150)."""
    grey = (rgb.max(axis=2) - rgb.min(axis=2)) <= 6
    return grey & ((np.abs(rgb[..., 0] - 110.0) <= 12) | (np.abs(rgb[..., 0] - 150.0) <= 12))


URL = re.compile(
    r"http://localhost:\d+/\?url=rerun%2Bhttp%3A%2F%2F127\.0\.0\.1%3A\d+%2Fproxy&manifest_url=\S+"
)


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"no Chromium at {CHROMIUM}")
def test_the_page_shows_the_camera_panels_filled(viewer, tmp_path) -> None:
    process, url, _graph, diagnostics = viewer
    assert URL.fullmatch(url), url
    wait_for(lambda: "url" in status(diagnostics), 10, "the viewer's diagnostics")
    assert status(diagnostics)["url"] == url
    min_pixels = 40 * 40  # each panel shows a 96 px image scaled up to ~200 px

    def panels(rgb: np.ndarray) -> list[np.ndarray]:
        return [colour_pixels(rgb, RED), colour_pixels(rgb, GREEN), masked_pixels(rgb)]

    with Browser(url, width=1280, height=800) as browser:
        try:
            png = browser.wait_for_screenshot(
                lambda rgb: all(m.sum() >= min_pixels for m in panels(rgb)),
                PAGE_TIMEOUT_S,
                "the camera panels to fill",
            )
        finally:
            if browser.last_png:  # kept for a look after a failure
                (tmp_path / "view.png").write_bytes(browser.last_png)
    assert process.alive()
    rgb = png_to_rgb(png)
    height, width = rgb.shape[:2]
    masks = panels(rgb)
    # Each camera in its own panel, left to right along the top: red, green, then MASKED.
    centres = [float(np.median(np.nonzero(m)[1])) for m in masks]
    assert centres[0] < width / 3 < centres[1] < 2 * width / 3 < centres[2], centres
    assert all(np.median(np.nonzero(m)[0]) < height / 2 for m in masks)
    # The published images: the white centre square of the red camera inside its panel.
    ys, xs = np.nonzero(masks[0])
    centre = rgb[int(np.median(ys)), int(np.median(xs))]
    assert (centre >= 230).all(), centre
    assert count(diagnostics, "shown.images") > 0 and count(diagnostics, "shown.masked") > 0


def test_bad_input_is_counted_and_the_node_keeps_serving(viewer) -> None:
    process, url, graph, diagnostics = viewer
    # Positive control first: the good stream is shown and nothing of it is rejected.
    wait_for(
        lambda: (
            count(diagnostics, "received.actions") > 5 and count(diagnostics, "shown.images") > 2
        ),
        30,
        lambda: f"good input shown (status {status(diagnostics)})",
    )
    assert not [k for k in status(diagnostics) if k.startswith("rejected.")], status(diagnostics)
    assert count(diagnostics, "text.cleaned") == 0
    wait_for(lambda: count(diagnostics, "shown.memory") == 2, 10, "the memory entries shown")
    assert count(diagnostics, "received.memory") == 3

    graph.good.clear()  # only bad input now: every bad frame is examined (none rate-limited)
    bad_size = good_frame(graph.stamp())
    bad_size.images[0].data = bytes(100)  # 100 bytes for a 96 x 96 rgb8 image
    bad_encoding = good_frame(graph.stamp())
    bad_encoding.images[1].encoding = "no_such_encoding"
    bad_layout = good_frame(graph.stamp())
    bad_layout.image_valid = [True]
    nan_chunk = graph.chunk([math.nan, 0.0, 0.0, 0.0])
    bad_shape = graph.chunk([0.0] * 3)
    bad_joints = JointState(name=JOINTS, position=[0.0])
    # Best-effort topics: each sent 3 times. A frame with a good slot is shown: the next one is
    # examined only after 1 / image_rate_hz.
    for _ in range(3):
        for msg in (bad_size, bad_encoding, bad_layout):
            graph.frames.publish(msg)
            time.sleep(0.15)
        graph.joints.publish(bad_joints)
    graph.actions.publish(nan_chunk)
    graph.actions.publish(bad_shape)
    graph.instruction.publish(String(data="lift the \x1b[31mred\x07 cube" + "!" * 5000))
    graph.speech.publish(SpeechToken(request_id="junk", token_index=7, text_delta="\x07"))
    expected = (
        "rejected.image_data_length",
        "rejected.image_encoding",
        "rejected.frame_layout",
        "rejected.action_nonfinite",
        "rejected.action_shape",
        "rejected.joint_layout",
        "text.cleaned",
        "speech.gap",
    )
    wait_for(
        lambda: all(count(diagnostics, k) >= 1 for k in expected),
        20,
        lambda: f"bad input counted (status {status(diagnostics)})",
    )
    assert process.alive()
    log = process.log()
    assert "not shown (action_nonfinite)" in log and "not shown (image_data_length)" in log
    assert "Traceback" not in log
    assert count(diagnostics, "rejected.internal_error") == 0

    # Still serving: good input is shown again and the page is there.
    shown = count(diagnostics, "shown.images")
    graph.good.set()
    wait_for(
        lambda: count(diagnostics, "shown.images") > shown,
        15,
        lambda: f"good frames shown again (status {status(diagnostics)})",
    )
    with urllib.request.urlopen(url, timeout=10) as reply:
        assert reply.status == 200
