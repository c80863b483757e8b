"""expert_recording: stamp pairing, episode windows and the writer thread (no ROS)."""

import threading
from pathlib import Path

import numpy as np
import pytest

from oxygen_ros.nodes.workcell.expert_recording import (
    EpisodeMeta,
    EpisodeRecorder,
    EpisodeWindow,
    RecorderConfig,
    RecordingWorker,
    StampSynchronizer,
    StepData,
    next_episode_index,
    reorder,
    stamp_ns,
)
from oxygen_ros.sim.recorder import episode_path, list_episodes, read_episode

CAMS = ("top", "left_wrist", "right_wrist")
SOURCES = (*CAMS, "joints")
MS = 1_000_000  # ns


def make_sync(max_pending: int = 32) -> StampSynchronizer:
    return StampSynchronizer(SOURCES, CAMS, max_pending=max_pending)


def add_tick(sync: StampSynchronizer, stamp: int, sources=SOURCES):
    """Adds one sample per source (value "<source>@<stamp>"); returns the emitted steps."""
    out = [sync.add(s, stamp, f"{s}@{stamp}") for s in sources]
    return [step for step in out if step is not None]


# ------------------------------------------------------------------ synchroniser
def test_complete_ticks_pair_exactly() -> None:
    sync = make_sync()
    steps = [s for t in (100 * MS, 133 * MS, 166 * MS) for s in add_tick(sync, t)]
    assert [s.stamp_ns for s in steps] == [100 * MS, 133 * MS, 166 * MS]
    assert dict(steps[1].parts) == {src: f"{src}@{133 * MS}" for src in SOURCES}
    assert sync.counters == {"steps": 3}
    assert sync.num_pending() == 0


def test_interleaved_streams_pair_by_stamp() -> None:
    sync = make_sync()
    # Each topic in order, but topics interleave: top runs two ticks ahead.
    assert sync.add("top", 1, "a1") is None
    assert sync.add("top", 2, "a2") is None
    assert sync.add("joints", 1, "j1") is None
    assert sync.add("left_wrist", 1, "l1") is None
    step = sync.add("right_wrist", 1, "r1")
    assert step is not None and step.stamp_ns == 1
    assert dict(step.parts) == {
        "top": "a1",
        "joints": "j1",
        "left_wrist": "l1",
        "right_wrist": "r1",
    }
    assert sync.num_pending() == 1  # stamp 2 can still complete
    assert [s.stamp_ns for s in add_tick(sync, 2, ("joints", "left_wrist", "right_wrist"))] == [2]


def test_misaligned_stamps_are_counted_and_skipped_never_paired() -> None:
    """Positive control: a camera stamped 1 ns off its tick never joins that tick's step."""
    sync = make_sync()
    steps = add_tick(sync, 10 * MS, ("top", "joints", "right_wrist"))
    steps += [sync.add("left_wrist", 10 * MS + 1, "l-off")]  # misaligned by 1 ns
    steps += add_tick(sync, 20 * MS)
    steps = [s for s in steps if s is not None]
    assert [s.stamp_ns for s in steps] == [20 * MS]
    assert steps[0].parts["left_wrist"] == f"left_wrist@{20 * MS}"
    assert sync.counters["skipped.incomplete"] == 2  # tick 10 ms and the lone 10 ms + 1 ns
    assert sync.counters["skipped.missing.left_wrist"] == 1
    assert sync.counters["skipped.missing.top"] == 1  # the lone image lacked the others
    assert sync.counters["skipped.missing.joints"] == 1
    assert sync.counters["steps"] == 1


def test_joint_only_ticks_are_unpaired_not_skipped() -> None:
    sync = make_sync()
    sync.add("joints", 5, "j5")  # joints at a higher rate than the cameras
    sync.add("joints", 6, "j6")
    steps = add_tick(sync, 7)
    assert [s.stamp_ns for s in steps] == [7]
    assert sync.counters == {"steps": 1, "unpaired": 2}


def test_late_and_duplicate_samples_are_dropped() -> None:
    sync = make_sync()
    add_tick(sync, 50)
    assert sync.add("top", 50, "again") is None  # at the last emitted stamp
    assert sync.add("joints", 40, "old") is None  # before it
    sync.add("top", 60, "t60")
    assert sync.add("top", 60, "t60-bis") is None
    (step,) = add_tick(sync, 60, ("left_wrist", "right_wrist", "joints"))
    assert step.parts["top"] == "t60"
    assert sync.counters["late.top"] == 1 and sync.counters["late.joints"] == 1
    assert sync.counters["duplicate.top"] == 1 and sync.counters["steps"] == 2


