"""When the cube state's current task began, in the clock the images are stamped with (ROS-free).

A task for the cube state begins at an instruction, and in the simulated workcell also at each
episode reset: the world jumps there (the robot to home, the cubes to a new layout), and an
image taken before it shows a layout that is gone. Perception must not feed such an image to
the task's fresh tracker.

The receiving node's clock at the instruction is not enough on its own: the simulator publishes
the instruction at the reset, right after the tick whose images carry the reset's own stamp, and
a node may handle the instruction before the `/clock` message of that tick (the clock lags by a
tick or more). The reset's time, which the simulator's episode status reports (its stamp minus
the elapsed time), is exact, but its message may be handled after the instruction, and a frame
built in between would feed the tracker the old world (seen once in test_observation_parity, on
a loaded machine). So the task also starts no earlier than the newest cube image the node had
received when the instruction came: that image was taken before the instruction was handled,
and the last tick before a reset is published before the reset's instruction. `TaskWindow`
takes the latest of the three.

The inference node's frame inbox (`nodes.inference.frame_inbox.FrameInbox`) keeps the start of
its task with the same rule, for observation frames instead of images (it has no tracker, so it
ignores what `on_reset` returns, and reports no `received` frames: its task starts at the later
of its clock and the reset): one rule and one clock-went-back bound for both nodes.

Invariants:
- `before_task(stamp)` holds for every stamp at or before the task's start (the image at the
  reset's own stamp was rendered before the reset); an instruction handled a little after a
  reset (the clock lagging or not) starts the task no earlier than the reset, nor earlier than
  the newest image `received` before it.
- A reset is a new task for the tracker too (a new layout: `on_reset` returns True), unless
  the tracker began at or after it (its instruction came later) and saw only later images; so
  a reset known only after the tracker was fed an image at or before it restarts the tracker,
  and no image from before the reset stays in the task's state.
- The clock may go back (a new simulator starts at 0): a start, reset or received image more
  than `MAX_LAG_S` ahead of a newer instruction or reset is dropped rather than blocking every
  image from then on.

A reset the node has not heard of yet cannot restart anything: DDS orders no messages across
topics, and under load images of the new episode reached perception before the reset's status
(and before its instruction), so the previous task's tracker was fed the new layout and a frame
after the reset carried it (a clean-clone CI run of test_observation_parity, 2026-12-04). The
simulator publishes a status before each tick's images, so a node that has handled a status at
or after an image's stamp has heard of every reset up to that image. `StatusGate` keeps images
newer than the newest status handled out of the tracker until one arrives, for at most
`wait_s` of image time (a status stream that is not periodic, or stopped, then lets them in).
"""

from __future__ import annotations

import math

MAX_LAG_S = 1.0  # a start further ahead of a newer time means the clock went back
# Stamps travel as integer nanoseconds, and a reset computed from a later status (stamp minus
# elapsed_s) can differ from the reset tick's own stamp by a nanosecond.
STAMP_TOLERANCE_S = 1e-6


def _went_back(seen_s: float, now_s: float) -> bool:
    """A time seen before lies more than `MAX_LAG_S` ahead of the newer `now_s`: the clock
    went back in between."""
    return seen_s > now_s + MAX_LAG_S


