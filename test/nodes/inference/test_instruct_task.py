"""The Instruct action's task bookkeeping without a node: one active task, feedback on changed
words, each ending exactly once (completion, time limit on the node clock incl. a sim clock
that starts late, cancel, supersede, abort), the first ending winning, and speech from the
engine thread racing the executor's polls."""

from __future__ import annotations

import threading

import pytest
from fake_clock import FakeClock

from oxygen_ros.nodes.inference.instruct_task import (
    NARRATION,
    SUBTASK,
    Ended,
    Feedback,
    InstructTask,
    Poll,
    Status,
)


def started(goal: str = "g1", limit: float = 0.0, clock: FakeClock | None = None):
    clock = clock or FakeClock()
    task = InstructTask()
    assert task.start(goal, "pick the red cube", limit, clock.node()) is None
    return task, clock


def test_status_values_are_the_action_result_constants() -> None:
    from oxygen_ros.action import Instruct

    for status in Status:
        assert getattr(Instruct.Result, f"STATUS_{status.name}") == status.value


def test_feedback_only_when_the_words_change_then_completion_succeeds() -> None:
    task, clock = started()
    assert task.active_goal == "g1" and task.instruction == "pick the red cube"
    assert task.poll(clock.node()) == Poll(None, None)  # nothing said yet
    clock.t = 0.5
    assert task.on_speech(SUBTASK, " reach the cube \n") is True
    assert task.on_speech(SUBTASK, "reach the cube") is False  # unchanged
    assert task.poll(clock.node()) == Poll(Feedback("g1", "reach the cube", "", 0.5), None)
    clock.t = 0.75
    assert task.poll(clock.node()) == Poll(None, None)
    assert task.on_speech(NARRATION, "I see a red cube") is True
    assert task.on_speech("memory", "the cube is red") is False  # not this action's words
    assert task.on_speech(NARRATION, "   ") is False
    clock.t = 1.25
    assert task.poll(clock.node()) == Poll(
        Feedback("g1", "reach the cube", "I see a red cube", 1.25), None
    )
    assert task.on_done() is True
    assert task.on_done() is False  # already ending
    clock.t = 2.0
    assert task.poll(clock.node()) == Poll(
        None,
        Ended(
            "g1",
            Status.SUCCEEDED,
            "task completion signalled",
            "reach the cube",
            "I see a red cube",
            2.0,
        ),
    )
    assert task.active_goal is None and task.instruction == ""
    assert task.poll(clock.node()) == Poll(None, None)  # ended once
    assert task.on_speech(SUBTASK, "lift") is False and task.on_done() is False


def test_speech_and_ending_in_one_poll_return_both() -> None:
    task, clock = started()
    task.on_speech(SUBTASK, "lift the cube")
    task.on_done()
    clock.t = 3.0
    poll = task.poll(clock.node())
    assert poll.feedback == Feedback("g1", "lift the cube", "", 3.0)
    assert poll.ended is not None and poll.ended.last_subtask == "lift the cube"


def test_speech_after_the_ending_is_recorded_does_not_change_the_result() -> None:
    task, clock = started()
    task.on_speech(SUBTASK, "reach")
    task.cancel("g1")
    assert task.on_speech(SUBTASK, "lift") is False
    ended = task.poll(clock.node()).ended
    assert ended is not None and (ended.status, ended.last_subtask) == (Status.CANCELED, "reach")


def test_speech_begun_under_another_prompt_is_ignored() -> None:
    task, clock = started()
    assert task.on_speech(SUBTASK, "open the drawer", prompt="open the drawer") is False
    assert task.on_speech(SUBTASK, "reach the cube", prompt="pick the red cube") is True
    assert task.poll(clock.node()).feedback == Feedback("g1", "reach the cube", "", 0.0)


def test_time_limit_on_the_node_clock() -> None:
    task, clock = started(limit=2.5)
    clock.t = 2.4999
    assert task.poll(clock.node()) == Poll(None, None)
    clock.t = 2.5
    assert task.poll(clock.node()) == Poll(
        None, Ended("g1", Status.TIME_LIMIT, "time limit of 2.5 s reached", "", "", 2.5)
    )
    assert task.active_goal is None


def test_a_recorded_ending_wins_over_the_time_limit_passing_at_the_same_poll() -> None:
    task, clock = started(limit=1.0)
    task.cancel("g1")
    clock.t = 5.0
    ended = task.poll(clock.node()).ended
    assert ended is not None and (ended.status, ended.elapsed_s) == (Status.CANCELED, 5.0)


def test_sim_clock_not_started_the_limit_counts_from_the_first_positive_time() -> None:
    task = InstructTask()
    task.start("g1", "pick", 5.0, 0.0)  # use_sim_time before the first /clock
    assert task.poll(0.0) == Poll(None, None)
    assert task.poll(100.0) == Poll(None, None)  # first /clock: the task starts now
    assert task.poll(104.9) == Poll(None, None)
    assert task.poll(105.0).ended == Ended(
        "g1", Status.TIME_LIMIT, "time limit of 5 s reached", "", "", 5.0
    )


