"""The live view's conversions: graph messages -> arrays and text to show (ROS-free).

Functions read messages by attribute (an `ObservationFrame`, an `ActionChunk`, ...), so tests
pass real messages or plain stand-ins; nothing here imports rclpy or Rerun.

Invariants:
- Bad input raises `ViewInputError` with a short `reason` (the node counts
  `rejected.<reason>`), never a numpy or index error; one bad camera slot rejects that slot
  only (`frame_images` returns it among the problems), the frame's other slots still show.
- Images are shown as the model receives them: the frame's rgb8 slot images, decoded as
  perception encodes them; a masked slot (image_valid false: the model ignores it) becomes a
  grey, striped picture saying MASKED, so it can never be mistaken for a camera image.
- Every text shown is cleaned: control characters (other than newline and tab) are replaced,
  and it is cut to a maximum length; markdown characters are escaped where text goes into a
  markdown panel.
- Memory stays bounded whatever runs for hours: `SpeechBook` keeps a fixed number of
  requests with texts of bounded length.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import re
from collections.abc import Mapping, Sequence

import numpy as np

from oxygen_ros.nodes.common.image_conversion import ImageConversionError, decode_image

PHASES = {0: "IDLE", 1: "RUNNING", 2: "SUCCEEDED", 3: "FAILED"}
SPEECH_KINDS = {0: "subtask", 1: "narration", 2: "memory"}
SPEECH_STATUSES = {0: "running", 1: "stopped", 2: "length", 3: "aborted", 4: "error"}
MAX_IMAGE_DIM = 4096  # pixels per side of a frame's slot image (the model's are ~100-224)
MASKED_SIZE = (96, 96)  # a masked slot whose own size is unusable is drawn this size
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_MARKDOWN = re.compile(r"([\\`*_\[\]<>#|~])")
_ENTITY_UNSAFE = re.compile(r"[^A-Za-z0-9_\-]")


class ViewInputError(ValueError):
    """A message (or part of one) that cannot be shown; `reason` names the counter."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def stamp_seconds(stamp) -> float:
    """A `builtin_interfaces/Time` as float seconds."""
    return stamp.sec + stamp.nanosec * 1e-9


def clean_text(text: str, max_chars: int) -> tuple[str, bool]:
    """(`text` with control characters replaced and cut to `max_chars`, whether it changed)."""
    cleaned = _CONTROL.sub("\ufffd", text)
    if len(cleaned) > max_chars:
        cleaned = cleaned[: max_chars - 1] + "\u2026"
    return cleaned, cleaned != text


def markdown_escape(text: str) -> str:
    """`text` shown literally in markdown (its markup characters escaped)."""
    return _MARKDOWN.sub(r"\\\1", text)


def entity_name(name: str, fallback: str) -> str:
    """`name` usable as one Rerun entity path part (`fallback` when nothing is left)."""
    safe = _ENTITY_UNSAFE.sub("_", name)[:64]
    return safe or fallback


# ---------------------------------------------------------------------------------- images
@dataclasses.dataclass(frozen=True)
class SlotImage:
    """One model image slot of a frame, as shown."""

    slot: str  # entity-safe slot name
    rgb: np.ndarray  # uint8 [h, w, 3]
    valid: bool  # false: masked (the model ignores this slot); `rgb` is the MASKED picture


