"""The inference node's action publisher and watchdog (ROS-free: the node passes a `publish`
function and its clock).

Two kinds of message, told apart by their trigger (`ActionChunk.trigger`):
- TICK: at `action_rate_hz` on absolute deadlines (deadline k = first + k * period), the
  current chunk from its first row at or after the publish time (re-based to that time).
- NEW_CHUNK: the engine thread hands a chunk over (`hand_off`) the moment it is denoised,
  before the frame's language work; the publisher thread wakes at once, offers it to the
  `ActionStream` (alignment, blending, clamps) and publishes it. The ticks go on on their own
  schedule: a hand-off never moves a deadline.

Immediate publish: one publishing thread and a one-slot mailbox.
- `hand_off` (engine thread) stores the chunk in the mailbox and notifies a condition; it
  builds no message and writes nothing to DDS, so it holds the GIL for microseconds. A chunk
  still in the mailbox when the next one arrives is replaced (`chunks_superseded`): only the
  newest matters.
- Only the publisher thread (`run`, one `service` per wake-up) calls `publish`. Each wake-up
  first empties the mailbox (offer + publish the new chunk), then publishes a tick if one is
  due. So a handed-off chunk is published before any tick that comes after the hand-off, one
  thread assigns the sequence numbers (strictly increasing, no gaps), and no lock is held
  across `publish`.
- One lock (the mailbox condition's) guards the mailbox, the stream and the watchdog. The
  publisher thread holds it for an offer or a slice (well under a millisecond); the engine
  thread for the hand-off; the node's parameter and diagnostics callbacks to reconfigure or
  read.

Late ticks: a tick is late when the publisher gets to it more than `LATE_TOLERANCE_PERIODS`
periods after its deadline. A late tick is skipped and counted (`action_ticks_skipped`), never
sent afterwards: the next message is the first tick whose deadline is still within the
tolerance. Half a period is where a tick lands nearer the next deadline than its own: up to
there it still fills its own slot (consecutive ticks stay at least half a period apart, the
rate holds through GIL and scheduling delays of a few milliseconds); beyond it, sending it
would make two messages in a burst carrying nearly the same rows, a catch-up.

Watchdog: fed by a hand-off whose observation was at most `watchdog_timeout_s` old when the
engine handed it over; armed by the first feed; tripped while the last feed is older than the
timeout. At the trip the stream takes a hold of the last measured joint state
(`ActionStream.offer_hold`: `HOLD_CHUNK_ID`, the same clamps as any chunk) and the tick sends
it: an explicit hold that supersedes the model rows consumers may have buffered. While
tripped, `watchdog_policy` decides what the following ticks send: `stop` nothing, `hold` the
hold (renewed before it expires). A chunk handed over while tripped (its observation was not
fresh) is taken into the stream, not published. The measured joint state
(`set_hold_positions`, the newest frame's) is also where a chunk's velocity limits start when
no previous chunk is live.

Stops: while any stop reason is engaged (`set_stop`: "estop" from the emergency stop inputs,
"inactive" from the node's lifecycle, "canceled" when an instruction goal is canceled) the
publisher sends a hold of the measured pose once, at the first reason, then nothing: ticks are
empty (`action_ticks_empty.<reason>`) and handed-off chunks are dropped unpublished
(`new_chunk_unpublished.<reason>`), never entering the stream. When the last reason is
released, ticks go on from the hold until the next fresh chunk, whose velocity limits start
there. The reason named in counters is "estop" while that one is engaged, else the first in
sorted order.

Nothing stale is published (the `ActionStream` invariants). A tick with nothing to send is
counted by reason (`action_ticks_empty.<reason>`: no_chunk, stale, exhausted, watchdog): a
starvation event; so is a new chunk that cannot be published (`new_chunk_unpublished.<reason>`).
"""

from __future__ import annotations

import collections
import dataclasses
import math
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from oxygen_ros.engine.action_stream import (
    HOLD_CHUNK_ID,
    ActionStream,
    RejectedChunkError,
    Slice,
    StreamConfig,
)
from oxygen_ros.nodes.common.sliding_window import SlidingWindow

TRIGGER_TICK = 0  # ActionChunk.TRIGGER_TICK
TRIGGER_NEW_CHUNK = 1  # ActionChunk.TRIGGER_NEW_CHUNK
LATE_TOLERANCE_PERIODS = 0.5  # a tick later than this many periods is skipped (docstring)
RATE_WINDOW_S = 2.0  # the tick rate in diagnostics is over this many seconds
# Parameters read live on every use (the node's NodeParameters, or a dict in tests).
ESTOP = "estop"  # the emergency stop's stop reason (`set_stop`)
PARAMETERS = ("action_rate_hz", "watchdog_timeout_s", "watchdog_policy", "stats_window_s")