def test_pending_is_bounded() -> None:
    sync = make_sync(max_pending=3)
    for t in range(1, 6):  # a camera that never publishes: nothing completes
        add_tick(sync, t, ("top", "left_wrist", "joints"))
    assert sync.num_pending() == 3
    assert sync.counters["skipped.incomplete"] == 2
    assert sync.counters["skipped.missing.right_wrist"] == 2


def test_synchroniser_refuses_bad_configuration() -> None:
    with pytest.raises(ValueError):
        StampSynchronizer(("a", "a"), ("a",))
    with pytest.raises(ValueError):
        StampSynchronizer(("a",), ("b",))
    with pytest.raises(ValueError):
        make_sync().add("depth", 1, None)


# ------------------------------------------------------------------ small helpers
def test_episode_window() -> None:
    w = EpisodeWindow(episode_id=3, start_ns=1000)
    assert not w.contains(999) and w.contains(1000) and w.contains(10**12)
    assert not w.finished_by(10**12)
    w.end_ns, w.success = 2000, True
    assert w.contains(2000) and not w.contains(2001)
    assert not w.finished_by(2000) and w.finished_by(2001)


def test_stamp_ns_is_exact() -> None:
    assert stamp_ns(12, 345_678_901) == 12_345_678_901
    assert stamp_ns(0, 0) == 0


def test_reorder() -> None:
    out = reorder(["b", "c", "a"], [2.0, 3.0, 1.0], ["a", "b"])
    np.testing.assert_array_equal(out, [1.0, 2.0])
    with pytest.raises(ValueError, match="missing"):
        reorder(["a"], [1.0], ["a", "z"])
    with pytest.raises(ValueError):
        reorder(["a", "b"], [1.0], ["a"])


def test_next_episode_index(tmp_path: Path) -> None:
    assert next_episode_index(tmp_path / "absent") == 0
    assert next_episode_index(tmp_path) == 0
    episode_path(tmp_path, 7).write_bytes(b"")
    (tmp_path / "episode_000009.hdf5.partial").write_bytes(b"")  # unfinished: not counted
    assert next_episode_index(tmp_path) == 8


# ------------------------------------------------------------------ worker
def meta(directory: Path, index: int, shape=(4, 6, 3)) -> EpisodeMeta:
    return EpisodeMeta(
        path=episode_path(directory, index),
        joint_names=("a", "b"),
        camera_names=("top", "wrist"),
        image_shape=shape,
        instruction="pick up the red cube",
        seed=42 + index,
        episode_index=index,
        fps=30.0,
        task_template="pick",
    )


def step(t: float, value: float, lazy: bool = False) -> StepData:
    image = np.full((4, 6, 3), int(value), dtype=np.uint8)
    return StepData(
        timestamp=t,
        qpos=np.array([value, -value]),
        qvel=np.array([0.5, 0.25]),
        images={"top": (lambda: image) if lazy else image, "wrist": image + 1},
        action=np.array([value + 1, value + 2]),
        subtask="reach" if value < 2 else "grasp",
    )


def test_worker_writes_episodes_in_order(tmp_path: Path) -> None:
    closed = []
    worker = RecordingWorker(on_closed=lambda p, s, n: closed.append((p.name, s, n)))
    worker.open(meta(tmp_path, 0))
    for k in range(3):
        worker.add_step(step(0.1 * (k + 1), k, lazy=k == 1))
    worker.close(True, {"episode_id": 5})
    worker.open(meta(tmp_path, 1))
    worker.add_step(step(9.0, 1.0))
    worker.close(False)
    assert worker.wait_idle(10.0)
    assert worker.stop()
    assert closed == [("episode_000000.hdf5", True, 3), ("episode_000001.hdf5", False, 1)]
    ep = read_episode(episode_path(tmp_path, 0))
    np.testing.assert_array_equal(ep.timestamps, [0.1, 0.2, 0.30000000000000004])
    np.testing.assert_array_equal(ep.qpos, np.float32([[0, 0], [1, -1], [2, -2]]))
    np.testing.assert_array_equal(ep.action[:, 0], np.float32([1, 2, 3]))
    assert ep.images["top"][1, 0, 0, 0] == 1 and ep.images["wrist"][2, 3, 5, 2] == 3
    assert ep.subtasks == ("reach", "reach", "grasp")
    assert (ep.success, ep.seed, ep.extra) == (True, 42, {"episode_id": 5})
    assert read_episode(episode_path(tmp_path, 1)).success is False
    stats = worker.stats()
    assert (stats.episodes_opened, stats.episodes_closed, stats.steps_written) == (2, 2, 4)


