"""The Instruct action over DDS: a host process (`instruct_host.py`, run like the inference
node: one single-threaded executor, `close()` after the spin) owns an `InstructServer` with a
scripted host; an rclpy ActionClient here sends goals. Checked: acceptance and refusals (with
positive controls), feedback of the fed subtask/narration, completion (SUCCEEDED, edge-
triggered), the time limit on wall and simulated time (TIME_LIMIT, a hold), cancel (CANCELED,
a hold), supersede by a goal and by a topic instruction, a refused instruction, deactivation
and shutdown (FAILED); every host call in the executor thread, and an idle active goal not
spinning the executor."""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path

import pytest
from action_msgs.msg import GoalStatus
from builtin_interfaces.msg import Duration, Time
from harness import DISCOVERY_TIMEOUT_S, wait_for
from rclpy.action import ActionClient
from rosgraph_msgs.msg import Clock
from std_msgs.msg import String

from oxygen_ros.action import Instruct
from oxygen_ros.nodes.common.runtime import RELIABLE_QOS, latched_qos

pytestmark = pytest.mark.integration

HOST = str(Path(__file__).with_name("instruct_host.py"))
START_TIMEOUT_S = 30.0  # interpreter + rclpy + discovery on 2 busy cores
REPLY_TIMEOUT_S = 10.0
Result = Instruct.Result


def seconds(d: Duration) -> float:
    return d.sec + d.nanosec * 1e-9


class Goal:
    """One goal sent by the test: its handle, feedback and result.

    Every request is made on the spin thread (`on_spin_thread`): rclpy's ActionClient stores a
    request's future, then adds its done callback, then hands it to the executor; a reply that
    completes the future in between makes that callback remove a future the executor does not
    hold yet (ValueError in the test thread, seen once in send_goal_async)."""

    def __init__(self, ros_node, client: ActionClient, text: str, limit_s: float) -> None:
        self.feedback: list[Instruct.Feedback] = []
        self._on_spin_thread = ros_node.on_spin_thread
        goal = Instruct.Goal(instruction=text)
        goal.time_limit = Duration(sec=int(limit_s), nanosec=round(limit_s % 1 * 1e9))
        sent = self._on_spin_thread(
            lambda: client.send_goal_async(goal, lambda msg: self.feedback.append(msg.feedback))
        )
        wait_for(sent.done, REPLY_TIMEOUT_S, f"the goal response to {text!r}")
        self.handle = sent.result()
        self.accepted = self.handle.accepted
        self._result = (
            self._on_spin_thread(self.handle.get_result_async) if self.accepted else None
        )

    def result(self) -> tuple[int, Instruct.Result]:
        """(goal terminal state, result) once the result came."""
        assert self._result is not None, "the goal was rejected"
        wait_for(self._result.done, REPLY_TIMEOUT_S, "the goal's result")
        response = self._result.result()
        return response.status, response.result

    def done(self) -> bool:
        return self._result is not None and self._result.done()

    def cancel(self):
        future = self._on_spin_thread(self.handle.cancel_goal_async)
        wait_for(future.done, REPLY_TIMEOUT_S, "the cancel response")
        return future.result()


