"""Test host of an `InstructServer`: a node run like the inference node (`run_node`, one
single-threaded executor in the main thread, `close()` after the spin) whose host methods are
scripted and recorded.

Usage: instruct_host.py <prefix> [--ros-args ...]. The action is `<prefix>/instruct`.
- `<prefix>/commands` (std_msgs/String, JSON `{"seq": n, "op": ..., ...}`) scripts it:
  `ping`; `accepting` {reason} (what `accepting()` answers); `start_refusal` {reason} (what
  `start_instruction` answers); `speech` {kind, text, prompt?} (`on_speech` from a separate
  "engine" thread); `task_status` {success}; `topic_instruction`; `abort_all` {reason}.
  Each command is acknowledged on the calls topic once it ran: `{"ack": n, "cpu_s": ...}`.
- `<prefix>/calls` (latched, 1000 kept) records every host call: `{"call": "accepting" |
  "start_instruction" | "hold", "arg": ..., "executor_thread": bool}`, and `{"closed":
  flushed}` when `close()` ended the goals at shutdown.
"""

from __future__ import annotations

import json
import queue
import sys
import threading
import time

from rclpy.node import Node
from std_msgs.msg import String

from oxygen_ros.nodes.common.runtime import RELIABLE_QOS, latched_qos, run_node
from oxygen_ros.nodes.inference.instruct_server import InstructServer

POLL_PERIOD_S = 0.05
MAX_CHARS = 40
FLUSH_S = 5.0


class ScriptedHost(Node):
    def __init__(self, prefix: str) -> None:
        super().__init__("instruct_host")
        self.refusal = ""  # accepting()
        self.start_refusal = ""  # start_instruction()
        self._calls = self.create_publisher(String, f"{prefix}/calls", latched_qos(1000))
        self.create_subscription(String, f"{prefix}/commands", self._on_command, RELIABLE_QOS)
        self.server = InstructServer(
            self, f"{prefix}/instruct", self, max_chars=MAX_CHARS, poll_period_s=POLL_PERIOD_S
        )
        self._speech: queue.Queue = queue.Queue()
        self._engine = threading.Thread(target=self._engine_thread, daemon=True)
        self._engine.start()

    # InstructHost
    def accepting(self) -> str:
        self._record("accepting", self.refusal)
        return self.refusal

    def start_instruction(self, text: str) -> str:
        self._record("start_instruction", text)
        return self.start_refusal

    def hold(self, reason: str) -> None:
        self._record("hold", reason)

    # scripting
    def _record(self, call: str, arg: str) -> None:
        main = threading.current_thread() is threading.main_thread()
        self._publish({"call": call, "arg": arg, "executor_thread": main})

    def _publish(self, value: dict) -> None:
        self._calls.publish(String(data=json.dumps(value)))

    def _ack(self, seq: int) -> None:
        self._publish({"ack": seq, "cpu_s": time.process_time()})

    def _on_command(self, msg: String) -> None:
        cmd = json.loads(msg.data)
        op = cmd["op"]
        if op == "speech":
            self._speech.put(cmd)  # acknowledged by the engine thread
            return
        if op == "accepting":
            self.refusal = cmd["reason"]
        elif op == "start_refusal":
            self.start_refusal = cmd["reason"]
        elif op == "task_status":
            self.server.on_task_status(cmd["success"])
        elif op == "topic_instruction":
            self.server.on_topic_instruction()
        elif op == "abort_all":
            self.server.abort_all(cmd["reason"])
        elif op != "ping":
            raise ValueError(f"unknown op {op!r}")
        self._ack(cmd["seq"])

    def _engine_thread(self) -> None:
        while (cmd := self._speech.get()) is not None:
            self.server.on_speech(cmd["kind"], cmd["text"], cmd.get("prompt"))
            self._ack(cmd["seq"])

    def close(self) -> None:
        self.server.abort_all("node shutting down")
        flushed = self.server.flush(FLUSH_S)
        self._publish({"closed": flushed})
        self._speech.put(None)
        self._engine.join(2.0)


def main() -> int:
    prefix = sys.argv[1]
    return run_node(lambda: ScriptedHost(prefix), "instruct_host", num_threads=1)


if __name__ == "__main__":
    sys.exit(main())
