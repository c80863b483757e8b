"""The served workcell model rebuilt from the repository alone (ROS-free): the whole chain of
demonstrations, DAgger rounds and fine-tunes that made `models/workcell_run76`, under the
current code.

Nothing but seeds goes in. The demonstrations are the reactive expert's
(`sim.generate_demos`, deterministic from their seeds); every DAgger round is a checkpoint of
this chain driving the workcell on fixed seeds (`training.dagger`, deterministic from
checkpoint and seeds on one machine); every training run is `training.train` with a fixed seed
(deterministic for fixed data on one machine). The chain is docs/TRAINING.md's, link by link:

- run 61 from scratch on 1000 demonstrations (seeds 1000-1999, the highest 50 held out);
- runs 62-64: three rounds of the mixture of run N and the expert (beta 0.3, 0.2 s per chunk),
  each followed by a fine-tune from run N on 250 of the demonstrations (1750-1999) and every
  round so far (four action draws per sample);
- runs 68-69: two rounds with the graph's execution (0.1 s per chunk, blended over 3 rows);
- runs 73 and 76: the language head alone (`--language-head-only`: the actions stay run 69's
  bit for bit) trained on the learner's own episodes (beta 0: the learner drives, the expert
  labels), run 75 the head between them whose episodes run 76 reads.

The historical rounds were collected by the code of their day (earlier perception windows, an
earlier stage); here every round runs under the current code, so the rebuilt model is the
recipe's, not a bit-for-bit copy: "reproduces" means its evaluation, within the noise.

Every stage writes `<work>/<stage>.done.json` (its command, the digests of its inputs' markers,
its seconds); a stage whose marker matches is skipped, so an interrupted chain resumes where it
stopped and a changed link reruns with everything after it. Rounds and evaluations run as two
processes side by side on fixed halves of their seeds (a rollout's action noise runs on across
the episodes of one process, so the split is part of the recipe).

`python -P -m oxygen_ros.training.reproduce --work data/reproduce [--until run64] [--list]
[--dry-run] [--import run64=DIR]` (`scripts/reproduce_model` sets everything up first) builds
a stage and whatever it needs that is not done; `--import` takes a checkpoint (a rebuilt link
committed to carry the chain to another machine) as a train stage's output, so the chain goes
on from it without its upstream stages. The stage times are in the markers.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import hashlib
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

PRESET = ("--object-state", "target_m", "--preset", "workcell_target_m_bins")

DEMOS = ("--expert", "reactive", "--workers", "2")
# Run 61: docs/TRAINING.md "Runs 60-61".
SCRATCH = (
    "--delta-actions", "--image-dropout", "0.5", "--steps", "4618", "--batch-size", "16",
    "--peak-lr", "6e-4", "--heldout", "50", "--eval-every", "500", "--early-steps", "10",
    "--early-weight", "2", "--workers", "2", "--seed", "0", "--bin-frequencies", "0.5",
    "--freeze-bin-rows", "--narration-numbers", "words",
)  # fmt: skip
# Runs 62-69: "Runs 62-66" (the fine-tune's flags are the same for every round).
FINE_TUNE = (
    "--delta-actions", "--image-dropout", "0.5", "--peak-lr", "3e-4", "--warmup-steps", "100",
    "--steps", "1480", "--min-norm-range", "0.1", "--eval-every", "250", "--early-steps", "10",
    "--early-weight", "2", "--action-draws", "4", "--freeze-bin-rows", "--heldout", "50",
    "--batch-size", "16", "--seed", "0", "--workers", "2",
)  # fmt: skip
# Runs 73-76: "Run 73" and "Runs 75-76".
HEAD = (
    "--delta-actions", "--language-head-only", "--peak-lr", "1e-3", "--warmup-steps", "100",
    "--steps", "1500", "--min-norm-range", "0.1", "--eval-every", "500", "--stage-weights",
    "2:2,5:2", "--action-draws", "1", "--freeze-bin-rows", "--heldout", "50", "--batch-size",
    "16", "--seed", "0", "--workers", "2",
)  # fmt: skip
LABELLER = (
    "--expert", "reactive", "--keep-held", "--aligned-m", "0.01", "--gripper-open", "1.0",
)  # fmt: skip
WIDE_ROUND = ("--beta", "0.3", "--execute-s", "0.2", "--blend-steps", "0")
DEPLOYED_ROUND = ("--beta", "0.3", "--execute-s", "0.1", "--blend-steps", "3")
LEARNER_ROUND = ("--beta", "0", "--execute-s", "0.1", "--blend-steps", "3")
EVALUATION = ("--execute-s", "0.1", "--blend-steps", "3", "--log-frames")


@dataclasses.dataclass(frozen=True)
class Stage:
    """One link: `kind` demos (one process), train (one process) or round / evaluate (two
    processes on the halves of `seeds`)."""

    name: str
    kind: str
    args: tuple[str, ...] = ()
    inputs: tuple[str, ...] = ()  # earlier stages whose outputs this one reads
    seeds: tuple[int, int] = (0, 0)  # rounds and evaluations: [first, stop)

    def outputs(self) -> tuple[str, ...]:
        """Names of what it writes under the work dir."""
        if self.kind in ("round", "evaluate"):
            return tuple(f"{self.name}{half}" for half in "ab")
        return (self.name,)

    def halves(self) -> tuple[tuple[int, int], tuple[int, int]]:
        first, stop = self.seeds
        middle = (first + stop) // 2
        return (first, middle), (middle, stop)


def _demos(name: str, episodes: int, seed_start: int) -> Stage:
    return Stage(
        name, "demos", (*DEMOS, "--episodes", str(episodes), "--seed-start", str(seed_start))
    )


def _train(
    name: str, data: Sequence[Stage | str], recipe: tuple[str, ...], init: str = ""
) -> Stage:
    """`data`: demos stages by name, rounds (both halves read)."""
    stages = [d if isinstance(d, str) else d.name for d in data]
    inputs = tuple(stages) + ((init,) if init else ())
    args = (*recipe, *(("--init-from", init) if init else ()))
    return Stage(name, "train", args, inputs)


def _round(name: str, checkpoint: str, recipe: tuple[str, ...], seeds: tuple[int, int]) -> Stage:
    return Stage(name, "round", (*LABELLER, *recipe), (checkpoint,), seeds)


def chain() -> tuple[Stage, ...]:
    """The chain that made run 76, in order (each stage's inputs come before it)."""
    d61 = _round("d61", "run61", WIDE_ROUND, (920, 980))
    d62 = _round("d62", "run62", WIDE_ROUND, (120, 180))
    d63 = _round("d63", "run63", WIDE_ROUND, (180, 240))
    d67 = _round("d67", "run64", DEPLOYED_ROUND, (300, 360))
    d68 = _round("d68", "run68", DEPLOYED_ROUND, (1000, 1060))
    w69 = _round("w69", "run69", DEPLOYED_ROUND, (1120, 1180))
    l69 = _round("l69", "run69", LEARNER_ROUND, (1180, 1300))
    l73 = _round("l73", "run73", LEARNER_ROUND, (1300, 1420))
    n75 = _round("n75", "run75", LEARNER_ROUND, (1180, 1300))
    return (
        _demos("demos_rx", 1000, 1000),
        _demos("demos_rx250", 250, 1750),
        _train("run61", ["demos_rx"], SCRATCH),
        d61,
        _train("run62", ["demos_rx250", d61], FINE_TUNE, "run61"),
        d62,
        _train("run63", ["demos_rx250", d61, d62], FINE_TUNE, "run62"),
        d63,
        _train("run64", ["demos_rx250", d61, d62, d63], FINE_TUNE, "run63"),
        d67,
        _train("run68", ["demos_rx250", d67], FINE_TUNE, "run64"),
        d68,
        _train("run69", ["demos_rx250", d67, d68], FINE_TUNE, "run68"),
        Stage("eval69", "evaluate", EVALUATION, ("run69",), (0, 120)),
        w69,
        l69,
        _train("run73", ["demos_rx250", d67, d68, w69, l69], HEAD, "run69"),
        l73,
        _train("run75", ["demos_rx250", l69, l73], HEAD, "run73"),
        n75,
        _train("run76", ["demos_rx250", n75, l73], HEAD, "run73"),
        Stage("eval76", "evaluate", EVALUATION, ("run76",), (0, 120)),
    )


def _data_dirs(stage: Stage, by_name: dict[str, Stage], work: Path) -> str:
    dirs = []
    for name in stage.inputs:
        if name == _init_of(stage):
            continue
        dirs += [str(work / out) for out in by_name[name].outputs()]
    return ",".join(dirs)


def _init_of(stage: Stage) -> str:
    args = list(stage.args)
    return args[args.index("--init-from") + 1] if "--init-from" in args else ""


def commands(stage: Stage, stages: Sequence[Stage], work: Path) -> list[list[str]]:
    """The process command lines of one stage (two for rounds and evaluations)."""
    by_name = {s.name: s for s in stages}
    py = [sys.executable, "-P", "-m"]
    if stage.kind == "demos":
        return [
            [*py, "oxygen_ros.sim.generate_demos", *stage.args, "--out", str(work / stage.name)]
        ]
    if stage.kind == "train":
        args = [a if a != _init_of(stage) else str(work / a) for a in stage.args]
        data = _data_dirs(stage, by_name, work)
        out = str(work / stage.name)
        return [[*py, "oxygen_ros.training.train", "--data", data, *PRESET, *args, "--out", out]]
    (checkpoint,) = stage.inputs
    module = (
        "oxygen_ros.training.dagger" if stage.kind == "round" else "oxygen_ros.training.rollout"
    )
    lines = []
    for out, (first, stop) in zip(stage.outputs(), stage.halves(), strict=True):
        target = work / out if stage.kind == "round" else work / f"{out}.json"
        lines.append(
            [*py, module, "--checkpoint", str(work / checkpoint), *PRESET, *stage.args,
             "--seeds", f"{first}:{stop}", "--out", str(target)]
        )  # fmt: skip
    return lines


def _marker(work: Path, name: str) -> Path:
    return work / f"{name}.done.json"


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16] if path.exists() else ""


