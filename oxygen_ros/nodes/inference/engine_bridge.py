"""Node-side bookkeeping around the engine, ROS-free: engine config from parameters, the
language request queue, and rolling rates for diagnostics.

The engine owns the model, the cache and scheduling; this module only decides *which*
requests the node hands it (bounded queue, one periodic request of a kind at a time) and keeps
the ids the node promised to service callers.

Invariants:
- Request ids are assigned here ("<kind>-<n>", n counting from 1 per node run), so a service
  reply can name the id before the engine has seen the request; the engine keeps given ids.
- Requests queued plus in flight never exceed `max_pending`; beyond that `submit` refuses
  with a reason (never an unbounded queue).
- Every submitted id ends exactly once: through `finish` (the engine reported it finished)
  or `abort_queued` / `fail_in_flight` / `drain` (the node ended it), each returning what it
  removed; outputs of ids no longer in flight are not published.
- Thread-safe: service callbacks submit, the engine thread takes and finishes.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from oxygen_ros.engine.checkpoint_assets import load_state_layout
from oxygen_ros.engine.config import (
    CacheConfig,
    EngineConfig,
    PromptConfig,
    RtcConfig,
    SchedulerConfig,
    get_model_config,
)
from oxygen_ros.engine.types import LanguageRequest, RequestKind
from oxygen_ros.resources import resolve_path


def build_engine_config(values: Mapping[str, Any], num_joints: int) -> EngineConfig:
    """The engine's frozen config from the inference node's parameter values.

    `checkpoint_dir` and `tokenizer_path` may be `package://` URIs (oxygen_ros.resources).

    Raises:
        ValueError: An unknown preset, more joints than the model's action dimension, a cache
            too small for the token budgets (the engine's own checks), or delta action joints
            that are not joints (or none, with `action_space: delta`).
    """
    model = get_model_config(values["model_preset"])
    if num_joints > model.action_dim:
        raise ValueError(
            f"{num_joints} joints exceed the model's action dimension {model.action_dim}"
        )
    defaults = PromptConfig()
    prompt = dataclasses.replace(
        defaults,
        subtask=dataclasses.replace(defaults.subtask, max_tokens=values["subtask_max_tokens"]),
        narration=dataclasses.replace(
            defaults.narration, max_tokens=values["narration_max_tokens"]
        ),
        memory=dataclasses.replace(defaults.memory, max_tokens=values["memory_max_tokens"]),
    )
    cache = CacheConfig(
        num_slots=values["cache_num_slots"],
        num_prefixes=values["cache_num_prefixes"],
        max_seq_len=values["cache_max_seq_len"],
    )
    scheduler = SchedulerConfig(
        mode=values["scheduler_mode"],
        policy=values["scheduler_policy"],
        decode_steps_per_frame=values["decode_steps_per_frame"],
        action_rate_hz=values["action_rate_hz"],
        actions_per_frame=values["actions_per_frame"],
        frame_deadline_s=values["frame_deadline_s"] or None,
        max_waiting=values["max_pending_requests"],
    )
    return EngineConfig(
        model=model,
        prompt=prompt,
        cache=cache,
        scheduler=scheduler,
        checkpoint_dir=resolve_path(values["checkpoint_dir"]) or None,
        assets_id=values["assets_id"] or None,
        tokenizer_path=resolve_path(values["tokenizer_path"]) or None,
        action_output_dim=num_joints,
        delta_action_mask=delta_action_mask(values),
        rtc=RtcConfig(
            enabled=values["chunk_transition"] == "rtc",
            row_dt_s=values["action_dt_s"],
            max_guidance=values["rtc_max_guidance"],
        ),
        seed=values["seed"],
        action_noise_scale=values["action_noise_scale"],
        warmup_masked_slots=tuple(values["warmup_masked_slots"]),
    )


def state_extra_names(
    configured: Sequence[str], config: EngineConfig, joint_names: Sequence[str]
) -> tuple[str, ...]:
    """The frame entries after the joints that the model's state holds: `configured` (the
    `state_extra_names` parameter), or, when that is empty, the checkpoint's own (its
    `state_layout.json`: what it was trained on), for the checkpoint `config`
    (`build_engine_config`'s) serves. A checkpoint that records no layout takes the parameter
    as it is. The joints are matched by position, not by name (a robot may name them its own
    way).

    Raises:
        ValueError: The checkpoint was trained on another number of joints, or a non-empty
            `state_extra_names` differs from the entries it was trained on, or its layout file
            is malformed (`checkpoint_assets.CheckpointError`).
    """
    configured = tuple(configured)
    checkpoint_dir = config.checkpoint_dir
    if not checkpoint_dir:
        return configured
    layout = load_state_layout(checkpoint_dir, config.assets_id)
    if layout is None:
        return configured
    if len(layout.joint_names) != len(joint_names):
        raise ValueError(
            f"checkpoint {checkpoint_dir} was trained on {len(layout.joint_names)} joints "
            f"({list(layout.joint_names)}), joint_names has {len(joint_names)}"
        )
    if configured and configured != layout.state_extra_names:
        raise ValueError(
            f"state_extra_names {list(configured)} differ from what checkpoint "
            f"{checkpoint_dir} was trained on ({list(layout.state_extra_names)}, its "
            "state_layout.json); leave state_extra_names empty to take the checkpoint's"
        )
    return layout.state_extra_names


def delta_action_mask(values: Mapping[str, Any]) -> tuple[bool, ...] | None:
    """`action_space` -> the engine's mask over the action columns (the joints in order):
    None = the checkpoint's own (`action_space.json`), () = absolute, else True on each of
    `delta_action_joints` (openpi's DeltaActions mask)."""
    space = values["action_space"]
    if space == "checkpoint":
        return None
    if space == "absolute":
        return ()
    names = list(values["joint_names"])
    delta = list(values["delta_action_joints"])
    unknown = [j for j in delta if j not in names]
    if unknown or not delta:
        raise ValueError(
            f"action_space delta needs delta_action_joints from joint_names; got {delta}"
            + (f" ({unknown} are not joints)" if unknown else "")
        )
    return tuple(name in delta for name in names)


@dataclasses.dataclass(frozen=True)
class Submitted:
    """Answer to `LanguageQueue.submit`."""

    accepted: bool
    request_id: str  # "" when refused
    reason: str  # "" when accepted


class LanguageQueue:
    """Bounded queue of language requests between the node's callbacks and the engine thread."""

    def __init__(self, max_pending: int, run_id: str = "") -> None:
        """`run_id` (the node's run) goes into every request id: `<kind>-<run_id>-<n>`, unique
        across the node's restarts (`<kind>-<n>` without it)."""
        self.max_pending = max_pending
        self._run = f"{run_id}-" if run_id else ""
        self._lock = threading.Lock()
        self._queued: collections.OrderedDict[str, LanguageRequest] = collections.OrderedDict()
        self._in_flight: dict[str, LanguageRequest] = {}
        self._origin: dict[str, str] = {}
        self._to_abort: list[str] = []
        self._counts = collections.Counter[RequestKind]()

    def submit(
        self, kind: RequestKind, max_tokens: int | None = None, origin: str = ""
    ) -> Submitted:
        """Queues a request; refuses when `max_pending` requests are queued or in flight."""
        with self._lock:
            if len(self._queued) + len(self._in_flight) >= self.max_pending:
                return Submitted(False, "", f"queue full ({self.max_pending} pending requests)")
            self._counts[kind] += 1
            request_id = f"{kind.value}-{self._run}{self._counts[kind]}"
            self._queued[request_id] = LanguageRequest(
                kind=kind, max_tokens=max_tokens, request_id=request_id
            )
            self._origin[request_id] = origin or kind.value
            return Submitted(True, request_id, "")

    def take(self) -> list[LanguageRequest]:
        """Moves every queued request to in flight and returns them, oldest first."""
        with self._lock:
            taken = list(self._queued.values())
            self._queued.clear()
            self._in_flight.update((r.request_id, r) for r in taken)
            return taken

    def requeue(self, requests: list[LanguageRequest]) -> None:
        """Puts taken (in-flight) requests back at the front of the queue, in order."""
        with self._lock:
            back = [r for r in requests if self._in_flight.pop(r.request_id, None) is not None]
            for r in reversed(back):
                self._queued[r.request_id] = r
                self._queued.move_to_end(r.request_id, last=False)

    def finish(self, request_id: str) -> str | None:
        """Marks a request finished; returns its origin (None if it was not in flight)."""
        with self._lock:
            if self._in_flight.pop(request_id, None) is None:
                return None
            return self._origin.pop(request_id, None)

    def abort_queued(self, kind: RequestKind) -> list[LanguageRequest]:
        """Removes queued (not yet in flight) requests of `kind` and returns them."""
        with self._lock:
            removed = [r for r in self._queued.values() if r.kind == kind]
            for r in removed:
                del self._queued[r.request_id]
                self._origin.pop(r.request_id, None)
            return removed

    def abort_in_flight(self, kind: RequestKind) -> list[str]:
        """Marks in-flight requests of `kind` for `Engine.abort` (the engine thread takes them
        with `take_aborts`; they stay in flight until the engine reports them finished)."""
        with self._lock:
            ids = [
                rid
                for rid, r in self._in_flight.items()
                if r.kind == kind and rid not in self._to_abort
            ]
            self._to_abort.extend(ids)
            return ids

    def take_aborts(self) -> list[str]:
        """Request ids to pass to `Engine.abort`, each returned once."""
        with self._lock:
            ids, self._to_abort = self._to_abort, []
            return ids

    def is_in_flight(self, request_id: str) -> bool:
        with self._lock:
            return request_id in self._in_flight

    def fail_in_flight(self) -> list[LanguageRequest]:
        """Ends every in-flight request (an engine fault) and returns them; queued ones stay."""
        with self._lock:
            failed = list(self._in_flight.values())
            self._in_flight.clear()
            for r in failed:
                self._origin.pop(r.request_id, None)
            self._to_abort.clear()
            return failed

    def drain(self) -> list[LanguageRequest]:
        """Removes every queued and in-flight request (shutdown) and returns them."""
        with self._lock:
            drained = [*self._queued.values(), *self._in_flight.values()]
            self._queued.clear()
            self._in_flight.clear()
            self._origin.clear()
            self._to_abort.clear()
            return drained

    def busy(self, kind: RequestKind) -> bool:
        """True while a request of `kind` is queued or in flight."""
        with self._lock:
            return any(r.kind == kind for r in (*self._queued.values(), *self._in_flight.values()))

    def origin(self, request_id: str) -> str:
        with self._lock:
            return self._origin.get(request_id, "")

    @property
    def num_queued(self) -> int:
        with self._lock:
            return len(self._queued)

    @property
    def num_in_flight(self) -> int:
        with self._lock:
            return len(self._in_flight)

    def has_queued(self) -> bool:
        return self.num_queued > 0


class RateMeter:
    """Events (with an amount) over a sliding window: publish rates, tokens per second."""

    def __init__(self, window_s: float = 2.0) -> None:
        self.window_s = window_s
        self._events: collections.deque[tuple[float, float]] = collections.deque()
        self._lock = threading.Lock()
        self._start = time.monotonic()

    def add(self, amount: float = 1.0, now: float | None = None) -> None:
        with self._lock:
            self._events.append((time.monotonic() if now is None else now, amount))

    def rate(self, now: float | None = None) -> float:
        """Amount per second over the window (over the time since creation if shorter)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            while self._events and self._events[0][0] < now - self.window_s:
                self._events.popleft()
            total = sum(a for _, a in self._events)
        span = min(self.window_s, max(now - self._start, 1e-6))
        return total / span


def random_weights_refusal(checkpoint_dir: str, use_sim_time: bool, allowed: bool) -> str:
    """Why the node must not activate ("" when it may): a randomly initialised model (no
    checkpoint) outside simulation would command a robot at random."""
    if checkpoint_dir or use_sim_time or allowed:
        return ""
    return (
        "no checkpoint_dir outside simulation: a random model would move the robot at random; "
        "give checkpoint_dir (or allow_random_weights:=true for a plumbing test on a stand)"
    )
