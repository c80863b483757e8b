"""TaskWindow: which cube-camera images belong to the current task, across instructions and
simulator resets, whatever order they reach the node in and however far its clock lags."""

from __future__ import annotations

from oxygen_ros.perception.task_window import MAX_LAG_S, InstructionWait, StatusGate, TaskWindow

DT = 0.01  # the simulator's control tick
RESET = 12.34  # the reset's sim time = the stamp of the last tick (and images) before it


def test_before_any_task_every_image_counts() -> None:
    assert not TaskWindow().before_task(0.0)


def test_the_image_at_the_reset_s_own_stamp_is_before_the_task() -> None:
    """The clock on time: the instruction arrives at the reset's own time; the image of that
    tick was rendered before the reset (the flake in test_observation_parity)."""
    window = TaskWindow()
    window.on_instruction(RESET)
    assert window.before_task(RESET)
    assert not window.before_task(RESET + DT)


def test_a_lagging_clock_is_corrected_by_the_reset_whichever_comes_first() -> None:
    # The status first, then the instruction handled while the clock lags two ticks.
    window = TaskWindow()
    assert window.on_reset(RESET)  # the tracker of before the reset started afresh
    window.on_instruction(RESET - 2 * DT)
    assert window.before_task(RESET) and window.before_task(RESET - DT)
    assert not window.before_task(RESET + DT)
    # The instruction first (clock lagging): without the reset it would let the old image in
    # (the positive control); the reset then moves the start and restarts the tracker that was
    # fed that image.
    window = TaskWindow()
    window.on_instruction(RESET - 2 * DT)
    assert not window.before_task(RESET)
    window.fed(RESET)
    assert window.on_reset(RESET)
    assert window.before_task(RESET)
    assert not window.before_task(RESET + DT)


def test_an_image_received_before_the_instruction_is_before_the_task() -> None:
    """The instruction handled before the status and with the clock lagging two ticks (the
    first-episode flake in test_observation_parity): the reset tick's image, received before
    the instruction, stays out of the task although no reset is known yet."""
    window = TaskWindow()
    window.received(RESET - DT)
    window.received(RESET)
    window.on_instruction(RESET - 2 * DT)
    assert window.before_task(RESET)
    assert not window.before_task(RESET + DT)
    # The positive control: the same order without the image received lets it in.
    window = TaskWindow()
    window.on_instruction(RESET - 2 * DT)
    assert not window.before_task(RESET)
    # An image of a clock that went back since (an old simulator's) does not hold the task.
    window = TaskWindow()
    window.received(RESET)
    window.on_instruction(DT)
    assert not window.before_task(2 * DT)
    # nor does an old clock's newest image keep a new clock's images from counting as newer.
    window = TaskWindow()
    window.received(RESET)
    window.received(DT)
    window.on_instruction(0.0)
    assert window.before_task(DT) and not window.before_task(2 * DT)


def test_a_tracker_begun_after_the_reset_is_kept() -> None:
    """The workcell graph: the instruction passes through the inference node, so it arrives
    after the reset (clock ahead of it) and the status after that; the tracker saw only images
    of the new episode and is kept."""
    window = TaskWindow()
    window.on_instruction(RESET + 3 * DT)
    window.fed(RESET + 4 * DT)
    assert not window.on_reset(RESET)
    assert window.before_task(RESET + 3 * DT)  # the instruction's start stays
    assert not window.before_task(RESET + 4 * DT)
    # The positive control: the same tracker fed an image from the reset's tick is restarted.
    window = TaskWindow()
    window.on_instruction(RESET + 3 * DT)
    window.fed(RESET)  # cannot pass before_task; fed() still records it
    assert window.on_reset(RESET)


def test_a_reset_without_an_instruction_is_a_new_task() -> None:
    """The same instruction again without a new publication (publish_instruction off): the
    reset alone starts the tracker afresh (a new layout), and the old layout's images stay out."""
    window = TaskWindow()
    window.on_instruction(1.0)
    window.fed(1.5)
    assert window.on_reset(RESET)
    assert window.before_task(RESET)
    assert not window.before_task(RESET + DT)


