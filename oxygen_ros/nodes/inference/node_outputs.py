"""The inference node's outputs (a part of `InferenceNode`, `inference_node`): what the action
process reports (ready, watchdog), SpeechTokens from the request book, finished requests
(Instruct feedback, memory entries committed, then published) and the memory republished at
start.

`InferenceOutputs` is a mixin of the node: its methods read the node's state (`params`,
`counters`, `_speech_pub`, `_memory_pub`, `_store`, `_instruct`, `_token_rate`).
"""

from __future__ import annotations

from oxygen_ros.engine.types import RequestKind, RequestOutput
from oxygen_ros.nodes.common.conversions import seconds_to_time
from oxygen_ros.nodes.common.runtime import now_s
from oxygen_ros.nodes.inference.conversions import memory_entry_msg, speech_token_msg
from oxygen_ros.nodes.inference.request_book import Finished

THROTTLE_S = 5.0  # at most one warning per call site per this many seconds


class InferenceOutputs:
    """The inference node's output callbacks (see the module docstring)."""

    # ================================================================ outputs
    def _on_actions_ready(self, refusal: str) -> None:
        """The action process started (its reader thread)."""
        priority = self.params["action_thread_priority"]
        if refusal:
            self.get_logger().warning(
                f"action publisher keeps normal scheduling (SCHED_FIFO {priority} refused: "
                f"{refusal}); its timing then depends on the machine's load"
            )
        elif priority > 0:
            self.get_logger().info(f"action publisher process runs SCHED_FIFO priority {priority}")

    def _on_watchdog(self, transition: str) -> None:
        if transition == "tripped":
            self.get_logger().error(
                f"watchdog: no fresh observation used for "
                f"{self.params['watchdog_timeout_s']:g} s; policy "
                f"{self.params['watchdog_policy']}"
            )
        else:
            self.get_logger().info("watchdog: fresh observations again, recovered")

    def _send_speech(
        self, output: RequestOutput, stamp: float, observation_stamp: float | None
    ) -> None:
        """The request book's `send`: one SpeechToken."""
        self._speech_pub.publish(
            speech_token_msg(output, seconds_to_time(stamp), observation_stamp)
        )
        self._token_rate.add(len(output.new_token_ids))

    def _on_finished(self, finished: Finished) -> None:
        """Engine thread: a request the engine reported finished (its final is sent)."""
        output = finished.output
        if finished.succeeded and output.kind in (RequestKind.SUBTASK, RequestKind.NARRATION):
            self._instruct.on_speech(output.kind.value, output.text or "", finished.prompt)
        if not finished.succeeded:
            self.counters[f"requests_{output.status.name.lower()}"] += 1
            self.get_logger().warning(
                f"{output.request_id} ended {output.status.name}: {output.error}",
                throttle_duration_sec=THROTTLE_S,
            )
            return
        self.counters[f"requests_done.{output.kind.value}"] += 1
        if output.kind == RequestKind.MEMORY:
            record = self._store.add(
                output.text or "",
                finished.origin,
                now_s(self),
                finished.observation_stamp,
                (finished.prompt,) if finished.prompt else (),
                output.request_id,
            )  # committed before it is published
            self._memory_pub.publish(memory_entry_msg(record, self.params["frame_id"]))
            self.counters["memory_entries"] += 1

    # ================================================================ memory
    def _republish_memory(self) -> None:
        records = self._store.recent(self.params["memory_republish_count"])
        for record in records:
            self._memory_pub.publish(memory_entry_msg(record, self.params["frame_id"]))
        if records:
            self.get_logger().info(
                f"republished {len(records)} memory entries (ids {records[0].entry_id}.."
                f"{records[-1].entry_id})"
            )
