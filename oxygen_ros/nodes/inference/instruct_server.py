"""The `oxygen_ros/action/Instruct` server: one instruction run as a task with feedback, a
result, a time limit and cancel. The thin rclpy part; `instruct_task.InstructTask` keeps the
books and a host (the inference node) applies instructions and holds the robot.

The host (`InstructHost`, called in the executor thread only):
- `accepting()`: "" while goals may start, else why not (for example "node inactive");
- `start_instruction(text)`: make `text` the prompt (and release a hold this server asked
  for); "" when applied, else why not;
- `hold(reason)`: stop motion with an explicit hold at the measured pose (after a cancel or
  a time limit, see `hold_on`).

The node calls, from any thread (each only records and wakes the executor):
- `on_speech(kind, text, prompt)`: a finished subtask or narration (the engine thread's
  `on_finished`), reported as feedback when the words change;
- `on_task_status(success)`: the task-completion signal. The inference node is to subscribe
  an `oxygen_ros/EpisodeStatus` topic named by a parameter and pass its `success`; the goal
  succeeds when the signal rises (false, then true) while it runs, so a success latched from
  the previous task does not end a new goal;
- `on_topic_instruction()`: an instruction arrived on the instruction topic (it replaced the
  goal's);
- `abort_all(reason)`: deactivation or shutdown. Results reach clients only while the
  executor spins: from a callback (lifecycle `on_deactivate`) they go out on the next spins;
  after the spin loop has ended (`close()` in `run_node`) call `flush` next.

Result status -> goal terminal state (rclpy: `succeed()`, `canceled()`, `abort()`):
- STATUS_SUCCEEDED -> SUCCEEDED;
- STATUS_CANCELED -> CANCELED (only reachable after a client's cancel request);
- STATUS_TIME_LIMIT -> ABORTED: the terminal state answers "was the goal achieved?", and at
  the limit the completion signal had not come. A client that only reads the state (a
  behaviour tree's action node) then treats it as a failure, which it is; one that used the
  limit as "act for N seconds" reads `result.status`;
- STATUS_SUPERSEDED, STATUS_FAILED -> ABORTED: not achieved, and ROS 2 has no preempted state
  (CANCELED needs a cancel request; nav2 aborts a preempted goal the same way).

Invariants:
- At most one goal is active; a new goal, once its instruction is applied, supersedes it.
  A goal whose instruction the host refuses ends FAILED and leaves the active one running.
- Every accepted goal ends with exactly one result (`InstructTask`).
- Never blocks the executor: `execute` is a coroutine awaiting a future that `_step` resolves;
  `_step` runs in the executor thread on a guard condition (woken by every event) and on a
  timer of `poll_period_s` on the node clock (the time limit; sim time under use_sim_time),
  running only while a goal with a time limit is active.
- Goal handles and the host are used from executor callbacks only (made for a
  single-threaded executor, the inference node's); the node-facing calls only record (under
  `InstructTask`'s lock) and trigger a guard condition, so any thread may make them.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import threading
import time
import uuid
from collections.abc import Collection
from typing import Protocol

from rclpy.action import ActionServer, CancelResponse, GoalResponse
from rclpy.action.server import ServerGoalHandle
from rclpy.callback_groups import CallbackGroup
from rclpy.exceptions import InvalidHandle
from rclpy.node import Node
from rclpy.task import Future

from oxygen_ros.action import Instruct
from oxygen_ros.nodes.common.conversions import seconds_to_duration
from oxygen_ros.nodes.common.runtime import ReasonThrottle, now_s
from oxygen_ros.nodes.inference.instruct_task import Ended, InstructTask, Status

POLL_PERIOD_S = 0.1  # time-limit resolution while a goal is active
DEFAULT_MAX_CHARS = 400  # the inference node's `instruction_max_chars` default
HOLD_ON = frozenset({Status.CANCELED, Status.TIME_LIMIT})  # endings that hold the robot
THROTTLE_S = 5.0
FLUSH_SPIN_S = 0.01


class InstructHost(Protocol):
    """What the server needs from its node; called in the executor thread."""

    def accepting(self) -> str:
        """Why goals are refused now (for example "node inactive"); empty while they may
        start."""
        ...

    def start_instruction(self, text: str) -> str:
        """Applies `text` as the prompt and releases a hold this server asked for; "" when
        applied, else why not."""
        ...

    def hold(self, reason: str) -> None:
        """Stops motion with an explicit hold at the measured pose (`reason`: "canceled",
        "time_limit")."""
        ...


@dataclasses.dataclass
class _Goal:
    handle: ServerGoalHandle  # rclpy's goal handle
    result: Future  # resolved with the goal's `Ended` by `_finish`


def goal_key(handle: ServerGoalHandle) -> bytes:
    """The goal's UUID bytes (the task's goal id)."""
    return bytes(handle.goal_id.uuid)


def goal_name(key: bytes) -> str:
    """A short printable goal id (logs)."""
    return str(uuid.UUID(bytes=key))[:8]


def result_msg(ended: Ended) -> Instruct.Result:
    return Instruct.Result(
        status=int(ended.status),
        message=ended.message,
        last_subtask=ended.last_subtask,
        last_narration=ended.last_narration,
        elapsed=seconds_to_duration(ended.elapsed_s),
    )


class InstructServer:
    """The Instruct action server of one node; see the module docstring."""

    def __init__(
        self,
        node: Node,
        action_name: str,
        host: InstructHost,
        callback_group: CallbackGroup | None = None,
        *,
        max_chars: int = DEFAULT_MAX_CHARS,
        poll_period_s: float = POLL_PERIOD_S,
        hold_on: Collection[Status] = HOLD_ON,
    ) -> None:
        """
        Args:
            node: The node the server, its timer and guard condition belong to.
            action_name: The action's name (resolved like a topic).
            host: Applies instructions and holds (`InstructHost`).
            callback_group: For the server, timer and guard condition (None: the node's
                default group).
            max_chars: Longest instruction accepted (after stripping).
            poll_period_s: Period of the time-limit check while a goal is active.
            hold_on: Endings after which `host.hold(<status name, lower case>)` is called.
        """
        self._node = node
        self._host = host
        self._max_chars = max_chars
        self._hold_on = frozenset(hold_on)
        self._task = InstructTask()
        self._goals: dict[bytes, _Goal] = {}  # accepted, execute not returned yet
        self._lock = threading.Lock()
        self._throttle = ReasonThrottle(THROTTLE_S)
        self.counters: collections.Counter[str] = collections.Counter()
        self._wake = node.create_guard_condition(self._step, callback_group=callback_group)
        self._timer = node.create_timer(
            poll_period_s, self._step, callback_group=callback_group, autostart=False
        )
        self._server = ActionServer(
            node,
            Instruct,
            action_name,
            execute_callback=self._execute,
            callback_group=callback_group,
            goal_callback=self._on_goal,
            handle_accepted_callback=self._on_accepted,
            cancel_callback=self._on_cancel,
        )

    # ================================================================ node-facing (any thread)
    @property
    def instruction(self) -> str:
        """The active goal's instruction ("" when none is active)."""
        return self._task.instruction

    def on_speech(self, kind: str, text: str, prompt: str | None = None) -> None:
        """A finished subtask or narration (`RequestKind.value`, the whole text, and the
        prompt its request started under, `Finished.prompt`: words begun under an earlier
        instruction are not the goal's)."""
        if self._task.on_speech(kind, text, prompt):
            self._wake_executor()

    def on_task_status(self, success: bool) -> None:
        """The task-completion signal (`EpisodeStatus.success`); rising while a goal runs ends
        it SUCCEEDED."""
        if self._task.on_task_status(success):
            self._wake_executor()

    def on_topic_instruction(self) -> None:
        """An instruction on the instruction topic replaced the goal's (SUPERSEDED)."""
        if self._task.supersede("superseded by an instruction on the instruction topic"):
            self._wake_executor()

    def abort_all(self, reason: str) -> None:
        """Ends the active goal FAILED with `reason` (deactivation, shutdown)."""
        if self._task.abort(reason):
            self._wake_executor()

    def flush(self, timeout_s: float) -> bool:
        """Spins the node's executor until every goal's result is handed to rclpy, at most
        `timeout_s`. Only for the thread that spun the executor, after its spin loop ended
        (the node's `close()`): other callbacks of the node may run meanwhile. Returns True
        when every goal ended and rclpy sent the results clients had asked for."""
        executor = self._node.executor
        if executor is None:
            return not self._running()
        deadline = time.monotonic() + timeout_s
        while self._running() and time.monotonic() < deadline:
            executor.spin_once(timeout_sec=FLUSH_SPIN_S)
        if self._running():
            return False
        # rclpy sends each result from a task queued when the goal ended (a done callback
        # of its result future); tasks run in the order they were queued, so one queued now
        # completes after them.
        marker = executor.create_task(lambda: None)
        executor.spin_until_future_complete(marker, max(0.0, deadline - time.monotonic()))
        return marker.done()

    def destroy(self) -> None:
        """Destroys the action server, timer and guard condition (goals end unanswered: call
        `abort_all` and let the executor spin first)."""
        self._server.destroy()
        self._node.destroy_timer(self._timer)
        self._node.destroy_guard_condition(self._wake)

    # ================================================================ rclpy callbacks
    def _on_goal(self, goal: Instruct.Goal) -> GoalResponse:
        reason = self._refusal(goal)
        if reason:
            self.counters["goals_rejected"] += 1
            self._throttle.warn(
                self._node, f"instruct_rejected.{reason}", f"goal rejected: {reason}"
            )
            return GoalResponse.REJECT
        return GoalResponse.ACCEPT

    def _refusal(self, goal: Instruct.Goal) -> str:
        """Why `goal` is rejected ("" to accept)."""
        reason = self._host.accepting()
        if reason:
            return reason
        text = goal.instruction.strip()
        if not text:
            return "empty instruction"
        if "\ufffd" in text:
            return "instruction is not valid UTF-8"
        if len(text) > self._max_chars:
            return f"instruction longer than {self._max_chars} characters"
        if goal.time_limit.sec < 0:
            return "negative time_limit"
        return ""

    def _on_accepted(self, handle: ServerGoalHandle) -> None:
        key = goal_key(handle)
        goal = handle.request
        text = goal.instruction.strip()
        limit = goal.time_limit.sec + goal.time_limit.nanosec * 1e-9
        with self._lock:
            self._goals[key] = _Goal(handle, Future())
        self.counters["goals_accepted"] += 1
        refusal = self._host.start_instruction(text)
        now = now_s(self._node)
        if refusal:
            # Never active: the running goal (if any) goes on.
            failed = Ended(key, Status.FAILED, f"instruction not applied: {refusal}", "", "", 0.0)
            self._finish(failed)
        else:
            previous = self._task.start(key, text, limit, now)
            self._node.get_logger().info(
                f"instruct goal {goal_name(key)}: {text!r}"
                + (f", time limit {limit:g} s" if limit > 0 else "")
            )
            if previous is not None:
                self._finish(previous)
            # The timer only checks time limits: it runs while a limited goal is active.
            if limit > 0:
                self._timer.reset()
            else:
                self._timer.cancel()
        handle.execute()

    def _on_cancel(self, handle: ServerGoalHandle) -> CancelResponse:
        if not self._task.cancel(goal_key(handle)):
            return CancelResponse.REJECT  # not the active goal, or already ending
        self._wake_executor()
        return CancelResponse.ACCEPT

    async def _execute(self, handle: ServerGoalHandle) -> Instruct.Result:
        key = goal_key(handle)
        with self._lock:
            future = self._goals[key].result
        ended: Ended = await future
        with self._lock:
            del self._goals[key]
        if ended.status == Status.SUCCEEDED:
            handle.succeed()
        elif ended.status == Status.CANCELED and handle.is_cancel_requested:
            handle.canceled()
        else:
            handle.abort()
        return result_msg(ended)

    # ================================================================ executor thread
    def _step(self) -> None:
        """Publishes changed feedback and ends what ended (guard condition and timer)."""
        poll = self._task.poll(now_s(self._node))
        if poll.feedback is not None:
            with self._lock:
                goal = self._goals.get(poll.feedback.goal_id)
            if goal is not None:
                goal.handle.publish_feedback(
                    Instruct.Feedback(
                        subtask=poll.feedback.subtask,
                        narration=poll.feedback.narration,
                        elapsed=seconds_to_duration(poll.feedback.elapsed_s),
                    )
                )
        if poll.ended is not None:
            self._finish(poll.ended)
        if self._task.active_goal is None and not self._timer.is_canceled():
            self._timer.cancel()

    def _finish(self, ended: Ended) -> None:
        """Holds if `ended.status` asks for it, then resolves the goal's future (its execute
        coroutine sets the terminal state and returns the result)."""
        name = ended.status.name.lower()
        if ended.status in self._hold_on:
            self._host.hold(name)
        self.counters[f"results.{name}"] += 1
        self._node.get_logger().info(
            f"instruct goal {goal_name(ended.goal_id)} ended {ended.status.name}: "
            f"{ended.message} after {ended.elapsed_s:.2f} s"
        )
        with self._lock:
            goal = self._goals.get(ended.goal_id)
        if goal is not None and not goal.result.done():
            goal.result.set_result(ended)

    def _wake_executor(self) -> None:
        """Runs `_step` soon in the executor thread (callable from any thread)."""
        with contextlib.suppress(InvalidHandle):  # destroyed: nothing left to step
            self._wake.trigger()

    def _running(self) -> bool:
        with self._lock:
            return bool(self._goals)