def _portable(lines: list[list[str]], work: Path) -> list[list[str]]:
    """Command lines as a marker records them: the same on any checkout and work dir."""
    root = str(work)
    return [
        ["python" if arg == sys.executable else arg.replace(root, "{work}") for arg in line]
        for line in lines
    ]


def _expected(stage: Stage, stages: Sequence[Stage], work: Path) -> dict:
    return {
        "commands": _portable(commands(stage, stages, work), work),
        "inputs": {name: _digest(_marker(work, name)) for name in stage.inputs},
    }


def _recorded(work: Path, name: str) -> dict | None:
    path = _marker(work, name)
    return json.loads(path.read_text()) if path.exists() else None


def is_done(stage: Stage, stages: Sequence[Stage], work: Path) -> bool:
    """Its marker exists and names the same commands and the same input markers (an imported
    stage: the same commands)."""
    recorded = _recorded(work, stage.name)
    if recorded is None:
        return False
    want = _expected(stage, stages, work)
    if recorded.get("imported"):
        return recorded.get("commands") == want["commands"]
    return all(recorded.get(key) == value for key, value in want.items())


def import_stage(stage: Stage, stages: Sequence[Stage], work: Path, source: Path) -> None:
    """Takes a train stage's checkpoint from elsewhere (a committed copy of a rebuilt link) as
    done, so that the chain goes on from it without its upstream stages."""
    if stage.kind != "train":
        raise ValueError(f"only checkpoints can be imported, {stage.name} is a {stage.kind}")
    if not (source / "params").is_dir():
        raise ValueError(f"{source} holds no params/ checkpoint")
    work.mkdir(parents=True, exist_ok=True)
    target = work / stage.name
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(source, target)
    record = {"commands": _expected(stage, stages, work)["commands"], "imported": str(source)}
    _marker(work, stage.name).write_text(json.dumps(record, indent=1))


