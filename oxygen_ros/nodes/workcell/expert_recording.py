"""Demonstration recording for the expert node (ROS-free): stamp pairing, episodes, a writer.

- `StampSynchronizer` pairs samples of several streams (the cameras and the joint states) that
  carry the SAME stamp into one step. Stamps are integer nanoseconds, compared exactly: the
  workcell sim renders every camera and a joint state in one tick and stamps them identically,
  so equal stamps are the only pairing that is never misaligned.
- `EpisodeWindow` says which steps belong to an episode (from its reset on, until it ends).
- `RecordingWorker` owns the `EpisodeWriter` on its own thread behind a queue, so HDF5 writing
  and compression never run on the control publishing path.
- `EpisodeRecorder` ties them together: samples in, one episode file per episode out. A step
  belongs to the episode whose window holds its stamp; its action and subtask label are the
  episode plan's at the stamp (steps wait while the plan does not exist yet). An episode's file
  is closed once a step after its end arrives (every step of it has then been seen), or
  `close_timeout_s` after its end; a new episode starting while one still runs ends that one
  (unsuccessful, `outcome` "interrupted"); an episode without any step leaves no file.

Invariants:
- Every stream is in stamp order (one publisher per topic; DDS may drop samples, it does not
  reorder one writer's samples). So once the step at stamp T is complete, every stream has
  delivered everything it ever will before T: an unfinished stamp before T can never complete,
  and is dropped at once (`skipped.incomplete`, plus `skipped.missing.<source>` per missing part)
  when it held a key-source sample (a camera), else counted as `unpaired` (a joint-state-only
  tick, normal when joints are published faster than cameras).
- Emitted steps have strictly increasing stamps; a sample at or before the last emitted stamp
  is dropped (`late.<source>`), a second sample of one source for one stamp too
  (`duplicate.<source>`). At most `max_pending` unfinished stamps are kept (oldest dropped).
- The worker processes commands in order; a writer error aborts that episode (nothing of it
  stays on disk), is reported through `on_error`, and later steps of it are ignored.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import os
import queue
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from oxygen_ros.sim.recorder import EPISODE_NAME, EpisodeWriter, episode_path, list_episodes

NS_PER_S = 1_000_000_000


@dataclasses.dataclass(frozen=True)
class SyncedStep:
    """One sample of every source, all with the same stamp."""

    stamp_ns: int  # the common stamp, integer nanoseconds
    parts: Mapping[str, Any]  # source name -> its sample (whatever the caller added)


class StampSynchronizer:
    """Pairs samples of several in-order streams by exactly equal stamps."""

    def __init__(
        self, sources: Sequence[str], key_sources: Iterable[str], max_pending: int = 32
    ) -> None:
        """
        Args:
            sources: Every stream a step needs one sample of.
            key_sources: Streams whose samples define steps (the cameras); an unfinished stamp
                that holds one of them is a skipped step, one without is an unpaired sample.
            max_pending: Unfinished stamps kept at most (oldest dropped first).
        """
        self.sources = tuple(sources)
        self.key_sources = frozenset(key_sources)
        if not self.sources or len(set(self.sources)) != len(self.sources):
            raise ValueError(f"sources must be unique and non-empty, got {self.sources}")
        if not self.key_sources <= set(self.sources):
            raise ValueError(f"key sources {sorted(self.key_sources)} are not all sources")
        if max_pending < 1:
            raise ValueError(f"max_pending must be >= 1, got {max_pending}")
        self.max_pending = max_pending
        self.counters: collections.Counter[str] = collections.Counter()
        self.last_stamp_ns: int | None = None  # stamp of the last emitted step
        self._pending: dict[int, dict[str, Any]] = {}  # stamp -> source -> sample

    def add(self, source: str, stamp_ns: int, sample: Any) -> SyncedStep | None:
        """Adds one sample; returns the step it completes, if any."""
        if source not in self.sources:
            raise ValueError(f"unknown source {source!r}; sources: {self.sources}")
        if self.last_stamp_ns is not None and stamp_ns <= self.last_stamp_ns:
            self.counters[f"late.{source}"] += 1
            return None
        parts = self._pending.setdefault(stamp_ns, {})
        if source in parts:
            self.counters[f"duplicate.{source}"] += 1
            return None
        parts[source] = sample
        if len(parts) == len(self.sources):
            del self._pending[stamp_ns]
            self._drop_before(stamp_ns)
            self.last_stamp_ns = stamp_ns
            self.counters["steps"] += 1
            return SyncedStep(stamp_ns, parts)
        while len(self._pending) > self.max_pending:
            self._drop(min(self._pending))
        return None

    def num_pending(self) -> int:
        return len(self._pending)

    def _drop_before(self, stamp_ns: int) -> None:
        for stamp in sorted(s for s in self._pending if s < stamp_ns):
            self._drop(stamp)

    def _drop(self, stamp_ns: int) -> None:
        parts = self._pending.pop(stamp_ns)
        if self.key_sources & set(parts):
            self.counters["skipped.incomplete"] += 1
            for source in self.sources:
                if source not in parts:
                    self.counters[f"skipped.missing.{source}"] += 1
        else:
            self.counters["unpaired"] += 1


@dataclasses.dataclass
class EpisodeWindow:
    """The stamps an episode's recording covers: from its reset to the status that ended it."""

    episode_id: int  # the sim's episode id
    start_ns: int  # first stamp that can belong to it (just after the reset time)
    end_ns: int | None = None  # stamp of the first status not RUNNING; None while running
    success: bool = False  # the ending status's phase was SUCCEEDED

    def contains(self, stamp_ns: int) -> bool:
        """True if a step at `stamp_ns` belongs to the episode."""
        return stamp_ns >= self.start_ns and (self.end_ns is None or stamp_ns <= self.end_ns)

    def finished_by(self, stamp_ns: int) -> bool:
        """True once the episode has ended and a step after its end was seen (every step of the
        episode has then arrived: streams are in stamp order)."""
        return self.end_ns is not None and stamp_ns > self.end_ns