def test_worker_bad_step_aborts_only_that_episode(tmp_path: Path) -> None:
    errors = []
    worker = RecordingWorker(on_error=errors.append)
    worker.open(meta(tmp_path, 0))
    worker.add_step(step(1.0, 0.0))
    worker.add_step(step(0.5, 0.0))  # time goes back: refused
    worker.add_step(step(2.0, 0.0))  # ignored: the episode already failed
    worker.close(True)
    worker.open(meta(tmp_path, 1))
    worker.add_step(step(3.0, 0.0))
    worker.close(True)
    assert worker.wait_idle(10.0) and worker.stop()
    assert len(errors) == 1 and "refused" in errors[0]
    assert [p.name for p in list_episodes(tmp_path)] == ["episode_000001.hdf5"]
    assert not list(tmp_path.glob("*.partial"))
    assert worker.stats().steps_refused == 2


def test_worker_stop_discards_an_open_episode(tmp_path: Path) -> None:
    worker = RecordingWorker()
    worker.open(meta(tmp_path, 0))
    worker.add_step(step(1.0, 0.0))
    assert worker.stop()
    assert list(tmp_path.iterdir()) == []


def test_worker_runs_off_the_calling_thread(tmp_path: Path) -> None:
    """Commands return at once; the images are made on the worker thread."""
    threads = []
    gate = threading.Event()

    def image():
        threads.append(threading.current_thread().name)
        gate.wait(10.0)
        return np.zeros((4, 6, 3), dtype=np.uint8)

    worker = RecordingWorker()
    worker.open(meta(tmp_path, 0))
    data = step(1.0, 0.0)
    worker.add_step(StepData(**{**data.__dict__, "images": {"top": image, "wrist": image}}))
    worker.close(True)
    assert worker.queue_length() >= 1  # still blocked in the first image
    gate.set()
    assert worker.wait_idle(10.0) and worker.stop()
    assert threads == ["episode_writer", "episode_writer"]
    assert len(list_episodes(tmp_path)) == 1


# ------------------------------------------------------------------ recorder (sync + episodes)
class FakePlan:
    """action = (t, -t), label "reach" before 1 s, then "grasp"."""

    def sample(self, t: float) -> np.ndarray:
        return np.array([t, -t])

    def subtask(self, t: float) -> str:
        return "reach" if t < 1.0 else "grasp"


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make_recorder(directory: Path, clock=None):
    warnings: list[str] = []
    recorder = EpisodeRecorder(
        RecorderConfig(directory, ("a", "b"), ("top", "wrist"), fps=10.0, close_timeout_s=3.0),
        RecordingWorker(),
        on_warning=warnings.append,
        **({"clock": clock} if clock else {}),
    )
    return recorder, warnings


def tick(recorder: EpisodeRecorder, k: int, skip: str = "", offset_ns: int = 0) -> None:
    """The sim's camera tick k (stamp k * 100 ms): both images (value k) and the joints."""
    stamp = k * 100 * MS
    image = np.full((4, 6, 3), k, dtype=np.uint8)
    if skip != "joints":
        recorder.add("joints", stamp, (np.array([k, 10.0 * k]), np.array([0.5, -0.5])))
    for camera in ("top", "wrist"):
        if camera != skip:
            recorder.add(camera, stamp + (offset_ns if camera == "wrist" else 0), image)


def finish(recorder: EpisodeRecorder) -> None:
    assert recorder.worker.wait_idle(10.0)


def test_recorder_writes_the_episode_window_with_plan_labels(tmp_path: Path) -> None:
    recorder, _ = make_recorder(tmp_path)
    for k in range(1, 6):  # before the episode: not recorded
        tick(recorder, k)
    assert recorder.start(1, 550 * MS, seed=7, instruction="pick", template="pick") == 0
    tick(recorder, 6)
    tick(recorder, 7)  # both wait for the plan
    recorder.set_plan(1, FakePlan())
    for k in range(8, 13):
        tick(recorder, k)
    recorder.end(1, 1200 * MS, success=True)
    assert not list_episodes(tmp_path)  # a step at the end stamp may still come
    tick(recorder, 13)  # after the end: the file closes, the step is outside every episode
    finish(recorder)
    ep = read_episode(episode_path(tmp_path, 0))
    np.testing.assert_allclose(ep.timestamps, np.arange(6, 13) / 10)
    np.testing.assert_array_equal(ep.qpos[:, 0], np.arange(6, 13, dtype=np.float32))
    np.testing.assert_array_equal(ep.qpos[:, 1], 10 * np.arange(6, 13, dtype=np.float32))
    np.testing.assert_array_equal(ep.qvel, np.tile(np.float32([0.5, -0.5]), (7, 1)))
    np.testing.assert_allclose(ep.action[:, 0], ep.timestamps.astype(np.float32))
    np.testing.assert_allclose(ep.action[:, 1], -ep.timestamps.astype(np.float32))
    assert ep.subtasks == ("reach",) * 4 + ("grasp",) * 3
    assert [int(ep.images["wrist"][k, 0, 0, 0]) for k in range(7)] == list(range(6, 13))
    assert (ep.seed, ep.instruction, ep.success, ep.fps) == (7, "pick", True, 10.0)
    assert ep.extra == {
        "episode_id": 1,
        "outcome": "succeeded",
        "start_stamp_ns": 550 * MS,
        "end_stamp_ns": 1200 * MS,
        "sync_counters": {},
    }
    assert recorder.counters == {"outside_episode": 6, "steps": 7, "episodes": 1}
    assert recorder.stop(10.0)