def masked_image(height: int, width: int) -> np.ndarray:
    """A grey picture with diagonal stripes and the word MASKED, `height` x `width` rgb8."""
    from PIL import Image, ImageDraw, ImageFont

    rows, cols = np.mgrid[0:height, 0:width]
    stripes = ((rows + cols) // max(4, min(height, width) // 12)) % 2
    rgb = np.where(stripes[..., None] == 1, 150, 110).astype(np.uint8).repeat(3, axis=2)
    picture = Image.fromarray(rgb)
    draw = ImageDraw.Draw(picture)
    font = ImageFont.load_default(size=max(8, width // 6))
    left, top, right, bottom = draw.textbbox((0, 0), "MASKED", font=font)
    x, y = (width - (right - left)) // 2 - left, (height - (bottom - top)) // 2 - top
    draw.rectangle((x + left - 2, y + top - 2, x + right + 2, y + bottom + 2), fill=(40, 40, 40))
    draw.text((x, y), "MASKED", fill=(255, 255, 255), font=font)
    return np.asarray(picture)


def frame_images(frame) -> tuple[list[SlotImage], list[ViewInputError]]:
    """The slots of an `ObservationFrame` to show, and the problems of slots that cannot be.

    Raises:
        ViewInputError: `frame_layout` when the per-slot lists differ in length.
    """
    names, images, valid = list(frame.image_names), list(frame.images), list(frame.image_valid)
    if not len(names) == len(images) == len(valid):
        raise ViewInputError(
            "frame_layout",
            f"{len(names)} image names, {len(images)} images, {len(valid)} valid flags",
        )
    shown, problems = [], []
    for index, (name, image, is_valid) in enumerate(zip(names, images, valid, strict=True)):
        slot = entity_name(name, f"slot_{index}")
        if not is_valid:
            size_ok = 0 < image.height <= MAX_IMAGE_DIM and 0 < image.width <= MAX_IMAGE_DIM
            height, width = (image.height, image.width) if size_ok else MASKED_SIZE
            shown.append(SlotImage(slot, masked_image(height, width), False))
            continue
        try:
            rgb = decode_image(
                image.height,
                image.width,
                image.encoding,
                image.step,
                image.data,
                max_dim=MAX_IMAGE_DIM,
            )
        except ImageConversionError as exc:
            problems.append(ViewInputError(f"image_{exc.reason}", f"slot {name!r}: {exc}"))
            continue
        shown.append(SlotImage(slot, rgb, True))
    return shown, problems


# ---------------------------------------------------------------------------------- joints
def joint_group(name: str) -> str:
    """The plot a joint goes to: `left` / `right` by its name's prefix, else `body`."""
    for side in ("left", "right"):
        if name.startswith((f"{side}_", f"{side}/")):
            return side
    return "body"


def group_joints(names: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """Joint names per plot group, in `names`' order (groups in order of first appearance)."""
    groups: dict[str, list[str]] = {}
    for name in names:
        groups.setdefault(joint_group(name), []).append(name)
    return {g: tuple(v) for g, v in groups.items()}


def group_values(
    values: Mapping[str, float], groups: Mapping[str, Sequence[str]]
) -> dict[str, np.ndarray]:
    """Per group, its joints' values in the group's order (NaN where `values` has none);
    groups with none of their joints in `values` are left out."""
    out = {}
    for group, names in groups.items():
        if any(n in values for n in names):
            out[group] = np.array([values.get(n, math.nan) for n in names], dtype=np.float64)
    return out


def measured_positions(joint_state) -> tuple[dict[str, float], int]:
    """({joint: position} of a `JointState`'s finite positions, number of non-finite ones).

    Raises:
        ViewInputError: `joint_layout` when names and positions differ in length.
    """
    names, positions = list(joint_state.name), list(joint_state.position)
    if len(names) != len(positions):
        raise ViewInputError(
            "joint_layout", f"{len(names)} joint names but {len(positions)} positions"
        )
    values = {n: float(p) for n, p in zip(names, positions, strict=True) if math.isfinite(p)}
    return values, len(names) - len(values)


def commanded_row(chunk) -> dict[str, float]:
    """{joint: target} of an `ActionChunk`'s first row (the target at its header stamp).

    Raises:
        ViewInputError: `action_shape` when `actions` is not horizon x joints (or empty),
            `action_nonfinite` when any row holds NaN or infinity (the whole chunk is refused,
            as the simulator refuses it).
    """
    names = list(chunk.joint_names)
    actions = np.asarray(chunk.actions, dtype=np.float64)
    if not names or chunk.horizon == 0 or actions.size != chunk.horizon * len(names):
        raise ViewInputError(
            "action_shape",
            f"{actions.size} action values for horizon {chunk.horizon} x {len(names)} joints",
        )
    if not np.isfinite(actions).all():
        bad = int((~np.isfinite(actions)).sum())
        raise ViewInputError("action_nonfinite", f"{bad} non-finite action values")
    return dict(zip(names, actions[: len(names)].tolist(), strict=True))


# ---------------------------------------------------------------------------------- speech
@dataclasses.dataclass
class SpeechRequest:
    """One language request's text as it streams."""

    request_id: str
    kind: str  # subtask | narration | memory | kind <n>
    text: str = ""
    final: bool = False
    status: str = "running"
    error: str = ""
    next_index: int = 0  # the token_index the next message should carry


class SpeechBook:
    """Language requests by id, newest last; at most `max_requests` are kept."""

    def __init__(self, max_requests: int, max_chars: int) -> None:
        self.max_requests = max_requests
        self.max_chars = max_chars
        self._requests: collections.OrderedDict[str, SpeechRequest] = collections.OrderedDict()

    def add(self, token) -> tuple[SpeechRequest, list[str]]:
        """Adds a `SpeechToken`; returns its request and the irregularities seen (counter
        names: `speech.gap` for a token_index other than the next, `speech.after_final` for a
        message after the request's final one, `speech.text_cleaned` for a text changed by
        `clean_text`)."""
        issues = []
        request_id, _ = clean_text(token.request_id, 80)
        request = self._requests.get(request_id)
        if request is None:
            kind = SPEECH_KINDS.get(token.kind, f"kind {token.kind}")
            request = self._requests[request_id] = SpeechRequest(request_id, kind)
            while len(self._requests) > self.max_requests:
                self._requests.popitem(last=False)
        self._requests.move_to_end(request_id)
        if request.final:
            issues.append("speech.after_final")
        if token.token_index != request.next_index:
            issues.append("speech.gap")
        request.next_index = token.token_index + len(token.token_ids)
        delta, changed = clean_text(token.text_delta, self.max_chars)
        request.text = clean_text(request.text + delta, self.max_chars)[0]  # cut at most
        if token.final:
            request.final = True
            request.status = SPEECH_STATUSES.get(token.status, f"status {token.status}")
            request.error, error_changed = clean_text(token.error, self.max_chars)
            changed |= error_changed
            if token.text:  # the whole text: authoritative over the deltas
                request.text, text_changed = clean_text(token.text, self.max_chars)
                changed |= text_changed
        if changed:
            issues.append("speech.text_cleaned")
        return request, issues

    def newest(self, count: int) -> list[SpeechRequest]:
        """The newest `count` requests, newest first."""
        return list(reversed(self._requests.values()))[:count]

    def newest_per_kind(self) -> list[SpeechRequest]:
        """The newest request of each kind, in kind order (subtask, narration, memory, ...)."""
        newest: dict[str, SpeechRequest] = {}
        for request in reversed(self._requests.values()):
            newest.setdefault(request.kind, request)
        order = {kind: i for i, kind in enumerate(SPEECH_KINDS.values())}
        return sorted(newest.values(), key=lambda r: (order.get(r.kind, len(order)), r.kind))


def speech_line(request: SpeechRequest) -> str:
    """One log line for a finished request."""
    line = f"{request.kind} [{request.status}] {request.text}"
    return f"{line} ({request.error})" if request.error else line


def speech_markdown(requests: Sequence[SpeechRequest]) -> str:
    """The streaming-text panel: per request its kind, id, text so far (a cursor while it
    streams) and how it ended."""
    if not requests:
        return "*no language requests yet*"
    lines = []
    for r in requests:
        state = f"**{r.status}**" if r.final else "*streaming*"
        text = markdown_escape(r.text) + ("" if r.final else " \u258c")
        error = f" \u2014 {markdown_escape(r.error)}" if r.error else ""
        lines.append(f"- **{r.kind}** `{r.request_id}` {state}: {text}{error}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------- memory
def memory_line(entry, max_chars: int) -> tuple[str, bool]:
    """(one log line for a `MemoryEntry`, whether its text was cleaned)."""
    text, changed = clean_text(entry.text, max_chars)
    kind, _ = clean_text(entry.kind, 40)
    return f"#{entry.entry_id} {kind}: {text}", changed


# ---------------------------------------------------------------------------------- episode
def phase_name(phase: int) -> str:
    return PHASES.get(phase, f"phase {phase}")


def episode_event(previous, status) -> str | None:
    """The log line when `status` starts a new episode or changes its phase (None else);
    `previous` is the status before (None at first)."""
    if previous is not None and (
        previous.episode_id == status.episode_id and previous.phase == status.phase
    ):
        return None
    phase = phase_name(status.phase)
    line = f"episode {status.episode_id} {phase} at {status.elapsed_s:.1f} s"
    if status.phase == 2 and status.time_to_success_s >= 0:
        line += f" (success after {status.time_to_success_s:.1f} s)"
    return line


def task_markdown(instruction: str, current: str, status, max_chars: int) -> tuple[str, bool]:
    """(the task panel: the instructions and the episode, whether a text was cleaned)."""
    instruction, a = clean_text(instruction, max_chars)
    current, b = clean_text(current, max_chars)
    lines = [
        f"- **instruction** {markdown_escape(instruction) or '*none yet*'}",
        f"- **in use by the model** {markdown_escape(current) or '*none yet*'}",
    ]
    cleaned = a or b
    if status is not None:
        stage, c = clean_text(status.stage, max_chars)
        text, d = clean_text(status.instruction, max_chars)
        cleaned = cleaned or c or d
        result = ""
        if status.phase == 2:
            result = f" \u2714 after {status.time_to_success_s:.1f} s"
        elif status.phase == 3:
            result = " \u2718 time limit"
        lines += [
            f"- **episode {status.episode_id}** {phase_name(status.phase)}{result} \u2014 "
            f"{status.elapsed_s:.1f} / {status.time_limit_s:.0f} s, seed {status.seed}: "
            f"{markdown_escape(text)}",
            f"- **stage** {markdown_escape(stage)} \u2014 real-time factor "
            f"{status.real_time_factor:.2f}, starved ticks {status.starvation_events}",
        ]
    return "\n".join(lines), cleaned


# ---------------------------------------------------------------------------------- diagnostics
def diagnostic_number(values: Mapping[str, str], key: str) -> float | None:
    """`values[key]` as a finite float (None when absent or not a finite number)."""
    try:
        number = float(values[key])
    except (KeyError, ValueError):
        return None
    return number if math.isfinite(number) else None


class RateGate:
    """Lets events through at most `rate_hz` times per second (of the caller's clock): an
    event is due `1 / rate_hz` after the last one marked (at once after the clock went back)."""

    def __init__(self, rate_hz: float) -> None:
        self.rate_hz = rate_hz
        self._last = -math.inf

    def due(self, now: float) -> bool:
        return not 0.0 <= now - self._last < 1.0 / self.rate_hz

    def mark(self, now: float) -> None:
        self._last = now

    def allow(self, now: float) -> bool:
        """`due`, and marks it when it is."""
        if not self.due(now):
            return False
        self.mark(now)
        return True
