"""A fork (atroposlib/launch/lineage.py): a new run whose trainer resumes a checkpoint of
another run, its lineage in launch.json, and a report that names the parent and starts
after the parent's step. Made-up run directories (tests/support/report_runs.py), the
launcher's `_finish` in-process; one fork is planned for real (a dry run), and
test_launch.py launches one."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
from rich.console import Console

from atroposlib.cli.report import main as report
from atroposlib.launch.config import ConfigError
from atroposlib.launch.lineage import fork_record, fork_run, resumable_steps
from atroposlib.launch.resume import (
    RECORD_FILE,
    LaunchRecord,
    ParentRun,
    resume_target,
    write_record,
)
from atroposlib.launch.supervisor import Launcher, Outcome
from atroposlib.trainer_contract import EventKind, RunRecords
from tests.support.launch import launch_config, write_config
from tests.support.report_runs import STEPS, launched_run, write_lines


def a_parent(run_dir: Path) -> Path:
    """A finished run: checkpoints of steps 10 and 20 that its trainer recorded, one of
    step 5 in example_trainer's format that it did not, and a step-7 folder that is no
    checkpoint (a save cut short)."""
    launched_run(run_dir)
    record = LaunchRecord.model_validate_json((run_dir / RECORD_FILE).read_text())
    write_record(run_dir, record.model_copy(update={"sets": ["seed=3"]}))
    (run_dir / "checkpoints" / "step-5").mkdir()
    (run_dir / "checkpoints" / "step-5" / "trainer_state.pt").write_bytes(b"")
    (run_dir / "checkpoints" / "step-7").mkdir()
    return run_dir


@pytest.mark.unit
def test_a_fork_record_takes_the_parents_yaml_and_overrides_then_its_own(tmp_path):
    parent = a_parent(tmp_path / "parent")
    assert resumable_steps(parent / "checkpoints") == [5, 10, 20]
    record = fork_record(parent, 10, None, ["trainer.args.loss_type=gspo"])
    assert record.config == str(parent / "config.yaml")
    assert record.sets == ["seed=3", "trainer.args.loss_type=gspo"]
    checkpoint = str(parent / "checkpoints" / "step-10")
    assert record.parent == ParentRun(run_dir=str(parent), step=10, checkpoint=checkpoint)
    other = write_config(tmp_path / "other.yaml", {"model": "tiny"})
    given = fork_record(parent, 5, str(other), ["seed=1"])
    assert (given.config, given.sets) == (str(other), ["seed=1"])  # not the parent's sets


@pytest.mark.unit
def test_what_cannot_be_forked_is_one_line_naming_why(tmp_path, capsys):
    parent = a_parent(tmp_path / "parent")
    (tmp_path / "bare").mkdir()
    (tmp_path / "bare" / "checkpoints" / "step-2").mkdir(parents=True)
    (tmp_path / "bare" / "checkpoints" / "step-2" / "trainer_state.pt").write_bytes(b"")
    cases = [
        (tmp_path / "missing", 10, "no such run directory"),
        (parent, 7, "no checkpoint of step 7 to fork from (checkpoints/step-7 with "),
        (parent, 30, "steps with one: 5, 10, 20"),
        (tmp_path / "bare", 2, "has no launch.json"),  # no CONFIG, and no record of one
    ]
    for where, step, why in cases:
        assert fork_run(where, step, None, [], None) == 2
        out, err = capsys.readouterr()
        assert out == "" and len(err.splitlines()) == 1, err
        assert err.startswith("atropos-rollouts fork: ") and why in err
    (parent / "config.yaml").unlink()
    with pytest.raises(ConfigError, match="launch YAML .* is gone; give the YAML"):
        fork_record(parent, 10, None, [])


@pytest.mark.unit
def test_a_resumed_fork_keeps_its_lineage_and_an_older_record_still_reads(tmp_path):
    old = {"config": str(tmp_path / "c.yaml"), "sets": ["seed=1"], "resumed_at": [4]}
    assert LaunchRecord.model_validate(old).parent is None  # launch.json before forks
    (tmp_path / "c.yaml").write_text("model: tiny\n")
    fork = tmp_path / "fork"
    fork.mkdir()
    parent = ParentRun(run_dir="/runs/p", step=10, checkpoint="/runs/p/checkpoints/step-10")
    write_record(fork, LaunchRecord(config=old["config"], sets=["seed=1"], parent=parent))
    again = resume_target(fork, None, ["trainer.args.training_steps=40"])
    assert again.parent == parent and again.sets == ["seed=1", "trainer.args.training_steps=40"]
    assert resume_target(fork, str(tmp_path / "c.yaml"), []).parent == parent


@pytest.mark.unit
def test_a_fork_that_crashes_before_its_own_checkpoint_restarts_from_its_parents(tmp_path):
    """Its trainer's first command carries --resume PARENT/checkpoints/step-N; with no
    checkpoint of its own the restart keeps it, and its newest own one replaces it."""
    plan = launched_run(tmp_path / "fork")
    (plan.checkpoints / "events.jsonl").unlink()  # the fork saved nothing yet
    parent_checkpoint = str(tmp_path / "parent" / "checkpoints" / "step-10")
    plan.trainer.command = ["python", "-m", "trainer", "--resume", parent_checkpoint]
    plan.start_from, plan.start_step = Path(parent_checkpoint), 10
    launcher = Launcher(plan, LaunchRecord(config=str(plan.run_dir / "config.yaml")))
    try:
        assert launcher._resume_command() == (plan.trainer.command, parent_checkpoint)
        assert launcher._trained_steps() == STEPS  # made_up_run's metrics
        plan.metrics_path.unlink()
        assert launcher._trained_steps() == 10  # none of its own: the parent's step
        own = plan.checkpoints / "step-11"
        own.mkdir()
        RunRecords(plan.checkpoints).event(EventKind.CHECKPOINT_SAVED, 11, path=str(own))
        command, checkpoint = launcher._resume_command()
        assert checkpoint == str(own) and command[-2:] == ["--resume", str(own)]
        assert parent_checkpoint not in command
    finally:
        launcher.status.close()


def a_fork(run_dir: Path, parent: Path, at: int) -> Path:
    """A fork of `parent` at step `at` that trained STEPS steps of its own: its metrics
    and trained groups are made_up_run's, `at` steps later, and its launch.json names
    the parent."""
    plan = launched_run(run_dir, training_steps=at + STEPS)
    for name in ("metrics.jsonl", "trained_groups.jsonl"):
        path = plan.checkpoints / name
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        write_lines(path, [{**row, "step": row["step"] + at} for row in rows])
    evals = plan.run_dir / "evals" / "learns-1" / "history.jsonl"
    rows = [json.loads(line) for line in evals.read_text().splitlines()]
    write_lines(evals, [{**row, "step": row["step"] + at} for row in rows])
    record = LaunchRecord.model_validate_json((run_dir / RECORD_FILE).read_text())
    checkpoint = str(parent / "checkpoints" / f"step-{at}")
    lineage = ParentRun(run_dir=str(parent), step=at, checkpoint=checkpoint)
    write_record(run_dir, record.model_copy(update={"parent": lineage}))
    plan.start_from, plan.start_step = Path(checkpoint), at
    plan.training_steps = at + STEPS
    return run_dir


@pytest.mark.unit
def test_a_forks_report_names_its_parent_and_judges_its_own_steps(tmp_path, capsys):
    """Steps 41 to 60: the verdict compares steps 41-50 with 51-60, the figure starts at
    41, and the summary, the page, the panel and a rebuilt report name the parent."""
    parent = tmp_path / "parent"
    fork = a_fork(tmp_path / "fork", parent, at=40)
    from atroposlib.launch.rebuild import read_back

    plan = read_back(fork).plan
    assert (plan.start_step, plan.start_from) == (40, parent / "checkpoints" / "step-40")
    out = io.StringIO()
    launcher = Launcher(plan, LaunchRecord.model_validate_json((fork / RECORD_FILE).read_text()))
    launcher.console = Console(file=out, width=80)
    try:
        launcher._finish(Outcome(0, "the trainer finished; stopping the run"), 30.0)
    finally:
        launcher.status.close()
    numbers = json.loads((fork / "summary.json").read_text())
    assert numbers["forked_from"] == {
        "run_dir": str(parent),
        "step": 40,
        "checkpoint": str(parent / "checkpoints" / "step-40"),
    }
    assert numbers["steps"] == STEPS and numbers["learned"] is True, numbers["verdict"]
    rows = [json.loads(line) for line in (fork / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["step"] == 41
    first = sum(row["score_mean"] for row in rows[:10]) / 10
    assert numbers["first_10_mean_score"] == pytest.approx(first)
    assert numbers["environments"]["learns"]["last_evaluation"]["step"] == 60
    assert (fork / "report.png").read_bytes()[:4] == b"\x89PNG"
    page = (fork / "report.html").read_text()
    assert f"<th>Forked from</th><td>{parent} at step 40</td>" in page
    panel = re.sub(r"[│\s]+", "", out.getvalue())  # a long path wraps inside the panel
    assert f"forkedfrom{parent}atstep40" in panel
    assert "resume_command" not in numbers

    (fork / "summary.json").unlink()
    assert report([str(fork)]) == 0
    capsys.readouterr()
    rebuilt = json.loads((fork / "summary.json").read_text())
    assert rebuilt["forked_from"] == numbers["forked_from"] and rebuilt["steps"] == STEPS


@pytest.mark.integration
def test_a_fork_is_planned_on_the_parents_yaml_with_its_checkpoint_as_resume(
    tmp_path, capsys, monkeypatch
):
    """The real plan and checks of a fork (a dry run): the parent's YAML and --set
    overrides, the fork's own overrides last, a run directory of its own (not the
    parent's run_dir from that YAML), and `--resume` of the parent's checkpoint."""
    parent = tmp_path / "parent"
    path = write_config(tmp_path / "quick.yaml", launch_config(parent, steps=4))
    checkpoint = parent / "checkpoints" / "step-2"
    checkpoint.mkdir(parents=True)
    (checkpoint / "trainer_state.pt").write_bytes(b"")
    write_record(parent, LaunchRecord(config=str(path), sets=["trainer.args.lr=0.0001"]))
    sets = ["trainer.args.loss_type=gspo"]  # GSPO from step 2 on
    fork = tmp_path / "fork"
    assert fork_run(parent, 2, None, sets, str(fork), dry_run=True) == 0
    out = capsys.readouterr().out
    trainer = next(line for line in out.splitlines() if line.startswith("trainer: "))
    assert f"--resume {checkpoint}" in trainer and f"--save-path {fork}/checkpoints" in trainer
    assert "--loss-type gspo" in trainer and "--lr 0.0001" in trainer
    assert f"fork of {parent} at step 2" in out and not fork.exists()
    from atroposlib.launch import lineage

    monkeypatch.setattr(lineage, "preflight", lambda plan, dry_run: [])  # checked above
    assert fork_run(parent, 2, None, [], None, dry_run=True) == 0
    default = re.search(r"run directory: (\S+)", capsys.readouterr().out)
    assert default and re.fullmatch(r"quick-fork-\d{8}-\d{6}", Path(default[1]).name)

    too_short = ["trainer.args.training_steps=2"]
    assert fork_run(parent, 2, None, too_short, str(fork), dry_run=True) == 2
    err = capsys.readouterr().err
    assert "nothing to train; e.g. --set trainer.args.training_steps=4" in err
