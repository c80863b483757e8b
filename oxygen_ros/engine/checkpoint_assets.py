"""A checkpoint's `assets/<id>/` directory and the two files this project records there,
without JAX: nodes read them before (or without) loading the engine.

`action_space.json` ({"delta_action_mask": [bool, ...]}): which action dims are relative to the
observation's state (openpi's `DeltaActions` mask, kept in openpi's training config, here with
the checkpoint); without the file the actions are absolute.

`state_layout.json` ({"joint_names": [...], "state_extra_names": [...]}): what the checkpoint's
state vector holds, the joints, then the perceived entries after them (written by
`training.train.save_checkpoint`), so that a node serving it can take the perceived entries'
names from the checkpoint instead of its user typing them.

`language.json` ({"narration_numbers": "digits" | "words"}): how the checkpoint was trained to
say the narration's numbers (`sim.language.narration_text`); without the file, digits.

Invariant: imports nothing but the standard library (the inference node imports this before
JAX, which it loads only when it configures).
"""

from __future__ import annotations

import dataclasses
import json
import pathlib


class CheckpointError(ValueError):
    """A checkpoint exists but does not fit the configured model."""


def assets_dir(checkpoint_dir: str | pathlib.Path, assets_id: str | None) -> pathlib.Path:
    """`<checkpoint_dir>/assets/<assets_id>`; with `assets_id` None the only directory under
    `assets/` (`CheckpointError` when there is not exactly one)."""
    assets = pathlib.Path(checkpoint_dir) / "assets"
    if assets_id is None:
        found = sorted(p.name for p in assets.iterdir() if p.is_dir()) if assets.is_dir() else []
        if len(found) != 1:
            raise CheckpointError(
                f"set assets_id: {assets} holds {len(found)} asset directories {found}"
            )
        assets_id = found[0]
    return assets / assets_id


def _read_asset(checkpoint_dir, assets_id, name: str, what: str, parse, default, *, strict=False):
    """`parse(the JSON in assets/<id>/name)`; `default` when the file is absent, or (unless
    `strict`) when there is no single asset directory to read it from. A file that is not
    JSON, or that `parse` refuses (ValueError, KeyError, TypeError), raises `CheckpointError`
    naming `what`."""
    try:
        path = assets_dir(checkpoint_dir, assets_id) / name
    except (CheckpointError, OSError):
        if strict:
            raise
        return default
    if not path.is_file():
        return default
    try:
        return parse(json.loads(path.read_text()))
    except (ValueError, KeyError, TypeError) as err:
        raise CheckpointError(f"{path}: no valid {what} ({err})") from err


STATE_LAYOUT_FILE = "state_layout.json"


@dataclasses.dataclass(frozen=True)
class StateLayout:
    """What a checkpoint's state vector holds, in order: the joints, then perceived entries
    (`state_layout.json`, written by `training.train.save_checkpoint`)."""

    joint_names: tuple[str, ...]
    state_extra_names: tuple[str, ...]


def load_state_layout(
    checkpoint_dir: str | pathlib.Path, assets_id: str | None
) -> StateLayout | None:
    """The checkpoint's `StateLayout`; None when it records none (older checkpoints, or no
    single asset directory to read it from). A malformed file raises `CheckpointError`."""

    def parse(raw) -> StateLayout:
        names = {key: raw[key] for key in ("joint_names", "state_extra_names")}
        for key, value in names.items():
            if not isinstance(value, list) or not all(isinstance(n, str) for n in value):
                raise TypeError(f"{key} is not a list of strings: {value!r}")
        return StateLayout(tuple(names["joint_names"]), tuple(names["state_extra_names"]))

    return _read_asset(checkpoint_dir, assets_id, STATE_LAYOUT_FILE, "state layout", parse, None)


def save_state_layout(directory: str | pathlib.Path, layout: StateLayout) -> None:
    """Writes `state_layout.json` into a checkpoint's `assets/<id>/` directory."""
    path = pathlib.Path(directory) / STATE_LAYOUT_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(dataclasses.asdict(layout), indent=1) + "\n")


ACTION_SPACE_FILE = "action_space.json"


def load_delta_action_mask(
    checkpoint_dir: str | pathlib.Path, assets_id: str | None
) -> tuple[bool, ...]:
    """The checkpoint's delta-action mask (`action_space.json`); () when it has none (absolute
    actions). No single asset directory raises `CheckpointError`, as a malformed file does."""

    def parse(raw) -> tuple[bool, ...]:
        mask = raw["delta_action_mask"]
        if not isinstance(mask, list) or not all(isinstance(m, bool) for m in mask):
            raise TypeError(f"not a list of booleans: {mask!r}")
        return tuple(mask)

    return _read_asset(
        checkpoint_dir, assets_id, ACTION_SPACE_FILE, "delta_action_mask", parse, (), strict=True
    )


def save_delta_action_mask(directory: str | pathlib.Path, mask: tuple[bool, ...]) -> None:
    """Writes `action_space.json` into a checkpoint's `assets/<id>/` directory."""
    path = pathlib.Path(directory) / ACTION_SPACE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"delta_action_mask": [bool(m) for m in mask]}) + "\n")


LANGUAGE_FILE = "language.json"
# how a narration says its numbers: "digits" ("step 2 of 4 ..."), "words" ("step two of four
# ..."; a checkpoint whose state-bin pieces are frozen cannot say the digit pieces they share)
NARRATION_NUMBERS = ("digits", "words")


def load_narration_numbers(checkpoint_dir: str | pathlib.Path, assets_id: str | None) -> str:
    """How the checkpoint says the narration's numbers (`NARRATION_NUMBERS`); "digits" when
    it records nothing. A malformed file raises `CheckpointError`."""

    def parse(raw) -> str:
        numbers = raw["narration_numbers"]
        if numbers not in NARRATION_NUMBERS:
            raise ValueError(f"{numbers!r} not in {NARRATION_NUMBERS}")
        return numbers

    return _read_asset(
        checkpoint_dir, assets_id, LANGUAGE_FILE, "narration_numbers", parse, "digits"
    )


def save_narration_numbers(directory: str | pathlib.Path, numbers: str) -> None:
    """Writes `language.json` into a checkpoint's `assets/<id>/` directory."""
    if numbers not in NARRATION_NUMBERS:
        raise ValueError(f"narration_numbers must be one of {NARRATION_NUMBERS}, got {numbers!r}")
    path = pathlib.Path(directory) / LANGUAGE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"narration_numbers": numbers}) + "\n")
