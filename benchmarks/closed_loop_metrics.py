"""closed_loop's metrics: what one episode measured and the summary over episodes.

From the samples the evaluator collected in one episode: joint jerk (`joint_jerk`), the jump
at chunk boundaries (`chunk_jumps`), the idle arm's start (`idle_arm_start_move`), the
furthest phase the sim reported (`furthest_stage`) and the language scored against the sim's
stage at each request's observation (`score_language`, `stage_at`); over episodes,
`summarise` and the inference node's figures from its diagnostics (`inference_figures`).
Imports no ROS module at load (`score_language` imports the message module when called).
"""

from __future__ import annotations

import dataclasses

import numpy as np

START_WINDOW_S = 0.5  # sim seconds after the reset the idle arm's start move is measured over


@dataclasses.dataclass
class EpisodeRecord:
    """What one episode measured."""

    seed: int
    instruction: str
    template: str
    success: bool
    time_to_success_s: float  # simulated seconds; NaN when it failed
    elapsed_s: float  # simulated seconds until the episode ended
    wall_s: float  # wall seconds from the reset to the end
    realtime_factor: float  # elapsed_s / wall_s
    starvation_events: int
    jerk_mean: float  # rad/s^3, arm joints
    jerk_max: float
    chunk_jump_mean: float  # rad, max over joints per chunk boundary, mean over boundaries
    chunk_jump_max: float
    chunks: int  # distinct chunks received during the episode
    subtasks_spoken: int
    subtasks_correct: int
    narrations_spoken: int = 0
    narrations_correct: int = 0
    memories_written: int = 0
    memories_correct: int = 0
    spoken_examples: tuple[str, ...] = ()  # a few "kind@t: said | expected" lines
    furthest_stage: int = -1  # index of the furthest phase the sim state reached (-1: none)
    furthest_stage_label: str = ""
    idle_arm_start_move_rad: float = float("nan")  # `idle_arm_start_move`