def stale(stages: Sequence[Stage], work: Path) -> set[str]:
    """Stages to run again: not done, or reading a stage that is (an imported checkpoint is
    never stale: the chain goes on from it whatever is upstream)."""
    out: set[str] = set()
    for stage in stages:
        imported = bool((_recorded(work, stage.name) or {}).get("imported"))
        done = is_done(stage, stages, work)
        if not done or (not imported and any(name in out for name in stage.inputs)):
            out.add(stage.name)
    return out


def needed(stages: Sequence[Stage], work: Path, target: str = "") -> list[Stage]:
    """The stale stages `target` (default: every stage nothing else reads) needs, it
    included, in chain order."""
    names = [s.name for s in stages]
    if target and target not in names:
        raise ValueError(f"unknown stage {target!r}; stages: {', '.join(names)}")
    read = {name for s in stages for name in s.inputs}
    by_name = {s.name: s for s in stages}
    to_run = stale(stages, work)
    todo: set[str] = set()
    pending = [target] if target else [name for name in names if name not in read]
    while pending:
        name = pending.pop()
        if name in todo or name not in to_run:
            continue
        todo.add(name)
        pending.extend(by_name[name].inputs)
    return [s for s in stages if s.name in todo]


def _run_processes(lines: list[list[str]], logs: list[Path]) -> None:
    procs = []
    for line, log in zip(lines, logs, strict=True):
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("w") as handle:
            procs.append(subprocess.Popen(line, stdout=handle, stderr=subprocess.STDOUT))
    codes = [p.wait() for p in procs]
    failed = [str(log) for log, code in zip(logs, codes, strict=True) if code != 0]
    if failed:
        raise RuntimeError(f"stage failed, see {', '.join(failed)}")