class Host:
    """The host process, its script channel and an action client of its server."""

    def __init__(self, ros_node, launcher, prefix: str, ros_args=()) -> None:
        self.ros_node = ros_node
        self.node = ros_node.node
        self.calls_received = ros_node.collect(String, f"{prefix}/calls", latched_qos(1000))
        self._commands = self.node.create_publisher(String, f"{prefix}/commands", RELIABLE_QOS)
        self.client = ros_node.action_client(Instruct, f"{prefix}/instruct")
        self.process = launcher.start(HOST, ros_args=list(ros_args), args=[prefix])
        self._seq = itertools.count(1)
        # Both directions of the script channel matched: a ping is acknowledged.
        seq = next(self._seq)
        wait_for(
            lambda: self._publish(seq, "ping") or self._acked(seq) or not self.process.alive(),
            START_TIMEOUT_S,
            "the host's acknowledgement of a ping",
            poll_s=0.2,
        )
        assert self.process.alive(), self.process.log()
        assert self.client.wait_for_server(timeout_sec=DISCOVERY_TIMEOUT_S), "no action server"

    def _publish(self, seq: int, op: str, **fields) -> None:
        self._commands.publish(String(data=json.dumps({"seq": seq, "op": op, **fields})))

    def _records(self) -> list[dict]:
        return [json.loads(m.data) for m in list(self.calls_received)]

    def _acked(self, seq: int) -> dict | None:
        return next((r for r in self._records() if r.get("ack") == seq), None)

    def command(self, op: str, **fields) -> dict:
        """Runs one script command in the host; returns its acknowledgement."""
        seq = next(self._seq)
        self._publish(seq, op, **fields)
        wait_for(lambda: self._acked(seq), REPLY_TIMEOUT_S, f"the host's ack of {op}")
        return self._acked(seq)

    def calls(self, name: str | None = None) -> list[dict]:
        """The host calls (of `name`) made before now. A ping first: the host records its
        calls and acknowledges commands on one publisher, in order, and anything the client
        has seen (a goal response, a result) was sent before the host took the ping."""
        self.command("ping")
        return [r for r in self._records() if "call" in r and name in (None, r["call"])]

    def send(self, text: str, limit_s: float = 0.0) -> Goal:
        return Goal(self.ros_node, self.client, text, limit_s)

    def feed_until_feedback(self, goal: Goal) -> None:
        """Feeds narrations until the client's feedback subscription receives one (feedback
        is published only on change: each feed differs)."""
        count = itertools.count()
        wait_for(
            lambda: (
                goal.feedback
                or self.command("speech", kind="narration", text=f"warm-up {next(count)}") is None
            ),
            REPLY_TIMEOUT_S,
            "feedback to reach the client",
            poll_s=0.1,
        )


def latest(goal: Goal) -> tuple[str, str] | None:
    return (goal.feedback[-1].subtask, goal.feedback[-1].narration) if goal.feedback else None


def test_goal_feedback_then_rising_completion_succeeds(ros_node, launcher) -> None:
    host = Host(ros_node, launcher, "/t_instruct_a")
    goal = host.send("  pick the red cube ")
    assert goal.accepted
    assert [c["arg"] for c in host.calls("start_instruction")] == ["pick the red cube"]
    host.feed_until_feedback(goal)
    host.command("speech", kind="subtask", text="reach the cube")
    wait_for(lambda: latest(goal) and latest(goal)[0] == "reach the cube", 5, "subtask feedback")
    host.command("speech", kind="narration", text="I see a red cube")
    wait_for(
        lambda: latest(goal) == ("reach the cube", "I see a red cube"), 5, "narration feedback"
    )
    # Words begun under another prompt, and memory, are not the goal's.
    host.command("speech", kind="subtask", text="open the drawer", prompt="open the drawer")
    host.command("speech", kind="memory", text="the cube is red")
    # A success latched from before the goal does not end it: the goal is still active
    # after it (a later feedback arrives).
    host.command("task_status", success=True)
    host.command("speech", kind="subtask", text="lift the cube", prompt="pick the red cube")
    wait_for(lambda: latest(goal)[0] == "lift the cube", 5, "feedback after the stale success")
    assert not goal.done()
    assert {f.subtask for f in goal.feedback} <= {"", "reach the cube", "lift the cube"}
    assert all(
        seconds(b.elapsed) >= seconds(a.elapsed) for a, b in itertools.pairwise(goal.feedback)
    )
    # The signal rises: SUCCEEDED.
    host.command("task_status", success=False)
    host.command("task_status", success=True)
    state, result = goal.result()
    assert state == GoalStatus.STATUS_SUCCEEDED
    assert (result.status, result.message) == (
        Result.STATUS_SUCCEEDED,
        "task completion signalled",
    )
    assert (result.last_subtask, result.last_narration) == ("lift the cube", "I see a red cube")
    assert seconds(result.elapsed) >= seconds(goal.feedback[-1].elapsed)
    assert host.calls("hold") == []
    calls = host.calls()
    assert calls and all(c["executor_thread"] for c in calls), calls
    assert [c["call"] for c in calls] == ["accepting", "start_instruction"]


