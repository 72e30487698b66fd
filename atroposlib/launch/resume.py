"""What `atropos-launch --resume RUN_DIR` needs to continue a run, and where it is kept.

Design: everything a run keeps is already durable in its directory: the API's store
(queue, kept batches, registrations), each environment's state (backlog, spool,
delivery ledger), the trainer's checkpoints and its metrics, events and trained-groups
files. What a resume adds is only how the run was launched: the YAML's path (scripts
are found relative to it) and the `--set` overrides, kept in `launch.json`. The
YAML is read again from its file, so a secret that `config.yaml` shows redacted
still reaches the processes; `--set` given with `--resume` is applied last (to run
longer: `--set trainer.args.training_steps=200`). The trainer goes on from its newest
checkpoint, and the API serves it the batches after that checkpoint again, so the
report counts one run: steps, score rise and the lost/trained-twice ledger over all
of it.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, Field, ValidationError

from atroposlib.launch.config import ConfigError
from atroposlib.trainer_contract import read_metrics

if TYPE_CHECKING:
    from atroposlib.launch.plan import Plan

RECORD_FILE = "launch.json"


class ParentRun(BaseModel):
    """The run a fork started from (`lineage.fork_run`): its trainer began on this
    checkpoint of that run, at that step."""

    run_dir: str = Field(..., description="The parent run's directory (absolute).")
    step: int = Field(..., ge=0, description="The parent's step the fork went on from.")
    checkpoint: str = Field(..., description="The checkpoint the fork's trainer resumed.")


class LaunchRecord(BaseModel):
    """How a run was launched: enough to launch it again on its own directory."""

    config: str = Field(..., description="The launch YAML's absolute path.")
    sets: list[str] = Field(default_factory=list, description="Its --set overrides, in order.")
    resumed_at: list[int] = Field(
        default_factory=list,
        description="The trainer step each --resume went on from (the report marks them).",
    )
    parent: ParentRun | None = Field(
        None, description="A fork's parent run and step (None: a run of its own)."
    )


def resume_command(run_dir: Path) -> str:
    """The command that continues the run in `run_dir`."""
    return f"atropos-launch --resume {shlex.quote(str(run_dir))}"


def refuse_a_finished_run(plan: Plan) -> None:
    """ConfigError for a run whose trainer already did every step: its trainer would
    exit at once, and the launch would read that as a failed start."""
    done = max((row.step for row in read_metrics(plan.metrics_path)), default=0)
    if done >= plan.training_steps:
        raise ConfigError(
            f"the run in {plan.run_dir} finished all {plan.training_steps} steps; to train "
            f"on: {resume_command(plan.run_dir)} --set "
            f"trainer.args.training_steps={2 * plan.training_steps}"
        )


def write_record(run_dir: Path, record: LaunchRecord) -> None:
    (run_dir / RECORD_FILE).write_text(record.model_dump_json(indent=2) + "\n")


def resume_target(run_dir: Path, config: str | None, sets: list[str]) -> LaunchRecord:
    """The record to launch `run_dir` again with; ConfigError when it cannot be resumed."""
    if not run_dir.is_dir():
        raise ConfigError(f"--resume {run_dir}: no such run directory")
    path = run_dir / RECORD_FILE
    if config is not None:
        earlier = _read_record(path) if path.exists() else LaunchRecord(config=config)
        return LaunchRecord(
            config=str(Path(config).resolve()),
            sets=[*earlier.sets, *sets],
            resumed_at=earlier.resumed_at,
            parent=earlier.parent,
        )
    if not path.exists():
        raise ConfigError(
            f"--resume {run_dir}: it has no {RECORD_FILE}, so it was not started by this "
            "atropos-launch; give its YAML too: atropos-launch CONFIG --resume RUN_DIR"
        )
    record = _read_record(path)
    if not Path(record.config).is_file():
        raise ConfigError(
            f"--resume {run_dir}: its config {record.config} is gone; give it again: "
            "atropos-launch CONFIG --resume RUN_DIR"
        )
    return record.model_copy(update={"sets": [*record.sets, *sets]})


def read_resumes(run_dir: Path) -> list[int]:
    """The steps the run was resumed at, from its record ([] without one)."""
    try:
        return _read_record(run_dir / RECORD_FILE).resumed_at
    except ConfigError:
        return []


def read_parent(run_dir: Path) -> ParentRun | None:
    """The run `run_dir` was forked from, from its record (None: not a fork, or no record)."""
    try:
        return _read_record(run_dir / RECORD_FILE).parent
    except ConfigError:
        return None


def _read_record(path: Path) -> LaunchRecord:
    try:
        return LaunchRecord.model_validate_json(path.read_text())
    except (OSError, ValidationError) as exc:
        raise ConfigError(
            f"{path} cannot be read ({exc.__class__.__name__}); give the YAML: "
            "atropos-launch CONFIG --resume RUN_DIR"
        ) from None
