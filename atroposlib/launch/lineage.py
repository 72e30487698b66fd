"""Fork a run: a new run whose trainer goes on from a checkpoint of another run.

Design: a run's checkpoints are resumable (weights, optimizer, scheduler, step), so a
question such as "what if from step 40 it had trained with GSPO?" needs no new
machinery: a new run directory, the parent's launch YAML (or another) with `--set`
overrides on top, and a trainer started with `--resume PARENT/checkpoints/step-N`. The
fork gets its own API, environments and records; its steps go on from N + 1, up to
`trainer.args.training_steps`. Its `launch.json` names the parent (`ParentRun`), so a
`--resume` of the fork keeps the lineage (a crash before the fork's own first
checkpoint restarts from the parent's, supervisor.py `_resume_command`) and its report
says where it came from (`forked_from`).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from pydantic import ValidationError

from atroposlib.launch.checks import preflight
from atroposlib.launch.config import ConfigError, load_config
from atroposlib.launch.needs import Finding
from atroposlib.launch.plan import Plan, plan
from atroposlib.launch.resume import RECORD_FILE, LaunchRecord, ParentRun
from atroposlib.trainer_contract import EventKind, events_path, read_events

TRAINER_STATE = "trainer_state.pt"
"""What makes the default trainer's checkpoint resumable (its trainer state file)."""
PROG = "atropos-rollouts fork"


def fork_run(
    parent: Path,
    step: int,
    config: str | None,
    sets: list[str],
    run_dir: str | None,
    dry_run: bool = False,
    prog: str = PROG,
) -> int:
    """Launch a fork of `parent` from its checkpoint of `step`; the exit status (as
    atropos-launch's). A mistake is one line on stderr and exit 2; `dry_run` prints the
    commands and checks instead of starting them."""
    try:
        resolved, record, findings = fork_plan(parent, step, config, sets, run_dir, dry_run)
    except ConfigError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    if dry_run:
        from atroposlib.launch.checks import print_dry_run

        print(f"fork of {parent} at step {step}; the trainer resumes {resolved.start_from}")
        print(f"run directory: {resolved.run_dir}")
        print_dry_run(resolved, findings)
        return 0
    from atroposlib.launch.supervisor import Launcher

    return Launcher(resolved, record).run()


def fork_plan(
    parent: Path,
    step: int,
    config: str | None,
    sets: list[str],
    run_dir: str | None,
    dry_run: bool = False,
) -> tuple[Plan, LaunchRecord, list[Finding]]:
    """The fork's plan, its record and what the checks found; ConfigError names a problem."""
    record = fork_record(parent, step, config, sets)
    assert record.parent is not None  # fork_record names it
    loaded = load_config(record.config, record.sets)
    if run_dir is None and not any(s.strip().startswith("run_dir=") for s in sets):
        run_dir = default_fork_dir(record.config)  # never the parent's own run_dir
    if run_dir is not None:
        loaded = loaded.model_copy(update={"run_dir": run_dir})
    resolved = plan(
        loaded, record.config, start_from=Path(record.parent.checkpoint), start_step=step
    )
    if resolved.training_steps <= step:
        raise ConfigError(
            f"the fork starts after step {step}, and trainer.args.training_steps is "
            f"{resolved.training_steps}: nothing to train; e.g. --set "
            f"trainer.args.training_steps={step + resolved.training_steps}"
        )
    return resolved, record, preflight(resolved, dry_run=dry_run)


def fork_record(parent: Path, step: int, config: str | None, sets: list[str]) -> LaunchRecord:
    """The fork's launch record: CONFIG (else the parent's YAML and its --set overrides),
    then `sets`, and the parent's checkpoint it starts from."""
    parent = parent.resolve()
    if not parent.is_dir():
        what = "is a file, not a run directory" if parent.exists() else "no such run directory"
        raise ConfigError(f"{parent}: {what}")
    checkpoint = parent_checkpoint(parent, step)
    if config is not None:
        path, earlier = str(Path(config).resolve()), []
    else:
        launched = parent_record(parent)
        path, earlier = launched.config, launched.sets
        if not Path(path).is_file():
            raise ConfigError(f"{parent}'s launch YAML {path} is gone; give the YAML: CONFIG")
    lineage = ParentRun(run_dir=str(parent), step=step, checkpoint=str(checkpoint))
    return LaunchRecord(config=path, sets=[*earlier, *sets], parent=lineage)


def parent_record(parent: Path) -> LaunchRecord:
    """How the parent was launched (its launch.json); ConfigError saying to give CONFIG."""
    path = parent / RECORD_FILE
    if not path.is_file():
        raise ConfigError(
            f"{parent} has no {RECORD_FILE} (not a run of atropos-launch, or an older one); "
            "give its YAML: CONFIG"
        )
    try:
        return LaunchRecord.model_validate_json(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, ValidationError) as exc:
        why = exc.__class__.__name__
        raise ConfigError(f"{path} cannot be read ({why}); give the YAML: CONFIG") from None


def parent_checkpoint(parent: Path, step: int) -> Path:
    """`parent`'s resumable checkpoint of `step`; ConfigError listing the steps that have one."""
    checkpoints = parent / "checkpoints"
    steps = resumable_steps(checkpoints)
    if step not in steps:
        have = ", ".join(map(str, steps)) or "none"
        raise ConfigError(
            f"{parent} has no checkpoint of step {step} to fork from "
            f"(checkpoints/step-{step} with {TRAINER_STATE}); steps with one: {have}"
        )
    return checkpoints / f"step-{step}"


def resumable_steps(checkpoints: Path) -> list[int]:
    """The steps of the checkpoints a trainer can resume: `step-N` directories that hold
    the default trainer's `trainer_state.pt`, or that the trainer recorded as saved (the
    contract's `checkpoint_saved`, for another trainer's format)."""
    recorded = {
        Path(str(event.detail.get("path"))).name
        for event in read_events(events_path(checkpoints))
        if event.kind is EventKind.CHECKPOINT_SAVED
    }
    steps = []
    for folder in checkpoints.glob("step-*"):
        number = folder.name.removeprefix("step-")
        if not number.isdigit() or not folder.is_dir():
            continue
        if (folder / TRAINER_STATE).is_file() or folder.name in recorded:
            steps.append(int(number))
    return sorted(steps)


def default_fork_dir(config_path: str) -> str:
    """`runs/<config name>-fork-<time>`, as the launcher names a run directory."""
    return f"runs/{Path(config_path).stem}-fork-{time.strftime('%Y%m%d-%H%M%S')}"
