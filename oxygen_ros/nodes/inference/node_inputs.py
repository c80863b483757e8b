"""The inference node's inputs (a part of `InferenceNode`, `inference_node`): frames, instructions
(topic and Instruct goals), the Instruct action's host, periodic and on-demand language
requests, memory queries, and the count-and-warn of rejected input.

`InferenceInputs` is a mixin of the node: its methods read the node's state (`params`,
`counters`, `_inbox`, `_queue`, `_book`, `_instruct`, `_actions`, `_store`, `_holds`, ...) and
are bound to its subscriptions, services and timers in `InferenceNode.__init__`. None calls
the engine.
"""

from __future__ import annotations

from std_msgs.msg import String

from oxygen_ros.engine.types import RequestKind
from oxygen_ros.msg import EpisodeStatus
from oxygen_ros.nodes.common.conversions import time_to_seconds
from oxygen_ros.nodes.inference.conversions import MSG_TO_KIND, memory_entry_msg
from oxygen_ros.nodes.inference.instruction_intake import message_key


class InferenceInputs:
    """The inference node's input callbacks and its Instruct host (see the module docstring)."""

    # ================================================================ inputs
    def _on_frame(self, data: bytes, info) -> None:
        """In the frame intake's thread (`frame_intake`)."""
        if self._engine is None:  # unconfigured: no engine to take it
            self._count_frame("frames_unconfigured")
            return
        # DDS timestamps (system time, ns): the diagnostics split the frame's trip.
        self._inbox.put_frame(
            data, info["source_timestamp"] * 1e-9, info["received_timestamp"] * 1e-9
        )
        self._count_frame("frames_received")

    def _count_frame(self, name: str) -> None:
        with self._frame_counts_lock:
            self._frame_counts[name] += 1

    def _clean_instruction(self, text: str) -> str | None:
        if "\ufffd" in text:
            self._reject("instruction_non_utf8", "instruction is not valid UTF-8")
            return None
        text = text.strip()
        if not text:
            return None
        limit = self.params["instruction_max_chars"]
        if len(text) > limit:
            self.counters["instruction_truncated"] += 1
            self._throttle.warn(
                self,
                "instruction_truncated",
                f"instruction of {len(text)} characters truncated to {limit}",
            )
            text = text[:limit]
        return text

    def _on_task_status(self, msg: EpisodeStatus) -> None:
        """Success ends a running Instruct goal; a new episode's reset (its stamp minus
        elapsed_s) ends the frames observed before it (`FrameInbox.note_reset`)."""
        self._instruct.on_task_status(msg.success)
        if msg.phase != EpisodeStatus.PHASE_IDLE and msg.episode_id != self._status_episode:
            self._status_episode = msg.episode_id
            self._inbox.note_reset(time_to_seconds(msg.header.stamp) - msg.elapsed_s)

    def _on_instruction(self, msg: String, info) -> None:
        # `info` must stay a required argument: rclpy passes message info only to a callback
        # that cannot be called with the message alone.
        if not self._instructions_seen.accept(message_key(info, msg.data)):
            self.counters["instruction_duplicates"] += 1  # the same publication, other route
            return
        text = self._clean_instruction(msg.data)
        if text is None:
            if "\ufffd" not in msg.data:
                self._reject("instruction_empty", "empty instruction ignored")
            return
        self._instruct.on_topic_instruction()  # it replaces a running goal's instruction
        self._apply_instruction(text)

    def _apply_instruction(self, text: str) -> None:
        """Makes `text` the prompt (topic or Instruct goal): published latched, a subtask
        request for it (at activate when not active), Instruct's holds released."""
        self._release_holds()
        self._inbox.set_prompt(text)
        self._instruction_pub.publish(String(data=text))
        self.counters["instructions"] += 1
        # Queued subtask requests end now; in-flight ones are aborted by the engine thread.
        self._book.supersede(RequestKind.SUBTASK, "superseded by a new instruction")
        if not self._active:  # kept as the prompt; its subtask is asked for at activate
            self._subtask_due = True
            self.get_logger().info(f"instruction: {text!r} (node {self._lifecycle_state()})")
            return
        self.get_logger().info(f"instruction: {text!r} ({self._request_subtask()})")

    # ================================================================ Instruct host
    def accepting(self) -> str:
        """Why Instruct goals are refused now ("" while active)."""
        if self._active:
            return ""
        return self._refusal or f"node not active ({self._lifecycle_state()})"

    def start_instruction(self, text: str) -> str:
        """An accepted Instruct goal's instruction (already checked by the server)."""
        self._apply_instruction(text)
        return ""

    def hold(self, reason: str) -> None:
        """Instruct ended by cancel or time limit: a hold of the measured pose, then silence
        until the next instruction."""
        self._holds.add(reason)
        actions = self._actions
        if actions is not None:
            actions.link.set_stop(reason, True)

    def _release_holds(self) -> None:
        """Releases the stop reasons `hold` engaged (the gate has no others of Instruct's)."""
        actions = self._actions
        if actions is not None:
            for reason in self._holds:
                actions.link.set_stop(reason, False)
        self._holds.clear()

    def _request_subtask(self) -> str:
        """Queues a subtask request of the current prompt; returns its id or 'refused'."""
        self._subtask_due = False
        submitted = self._queue.submit(RequestKind.SUBTASK, origin="subtask")
        if not submitted.accepted:
            self._reject("request_refused", f"subtask request refused: {submitted.reason}")
        self._inbox.wake()
        return submitted.request_id or "refused"

    def _periodic(self, kind: RequestKind) -> None:
        name = f"{kind.value}_period_s"
        if not self.params[name] or not self._active:
            return
        if self._queue.busy(kind):
            self.counters[f"periodic_skipped.{kind.value}"] += 1
            return
        submitted = self._queue.submit(kind, origin=kind.value)
        if not submitted.accepted:
            self._reject("request_refused", f"{kind.value} request refused: {submitted.reason}")
        self._inbox.wake()

    def _on_request_language(self, request, response):
        kind = MSG_TO_KIND.get(request.kind)
        if kind is None:
            response.accepted, response.reason = False, f"unknown kind {request.kind}"
        elif not self._active:
            response.accepted = False
            response.reason = f"node not active ({self._lifecycle_state()})"
        else:
            origin = "on_demand" if kind == RequestKind.MEMORY else kind.value
            submitted = self._queue.submit(kind, request.max_tokens or None, origin=origin)
            response.accepted = submitted.accepted
            response.request_id = submitted.request_id
            response.reason = submitted.reason
            self._inbox.wake()
        if not response.accepted:
            self.counters["requests_refused"] += 1
        return response

    def _on_query_memory(self, request, response):
        limit = request.max_entries or self.params["memory_query_max_entries"]
        records = self._store.query(request.text, time_to_seconds(request.since), limit)
        response.entries = [memory_entry_msg(r, self.params["frame_id"]) for r in records]
        return response

    def _reject(self, reason: str, message: str) -> None:
        self.counters[f"rejected.{reason}"] += 1
        self._throttle.warn(self, reason, message)