PublishFn = Callable[[Slice, int, int], None]  # (piece, sequence, trigger)


@dataclasses.dataclass(frozen=True)
class TickPoll:
    """What `TickClock.poll` decided."""

    skipped: int  # late ticks given up since the previous poll
    deadline: float | None  # the deadline of the tick to publish now; None: none is due


class TickClock:
    """Absolute tick deadlines on a monotonic clock; decides which tick is due or late."""

    def __init__(self, start: float, period_s: float) -> None:
        self.next_deadline = start + period_s

    def poll(self, t: float, period_s: float) -> TickPoll:
        """At time `t`: skips the ticks more than `LATE_TOLERANCE_PERIODS` late, then returns
        the next one if its deadline has come. `period_s` may differ from the last poll's
        (a runtime rate change): deadlines go on from the next one with the new period."""
        skipped = 0
        late_by = t - self.next_deadline - LATE_TOLERANCE_PERIODS * period_s
        if late_by > 0:
            skipped = math.ceil(late_by / period_s)
            self.next_deadline += skipped * period_s
        if t < self.next_deadline:
            return TickPoll(skipped, None)
        deadline = self.next_deadline
        self.next_deadline += period_s
        return TickPoll(skipped, deadline)


class Watchdog:
    """Tripped while no fresh observation was used for longer than the timeout."""

    def __init__(self) -> None:
        self.state = "starting"  # starting (not armed yet) | ok | tripped
        self.trips = 0
        self._fed: float | None = None

    def feed(self, now: float) -> None:
        """A fresh observation was used at `now` (arms the watchdog)."""
        self._fed = now

    def check(self, now: float, timeout_s: float) -> tuple[bool, str]:
        """Returns (tripped, transition): transition is "tripped", "recovered" or ""."""
        if self._fed is None:
            return False, ""
        tripped = now - self._fed > timeout_s
        state = "tripped" if tripped else "ok"
        transition = ""
        if state != self.state:
            if tripped:
                self.trips += 1
                transition = "tripped"
            elif self.state == "tripped":
                transition = "recovered"
            self.state = state
        return tripped, transition


@dataclasses.dataclass(frozen=True)
class HandOff:
    """A chunk from the engine thread, waiting in the mailbox."""

    actions: np.ndarray  # float [A, J], row 0 at the observation time
    observation_stamp: float  # seconds, the node's clock
    latency_s: float  # observation stamp -> hand-off, seconds (the engine's measure)
    handed_at: float  # monotonic seconds of the hand-off
    task: int = 0  # the task (instruction) it was inferred for (`ActionStream.offer`)


