"""Language request queue bookkeeping and rate meters."""

import dataclasses
import threading

import pytest

from oxygen_ros.engine.checkpoint_assets import StateLayout, save_state_layout
from oxygen_ros.engine.config import EngineConfig
from oxygen_ros.engine.types import RequestKind
from oxygen_ros.nodes.inference.engine_bridge import (
    LanguageQueue,
    RateMeter,
    random_weights_refusal,
    state_extra_names,
)
from oxygen_ros.resources import resolve_path


def test_ids_per_kind_and_take_moves_to_in_flight() -> None:
    q = LanguageQueue(max_pending=8)
    a = q.submit(RequestKind.NARRATION)
    b = q.submit(RequestKind.MEMORY, max_tokens=5, origin="on_demand")
    c = q.submit(RequestKind.NARRATION)
    assert [a.request_id, b.request_id, c.request_id] == ["narration-1", "memory-1", "narration-2"]
    taken = q.take()
    assert [r.request_id for r in taken] == ["narration-1", "memory-1", "narration-2"]
    assert taken[1].max_tokens == 5 and taken[0].max_tokens is None
    assert (q.num_queued, q.num_in_flight) == (0, 3)
    assert q.finish("memory-1") == "on_demand"
    assert q.finish("memory-1") is None  # exactly once
    assert q.num_in_flight == 2
    # The node's queue names its run: ids stay unique across restarts.
    run = LanguageQueue(max_pending=8, run_id="6937c1a2")
    assert run.submit(RequestKind.SUBTASK).request_id == "subtask-6937c1a2-1"
    assert run.submit(RequestKind.SUBTASK).request_id == "subtask-6937c1a2-2"


def test_requeue_puts_requests_back_in_front_in_order() -> None:
    q = LanguageQueue(max_pending=8)
    q.submit(RequestKind.SUBTASK)
    q.submit(RequestKind.NARRATION)
    taken = q.take()
    q.submit(RequestKind.MEMORY)
    q.requeue(taken)
    assert [r.request_id for r in q.take()] == ["subtask-1", "narration-1", "memory-1"]


def test_bounded_queue_refuses_with_reason() -> None:
    q = LanguageQueue(max_pending=2)
    assert q.submit(RequestKind.SUBTASK).accepted
    q.take()
    assert q.submit(RequestKind.SUBTASK).accepted
    refused = q.submit(RequestKind.SUBTASK)
    assert not refused.accepted and "queue full" in refused.reason and refused.request_id == ""
    q.finish("subtask-1")
    assert q.submit(RequestKind.SUBTASK).accepted


def test_busy_abort_queued_and_drain() -> None:
    q = LanguageQueue(max_pending=8)
    q.submit(RequestKind.SUBTASK)
    assert q.busy(RequestKind.SUBTASK) and not q.busy(RequestKind.MEMORY)
    q.take()
    q.submit(RequestKind.SUBTASK)
    aborted = q.abort_queued(RequestKind.SUBTASK)
    assert [r.request_id for r in aborted] == ["subtask-2"]
    assert q.busy(RequestKind.SUBTASK)  # subtask-1 still in flight
    q.submit(RequestKind.MEMORY)
    assert sorted(r.request_id for r in q.drain()) == ["memory-1", "subtask-1"]
    assert (q.num_queued, q.num_in_flight) == (0, 0)


def test_concurrent_submits_never_exceed_bound() -> None:
    q = LanguageQueue(max_pending=50)
    results = []

    def worker() -> None:
        for _ in range(30):
            results.append(q.submit(RequestKind.NARRATION))

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    accepted = [r.request_id for r in results if r.accepted]
    assert len(accepted) == 50 and len(set(accepted)) == 50


def test_abort_in_flight_is_handed_to_the_engine_once() -> None:
    q = LanguageQueue(max_pending=8)
    q.submit(RequestKind.SUBTASK)
    q.submit(RequestKind.NARRATION)
    q.take()
    assert q.abort_in_flight(RequestKind.SUBTASK) == ["subtask-1"]
    assert q.take_aborts() == ["subtask-1"] and q.take_aborts() == []
    assert q.busy(RequestKind.SUBTASK)  # until the engine reports it finished (aborted)
    assert q.finish("subtask-1") == "subtask"


def test_rate_meter_window() -> None:
    m = RateMeter(window_s=2.0)
    start = m._start
    for i in range(140):
        m.add(now=start + 10 + i / 70)
    assert m.rate(now=start + 10 + 2.0) == pytest.approx(70.0, rel=0.01)
    assert m.rate(now=start + 20) == 0.0


def test_state_extra_names_come_from_the_checkpoint_when_not_given(tmp_path) -> None:
    joints = ("a", "b")
    trained = StateLayout(joints, ("cube.x", "cube.y"))
    save_state_layout(tmp_path / "assets" / "workcell", trained)

    def names(extra, checkpoint=str(tmp_path), assets_id="", joint_names=joints):
        config = dataclasses.replace(
            EngineConfig(),
            checkpoint_dir=resolve_path(checkpoint) or None,
            assets_id=assets_id or None,
        )
        return state_extra_names(extra, config, joint_names)

    assert names([]) == ("cube.x", "cube.y")  # empty: the checkpoint's
    assert names([], assets_id="workcell") == ("cube.x", "cube.y")
    assert names(["cube.x", "cube.y"]) == ("cube.x", "cube.y")  # the same, typed: accepted
    assert names([], joint_names=("left", "right")) == ("cube.x", "cube.y")  # by position
    with pytest.raises(ValueError, match="differ from what checkpoint"):
        names(["cube.y", "cube.x"])
    with pytest.raises(ValueError, match="trained on 2 joints"):
        names([], joint_names=("a", "b", "c"))
    # Without a checkpoint, or one that records no layout, the parameter is taken as it is.
    assert names(["cube.y"], checkpoint="") == ("cube.y",)
    assert names([], checkpoint="") == ()
    (tmp_path / "other" / "assets" / "workcell").mkdir(parents=True)
    assert names(["cube.y"], checkpoint=str(tmp_path / "other")) == ("cube.y",)
    # The shipped checkpoint of the line serves with no names typed: the target state's.
    from oxygen_ros.perception import workcell_cubes
    from oxygen_ros.sim import robot

    shipped = names(
        [], checkpoint="package://oxygen_ros/models/workcell_run38", joint_names=robot.JOINT_NAMES
    )
    assert shipped == workcell_cubes.TARGET_STATE_NAMES


def test_random_weights_are_refused_only_on_a_robot_not_asking_for_them() -> None:
    robot = random_weights_refusal("", use_sim_time=False, allowed=False)
    assert "no checkpoint_dir outside simulation" in robot and "allow_random_weights" in robot
    assert random_weights_refusal("/ckpt/pi05", use_sim_time=False, allowed=False) == ""
    assert random_weights_refusal("", use_sim_time=True, allowed=False) == ""  # simulation
    assert random_weights_refusal("", use_sim_time=False, allowed=True) == ""  # a stand