def test_recorder_skips_misaligned_and_incomplete_ticks_and_says_so(tmp_path: Path) -> None:
    recorder, _ = make_recorder(tmp_path)
    recorder.start(1, 0, seed=1, instruction="i", template="t")
    recorder.set_plan(1, FakePlan())
    tick(recorder, 1)
    tick(recorder, 2, offset_ns=1)  # the wrist image is stamped 1 ns late: never paired
    tick(recorder, 3, skip="joints")  # the joint state was lost
    tick(recorder, 4)
    recorder.end(1, 400 * MS, success=False)
    tick(recorder, 5)
    finish(recorder)
    ep = read_episode(episode_path(tmp_path, 0))
    np.testing.assert_allclose(ep.timestamps, [0.1, 0.4])
    np.testing.assert_array_equal(ep.qpos[:, 0], [1, 4])  # never a neighbour's joints
    assert [int(ep.images["wrist"][k, 0, 0, 0]) for k in range(2)] == [1, 4]
    assert ep.success is False and ep.extra["outcome"] == "failed"
    assert ep.extra["sync_counters"] == {
        "skipped.incomplete": 3,  # tick 2, its lone wrist image, tick 3
        "skipped.missing.joints": 2,  # the lone wrist image, tick 3
        "skipped.missing.top": 1,
        "skipped.missing.wrist": 1,
    }
    assert recorder.stop(10.0)


def test_recorder_a_reset_interrupts_the_running_episode(tmp_path: Path) -> None:
    recorder, _ = make_recorder(tmp_path)
    recorder.start(1, 0, seed=1, instruction="first", template="t")
    recorder.set_plan(1, FakePlan())
    tick(recorder, 1)
    tick(recorder, 2)
    assert recorder.start(2, 250 * MS, seed=2, instruction="second", template="t") == 1
    recorder.set_plan(2, FakePlan())
    tick(recorder, 3)  # closes episode 1, starts episode 2's file
    recorder.end(2, 300 * MS, success=True)
    tick(recorder, 4)
    finish(recorder)
    first, second = (read_episode(episode_path(tmp_path, i)) for i in (0, 1))
    np.testing.assert_allclose(first.timestamps, [0.1, 0.2])
    assert first.success is False and first.extra["outcome"] == "interrupted"
    assert first.extra["end_stamp_ns"] == 250 * MS - 1
    np.testing.assert_allclose(second.timestamps, [0.3])
    assert (second.instruction, second.success, second.episode_index) == ("second", True, 1)
    assert recorder.stop(10.0)


def test_recorder_closes_after_a_timeout_and_skips_empty_episodes(tmp_path: Path) -> None:
    clock = FakeClock()
    recorder, warnings = make_recorder(tmp_path, clock)
    recorder.start(1, 0, seed=1, instruction="i", template="t")
    recorder.set_plan(1, FakePlan())
    tick(recorder, 1)
    recorder.end(1, 100 * MS, success=True)  # no later step comes (the sim stopped)
    clock.now = 2.9
    recorder.close_timed_out()
    assert recorder.open_episode_ids() == [1]
    clock.now = 3.1
    recorder.close_timed_out()
    assert recorder.open_episode_ids() == []
    recorder.start(2, 150 * MS, seed=2, instruction="i", template="t")
    recorder.end(2, 160 * MS, success=False)  # no step at all
    tick(recorder, 2)
    finish(recorder)
    assert [p.name for p in list_episodes(tmp_path)] == ["episode_000000.hdf5"]
    assert recorder.counters["closed_by_timeout"] == 1
    assert recorder.counters["empty_episodes"] == 1 and "no recorded step" in warnings[0]
    assert recorder.stop(10.0)


def test_recorder_continues_the_directory_numbering(tmp_path: Path) -> None:
    episode_path(tmp_path, 4).write_bytes(b"")
    recorder, _ = make_recorder(tmp_path)
    assert recorder.start(1, 0, seed=1, instruction="i", template="t") == 5
    assert recorder.stop(10.0)