def joint_jerk(stamps: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """|third derivative| per sample and joint by finite differences over uneven stamps."""
    if len(stamps) < 4:
        return np.zeros((0, positions.shape[1] if positions.ndim == 2 else 0))
    v = np.diff(positions, axis=0) / np.diff(stamps)[:, None]
    a = np.diff(v, axis=0) / np.diff(stamps[1:])[:, None]
    j = np.diff(a, axis=0) / np.diff(stamps[2:])[:, None]
    return np.abs(j)


def chunk_jumps(chunks: list[tuple[int, float, float, np.ndarray]]) -> list[float]:
    """Jump at each chunk boundary: first row of a new chunk vs the previous chunk sampled at
    that row's time (linear between rows, held past its end). chunks: (id, start, dt, rows)."""
    jumps = []
    previous = None
    for chunk_id, start, dt, rows in chunks:
        if previous is not None and chunk_id != previous[0]:
            _, p_start, p_dt, p_rows = previous
            x = np.clip((start - p_start) / p_dt, 0.0, len(p_rows) - 1)
            k = int(np.floor(x))
            frac = x - k
            k1 = min(k + 1, len(p_rows) - 1)
            before = (1 - frac) * p_rows[k] + frac * p_rows[k1]
            jumps.append(float(np.max(np.abs(rows[0] - before))))
        if previous is None or chunk_id != previous[0]:
            previous = (chunk_id, start, dt, rows)
    return jumps


def idle_arm_start_move(
    joint_names: list[str],
    stamps: np.ndarray,
    positions: np.ndarray,
    task_arm: str,
    window_s: float = START_WINDOW_S,
) -> float:
    """The largest |move| from the first sample of the joints of the arm that is not
    `task_arm` (grippers left out) over the samples within `window_s` of the first; NaN
    without samples. stamps [T] sim seconds of this episode, positions [T, J]."""
    idle = [
        i
        for i, n in enumerate(joint_names)
        if not n.startswith(f"{task_arm}_") and not n.endswith("gripper")
    ]
    if not len(stamps) or not idle:
        return float("nan")
    early = positions[stamps <= stamps[0] + window_s][:, idle]
    return float(np.abs(early - early[0]).max())


def stage_at(stages: list[tuple[float, str]], stamp: float) -> str:
    """The last stage reported at or before `stamp` ("" before the first report)."""
    stamps = [t for t, _ in stages]
    i = int(np.searchsorted(stamps, stamp, side="right")) - 1
    return stages[i][1] if i >= 0 else ""


def furthest_stage(
    seed: int, instruction: str, stages: list[tuple[float, str]]
) -> tuple[int, str]:
    """The furthest phase (index, label) the sim reported this episode; (-1, "") if none."""
    from oxygen_ros.sim import tasks

    labels = tasks.subtask_labels(tasks.sample_episode(seed, instruction))
    reached = [labels.index(stage) for _, stage in stages if stage in labels]
    return (max(reached), labels[max(reached)]) if reached else (-1, "")


def score_language(
    seed: int,
    instruction: str,
    reset_s: float,
    stages: list[tuple[float, str]],
    spoken: list[tuple[int, str, float]],
    memories: list[tuple[str, float]],
) -> dict[str, object]:
    """Counts what the model said this episode and how much of it the sim state confirms.

    Only requests started from an observation of this episode count (observation stamp after
    the reset and at or after the first stage report)."""
    from oxygen_ros.msg import SpeechToken
    from oxygen_ros.sim import language, tasks

    spec = tasks.sample_episode(seed, instruction)
    counts = dict.fromkeys(
        (
            "subtasks_spoken", "subtasks_correct", "narrations_spoken", "narrations_correct",
            "memories_written", "memories_correct",
        ),
        0,
    )  # fmt: skip
    examples: list[str] = []
    first = stages[0][0] if stages else float("inf")

    def expected(kind: str, stamp: float) -> str | None:
        if stamp <= reset_s or stamp < first:
            return None
        return language.targets(spec, language.stage_index(spec, stage_at(stages, stamp)))[kind]

    kinds = {SpeechToken.KIND_SUBTASK: "subtask", SpeechToken.KIND_NARRATION: "narration"}
    items = [(kinds[k], text, t) for k, text, t in spoken if k in kinds]
    items += [("memory", text, t) for text, t in memories]
    for kind, text, stamp in sorted(items, key=lambda item: item[2]):
        want = expected(kind, stamp)
        if want is None:
            continue
        said, right = {
            "subtask": ("subtasks_spoken", "subtasks_correct"),
            "narration": ("narrations_spoken", "narrations_correct"),
            "memory": ("memories_written", "memories_correct"),
        }[kind]
        counts[said] += 1
        correct = language.same_text(text, want)
        counts[right] += int(correct)
        if len(examples) < 12 and (not correct or len(examples) < 4):
            examples.append(f"{kind}@{stamp - reset_s:.1f}s: {text!r} | {want!r}")
    return {**counts, "spoken_examples": tuple(examples)}


def summarise(records: list[EpisodeRecord]) -> dict[str, float]:
    def finite(statistic):
        """`statistic` over the finite values (NaN when there are none)."""

        def of(values):
            values = [v for v in values if np.isfinite(v)]
            return float(statistic(values)) if values else float("nan")

        return of

    mean, median = finite(np.mean), finite(np.median)

    def ratio(hits: str, total: str) -> float:
        count = sum(getattr(r, total) for r in records)
        return sum(getattr(r, hits) for r in records) / count if count else float("nan")

    spoken = sum(r.subtasks_spoken for r in records)
    return {
        "episodes": len(records),
        "success_rate": mean([float(r.success) for r in records]),
        "time_to_success_s_mean": mean([r.time_to_success_s for r in records]),
        "realtime_factor_mean": mean([r.realtime_factor for r in records]),
        "starvation_events_total": int(sum(r.starvation_events for r in records)),
        "jerk_mean": mean([r.jerk_mean for r in records]),
        "jerk_max": float(
            max((r.jerk_max for r in records if np.isfinite(r.jerk_max)), default=float("nan"))
        ),
        "chunk_jump_mean": mean([r.chunk_jump_mean for r in records]),
        "idle_arm_start_move_rad_median": median([r.idle_arm_start_move_rad for r in records]),
        "chunk_jump_max": float(
            max(
                (r.chunk_jump_max for r in records if np.isfinite(r.chunk_jump_max)),
                default=float("nan"),
            )
        ),
        "subtasks_spoken": spoken,
        "subtask_accuracy": ratio("subtasks_correct", "subtasks_spoken"),
        "narrations_spoken": int(sum(r.narrations_spoken for r in records)),
        "narration_accuracy": ratio("narrations_correct", "narrations_spoken"),
        "memories_written": int(sum(r.memories_written for r in records)),
        "memory_accuracy": ratio("memories_correct", "memories_written"),
    }


def inference_figures(diagnostics: list[dict[str, str]]) -> dict[str, float]:
    """Frame time and token rate percentiles from the inference node's diagnostics."""

    def values(key: str) -> np.ndarray:
        out = []
        for d in diagnostics:
            try:
                out.append(float(d.get(key, "nan")))
            except ValueError:
                continue
        array = np.array(out, dtype=float)
        return array[np.isfinite(array)]

    frame, tokens = values("frame_time_s"), values("tokens_per_s")
    nan = float("nan")
    return {
        "frame_time_s_p50": float(np.percentile(frame, 50)) if frame.size else nan,
        "frame_time_s_p90": float(np.percentile(frame, 90)) if frame.size else nan,
        "tokens_per_s_mean": float(tokens.mean()) if tokens.size else nan,
        "diagnostics_samples": int(frame.size),
    }
