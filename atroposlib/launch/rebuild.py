"""A run read back from its directory alone, for `atropos-report` (cli/report.py).

Design: a run's report is built from files the run keeps (`config.yaml`, the exact
commands in `commands.json`, the trainer's metrics, events and trained groups, the
rollouts, evaluations and delivery ledgers), so it can be written again once the
launcher is gone: after a Ctrl-C skipped it, for a run copied from another machine,
or beside other runs (compare.py). What `plan.plan` decides by acting (free ports,
building the tiny model, importing the trainer, finding the scripts) is read from what
the launch recorded instead, so reading a run starts nothing. What only the launcher
knew at the end (the restarts after crashes, the machine it ran on) is kept from the
run's earlier summary.json when there is one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from atroposlib.launch.config import ConfigError, LaunchConfig, load_config
from atroposlib.launch.plan import Plan, ProcessPlan
from atroposlib.launch.report import run_facts, run_numbers, write_report
from atroposlib.launch.report_data import RunReading, read_run
from atroposlib.launch.resume import read_parent

CONFIG_FILE = "config.yaml"
COMMANDS_FILE = "commands.json"
SUMMARY_FILE = "summary.json"
NOT_ENVIRONMENTS = ("api", "engine", "teacher", "trainer", "replay")
"""The processes of commands.json that are not environments (plan.Plan.processes)."""
KEPT_FACTS = ("machine", "tiny_model")
"""What the score depended on that an earlier summary.json knows better than this
machine: the machine the run trained on, and the tiny model it trained."""


class NotARun(ValueError):
    """A directory that holds no run of atropos-launch; the message says why."""


@dataclass
class RunOnDisk:
    """A run as its directory keeps it: its plan read back, its config, its summary."""

    plan: Plan
    config_text: str
    earlier: dict[str, Any] = field(default_factory=dict)
    """Its summary.json as the launcher (or a rebuild) last wrote it; {} when none."""

    @property
    def name(self) -> str:
        return self.plan.run_dir.name


def read_back(run_dir: Path) -> RunOnDisk:
    """The run in `run_dir`; NotARun when there is none (no directory, no config.yaml, a
    config.yaml that is not a launch config)."""
    run_dir = run_dir.resolve()
    if not run_dir.is_dir():
        what = "is a file, not a run directory" if run_dir.exists() else "no such run directory"
        raise NotARun(f"{run_dir}: {what}")
    config_file = run_dir / CONFIG_FILE
    if not config_file.is_file():
        raise NotARun(
            f"{run_dir} is not a run directory: it has no {CONFIG_FILE} "
            "(atropos-launch writes one in every run directory)"
        )
    try:
        config = load_config(config_file)
    except ConfigError as exc:
        raise NotARun(f"{run_dir} is not a run directory of this launcher: {exc}") from None
    commands = _commands(run_dir / COMMANDS_FILE)
    trainer = commands.get("trainer", [])
    parent = read_parent(run_dir)  # a fork: its steps go on from its parent's
    plan = Plan(
        config=config,
        run_dir=run_dir,
        api_url="",  # nothing runs: a plan read back names files, not servers
        engine_url="",
        model=_flag(trainer, "--model-name") or config.model,
        training_steps=_training_steps(trainer, config),
        api=ProcessPlan("api", commands.get("api", [])),
        trainer=ProcessPlan("trainer", trainer),
        environments=_environments(commands, config),
        api_state_dir=_api_state_dir(run_dir, config, commands.get("api", [])),
        resumed=True,
        start_from=Path(parent.checkpoint) if parent else None,
        start_step=parent.step if parent else 0,
    )
    earlier = _recorded(run_dir / SUMMARY_FILE)
    return RunOnDisk(plan, config_file.read_text(encoding="utf-8"), earlier)


def rebuilt_numbers(run: RunOnDisk, reading: RunReading) -> dict[str, Any]:
    """The run's summary numbers, as the launcher's closing panel had them."""
    return run_numbers(run.plan, run.earlier.get("restarts"), reading)


def rebuild_report(run_dir: Path) -> Path:
    """Write `run_dir`'s summary.json, report.png and report.html again; the page's path."""
    run = read_back(run_dir)
    reading = read_run(run.plan)
    if "machine" in run.earlier:
        kept = {key: run.earlier[key] for key in KEPT_FACTS if key in run.earlier}
        facts = {"seed": run.plan.config.seed, **kept}
    else:
        facts = run_facts(run.plan)
    numbers = rebuilt_numbers(run, reading)
    return write_report(run.plan, run.config_text, numbers, reading, facts)


def _recorded(path: Path) -> dict[str, Any]:
    """A JSON object the launcher wrote, or {} when it is missing or unreadable."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _commands(path: Path) -> dict[str, list[str]]:
    """commands.json: each process's name -> its exact command, in the plan's order."""
    recorded = _recorded(path)
    return {
        str(name): [str(argument) for argument in command]
        for name, command in recorded.items()
        if isinstance(command, list)
    }


def _flag(command: list[str], name: str) -> str | None:
    """The value of `name` in a recorded command (`--name value` or `--name=value`)."""
    for at, argument in enumerate(command):
        if argument == name and at + 1 < len(command):
            return command[at + 1]
        if argument.startswith(f"{name}="):
            return argument.partition("=")[2]
    return None


def _training_steps(trainer: list[str], config: LaunchConfig) -> int:
    """The steps the trainer was asked for (0 when unknown: no resume is offered then)."""
    given = _flag(trainer, "--training-steps") or config.trainer.args.get("training_steps")
    try:
        return int(given or 0)
    except (TypeError, ValueError):
        return 0


def _environments(commands: dict[str, list[str]], config: LaunchConfig) -> list[ProcessPlan]:
    """The environment processes, each with its YAML section: commands.json lists them in
    the plan's order, each section's copies in turn. Without that record, none: each
    rollouts file then counts under its own name."""
    names = [name for name in commands if name not in NOT_ENVIRONMENTS]
    sections = [at for at, section in enumerate(config.environments) for _ in range(section.copies)]
    if len(names) != len(sections):
        return [ProcessPlan(name, commands[name]) for name in names]
    return [
        ProcessPlan(
            name, commands[name], section=at, evaluate_only=config.environments[at].evaluate_only
        )
        for name, at in zip(names, sections, strict=True)
    ]


def _api_state_dir(run_dir: Path, config: LaunchConfig, api: list[str]) -> Path | None:
    """The API's store: as its command named it, or in the run directory (moved since);
    None for an ephemeral API."""
    if config.api.args.get("ephemeral"):
        return None
    recorded = _flag(api, "--state-dir")
    if recorded and Path(recorded).is_dir():
        return Path(recorded)
    return run_dir / "api-state"
