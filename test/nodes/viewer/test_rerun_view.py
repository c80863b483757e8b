"""The live view's Rerun side (rerun_view, layout) and the browser client's pure helpers:
ports, the URL, layout changes, bounded PNGs, and no rclpy in the ROS-free modules."""

import io
import socket
import subprocess
import sys
import urllib.parse
import urllib.request

import numpy as np
import psutil
import pytest
from PIL import Image

from oxygen_ros.nodes.viewer import layout
from oxygen_ros.nodes.viewer.browser import png_to_rgb, shrink_png
from oxygen_ros.nodes.viewer.rerun_view import RerunView, free_port, view_url

ROS_FREE = (
    "oxygen_ros.nodes.viewer.view_data",
    "oxygen_ros.nodes.viewer.layout",
    "oxygen_ros.nodes.viewer.rerun_view",
    "oxygen_ros.nodes.viewer.browser",
)


def test_view_url_format() -> None:
    url = view_url(9090, "rerun+http://127.0.0.1:9876/proxy")
    assert url == (
        "http://localhost:9090/?url=rerun%2Bhttp%3A%2F%2F127.0.0.1%3A9876%2Fproxy"
        "&manifest_url=data%3Aapplication%2Fjson%2C%5B%5D"
    )
    query = urllib.parse.parse_qs(urllib.parse.urlparse(url).query)
    assert query == {
        "url": ["rerun+http://127.0.0.1:9876/proxy"],
        "manifest_url": ["data:application/json,[]"],
    }


@pytest.fixture(scope="module")
def view():
    view = RerunView(0, 0, "32MiB", ("a",), {"left": ("left_x",)})
    yield view
    view.close()


def test_serves_the_page_and_the_log_on_free_ports(view) -> None:
    assert view.grpc_port != view.web_port
    assert view.grpc_uri == f"rerun+http://127.0.0.1:{view.grpc_port}/proxy"
    assert view.url == view_url(view.web_port, view.grpc_uri)
    with urllib.request.urlopen(f"http://127.0.0.1:{view.web_port}/", timeout=10) as reply:
        page = reply.read().decode(errors="replace")
    assert reply.status == 200 and "<html" in page.lower()
    with socket.create_connection(("127.0.0.1", view.grpc_port), timeout=5):
        pass  # listening


def test_a_port_in_use_is_refused() -> None:
    with socket.socket() as taken:
        taken.bind(("", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(OSError, match=f"web viewer port {port} is not free"):
            RerunView(free_port(), port, "32MiB", (), {})


def test_layout_grows_with_new_slots_and_groups_only(view) -> None:
    assert not view.ensure_layout(["a"], {"left": ("left_x",)})
    assert view.ensure_layout(["a", "b"], {})
    assert view.ensure_layout([], {"right": ("right_x",)})
    assert dict(view.groups) == {"left": ("left_x",), "right": ("right_x",)}
    view.at(1.5)  # logging with the grown layout works
    view.image("b", np.zeros((4, 4, 3), np.uint8))
    view.scalars(layout.arm_path("right", layout.MEASURED), [0.5])


def test_memory_stays_bounded_by_the_server_limit() -> None:
    """200 MiB of images through a server limited to 16 MiB: the process grows far less than
    what was logged (the oldest data is dropped). With a 4 GiB limit the same run grew 224 MiB
    here; RSS stayed flat at ~240 MiB while 1.4 GiB went through a 64 MiB limit."""
    process = psutil.Process()
    view = RerunView(0, 0, "16MiB", ("a",), {})
    image = np.random.default_rng(0).integers(0, 255, (224, 224, 3), dtype=np.uint8)
    count = (200 * 2**20) // image.nbytes
    try:
        for i in range(count):
            view.at(0.01 * i)
            view.image("a", image)
            if i == count // 4:
                view.rec.flush(timeout_sec=10.0)
                warm = process.memory_info().rss
        view.rec.flush(timeout_sec=10.0)
        growth = process.memory_info().rss - warm
    finally:
        view.close()
    assert growth < 64 * 2**20, f"grew {growth / 2**20:.0f} MiB after 150 MiB more logged"


def test_paths() -> None:
    assert layout.camera_path("base_0_rgb") == "cameras/base_0_rgb"
    assert layout.arm_path("left", layout.COMMANDED) == "arms/left/commanded"
    assert len(set(layout.series_colors(12))) == len(layout.PALETTE)


def test_shrink_png_fits_the_budget() -> None:
    rng = np.random.default_rng(0)
    noisy = rng.integers(0, 255, (300, 400, 3), dtype=np.uint8)
    noisy[:, :200] = (200, 30, 30)
    buffer = io.BytesIO()
    Image.fromarray(noisy).save(buffer, format="PNG")
    small = shrink_png(buffer.getvalue(), max_bytes=len(buffer.getvalue()) // 2)
    assert len(small) <= len(buffer.getvalue()) // 2
    rgb = png_to_rgb(small)
    assert rgb.shape == (300, 400, 3)
    assert np.abs(rgb[:, :200].astype(int) - (200, 30, 30)).max() <= 8


def test_the_ros_free_modules_never_import_rclpy() -> None:
    code = (
        "import sys\n"
        + "".join(f"import {m}\n" for m in ROS_FREE)
        + "print('rclpy' in sys.modules)\n"
        + "import oxygen_ros.nodes.viewer.viewer_node\n"  # positive control: the node does
        + "print('rclpy' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True)
    assert done.stdout.split() == ["False", "True"], done.stderr