def next_episode_index(directory: str | os.PathLike) -> int:
    """One past the highest complete episode index in `directory` (0 if none or absent)."""
    path = Path(directory)
    if not path.is_dir():
        return 0
    indices = [int(EPISODE_NAME.fullmatch(p.name)[1]) for p in list_episodes(path)]
    return max(indices) + 1 if indices else 0


def reorder(names: Sequence[str], values: Sequence[float], order: Sequence[str]) -> np.ndarray:
    """`values` (one per name of `names`) in `order`; raises ValueError naming missing joints."""
    index = {n: i for i, n in enumerate(names)}
    missing = [n for n in order if n not in index]
    if missing:
        raise ValueError(f"missing joints {missing[:8]}")
    if len(values) != len(names):
        raise ValueError(f"{len(values)} values for {len(names)} names")
    return np.array([values[index[n]] for n in order], dtype=np.float64)


@dataclasses.dataclass(frozen=True)
class EpisodeMeta:
    """What an episode file is opened with (see `EpisodeWriter`)."""

    path: Path
    joint_names: tuple[str, ...]
    camera_names: tuple[str, ...]
    image_shape: tuple[int, int, int]
    instruction: str
    seed: int
    episode_index: int
    fps: float
    task_template: str


@dataclasses.dataclass(frozen=True)
class StepData:
    """One step to write. `images` values are uint8 [H, W, 3] arrays or callables making them
    (so the conversion from a message also runs on the worker thread)."""

    timestamp: float
    qpos: np.ndarray
    qvel: np.ndarray
    images: Mapping[str, Any]
    action: np.ndarray
    subtask: str


@dataclasses.dataclass
class WorkerStats:
    """Counters of the worker (read under its lock via `RecordingWorker.stats`)."""

    episodes_opened: int = 0
    episodes_closed: int = 0
    episodes_aborted: int = 0
    steps_written: int = 0
    steps_refused: int = 0  # add_step raised, or the episode had already failed
    write_s_total: float = 0.0  # seconds spent in add_step (conversion + HDF5)
    write_s_max: float = 0.0
    close_s_max: float = 0.0
    max_queue: int = 0  # largest queue length seen when a command was queued
    last_path: str = ""  # the last episode file closed