def run(
    stages: Sequence[Stage],
    work: Path,
    target: str = "",
    execute: Callable[[list[list[str]], list[Path]], None] = _run_processes,
    say: Callable[[str], None] = print,
) -> list[str]:
    """Runs what `target` (default: every end of the chain) needs that is stale, in order;
    returns the names it ran. A stage's old outputs are removed before it runs, and its marker
    is written only once every process of it succeeded."""
    work.mkdir(parents=True, exist_ok=True)
    ran = []
    for stage in needed(stages, work, target):
        for out in stage.outputs():
            for path in (work / out, work / f"{out}.json"):
                if path.is_dir():
                    shutil.rmtree(path)
                elif path.exists():
                    path.unlink()
        _marker(work, stage.name).unlink(missing_ok=True)
        lines = commands(stage, stages, work)
        logs = [work / "logs" / f"{out}.log" for out in stage.outputs()]
        say(f"[reproduce] {stage.name}: running ({len(lines)} process(es), log {logs[0]})")
        started = time.monotonic()
        execute(lines, logs)
        seconds = time.monotonic() - started
        record = {**_expected(stage, stages, work), "seconds": round(seconds, 1)}
        _marker(work, stage.name).write_text(json.dumps(record, indent=1))
        say(f"[reproduce] {stage.name}: done in {seconds / 60:.1f} min")
        ran.append(stage.name)
    return ran


# The committed rows the rebuilt checkpoints' evaluations are checked against (run 76 acts as
# run 69 does, bit for bit: its row is run 69's actions under the current code).
REFERENCE = "docs/results/rollout_run76_seeds0-119.json.gz"
CHECKS = {"eval69": ("success",), "eval76": ("success", "subtask")}