class TaskWindow:
    """The start of the current task and the images fed to its tracker."""

    def __init__(self) -> None:
        self.start_s = -math.inf  # images stamped at or before this are not the task's
        self._reset_s = -math.inf  # the newest episode reset known
        self._fed_from = math.inf  # the oldest image stamp fed to the current tracker
        self._received_s = -math.inf  # the newest image stamp received

    def received(self, image_stamp: float) -> None:
        """The node received an image stamped `image_stamp` (fed to the tracker or not)."""
        if image_stamp > self._received_s or _went_back(self._received_s, image_stamp):
            self._received_s = image_stamp  # newer, or the clock went back

    def on_instruction(self, now_s: float) -> None:
        """A new task (with a fresh tracker) at the receiving clock's `now_s`."""
        if _went_back(self._reset_s, now_s):  # a reset of the clock before
            self._reset_s = -math.inf
        if _went_back(self._received_s, now_s):  # an image of the clock before
            self._received_s = -math.inf
        self.start_s = max(now_s, self._reset_s, self._received_s)
        self._fed_from = math.inf

    def on_reset(self, reset_s: float) -> bool:
        """A new episode's reset at `reset_s` (the caller passes each episode once); True when
        the tracker must start afresh: it began before the reset, or was fed an image taken
        at or before it, or the clock went back."""
        went_back = _went_back(self.start_s, reset_s)
        self._reset_s = reset_s
        if went_back or self.start_s < reset_s or self._fed_from <= reset_s:
            self.start_s = reset_s
            self._fed_from = math.inf
            return True
        return False

    def before_task(self, image_stamp: float) -> bool:
        """Whether an image stamped `image_stamp` was taken before the current task began."""
        return image_stamp <= self.start_s + STAMP_TOLERANCE_S

    def fed(self, image_stamp: float) -> None:
        """The tracker was fed an image stamped `image_stamp`."""
        self._fed_from = min(self._fed_from, image_stamp)


class StatusGate:
    """Whether an image may be fed to the tracker: the episode status stream has caught up with
    it (or `wait_s` of image time passed without a status since).

    Invariants:
    - Off (`wait_s` 0) or before the first status: every image passes.
    - An image stamped at or before the newest status handled passes; a newer one waits while
      it is at most `wait_s` ahead of that status, and passes once it is further ahead.
    - The clock may go back (a new simulator): a status more than `MAX_LAG_S` behind the newest
      one replaces it.
    """

    def __init__(self, wait_s: float) -> None:
        self.wait_s = wait_s
        self.status_s = -math.inf  # the newest status stamp handled

    def on_status(self, stamp_s: float) -> None:
        if stamp_s > self.status_s or _went_back(self.status_s, stamp_s):
            self.status_s = stamp_s

    def waits(self, image_stamp: float) -> bool:
        """Whether the image stamped `image_stamp` must wait for a newer status."""
        ahead = image_stamp - self.status_s
        return self.wait_s > 0 and STAMP_TOLERANCE_S < ahead <= self.wait_s


class InstructionWait:
    """Frames held from a reset until the new episode's instruction arrives.

    The simulator publishes a reset's episode status (to perception directly) and the episode's
    instruction (which reaches perception through the inference node, as the instruction in
    use); they arrive in either order. A frame built between a status that came first and the
    instruction would carry the previous task's target cube (none, before the first episode).
    So a reset whose episode names another target than the current task's holds frames until
    an instruction arrives, or `timeout_s` on the node's clock (a robot whose instruction is
    given some other way: its frames then go on with the current target).

    Invariants:
    - No hold when the episode names the current target (the instruction came first, or the
      same cube again) or no target at all.
    - A hold ends at the next instruction, at the timeout, or when the clock goes back (a new
      simulator starting at 0), whichever is first; `holds` reports each timeout once.
    """

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.since_s: float | None = None  # when the current hold began (None: no hold)
        self.awaited: str | None = None  # the target the held-for episode names

    def on_reset(self, episode_target: str | None, current_target: str | None, now_s: float):
        """A new episode whose instruction names `episode_target`."""
        if episode_target is None or episode_target == current_target:
            self.since_s, self.awaited = None, None
        else:
            self.since_s, self.awaited = now_s, episode_target

    def on_instruction(self) -> None:
        self.since_s, self.awaited = None, None

    def holds(self, now_s: float) -> tuple[bool, bool]:
        """(hold this frame, the hold just timed out)."""
        if self.since_s is None:
            return False, False
        if now_s < self.since_s:  # the clock went back: a new simulator
            self.since_s, self.awaited = None, None
            return False, False
        if now_s - self.since_s < self.timeout_s:
            return True, False
        self.since_s, self.awaited = None, None
        return False, True
