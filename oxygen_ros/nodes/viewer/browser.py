"""A small headless-Chromium client over the DevTools protocol: open a URL, wait until a
screenshot satisfies a condition, keep that screenshot as a PNG.

Rerun's web viewer loads a wasm bundle that takes 30-50 s of real time under Chromium's
software rasterizer on these machines, so `chromium --screenshot` (which captures as soon as
the page's load event fires) shows only the loading screen. Here the browser runs with a
DevTools endpoint (a free port Chromium picks itself and writes to `DevToolsActivePort`), the
page is driven over its websocket (`websockets`' synchronous client) and screenshots are
polled with `Page.captureScreenshot` until the caller's predicate holds.

Invariants:
- The browser is a child process with a profile directory of its own, removed (and the
  process ended) by `close()` or when the `with` block ends, also after an error.
- Every wait has a deadline; a timeout raises `TimeoutError` naming what did not happen and
  keeps the last screenshot (`last_png`) for the caller to save.
- No ROS import: the tests and `scripts/view_screenshot.py` use it alike.
"""

from __future__ import annotations

import base64
import contextlib
import io
import itertools
import json
import shutil
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import numpy as np
from PIL import Image

CHROMIUM = "/usr/bin/chromium"
# WebGL through SwiftShader (no GPU here): without these the viewer's canvas stays black.
CHROMIUM_FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-extensions",
    "--disable-background-networking",
    "--mute-audio",
    "--hide-scrollbars",
    "--use-gl=angle",
    "--use-angle=swiftshader",
    "--enable-unsafe-swiftshader",
    "--remote-allow-origins=*",
    "--remote-debugging-port=0",
)
START_TIMEOUT_S = 30.0  # Chromium writes its DevTools port within a second or two
COMMAND_TIMEOUT_S = 30.0  # one DevTools command (a screenshot of a busy page: ~1 s)


class Browser:
    """One headless Chromium showing `url` in one page, driven over the DevTools protocol (the
    page is opened at start: a navigation of a running page's target detached it here)."""

    def __init__(
        self, url: str, width: int = 1600, height: int = 1000, chromium: str = CHROMIUM
    ) -> None:
        from websockets.sync.client import connect

        self.width, self.height = width, height
        self.last_png: bytes | None = None
        self._ids = itertools.count(1)
        self._resources = contextlib.ExitStack()  # the websocket
        self._profile = Path(tempfile.mkdtemp(prefix="oxygen_view_chromium_"))
        self._log = (self._profile / "chromium.log").open("wb")
        self._process = subprocess.Popen(
            [
                chromium,
                *CHROMIUM_FLAGS,
                f"--user-data-dir={self._profile}",
                f"--window-size={width},{height}",
                url,
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        try:
            port = self._devtools_port()
            self._ws = self._resources.enter_context(
                connect(self._page_websocket(port), max_size=None, open_timeout=10)
            )
            self.command(
                "Emulation.setDeviceMetricsOverride",
                width=width,
                height=height,
                deviceScaleFactor=1,
                mobile=False,
            )
        except BaseException:
            self.close()
            raise

    def _devtools_port(self) -> int:
        port_file = self._profile / "DevToolsActivePort"
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"chromium exited with code {self._process.returncode}")
            lines = port_file.read_text().split() if port_file.is_file() else []
            if lines and lines[0].isdigit():
                return int(lines[0])
            time.sleep(0.05)
        raise TimeoutError(f"chromium wrote no DevTools port within {START_TIMEOUT_S:.0f} s")

    def _page_websocket(self, port: int) -> str:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=5) as r:
                pages = [t for t in json.load(r) if t.get("type") == "page"]
            if pages:
                return pages[0]["webSocketDebuggerUrl"]
            if time.monotonic() > deadline:
                raise TimeoutError("chromium opened no page")
            time.sleep(0.05)

    def command(self, method: str, **params) -> dict:
        """Sends one DevTools command and returns its result (events in between are
        skipped)."""
        ident = next(self._ids)
        self._ws.send(json.dumps({"id": ident, "method": method, "params": params}))
        deadline = time.monotonic() + COMMAND_TIMEOUT_S
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no answer to {method} within {COMMAND_TIMEOUT_S:.0f} s")
            reply = json.loads(self._ws.recv(timeout=remaining))
            if reply.get("id") == ident:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    def screenshot(self) -> bytes:
        """The page as a PNG, now."""
        data = self.command("Page.captureScreenshot", format="png")["data"]
        self.last_png = base64.b64decode(data)
        return self.last_png

    def wait_for_screenshot(
        self,
        predicate: Callable[[np.ndarray], bool],
        timeout_s: float,
        what: str,
        poll_s: float = 2.0,
    ) -> bytes:
        """Screenshots every `poll_s` until `predicate(rgb array)` holds; returns that PNG.
        Raises TimeoutError naming `what` after `timeout_s` (`last_png` keeps the last)."""
        deadline = time.monotonic() + timeout_s
        while True:
            png = self.screenshot()
            if predicate(png_to_rgb(png)):
                return png
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")
            time.sleep(poll_s)

    def close(self) -> None:
        self._resources.close()
        if self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(5)
        self._log.close()
        shutil.rmtree(self._profile, ignore_errors=True)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def png_to_rgb(png: bytes) -> np.ndarray:
    """A PNG as a uint8 [h, w, 3] array."""
    return np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))


def shrink_png(png: bytes, max_bytes: int) -> bytes:
    """`png` re-encoded with an adaptive palette (256, then fewer colours) until it fits in
    `max_bytes` (the last try is returned if none does)."""
    image = Image.open(io.BytesIO(png)).convert("RGB")
    out = png
    for colours in (256, 128, 64):
        buffer = io.BytesIO()
        image.quantize(colours, method=Image.Quantize.MEDIANCUT).save(
            buffer, format="PNG", optimize=True
        )
        out = buffer.getvalue()
        if len(out) <= max_bytes:
            break
    return out