class ActionPublisher:
    """Publishes ticks and new chunks, runs the watchdog; see the module docstring.

    `params` is read live (keys in `PARAMETERS`); `publish(piece, sequence, trigger)` sends one
    message; `clock()` is the node's clock (observation stamps, row times); `monotonic()` times
    the tick deadlines. `on_reject(reason, message)` hears of refused chunks, `on_watchdog(
    transition)` of watchdog transitions ("tripped", "recovered"), both in the publisher thread.
    """

    def __init__(
        self,
        stream_config: StreamConfig,
        horizon: int,
        params: Mapping[str, Any],
        publish: PublishFn,
        clock: Callable[[], float],
        *,
        monotonic: Callable[[], float] = time.monotonic,
        on_reject: Callable[[str, str], None] | None = None,
        on_watchdog: Callable[[str], None] | None = None,
    ) -> None:
        self._stream = ActionStream(stream_config)
        self._horizon = horizon
        self._params = params
        self._publish = publish
        self._clock = clock
        self._monotonic = monotonic
        self._on_reject = on_reject or (lambda reason, message: None)
        self._on_watchdog = on_watchdog or (lambda transition: None)
        self._cond = threading.Condition()  # guards everything below but the publisher's own
        self._mailbox: HandOff | None = None
        self._stopping = False
        self._watchdog = Watchdog()
        self._hold_positions: np.ndarray | None = None
        self._stops: set[str] = set()  # engaged stop reasons (docstring, "Stops")
        self._stop_hold_due = False
        self._counters: collections.Counter[str] = collections.Counter()
        # The publisher thread's own state.
        self._ticks = TickClock(monotonic(), 1.0 / params["action_rate_hz"])
        self._sequence = 0
        self._tick_times = SlidingWindow(RATE_WINDOW_S)
        self._tick_lateness = SlidingWindow(params["stats_window_s"])
        self._coverage = SlidingWindow(params["stats_window_s"])
        self._chunks = SlidingWindow(params["stats_window_s"])
        self._handoff_delay = SlidingWindow(params["stats_window_s"])

    # ------------------------------------------------------------------ other threads
    def hand_off(
        self,
        actions: np.ndarray,
        observation_stamp: float,
        latency_s: float,
        handed_at: float | None = None,
        task: int = 0,
    ) -> None:
        """Engine thread: a chunk the engine just denoised; the publisher thread offers and
        publishes it at once. Feeds the watchdog when the observation was fresh. `handed_at`:
        monotonic time of the engine's hand-off when it happened elsewhere (another process:
        `action_process`); default now. `task`: the instruction it was inferred for (a chunk
        of a new one does not continue the previous chunk: `ActionStream`)."""
        if handed_at is None:
            handed_at = self._monotonic()
        handed = HandOff(actions, observation_stamp, latency_s, handed_at, task)
        with self._cond:
            if latency_s <= self._params["watchdog_timeout_s"]:
                self._watchdog.feed(observation_stamp + latency_s)
            if self._mailbox is not None:
                self._counters["chunks_superseded"] += 1
            self._mailbox = handed
            self._cond.notify_all()

    def set_hold_positions(self, positions: np.ndarray) -> None:
        """The measured joint state of the newest frame, in the configured joint order (holds
        repeat it; velocity limits start from it when no chunk is live)."""
        with self._cond:
            self._hold_positions = np.asarray(positions, dtype=np.float64)

    def set_stop(self, reason: str, engaged: bool) -> None:
        """Engages or releases one stop reason (any thread; idempotent per reason). The first
        reason engaged makes the publisher thread send a hold of the measured pose at once
        (superseding every buffered row); see the module docstring."""
        with self._cond:
            if engaged and reason not in self._stops:
                if not self._stops:
                    self._stop_hold_due = True
                self._counters[f"stop_engagements.{reason}"] += 1
                self._stops.add(reason)
            elif not engaged:
                self._stops.discard(reason)
            self._cond.notify_all()

    def set_estop(self, engaged: bool) -> None:
        """Emergency stop (any thread): the stop reason "estop"."""
        self.set_stop(ESTOP, engaged)

    @property
    def stops(self) -> frozenset[str]:
        """The stop reasons engaged now."""
        with self._cond:
            return frozenset(self._stops)

    def reconfigure(self, stream_config: StreamConfig) -> None:
        """New blending/age settings (`ActionStream.reconfigure`)."""
        with self._cond:
            self._stream.reconfigure(stream_config)

    def stop(self) -> None:
        """Ends `run` (at once, also from inside a wait)."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()

    @property
    def watchdog_state(self) -> str:
        with self._cond:
            return self._watchdog.state

    def diagnostics(self) -> dict[str, object]:
        """Key/values for /diagnostics (windows over the last `stats_window_s`)."""
        t = self._monotonic()
        window = self._params["stats_window_s"]
        for w in (self._tick_lateness, self._coverage, self._chunks, self._handoff_delay):
            w.window_s = window
        with self._cond:
            counters = dict(self._counters)
            stream = dataclasses.asdict(self._stream.counters)
            watchdog, trips = self._watchdog.state, self._watchdog.trips
            stops = self._stops.copy()
        values: dict[str, object] = {
            "action_rate_hz": self._tick_times.rate(t),
            "action_tick_late_p99_ms": 1e3 * _or_zero(self._tick_lateness.percentile(99, t)),
            "action_messages": self._sequence,
            "actions.chunk_rate_hz": self._chunks.rate(t),
            "actions.coverage_p50_s": self._coverage.percentile(50, t),
            "actions.coverage_min_s": self._coverage.minimum(t),
            "actions.handoff_to_publish_p99_ms": 1e3 * self._handoff_delay.percentile(99, t),
            "watchdog": watchdog,
            "watchdog_trips": trips,
            "estop": "engaged" if ESTOP in stops else "released",
            "stopped_by": ",".join(sorted(stops)),
            "action_ticks_skipped": 0,
        }
        values.update((f"actions.{k}", v) for k, v in stream.items())
        values.update(counters)
        return values

    # ------------------------------------------------------------------ publisher thread
    def run(self) -> None:
        """The publisher thread: `service`, then sleep until the next deadline or hand-off."""
        while True:
            wait_s = self.service()
            with self._cond:
                idle = self._mailbox is None and not self._stop_hold_due
                if not self._stopping and idle and wait_s > 0:
                    self._cond.wait(wait_s)
                if self._stopping:
                    return

    def service(self) -> float:
        """One wake-up: publishes a handed-off chunk, then the tick if one is due (or counts the
        late ones skipped). Returns seconds until the next tick deadline."""
        with self._cond:
            handed, self._mailbox = self._mailbox, None
            hold_due, self._stop_hold_due = self._stop_hold_due, False
            stopped_by = self._stop_label()
        if hold_due:
            self._publish_stop_hold()
        if handed is not None and stopped_by:
            with self._cond:
                self._counters[f"new_chunk_unpublished.{stopped_by}"] += 1
        elif handed is not None:
            self._publish_new_chunk(handed)
        t = self._monotonic()
        poll = self._ticks.poll(t, 1.0 / self._params["action_rate_hz"])
        if poll.skipped:
            with self._cond:
                self._counters["action_ticks_skipped"] += poll.skipped
        if poll.deadline is not None:
            self._tick_lateness.add(t - poll.deadline, t)
            self._publish_tick()
        return max(self._ticks.next_deadline - self._monotonic(), 0.0)

    def _publish_new_chunk(self, handed: HandOff) -> None:
        now = self._clock()
        rejected: RejectedChunkError | None = None
        piece: Slice | None = None
        transition = ""
        with self._cond:
            try:
                self._stream.offer(
                    handed.actions,
                    handed.observation_stamp,
                    handed.latency_s,
                    now,
                    measured=self._measured(),
                    task=handed.task,
                )
            except RejectedChunkError as exc:
                rejected = exc
            else:
                piece = self._stream.slice(now)
                reason = self._stream.empty_reason(now) if piece is None else ""
                tripped, transition = self._watchdog.check(now, self._params["watchdog_timeout_s"])
                if tripped:
                    piece, reason = None, "watchdog"
                if piece is None:
                    self._counters[f"new_chunk_unpublished.{reason}"] += 1
        if rejected is not None:
            self._on_reject(f"chunk_{rejected.reason}", f"action chunk discarded: {rejected}")
            return
        if transition:
            self._on_watchdog(transition)
        t = self._monotonic()
        self._chunks.add(1.0, t)
        if piece is not None:
            self._handoff_delay.add(t - handed.handed_at, t)
            self._send(piece, TRIGGER_NEW_CHUNK, now)

    def _stop_label(self) -> str:
        """The stop reason named in counters ("" when none is engaged); lock held."""
        if ESTOP in self._stops:
            return ESTOP
        return min(self._stops, default="")

    def _publish_stop_hold(self) -> None:
        now = self._clock()
        with self._cond:
            measured = self._measured()
            if measured is None:  # no frame yet: nothing was sent, nothing to supersede
                return
            self._stream.offer_hold(measured, now, self._horizon)
            piece = self._stream.slice(now)
        if piece is not None:
            self._send(piece, TRIGGER_TICK, now)

    def _publish_tick(self) -> None:
        now = self._clock()
        with self._cond:
            stopped_by = self._stop_label()
            if stopped_by:
                self._counters[f"action_ticks_empty.{stopped_by}"] += 1
                return
            piece = self._stream.slice(now)
            reason = self._stream.empty_reason(now) if piece is None else ""
            tripped, transition = self._watchdog.check(now, self._params["watchdog_timeout_s"])
            if tripped:
                piece, reason = self._hold_slice(now, transition == "tripped"), "watchdog"
            if piece is None:
                self._counters[f"action_ticks_empty.{reason}"] += 1
        if transition:
            self._on_watchdog(transition)
        if piece is not None:
            self._send(piece, TRIGGER_TICK, now)
            self._tick_times.add(1.0, self._monotonic())

    def _send(self, piece: Slice, trigger: int, now: float) -> None:
        self._publish(piece, self._sequence, trigger)
        self._sequence += 1
        if piece.chunk.chunk_id != HOLD_CHUNK_ID:  # how far ahead the model's rows reach
            last_row = piece.stamp + (len(piece.rows) - 1) * piece.chunk.dt
            self._coverage.add(last_row - now, self._monotonic())

    def _measured(self) -> np.ndarray | None:
        positions = self._hold_positions
        if positions is None or positions.shape != (self._stream.config.num_joints,):
            return None
        return positions

    def _hold_slice(self, now: float, at_trip: bool) -> Slice | None:
        """While tripped: the explicit hold at the trip (both policies), then, with `hold`,
        the hold again (a new one once the current has expired or run out)."""
        if not at_trip and self._params["watchdog_policy"] != "hold":
            return None
        measured = self._measured()
        if measured is None:
            return None  # no frame yet: nothing known to hold
        current = self._stream.current
        if (
            at_trip
            or current is None
            or current.chunk_id != HOLD_CHUNK_ID
            or self._stream.empty_reason(now)
        ):
            self._stream.offer_hold(measured, now, self._horizon)
            self._counters["watchdog_holds"] += 1
        return self._stream.slice(now)


def raise_thread_priority(priority: int) -> str:
    """SCHED_FIFO at `priority` for the calling thread (0: leave it alone). Needs
    CAP_SYS_NICE (root, or an rtprio limit). Returns "" or why it was refused."""
    if priority <= 0:
        return ""
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(priority))
    except (OSError, AttributeError) as exc:
        return str(exc)
    return ""


def _or_zero(value: float) -> float:
    return 0.0 if math.isnan(value) else value