def test_a_clock_jumping_back_clamps_elapsed_at_zero() -> None:
    task = InstructTask()
    task.start("g1", "pick", 2.0, 50.0)
    assert task.poll(10.0) == Poll(None, None)  # sim restarted: no time limit, no negative
    task.on_speech(SUBTASK, "reach")
    assert task.poll(20.0).feedback == Feedback("g1", "reach", "", 0.0)
    assert task.poll(52.0).ended.status == Status.TIME_LIMIT


def test_a_new_goal_supersedes_the_active_one() -> None:
    task, clock = started()
    task.on_speech(NARRATION, "moving to the cube")
    clock.t = 1.5
    previous = task.start("g2", "open the drawer", 0.0, clock.node())
    assert previous == Ended(
        "g1", Status.SUPERSEDED, "superseded by a new goal", "", "moving to the cube", 1.5
    )
    assert task.active_goal == "g2" and task.instruction == "open the drawer"
    # The new task starts with no words and its own clock.
    clock.t = 2.0
    assert task.poll(clock.node()) == Poll(None, None)
    task.on_speech(SUBTASK, "grasp the handle")
    assert task.poll(clock.node()).feedback == Feedback("g2", "grasp the handle", "", 0.5)


def test_a_new_goal_returns_the_ending_the_previous_one_had_recorded() -> None:
    task, clock = started()
    task.on_done()
    clock.t = 1.0
    previous = task.start("g2", "open the drawer", 0.0, clock.node())
    assert previous is not None and (previous.goal_id, previous.status) == ("g1", Status.SUCCEEDED)
    assert task.poll(clock.node()) == Poll(None, None)  # g1 is not returned again


def test_starting_the_active_goal_again_or_a_negative_limit_is_an_error() -> None:
    task, clock = started()
    with pytest.raises(ValueError, match="already active"):
        task.start("g1", "pick", 0.0, clock.node())
    with pytest.raises(ValueError, match="time_limit_s"):
        task.start("g2", "pick", -1.0, clock.node())
    assert task.active_goal == "g1"


def test_cancel_only_the_active_goal() -> None:
    task, clock = started()
    assert task.cancel("other") is False
    assert task.cancel("g1") is True
    assert task.cancel("g1") is False  # already ending
    ended = task.poll(clock.node()).ended
    assert ended == Ended("g1", Status.CANCELED, "canceled by the client", "", "", 0.0)
    assert task.cancel("g1") is False  # no longer active


def test_supersede_and_abort_end_the_active_task_first_ending_wins() -> None:
    task, clock = started()
    assert task.supersede("superseded by an instruction on the topic") is True
    assert task.abort("node shutting down") is False
    assert task.poll(clock.node()).ended == Ended(
        "g1", Status.SUPERSEDED, "superseded by an instruction on the topic", "", "", 0.0
    )
    task.start("g2", "pick", 0.0, clock.node())
    assert task.abort("node deactivated") is True
    assert task.poll(clock.node()).ended == Ended(
        "g2", Status.FAILED, "node deactivated", "", "", 0.0
    )
    # Idle: nothing to end.
    assert not task.supersede("x") and not task.abort("y") and not task.on_done()


def test_completion_signal_is_edge_triggered() -> None:
    task, clock = started()
    assert task.on_task_status(True) is False  # latched from the previous task
    assert task.poll(clock.node()) == Poll(None, None)
    assert task.on_task_status(False) is False  # armed
    assert task.on_task_status(False) is False
    assert task.on_task_status(True) is True
    assert task.on_task_status(True) is False
    assert task.poll(clock.node()).ended.status == Status.SUCCEEDED
    # A new task must see the signal false again.
    task.start("g2", "pick", 0.0, clock.node())
    assert task.on_task_status(True) is False
    assert task.poll(clock.node()) == Poll(None, None)
    assert task.on_task_status(True) is False  # still not armed
    assert task.on_task_status(False) is False and task.on_task_status(True) is True


def test_speech_from_another_thread_while_polling_ends_exactly_once() -> None:
    """The engine thread feeds words while the executor polls and a completion races them:
    every feedback carries words fed in order, and the task ends exactly once."""
    task, clock = started()
    fed = [f"step {i}" for i in range(2000)]

    def engine() -> None:
        for text in fed:
            task.on_speech(SUBTASK, text)
        task.on_done()

    thread = threading.Thread(target=engine)
    thread.start()
    feedbacks: list[Feedback] = []
    endings: list[Ended] = []
    while not endings:
        poll = task.poll(clock.node())
        feedbacks += [poll.feedback] if poll.feedback else []
        endings += [poll.ended] if poll.ended else []
    thread.join()
    assert task.poll(clock.node()) == Poll(None, None)
    assert len(endings) == 1 and endings[0].last_subtask == "step 1999"
    indices = [int(f.subtask.split()[1]) for f in feedbacks]
    assert indices == sorted(set(indices)) and indices[-1] == 1999
