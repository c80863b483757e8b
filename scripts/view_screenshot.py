"""Screenshot a running live view (viewer_node) to a PNG, with headless Chromium.

Opens the view's URL (what the viewer node logs as `view: <url>`, or `--from-log` reads it from
a log file), waits until the camera panels show images (coloured pixels in the page's top
half), lets the view run `--settle-s` more seconds, and writes the screenshot, re-encoded with a
palette when it exceeds `--max-bytes`. The browser client is
`oxygen_ros.nodes.viewer.browser` (the tests use the same one).

Usage (with `source scripts/env.sh`):
    python -P scripts/view_screenshot.py 'http://localhost:PORT/?url=...' --out view.png
    python -P scripts/view_screenshot.py --from-log viewer.log --out docs/images/live_view.png
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

import numpy as np

from oxygen_ros.nodes.viewer.browser import Browser, shrink_png

URL_LINE = re.compile(r"view: (http://\S+)")


def url_from_log(path: Path, timeout_s: float) -> str:
    """The URL of the newest `view: <url>` line of `path`, waiting for one up to `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        text = path.read_text(errors="replace") if path.is_file() else ""
        found = URL_LINE.findall(text)
        if found:
            return found[-1]
        if time.monotonic() > deadline:
            raise TimeoutError(f"no 'view: <url>' line in {path} within {timeout_s:.0f} s")
        time.sleep(0.5)


def cameras_shown(rgb: np.ndarray, min_pixels: int = 2000) -> bool:
    """Whether the page's top half has coloured pixels (the viewer's chrome is grey/white)."""
    top = rgb[: rgb.shape[0] // 2].astype(int)
    colourful = (top.max(axis=2) - top.min(axis=2)) > 40
    return int(colourful.sum()) >= min_pixels


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("url", nargs="?", help="the view's URL (or --from-log)")
    parser.add_argument("--from-log", type=Path, help="a log holding the node's 'view:' line")
    parser.add_argument("--out", type=Path, required=True, help="PNG to write")
    parser.add_argument("--width", type=int, default=1600)
    parser.add_argument("--height", type=int, default=1000)
    parser.add_argument("--timeout-s", type=float, default=120.0, help="for the page to load")
    parser.add_argument("--settle-s", type=float, default=5.0, help="then wait this long")
    parser.add_argument("--max-bytes", type=int, default=400_000)
    args = parser.parse_args(argv)
    if (args.url is None) == (args.from_log is None):
        parser.error("give the URL or --from-log, one of them")
    url = args.url or url_from_log(args.from_log, args.timeout_s)
    with Browser(url, width=args.width, height=args.height) as browser:
        started = time.monotonic()
        browser.wait_for_screenshot(cameras_shown, args.timeout_s, "the camera panels")
        print(f"[view_screenshot] page shown after {time.monotonic() - started:.0f} s")
        time.sleep(args.settle_s)
        png = browser.screenshot()
    png = shrink_png(png, args.max_bytes) if len(png) > args.max_bytes else png
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_bytes(png)
    print(f"[view_screenshot] {args.out} ({len(png) / 1e3:.0f} kB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
