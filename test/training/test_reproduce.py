"""The rebuild chain of the served model: its data never touches the evaluation seeds, and an
interrupted or changed chain reruns exactly what is not done."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from oxygen_ros.training import reproduce

STAGES = reproduce.chain()
BY_NAME = {s.name: s for s in STAGES}
EVALUATION_SEEDS = set(range(0, 120))  # every closed-loop evaluation of the line
HELD_OUT_DEMOS = set(range(1950, 2000))  # the demonstrations' held-out 50


def _seeds(stage: reproduce.Stage) -> set[int]:
    if stage.kind == "demos":
        args = list(stage.args)
        first = int(args[args.index("--seed-start") + 1])
        return set(range(first, first + int(args[args.index("--episodes") + 1])))
    return set(range(*stage.seeds))


def _fake_execute(calls: list[str]):
    """Stands in for the processes: writes each command's --out as a dir (a file for
    rollouts' .json) and records the stage."""

    def execute(lines: list[list[str]], logs: list[Path]) -> None:
        for line in lines:
            out = Path(line[line.index("--out") + 1])
            if out.suffix == ".json":
                out.write_text("{}")
            else:
                (out / "params").mkdir(parents=True)
        calls.append(logs[0].stem.rstrip("ab") if len(logs) == 2 else logs[0].stem)

    return execute


def test_every_input_comes_before_its_stage() -> None:
    seen: set[str] = set()
    for stage in STAGES:
        assert stage.name not in seen
        assert set(stage.inputs) <= seen, stage.name
        seen.add(stage.name)
    assert STAGES[-1].kind == "evaluate" and STAGES[-1].inputs == ("run76",)


def test_no_training_data_shares_a_seed_with_the_evaluation_or_with_itself() -> None:
    for stage in STAGES:
        if stage.kind != "train":
            continue
        init = reproduce._init_of(stage)
        sources = [BY_NAME[name] for name in stage.inputs if name != init]
        assert sources, stage.name
        used: set[int] = set()
        for source in sources:
            seeds = _seeds(source)
            assert not seeds & EVALUATION_SEEDS, (stage.name, source.name)
            assert not seeds & used, (stage.name, source.name)
            used |= seeds
        # the held-out demonstrations are held out by --heldout 50, the highest seeds
        assert "--heldout" in stage.args and stage.args[stage.args.index("--heldout") + 1] == "50"
        assert max(used) == max(HELD_OUT_DEMOS), stage.name
    for stage in STAGES:
        if stage.kind == "round":
            assert not _seeds(stage) & HELD_OUT_DEMOS, stage.name


def test_commands_read_the_inputs_and_split_the_seeds(tmp_path: Path) -> None:
    (line,) = reproduce.commands(BY_NAME["run62"], STAGES, tmp_path)
    data = line[line.index("--data") + 1].split(",")
    assert data == [str(tmp_path / n) for n in ("demos_rx250", "d61a", "d61b")]
    assert line[line.index("--init-from") + 1] == str(tmp_path / "run61")
    assert line[line.index("--out") + 1] == str(tmp_path / "run62")
    a, b = reproduce.commands(BY_NAME["eval76"], STAGES, tmp_path)
    assert a[a.index("--seeds") + 1] == "0:60" and b[b.index("--seeds") + 1] == "60:120"
    assert a[a.index("--checkpoint") + 1] == str(tmp_path / "run76")
    (scratch,) = reproduce.commands(BY_NAME["run61"], STAGES, tmp_path)
    assert "--init-from" not in scratch and scratch[scratch.index("--steps") + 1] == "4618"
    (head,) = reproduce.commands(BY_NAME["run76"], STAGES, tmp_path)
    assert "--language-head-only" in head
    assert head[head.index("--init-from") + 1] == str(tmp_path / "run73")


def test_a_finished_chain_reruns_nothing_and_a_changed_link_reruns_what_follows(
    tmp_path: Path,
) -> None:
    calls: list[str] = []
    ran = reproduce.run(STAGES, tmp_path, execute=_fake_execute(calls), say=lambda _: None)
    assert ran == [s.name for s in STAGES] == calls
    assert reproduce.run(STAGES, tmp_path, execute=_fake_execute(calls), say=lambda _: None) == []
    # Positive control: the same check sees a link that changed (d63 collected again).
    marker = tmp_path / "d63.done.json"
    record = json.loads(marker.read_text())
    marker.write_text(json.dumps({**record, "seconds": record["seconds"] + 1}))
    rerun = reproduce.run(STAGES, tmp_path, execute=_fake_execute([]), say=lambda _: None)
    downstream = [s.name for s in STAGES if s.name not in ("demos_rx", "demos_rx250")]
    downstream = downstream[downstream.index("run64") :]
    assert rerun == downstream


