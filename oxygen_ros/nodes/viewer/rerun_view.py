"""The live view's Rerun side: serves the log over gRPC and the web viewer over HTTP, and logs
what the node hands it (ROS-free).

Rerun (0.41) was chosen because its web viewer is served by the SDK itself and runs offline
(Foxglove's viewer is a hosted web app); LeRobot shows its episodes in Rerun too.

Invariants:
- The page a browser opens is `url`: `http://localhost:<web_port>/?url=<the gRPC URI>&
  manifest_url=<an empty inline list>` (query values percent-encoded); both servers listen on
  every interface of this host.
- Port 0 means a free port, picked here (Rerun would bind 0 but not say which port it got).
  A port in use is refused before serving (Rerun only logs that error): `OSError`, and the
  node does not start. The gRPC server is listening when the constructor returns.
- The gRPC server keeps at most `memory_limit` of log data for browsers that connect later and
  drops the oldest first, so the view's memory stays bounded however long the graph runs (the
  blueprint and the series styles are static: never dropped). A browser that connects late
  gets the newest data first (a software-rendered page on a loaded machine took minutes to
  replay two minutes of history oldest first, showing the past all the while).
- Time: everything is logged at a message's header stamp on the `stamp` timeline, as a
  duration (sim time from 0) or, when the first stamp given to `at` is a wall-clock time
  (after 2001), as a timestamp; the first stamp decides for the recording.
"""

from __future__ import annotations

import datetime
import socket
import time
import urllib.parse
from collections.abc import Mapping, Sequence

import numpy as np
import rerun as rr

from oxygen_ros.nodes.viewer import layout

APPLICATION_ID = "oxygen_ros"
LISTEN_TIMEOUT_S = 10.0
WALL_CLOCK_AFTER_S = 1e9  # a first stamp after 2001 is a wall-clock time, not sim time
# The SDK sends what was logged in chunks (one per entity) this often: a browser's work grows
# with the number of chunks, and a software-rendered page on a loaded machine fell behind the
# live graph with Rerun's 0.2 s; half a second of delay is nothing for a person watching.
FLUSH_TICK_S = 0.5


def free_port() -> int:
    """A TCP port free on every interface now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("", 0))
        return probe.getsockname()[1]


def check_port_free(port: int, what: str) -> None:
    """Raises OSError naming `what` when `port` cannot be bound."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("", port))
        except OSError as exc:
            raise OSError(f"{what} port {port} is not free: {exc.strerror}") from exc


def wait_listening(port: int, timeout_s: float, what: str) -> None:
    """Waits until a TCP connection to localhost:`port` succeeds; OSError after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1.0):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise OSError(f"{what} is not listening on port {port}") from None
            time.sleep(0.05)


# The viewer fetches its examples' manifest from rerun.io and shows an error offline; an empty
# one, inline, keeps it quiet.
NO_EXAMPLES = "data:application/json,[]"


def view_url(web_port: int, grpc_uri: str) -> str:
    """The page that shows the log served at `grpc_uri`."""
    query = urllib.parse.urlencode({"url": grpc_uri, "manifest_url": NO_EXAMPLES})
    return f"http://localhost:{web_port}/?{query}"


class RerunView:
    """One Rerun recording, served to browsers, with the view's layout."""

    def __init__(
        self,
        grpc_port: int,
        web_port: int,
        memory_limit: str,
        slots: Sequence[str],
        groups: Mapping[str, Sequence[str]],
    ) -> None:
        self.grpc_port = grpc_port or free_port()
        self.web_port = web_port or free_port()
        check_port_free(self.grpc_port, "gRPC")
        check_port_free(self.web_port, "web viewer")
        self.rec = rr.RecordingStream(
            APPLICATION_ID,
            batcher_config=rr.ChunkBatcherConfig(
                flush_tick=datetime.timedelta(seconds=FLUSH_TICK_S)
            ),
        )
        self._slots, self._groups = tuple(slots), {g: tuple(n) for g, n in groups.items()}
        self._wall_clock: bool | None = None  # how the stamp timeline counts (first stamp)
        self.grpc_uri = self.rec.serve_grpc(
            grpc_port=self.grpc_port,
            server_memory_limit=memory_limit,
            newest_first=True,
            default_blueprint=layout.blueprint(self._slots, self._groups),
        )
        wait_listening(self.grpc_port, LISTEN_TIMEOUT_S, "Rerun's gRPC server")
        rr.serve_web_viewer(web_port=self.web_port, open_browser=False, connect_to=self.grpc_uri)
        self.url = view_url(self.web_port, self.grpc_uri)
        self._log_styles()

    # ------------------------------------------------------------------------ layout
    def ensure_layout(self, slots: Sequence[str], groups: Mapping[str, Sequence[str]]) -> bool:
        """Adds panels for slots and joint groups the layout lacks (sends the blueprint
        again); returns whether it changed."""
        new_slots = tuple(s for s in slots if s not in self._slots)
        new_groups = {g: tuple(n) for g, n in groups.items() if g not in self._groups}
        if not new_slots and not new_groups:
            return False
        self._slots += new_slots
        self._groups.update(new_groups)
        self.rec.send_blueprint(layout.blueprint(self._slots, self._groups), make_active=True)
        self._log_styles()
        return True

    @property
    def groups(self) -> Mapping[str, tuple[str, ...]]:
        return self._groups

    def _log_styles(self) -> None:
        for group, names in self._groups.items():
            colors = layout.series_colors(len(names))
            self.rec.log(
                layout.arm_path(group, layout.MEASURED),
                rr.SeriesLines(colors=colors, names=list(names), widths=[2.0] * len(names)),
                static=True,
            )
            self.rec.log(
                layout.arm_path(group, layout.COMMANDED),
                rr.SeriesLines(
                    colors=colors, names=[f"{n} cmd" for n in names], widths=[1.0] * len(names)
                ),
                static=True,
            )

    # ------------------------------------------------------------------------ logging
    def at(self, stamp_s: float) -> None:
        """Logs what follows at `stamp_s` on the stamp timeline."""
        if self._wall_clock is None:
            self._wall_clock = stamp_s > WALL_CLOCK_AFTER_S
        if self._wall_clock:
            self.rec.set_time(layout.TIMELINE, timestamp=stamp_s)
        else:
            self.rec.set_time(layout.TIMELINE, duration=stamp_s)

    def image(self, slot: str, rgb: np.ndarray) -> None:
        # Raw pixels: JPEG-compressed images were drawn pale behind a decoding indicator by
        # the web viewer under a software rasterizer, the model's images are small anyway.
        self.rec.log(layout.camera_path(slot), rr.Image(rgb))

    def document(self, path: str, markdown: str) -> None:
        self.rec.log(path, rr.TextDocument(markdown, media_type=rr.MediaType.MARKDOWN))

    def line(self, path: str, text: str, level: str = "INFO") -> None:
        self.rec.log(path, rr.TextLog(text, level=level))

    def scalars(self, path: str, values: Sequence[float] | np.ndarray) -> None:
        self.rec.log(path, rr.Scalars(np.asarray(values, dtype=np.float64)))

    def close(self) -> None:
        self.rec.flush(timeout_sec=2.0)
        self.rec.disconnect()