def test_time_limit_ends_aborted_with_time_limit_and_holds(ros_node, launcher) -> None:
    host = Host(ros_node, launcher, "/t_instruct_b")
    started = time.monotonic()
    goal = host.send("pick the red cube", limit_s=0.5)
    assert goal.accepted
    state, result = goal.result()
    waited = time.monotonic() - started
    assert state == GoalStatus.STATUS_ABORTED
    assert (result.status, result.message) == (
        Result.STATUS_TIME_LIMIT,
        "time limit of 0.5 s reached",
    )
    # The node clock (wall time here) ran past the limit, by at most a few poll periods.
    assert 0.5 <= seconds(result.elapsed) < 0.5 + 2.0, result.elapsed
    assert waited >= 0.5
    assert [(c["arg"], c["executor_thread"]) for c in host.calls("hold")] == [("time_limit", True)]


def test_time_limit_on_simulated_time(ros_node, launcher) -> None:
    """use_sim_time: the limit runs on /clock, published by the test, to exact values."""
    host = Host(ros_node, launcher, "/t_instruct_c", ros_args=["-p", "use_sim_time:=true"])
    clock = ros_node.node.create_publisher(Clock, "/clock", RELIABLE_QOS)
    ros_node.wait_for_subscribers(clock)

    def probe_at(t: float) -> bool:
        """Publishes /clock = t and sends a goal; True when its acceptance stamp is t (the
        host's clock is at t)."""
        clock.publish(Clock(clock=Time(sec=int(t), nanosec=round(t % 1 * 1e9))))
        probe = host.send("wait")
        return probe.accepted and seconds(probe.handle.stamp) == t

    wait_for(lambda: probe_at(100.0), REPLY_TIMEOUT_S, "the host's clock at 100 s", poll_s=0.1)
    goal = host.send("pick the red cube", limit_s=5.0)
    assert seconds(goal.handle.stamp) == 100.0
    clock.publish(Clock(clock=Time(sec=104, nanosec=900_000_000)))
    count = itertools.count()
    wait_for(
        lambda: (
            (goal.feedback and seconds(goal.feedback[-1].elapsed) == pytest.approx(4.9))
            or host.command("speech", kind="subtask", text=f"step {next(count)}") is None
        ),
        REPLY_TIMEOUT_S,
        "feedback at 104.9 s",
        poll_s=0.1,
    )
    assert not goal.done()  # 4.9 s of the 5 s passed
    assert goal.feedback[-1].elapsed == Duration(sec=4, nanosec=900_000_000)
    clock.publish(Clock(clock=Time(sec=105)))
    state, result = goal.result()
    assert state == GoalStatus.STATUS_ABORTED and result.status == Result.STATUS_TIME_LIMIT
    assert result.elapsed == Duration(sec=5, nanosec=0)
    assert [c["arg"] for c in host.calls("hold")] == ["time_limit"]