def test_a_failed_stage_leaves_no_marker_and_runs_again(tmp_path: Path) -> None:
    def fail(lines, logs):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        reproduce.run(STAGES, tmp_path, "demos_rx", execute=fail, say=lambda _: None)
    assert not (tmp_path / "demos_rx.done.json").exists()
    calls: list[str] = []
    reproduce.run(STAGES, tmp_path, "demos_rx", execute=_fake_execute(calls), say=lambda _: None)
    assert calls == ["demos_rx"]


def test_an_imported_checkpoint_carries_the_chain_on_without_its_upstream(tmp_path: Path) -> None:
    source = tmp_path / "committed_run64"
    (source / "params").mkdir(parents=True)
    work = tmp_path / "work"
    reproduce.import_stage(BY_NAME["run64"], STAGES, work, source)
    assert [s.name for s in reproduce.needed(STAGES, work, "run68")] == [
        "demos_rx250",
        "d67",
        "run68",
    ]
    # Control: without the import run68 needs the chain from the start.
    assert reproduce.needed(STAGES, tmp_path / "empty", "run68")[0].name == "demos_rx"
    with pytest.raises(ValueError, match="only checkpoints"):
        reproduce.import_stage(BY_NAME["d67"], STAGES, work, source)
    with pytest.raises(ValueError, match="no params"):
        reproduce.import_stage(BY_NAME["run68"], STAGES, work, tmp_path / "nothing")


def test_markers_do_not_name_the_checkout(tmp_path: Path) -> None:
    reproduce.run(STAGES, tmp_path, "run61", execute=_fake_execute([]), say=lambda _: None)
    text = (tmp_path / "run61.done.json").read_text()
    assert str(tmp_path) not in text and "{work}/demos_rx" in text


def test_the_listing_names_every_stage(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert reproduce.main(["--work", str(tmp_path), "--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == [s.name for s in STAGES]
    assert all(line.split()[-1] == "do" for line in lines)  # "to do"


def _episode(seed: int, success: bool, hits: int, said: int = 60) -> dict:
    return {"seed": seed, "success": success, "subtask_hits": hits, "subtask_said": said}


def _row(successes: int, hits: int, n: int = 120) -> list[dict]:
    return [_episode(i, i < successes, hits + (i % 5) - 2) for i in range(n)]


def test_the_comparison_passes_the_same_row_and_fails_a_worse_one() -> None:
    reference = _row(99, 55)
    same = reproduce.compare(reference, reference, ("success", "subtask"))
    assert same["reproduced"] and same["p"]["success_fisher"] == 1.0
    # Positive controls: the same check sees fewer successes, and a worse subtask alone.
    fewer = reproduce.compare(_row(70, 55), reference, ("success", "subtask"))
    assert not fewer["reproduced"] and fewer["p"]["success_fisher"] < 0.05
    worse = reproduce.compare(_row(99, 45), reference, ("success", "subtask"))
    assert not worse["reproduced"] and worse["p"]["subtask_mannwhitney"] < 0.05
    # eval69 checks successes alone: a different head does not fail it.
    assert reproduce.compare(_row(99, 45), reference, ("success",))["reproduced"]


def test_compare_stage_reads_both_halves(tmp_path: Path) -> None:
    assert set(reproduce.CHECKS) == {s.name for s in STAGES if s.kind == "evaluate"}
    row = _row(99, 55)
    for half, episodes in zip("ab", (row[:60], row[60:]), strict=True):
        (tmp_path / f"eval76{half}.json").write_text(json.dumps({"episodes": episodes}))
    reference = tmp_path / "reference.json"
    reference.write_text(json.dumps({"episodes": row}))
    result = reproduce.compare_stage("eval76", tmp_path, reference)
    assert result["rebuilt"]["episodes"] == 120 and result["reproduced"]
    with pytest.raises(ValueError, match="not an evaluation"):
        reproduce.compare_stage("run76", tmp_path, reference)
