"""What the robot should say in the workcell: narration and memory texts per task phase.

The expert's phases (`tasks.subtask_labels`) define three language targets per moment of an
episode; a trained model speaks them from the shared observation prefix and the evaluation
compares what it said with these functions applied to the simulator's own stage:
- subtask: the phase label itself ("grasp the red cube");
- narration: progress through the task and the arm doing it ("step 2 of 4 with the left arm",
  or with its numbers as words, "step two of four with the left arm": a checkpoint whose
  state-bin pieces are frozen cannot say the digit pieces they share, `NARRATION_NUMBERS`);
- memory: the fact the episode's events have established so far ("the red cube is on the
  table", then "the left gripper holds the red cube", then for `move` "the red cube is on
  the right").

Invariants:
- Every text is a pure function of (spec, stage index); the same stage gives the same text.
- Texts use only words of the bundled tokenizer's corpus and fit the engine's default
  max_tokens of their kind (tests check both).
- `same_text` compares what a model said with a target whatever numbers its narration was
  trained to say: both spellings of one narration are the same text, nothing else is.
"""

from __future__ import annotations

from oxygen_ros.sim.tasks import EpisodeSpec, subtask_labels

GRASP_STAGE = 1  # index of "grasp ..." in every template's labels
LIFT_STAGE = 2  # from here on the arm holds the cube
RELEASE_STAGE = 5  # `move`: the cube has been put down and is let go


def stage_index(spec: EpisodeSpec, stage: str) -> int:
    """Index of a stage label in the episode's phases.

    Raises:
        ValueError: `stage` is not one of `subtask_labels(spec)`.
    """
    labels = subtask_labels(spec)
    if stage not in labels:
        raise ValueError(f"{stage!r} is not a phase of {spec.instruction!r}: {labels}")
    return labels.index(stage)


# how a narration says its numbers (a checkpoint records its own:
# engine.checkpoint_assets.NARRATION_NUMBERS, the same values; the engine imports no sim)
NARRATION_NUMBERS = ("digits", "words")
NUMBER_WORDS = ("one", "two", "three", "four", "five", "six", "seven", "eight", "nine")


def narration_text(spec: EpisodeSpec, stage: int, numbers: str = "digits") -> str:
    """Progress narration at phase `stage`: "step 2 of 4 with the left arm" (`numbers`
    "words": "step two of four with the left arm")."""
    count = len(subtask_labels(spec))
    _check(stage, count)
    if numbers not in NARRATION_NUMBERS:
        raise ValueError(f"numbers must be one of {NARRATION_NUMBERS}, got {numbers!r}")
    if numbers == "words":
        return f"step {_word(stage + 1)} of {_word(count)} with the {spec.arm} arm"
    return f"step {stage + 1} of {count} with the {spec.arm} arm"


def memory_text(spec: EpisodeSpec, stage: int) -> str:
    """The fact established by the episode's events up to phase `stage`."""
    _check(stage, len(subtask_labels(spec)))
    cube = f"the {spec.colour} cube"
    if spec.action == "move" and stage >= RELEASE_STAGE:
        return f"{cube} is on the {spec.direction}"
    if stage >= LIFT_STAGE:
        return f"the {spec.arm} gripper holds {cube}"
    return f"{cube} is on the table"


def targets(spec: EpisodeSpec, stage: int, numbers: str = "digits") -> dict[str, str]:
    """The three language targets at phase `stage`, keyed by request kind value (`numbers`:
    the narration's, `NARRATION_NUMBERS`)."""
    return {
        "subtask": subtask_labels(spec)[stage],
        "narration": narration_text(spec, stage, numbers),
        "memory": memory_text(spec, stage),
    }


def same_text(said: str, target: str) -> bool:
    """Whether `said` is `target`, a narration's numbers in either spelling ("step 2 of 4
    ..." is "step two of four ..."); any other difference makes them different."""
    return _digits(said) == _digits(target)


def _word(number: int) -> str:
    if not 1 <= number <= len(NUMBER_WORDS):
        raise ValueError(f"no word for {number}")
    return NUMBER_WORDS[number - 1]


def _digits(text: str) -> str:
    """`text` with the narration's number words as digits ("step two of four" -> "step 2 of
    4"); only the two places a narration has numbers, so other words stay."""
    words = text.split(" ")
    if len(words) >= 4 and words[0] == "step" and words[2] == "of":
        for at in (1, 3):
            if words[at] in NUMBER_WORDS:
                words[at] = str(NUMBER_WORDS.index(words[at]) + 1)
    return " ".join(words)


def _check(stage: int, count: int) -> None:
    if not 0 <= stage < count:
        raise ValueError(f"stage index {stage} outside 0..{count - 1}")