def test_a_clock_that_went_back_does_not_block_every_image() -> None:
    """A new simulator starts at 0: its first reset and instruction start a task at the new
    time, not after the old clock's times."""
    window = TaskWindow()
    window.on_reset(RESET)
    window.on_instruction(RESET)
    assert window.on_reset(0.0)  # far back: a new clock, a new tracker
    assert not window.before_task(DT)
    window = TaskWindow()
    window.on_reset(RESET)
    window.on_instruction(RESET)
    window.on_instruction(RESET - MAX_LAG_S - 1.0)  # an instruction on the new clock
    assert not window.before_task(RESET - MAX_LAG_S)


def test_a_reset_naming_another_cube_holds_frames_until_the_instruction() -> None:
    wait = InstructionWait(timeout_s=1.0)
    assert wait.holds(RESET) == (False, False)  # before any reset
    wait.on_reset("blue_cube", "red_cube", RESET)  # the status came first
    assert wait.holds(RESET + DT) == (True, False)
    assert wait.awaited == "blue_cube"
    wait.on_instruction()
    assert wait.holds(RESET + 2 * DT) == (False, False)
    # The first episode: no target yet, so its reset holds too.
    wait.on_reset("red_cube", None, RESET)
    assert wait.holds(RESET + DT) == (True, False)


def test_no_hold_when_the_instruction_came_first_or_names_the_same_cube() -> None:
    wait = InstructionWait(timeout_s=1.0)
    wait.on_reset("red_cube", "red_cube", RESET)
    assert wait.holds(RESET + DT) == (False, False)
    wait.on_reset(None, "red_cube", RESET)  # an episode whose instruction names no cube
    assert wait.holds(RESET + DT) == (False, False)


def test_a_hold_ends_at_the_timeout_once_or_when_the_clock_goes_back() -> None:
    wait = InstructionWait(timeout_s=1.0)
    wait.on_reset("blue_cube", "red_cube", RESET)
    assert wait.holds(RESET + 0.99) == (True, False)
    assert wait.holds(RESET + 1.0) == (False, True)  # reported once
    assert wait.holds(RESET + 1.1) == (False, False)
    wait.on_reset("blue_cube", "red_cube", RESET)
    assert wait.holds(0.5) == (False, False)  # a new simulator started at 0


def test_an_image_newer_than_the_newest_status_waits_for_one() -> None:
    """The simulator publishes a status before each tick's images; an image that arrived
    before its tick's status (no order across topics: the CI flake of 2026-12-04, a frame
    after a reset with the old task's tracker fed the new layout) waits until a status at or
    after its stamp is handled."""
    gate = StatusGate(wait_s=0.5)
    assert not gate.waits(RESET)  # before the first status: a robot without a simulator
    gate.on_status(RESET)
    assert not gate.waits(RESET) and not gate.waits(RESET - DT)
    assert gate.waits(RESET + DT)  # its tick's status (and maybe a reset) still to come
    gate.on_status(RESET + DT)
    assert not gate.waits(RESET + DT)
    assert gate.waits(RESET + 2 * DT)
    # A status stream that stopped (or is not periodic) holds images at most wait_s.
    assert gate.waits(RESET + DT + 0.5)
    assert not gate.waits(RESET + DT + 0.5 + DT)
    # An older status (reordered) does not move it back.
    gate.on_status(RESET)
    assert not gate.waits(RESET + DT)
    # The positive control of "passes": the same images with the gate off.
    off = StatusGate(wait_s=0.0)
    off.on_status(RESET)
    assert not off.waits(RESET + DT)


def test_a_status_of_a_clock_that_went_back_replaces_the_newest() -> None:
    gate = StatusGate(wait_s=0.5)
    gate.on_status(RESET)
    gate.on_status(0.1)  # a new simulator, its clock from 0
    assert gate.waits(0.1 + DT)
    assert not gate.waits(0.1)
    # Within MAX_LAG_S an older status is a reordered one, not a new clock: kept out.
    gate.on_status(0.1 - MAX_LAG_S / 2)
    assert gate.status_s == 0.1