class RecordingWorker:
    """Writes episodes on its own thread; every method only queues a command and returns."""

    def __init__(
        self,
        on_error: Callable[[str], None] = lambda _message: None,
        on_closed: Callable[[Path, bool, int], None] = lambda _path, _success, _steps: None,
    ) -> None:
        """
        Args:
            on_error: Called on the worker thread with a message when an episode fails.
            on_closed: Called on the worker thread with (path, success, steps) after a close.
        """
        self._on_error = on_error
        self._on_closed = on_closed
        self._queue: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._stats = WorkerStats()
        self._writer: EpisodeWriter | None = None
        self._failed = False  # the current episode failed: ignore its remaining steps
        self._idle = threading.Event()
        self._idle.set()
        self._pending = 0
        self._thread = threading.Thread(target=self._run, name="episode_writer", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ commands
    def open(self, meta: EpisodeMeta) -> None:
        """Starts a new episode (an episode still open is aborted first)."""
        self._put("open", meta)

    def add_step(self, step: StepData) -> None:
        self._put("step", step)

    def close(self, success: bool, extra: dict | None = None) -> None:
        self._put("close", (success, extra or {}))

    def abort(self) -> None:
        self._put("abort", None)

    def stop(self, timeout_s: float = 30.0) -> bool:
        """Aborts an open episode, ends the thread; True if it ended within `timeout_s`."""
        self._put("abort", None)
        self._put("stop", None)
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def wait_idle(self, timeout_s: float) -> bool:
        """True once every queued command has been processed (within `timeout_s`)."""
        return self._idle.wait(timeout_s)

    def stats(self) -> WorkerStats:
        with self._lock:
            return dataclasses.replace(self._stats)

    def queue_length(self) -> int:
        with self._lock:
            return self._pending

    def _put(self, kind: str, payload: Any) -> None:
        with self._lock:
            self._pending += 1
            self._stats.max_queue = max(self._stats.max_queue, self._pending)
            self._idle.clear()
        self._queue.put((kind, payload))

    # ------------------------------------------------------------------ thread
    def _run(self) -> None:
        while True:
            kind, payload = self._queue.get()
            try:
                if kind == "stop":
                    return
                self._handle(kind, payload)
            finally:
                with self._lock:
                    self._pending -= 1
                    if self._pending == 0:
                        self._idle.set()

    def _handle(self, kind: str, payload: Any) -> None:
        if kind == "open":
            self._abort_current()
            meta: EpisodeMeta = payload
            try:
                self._writer = EpisodeWriter(
                    meta.path,
                    meta.joint_names,
                    meta.camera_names,
                    meta.image_shape,
                    meta.instruction,
                    meta.seed,
                    meta.episode_index,
                    meta.fps,
                    task_template=meta.task_template,
                )
                self._failed = False
                with self._lock:
                    self._stats.episodes_opened += 1
            except (OSError, ValueError) as exc:
                self._fail(f"cannot open {meta.path}: {type(exc).__name__}: {exc}")
        elif kind == "step":
            self._write_step(payload)
        elif kind == "close":
            self._close(*payload)
        elif kind == "abort":
            self._abort_current()

    def _write_step(self, step: StepData) -> None:
        if self._writer is None or self._failed:
            with self._lock:
                self._stats.steps_refused += 1
            return
        start = time.perf_counter()
        try:
            images = {k: v() if callable(v) else v for k, v in step.images.items()}
            self._writer.add_step(
                step.timestamp, step.qpos, step.qvel, images, step.action, step.subtask
            )
        except (OSError, ValueError) as exc:
            with self._lock:
                self._stats.steps_refused += 1
            self._fail(f"step at {step.timestamp:.3f} s refused: {type(exc).__name__}: {exc}")
            return
        elapsed = time.perf_counter() - start
        with self._lock:
            self._stats.steps_written += 1
            self._stats.write_s_total += elapsed
            self._stats.write_s_max = max(self._stats.write_s_max, elapsed)

    def _close(self, success: bool, extra: dict) -> None:
        writer, self._writer = self._writer, None
        if writer is None or self._failed:
            return
        start = time.perf_counter()
        try:
            path = writer.close(success, extra)
        except (OSError, ValueError) as exc:
            writer.abort()
            with self._lock:
                self._stats.episodes_aborted += 1
            self._on_error(f"episode {writer.path.name} not saved: {exc}")
            return
        with self._lock:
            self._stats.episodes_closed += 1
            self._stats.close_s_max = max(self._stats.close_s_max, time.perf_counter() - start)
            self._stats.last_path = str(path)
        self._on_closed(path, bool(success), writer.num_steps)

    def _abort_current(self) -> None:
        if self._writer is not None:
            self._writer.abort()
            self._writer = None
            with self._lock:
                self._stats.episodes_aborted += 1

    def _fail(self, message: str) -> None:
        self._abort_current()
        self._failed = True
        self._on_error(message)


def stamp_ns(sec: int, nanosec: int) -> int:
    """A `builtin_interfaces/Time`'s fields as integer nanoseconds (exact)."""
    return int(sec) * NS_PER_S + int(nanosec)


@dataclasses.dataclass(frozen=True)
class RecorderConfig:
    """Where and what `EpisodeRecorder` records."""

    directory: Path  # episode files go here (`episode_path`)
    joint_names: tuple[str, ...]  # qpos / qvel / action columns
    camera_names: tuple[str, ...]  # image streams, in file order
    fps: float  # the files' fps attribute (the camera rate)
    joints_source: str = "joints"  # the synchroniser's name of the joint stream
    close_timeout_s: float = 3.0  # close this long (clock seconds) after an end without a step
    max_deferred: int = 600  # steps kept per episode while its plan does not exist yet


@dataclasses.dataclass
class _Episode:
    """One episode being recorded."""

    window: EpisodeWindow
    seed: int
    instruction: str
    template: str
    index: int  # file index
    sync_base: dict[str, int]  # synchroniser counters at the start (the file stores the delta)
    plan: Any = None  # has sample(t) -> [J] and subtask(t) -> str; labels the steps
    image_shape: tuple[int, int, int] | None = None  # set when the file is opened
    steps: int = 0  # steps sent to the worker
    deferred: list[SyncedStep] = dataclasses.field(default_factory=list)
    ended_at: float | None = None  # clock time the end became known
    outcome: str = "running"  # succeeded, failed or interrupted once ended


class EpisodeRecorder:
    """Samples in (cameras + joint states), one HDF5 file per episode out, via a worker.

    Thread-safe: every method takes the recorder's lock (cheap work only; the worker writes).
    Joint samples are (positions [J], velocities [J]) in `joint_names` order; camera samples are
    whatever `image_of` turns into uint8 [H, W, 3] (called on the worker thread) and
    `shape_of` measures as (H, W).
    """

    def __init__(
        self,
        config: RecorderConfig,
        worker: RecordingWorker,
        image_of: Callable[[Any], np.ndarray] = np.asarray,
        shape_of: Callable[[Any], tuple[int, int]] = lambda image: tuple(image.shape[:2]),
        on_warning: Callable[[str], None] = lambda _message: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.worker = worker
        self._image_of, self._shape_of = image_of, shape_of
        self._on_warning, self._clock = on_warning, clock
        self.sync = StampSynchronizer(
            (*config.camera_names, config.joints_source), config.camera_names
        )
        self.counters: collections.Counter[str] = collections.Counter()
        self.next_index = next_episode_index(config.directory)
        self._episodes: collections.deque[_Episode] = collections.deque()  # oldest first
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ episodes
    def start(
        self, episode_id: int, start_ns: int, seed: int, instruction: str, template: str
    ) -> int:
        """A new episode whose steps are stamped `start_ns` or later; returns its file index."""
        with self._lock:
            for episode in self._episodes:
                if episode.window.end_ns is None:  # still running: a reset interrupted it
                    episode.window.end_ns = start_ns - 1
                    episode.outcome = "interrupted"
                    episode.ended_at = self._clock()
            index = self.next_index
            self.next_index += 1
            self._episodes.append(
                _Episode(
                    EpisodeWindow(episode_id, start_ns),
                    seed,
                    instruction,
                    template,
                    index,
                    sync_base=dict(self.sync.counters),
                )
            )
            return index

    def set_plan(self, episode_id: int, plan: Any) -> None:
        """The episode's plan: labels its steps, including those that waited for it."""
        with self._lock:
            for episode in self._episodes:
                if episode.window.episode_id == episode_id:
                    episode.plan = plan
                    deferred, episode.deferred = episode.deferred, []
                    for step in deferred:
                        self._send(episode, step)

    def end(self, episode_id: int, end_ns: int, success: bool) -> None:
        """The episode ended at `end_ns` (its last step may carry that stamp)."""
        with self._lock:
            for episode in self._episodes:
                if episode.window.episode_id == episode_id and episode.window.end_ns is None:
                    episode.window.end_ns, episode.window.success = end_ns, bool(success)
                    episode.outcome = "succeeded" if success else "failed"
                    episode.ended_at = self._clock()

    def close_timed_out(self) -> None:
        """Closes ended episodes that saw no later step within `close_timeout_s`."""
        now = self._clock()
        with self._lock:
            while self._episodes and (
                self._episodes[0].ended_at is not None
                and now - self._episodes[0].ended_at > self.config.close_timeout_s
            ):
                self._finish(self._episodes.popleft())
                self.counters["closed_by_timeout"] += 1

    def open_episode_ids(self) -> list[int]:
        """Episodes not closed yet."""
        with self._lock:
            return [e.window.episode_id for e in self._episodes]

    def stop(self, timeout_s: float) -> bool:
        """Discards unfinished episodes, lets the worker finish; True if it ended in time."""
        with self._lock:
            self._episodes.clear()
        return self.worker.stop(timeout_s)

    # ------------------------------------------------------------------ samples
    def add(self, source: str, stamp_ns: int, sample: Any) -> None:
        """One camera image or joint sample (`joints_source`: (positions, velocities))."""
        with self._lock:
            step = self.sync.add(source, stamp_ns, sample)
            if step is None:
                return
            while self._episodes and self._episodes[0].window.finished_by(step.stamp_ns):
                self._finish(self._episodes.popleft())
            episode = next((e for e in self._episodes if e.window.contains(step.stamp_ns)), None)
            if episode is None:
                self.counters["outside_episode"] += 1
            elif episode.plan is None:
                episode.deferred.append(step)
                if len(episode.deferred) > self.config.max_deferred:
                    episode.deferred.pop(0)
                    self.counters["dropped_no_plan"] += 1
            else:
                self._send(episode, step)

    def _send(self, episode: _Episode, step: SyncedStep) -> None:
        cams = self.config.camera_names
        sizes = {self._shape_of(step.parts[c]) for c in cams}
        shape = (*next(iter(sizes)), 3)
        if len(sizes) != 1 or (episode.image_shape not in (None, shape)):
            self.counters["bad_image_shape"] += 1
            return
        if episode.image_shape is None:
            episode.image_shape = shape
            self.worker.open(
                EpisodeMeta(
                    path=episode_path(self.config.directory, episode.index),
                    joint_names=self.config.joint_names,
                    camera_names=cams,
                    image_shape=shape,
                    instruction=episode.instruction,
                    seed=episode.seed,
                    episode_index=episode.index,
                    fps=self.config.fps,
                    task_template=episode.template,
                )
            )
        positions, velocities = step.parts[self.config.joints_source]
        t = step.stamp_ns / NS_PER_S
        image_of = self._image_of
        self.worker.add_step(
            StepData(
                timestamp=t,
                qpos=positions,
                qvel=velocities,
                images={c: functools.partial(image_of, step.parts[c]) for c in cams},
                action=np.asarray(episode.plan.sample(t), dtype=np.float64),
                subtask=str(episode.plan.subtask(t)),
            )
        )
        episode.steps += 1
        self.counters["steps"] += 1

    def _finish(self, episode: _Episode) -> None:
        if episode.deferred:
            self.counters["dropped_no_plan"] += len(episode.deferred)
            episode.deferred = []
        window = episode.window
        if episode.image_shape is None:
            self.counters["empty_episodes"] += 1
            self._on_warning(f"episode {window.episode_id} ended with no recorded step: no file")
            return
        base = episode.sync_base
        self.worker.close(
            window.success,
            {
                "episode_id": window.episode_id,
                "outcome": episode.outcome,
                "start_stamp_ns": window.start_ns,
                "end_stamp_ns": window.end_ns,
                "sync_counters": {  # this episode's pairing drops (see StampSynchronizer)
                    k: v - base.get(k, 0)
                    for k, v in sorted(self.sync.counters.items())
                    if k != "steps" and v != base.get(k, 0)
                },
            },
        )
        self.counters["episodes"] += 1