def _episodes(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as handle:
        return json.load(handle)["episodes"]


def compare(rebuilt: Sequence[dict], reference: Sequence[dict], checks: Sequence[str]) -> dict:
    """The rebuilt evaluation against the committed one, as decided before the rebuild ran:
    successes by Fisher's exact test, per-episode subtask accuracy by the Mann-Whitney U test,
    both two-sided; "reproduced" when no checked p is below 0.05."""
    from scipy import stats

    def rates(episodes: Sequence[dict]) -> tuple[int, int, float, list[float]]:
        hits = sum(e["subtask_hits"] for e in episodes)
        said = sum(e["subtask_said"] for e in episodes)
        per_episode = [
            e["subtask_hits"] / e["subtask_said"] for e in episodes if e["subtask_said"]
        ]
        return sum(e["success"] for e in episodes), len(episodes), hits / max(said, 1), per_episode

    got, want = rates(rebuilt), rates(reference)
    out = {
        "rebuilt": {"successes": got[0], "episodes": got[1], "subtask_accuracy": got[2]},
        "reference": {"successes": want[0], "episodes": want[1], "subtask_accuracy": want[2]},
        "p": {},
    }
    if "success" in checks:
        table = [[got[0], got[1] - got[0]], [want[0], want[1] - want[0]]]
        out["p"]["success_fisher"] = float(stats.fisher_exact(table).pvalue)
    if "subtask" in checks:
        test = stats.mannwhitneyu(got[3], want[3], alternative="two-sided")
        out["p"]["subtask_mannwhitney"] = float(test.pvalue)
    out["reproduced"] = all(p >= 0.05 for p in out["p"].values())
    return out


def compare_stage(name: str, work: Path, reference: Path) -> dict:
    """`compare` for a finished evaluate stage of the chain (both halves)."""
    stage = {s.name: s for s in chain()}[name]
    if stage.kind != "evaluate":
        raise ValueError(f"{name} is not an evaluation stage")
    paths = [work / f"{out}.json" for out in stage.outputs()]
    missing = [str(path) for path in (*paths, reference) if not path.exists()]
    if missing:
        raise FileNotFoundError(f"not there (run the stage first?): {', '.join(missing)}")
    rebuilt = [e for path in paths for e in _episodes(path)]
    return compare(rebuilt, _episodes(reference), CHECKS[name])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--work", default="data/reproduce", help="where every stage writes")
    parser.add_argument(
        "--until",
        default="",
        help="build this stage and what it needs (default: every stage nothing else reads)",
    )
    parser.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="STAGE=DIR",
        help="take a checkpoint (a committed rebuilt link) as that train stage's output",
    )
    parser.add_argument("--list", action="store_true", help="print the stages and their state")
    parser.add_argument("--dry-run", action="store_true", help="print the commands only")
    parser.add_argument(
        "--compare",
        default="",
        metavar="STAGE",
        help=f"check a finished evaluation ({', '.join(CHECKS)}) against the committed row",
    )
    parser.add_argument(
        "--reference",
        default=REFERENCE,
        help="the committed rollout JSON (from the repository root)",
    )
    args = parser.parse_args(argv)
    work = Path(args.work).resolve()
    stages = chain()
    by_name = {s.name: s for s in stages}
    for item in args.imports:
        name, _, source = item.partition("=")
        if name not in by_name:
            parser.error(f"unknown stage {name!r}")
        import_stage(by_name[name], stages, work, Path(source))
    if args.compare:
        result = compare_stage(args.compare, work, Path(args.reference))
        print(json.dumps(result, indent=1))
        return 0 if result["reproduced"] else 1
    if args.list or args.dry_run:
        for stage in stages:
            state = "done" if is_done(stage, stages, work) else "to do"
            print(f"{stage.name:12s} {stage.kind:9s} {state}")
            if args.dry_run:
                for line in commands(stage, stages, work):
                    print("   ", " ".join(line))
        return 0
    run(stages, work, args.until)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
