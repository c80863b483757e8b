"""The inference node's /diagnostics (a part of `InferenceNode`, `inference_node`): one status
whose level names the most serious condition (autostart failed, refused to activate (no
checkpoint outside simulation), no engine, the action
process silent or starting, emergency stop, watchdog, engine loading, not active, fault
injection, action rate below 90 % of its target) with the units' values and counters.

`InferenceDiagnostics` is a mixin of the node: its methods read the node's state.
"""

from __future__ import annotations

import collections

from oxygen_ros.nodes.common.runtime import publish_status


class InferenceDiagnostics:
    """The inference node's diagnostics timer callback (see the module docstring)."""

    def _publish_diagnostics(self) -> None:
        if not self.params["diagnostics_period_s"]:
            return
        units, engine = self._actions, self._engine
        lifecycle = self._lifecycle_state()
        link = units.link if units is not None else None
        actions = link.diagnostics() if link is not None and link.ready.is_set() else None
        if actions is None:  # none, starting, or not answering (gone: the spin loop ends then)
            process = "none" if link is None else "silent" if link.ready.is_set() else "starting"
            actions = {"action_rate_hz": 0.0, "watchdog": "unknown", "action_process": process}
        rate = actions["action_rate_hz"]
        target = self.params["action_rate_hz"]
        state = engine.state if engine is not None else "none"
        if self._autostart_failed:
            level, message = "ERROR", "autostart failed (engine or action process did not start)"
        elif self._refusal and not self._active:
            level, message = "ERROR", f"{lifecycle}: {self._refusal}"
        elif engine is None:
            level, message = "WARN", f"{lifecycle}: no engine (configure to load it)"
        elif actions.get("action_process") == "silent":
            level, message = "ERROR", "action process not answering"
        elif actions.get("action_process") == "starting":
            level, message = "WARN", "action process starting"
        elif actions.get("estop") == "engaged":
            level, message = "ERROR", "emergency stop engaged: holding, no actions"
        elif actions["watchdog"] == "tripped":
            level, message = "ERROR", f"watchdog tripped ({self.params['watchdog_policy']})"
        elif state == "loading":
            level, message = "WARN", "engine loading"
        elif not self._active:
            level, message = "WARN", f"{lifecycle}: no actions (activate to start them)"
        elif self.params["fault_injection"]:
            level, message = "WARN", f"fault_injection={self.params['fault_injection']} (test)"
        elif rate < 0.9 * target:
            level, message = "WARN", f"action rate {rate:.1f} Hz below {target:g} Hz"
        else:
            level, message = "OK", f"actions {rate:.1f} Hz"
        values: dict[str, object] = {
            "lifecycle_state": lifecycle,
            "model_preset": self._engine_config.model.name,
            "action_rate_target_hz": target,
            "tokens_per_s": self._token_rate.rate(),
            "active_requests": self._queue.num_in_flight,
            "queued_requests": self._queue.num_queued,
            "cache_occupancy": self._cache_occupancy(),
            "memory_entries_total": self._store.last_id(),
            "prompt": self._inbox.prompt,
            "instruct_goal": self._instruct.instruction,
            "task_holds": ",".join(sorted(self._holds)),
            "fault_injection": self.params["fault_injection"],
            "random_weights": not self.params["checkpoint_dir"],
            "stats_window_s": self.params["stats_window_s"],
        }
        if engine is not None:
            values.update(engine.diagnostics())
        values.update(actions)
        with self._frame_counts_lock:
            counters = self.counters + self._book.counters + self._frame_counts
        counters += collections.Counter(
            {f"instruct.{k}": v for k, v in self._instruct.counters.items()}
        )
        if engine is not None:
            counters += engine.counters
        values.update(sorted(counters.items()))
        publish_status(self, self._diag_pub, level, message, values)

    def _cache_occupancy(self) -> float:
        engine = self._engine
        stats = engine.engine_stats if engine is not None else {}
        if stats.get("cache_bytes_total"):
            return float(stats["cache_bytes_used"]) / float(stats["cache_bytes_total"])
        return self._queue.num_in_flight / self._engine_config.cache.num_slots