def test_cancel_holds_and_ends_canceled_and_an_active_goal_is_idle(ros_node, launcher) -> None:
    host = Host(ros_node, launcher, "/t_instruct_d")
    goal = host.send("pick the red cube")
    assert goal.accepted
    host.command("speech", kind="subtask", text="reach the cube")
    # While the goal waits the executor sleeps (execute awaits a future): the host uses
    # little CPU over a second (an executor resuming the coroutine in a loop uses a core).
    cpu_before = host.command("ping")["cpu_s"]
    window = time.monotonic()
    wait_for(lambda: time.monotonic() - window > 1.0, 2, "one second")
    cpu_s = host.command("ping")["cpu_s"] - cpu_before
    assert cpu_s < 0.3, f"{cpu_s:.2f} s CPU in 1 s with an idle goal"
    response = goal.cancel()
    assert [bytes(g.goal_id.uuid) for g in response.goals_canceling] == [
        bytes(goal.handle.goal_id.uuid)
    ]
    state, result = goal.result()
    assert state == GoalStatus.STATUS_CANCELED
    assert (result.status, result.message) == (Result.STATUS_CANCELED, "canceled by the client")
    assert result.last_subtask == "reach the cube"
    assert [(c["arg"], c["executor_thread"]) for c in host.calls("hold")] == [("canceled", True)]
    # Ended: a second cancel is refused.
    assert goal.cancel().goals_canceling == []


def test_a_new_goal_then_a_topic_instruction_supersede(ros_node, launcher) -> None:
    host = Host(ros_node, launcher, "/t_instruct_e")
    first = host.send("pick the red cube")
    second = host.send("open the drawer")
    assert first.accepted and second.accepted
    state, result = first.result()
    assert state == GoalStatus.STATUS_ABORTED
    assert (result.status, result.message) == (
        Result.STATUS_SUPERSEDED,
        "superseded by a new goal",
    )
    assert not second.done()
    host.feed_until_feedback(second)
    assert first.feedback == []  # the new goal's words are its own
    host.command("topic_instruction")
    state, result = second.result()
    assert state == GoalStatus.STATUS_ABORTED
    assert (result.status, result.message) == (
        Result.STATUS_SUPERSEDED,
        "superseded by an instruction on the instruction topic",
    )
    assert result.last_narration.startswith("warm-up")
    assert [c["arg"] for c in host.calls("start_instruction")] == [
        "pick the red cube",
        "open the drawer",
    ]
    assert host.calls("hold") == []


def test_refusals_with_positive_controls_then_deactivation_fails_the_goal(
    ros_node, launcher
) -> None:
    host = Host(ros_node, launcher, "/t_instruct_f")
    host.command("accepting", reason="node inactive")
    assert not host.send("pick the red cube").accepted
    assert host.calls("start_instruction") == []
    host.command("accepting", reason="")
    assert host.send("pick the red cube").accepted  # positive control
    assert not host.send("   ").accepted
    assert not host.send("x" * 41).accepted  # MAX_CHARS 40 in the host
    assert not host.send("pick", limit_s=-1.0).accepted
    active = host.send("x" * 40)  # positive control: at the limit
    assert active.accepted
    # The host refuses to apply an instruction: that goal fails, the active one goes on.
    host.command("start_refusal", reason="engine failed")
    refused = host.send("open the drawer")
    assert refused.accepted
    state, result = refused.result()
    assert state == GoalStatus.STATUS_ABORTED
    assert (result.status, result.message) == (
        Result.STATUS_FAILED,
        "instruction not applied: engine failed",
    )
    host.feed_until_feedback(active)
    assert not active.done()
    host.command("abort_all", reason="node deactivated")
    state, result = active.result()
    assert state == GoalStatus.STATUS_ABORTED
    assert (result.status, result.message) == (Result.STATUS_FAILED, "node deactivated")
    assert [c["arg"] for c in host.calls("start_instruction")] == [
        "pick the red cube",
        "x" * 40,
        "open the drawer",
    ]


def test_shutdown_ends_the_active_goal_failed(ros_node, launcher) -> None:
    host = Host(ros_node, launcher, "/t_instruct_g")
    goal = host.send("pick the red cube")
    assert goal.accepted
    host.feed_until_feedback(goal)  # the result channel is matched too by now
    assert host.process.stop() == 0  # SIGINT: run_node ends the spin, then close()
    state, result = goal.result()
    assert state == GoalStatus.STATUS_ABORTED
    assert (result.status, result.message) == (Result.STATUS_FAILED, "node shutting down")
