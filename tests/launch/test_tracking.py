"""The YAML's `tracking:` section: one switch turns a tracker on for the trainer and,
for wandb, every environment; a per-section value still wins."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from atroposlib.cli.launch import main
from atroposlib.launch.config import ConfigError, TrackingSection, load_config
from atroposlib.launch.plan import Plan, plan
from atroposlib.utils.flags import add_model_flags, parse_settings
from example_trainer.config import TrainingConfig
from tests.support.launch import launch_config, write_config


def plan_of(tmp_path: Path, config: dict[str, Any], name: str = "c.yaml") -> Plan:
    path = write_config(tmp_path / name, config)
    return plan(load_config(path), path)


def trainer_settings(resolved: Plan) -> TrainingConfig:
    """The trainer's command read by its own parser, as the trainer reads it."""
    parser = argparse.ArgumentParser()
    add_model_flags(parser, TrainingConfig)
    command = resolved.trainer.command
    settings, _ = parse_settings(parser, TrainingConfig, command[command.index("-m") + 2 :])
    return settings


def env_flag(command: list[str], name: str) -> str:
    (value,) = [command[i + 1] for i, flag in enumerate(command) if flag == f"--env.{name}"]
    return value


def test_one_switch_turns_the_trackers_on_for_the_trainer_and_every_environment(
    tmp_path, tiny_model_path
):
    config = launch_config(tmp_path / "run", tracking={"report_to": ["wandb", "trackio"]})
    config["tracking"]["project"] = "p"
    config["environments"][0]["copies"] = 2
    resolved = plan_of(tmp_path, config)
    logging = trainer_settings(resolved).logging
    assert (logging.use_wandb, logging.wandb_project) == (True, "p")
    assert (logging.use_trackio, logging.trackio_project) == (True, "p")
    # the run's name, and the wandb group the environments get from the API's /wandb_info
    assert logging.run_name == logging.wandb_group == "run"
    assert [env_flag(e.command, "use_wandb") for e in resolved.environments] == ["true", "true"]


def test_a_value_in_its_own_section_wins_and_no_section_tracks_nothing(tmp_path, tiny_model_path):
    config = launch_config(tmp_path / "run")
    config["tracking"] = {"report_to": "wandb", "project": "p", "run_name": "try-3"}
    config["trainer"]["args"]["wandb_project"] = "mine"
    config["environments"][0]["env"]["use_wandb"] = False
    resolved = plan_of(tmp_path, config)
    logging = trainer_settings(resolved).logging
    assert (logging.use_wandb, logging.wandb_project, logging.wandb_group) == (
        True,
        "mine",
        "try-3",
    )
    assert not logging.use_trackio
    assert env_flag(resolved.environments[0].command, "use_wandb") == "false"

    plain = launch_config(tmp_path / "plain")
    resolved = plan_of(tmp_path, plain, "plain.yaml")
    logging = trainer_settings(resolved).logging
    assert (logging.use_wandb, logging.use_trackio, logging.run_name) == (False, False, None)
    assert logging.wandb_group == "grpo"  # as before the section existed
    assert env_flag(resolved.environments[0].command, "use_wandb") == "false"


def test_an_unknown_tracker_is_one_line_naming_the_key(tmp_path, capsys):
    config = {**launch_config(tmp_path / "r"), "tracking": {"report_to": ["wandb", "tensorbord"]}}
    code = main([str(write_config(tmp_path / "c.yaml", config)), "--dry-run"])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1 and "tracking.report_to.1" in err, err
    assert "'wandb' or 'trackio'" in err, err


def test_report_to_takes_trls_spellings(tmp_path):
    path = write_config(tmp_path / "c.yaml", launch_config(tmp_path / "r"))
    assert load_config(path).tracking.report_to == []
    assert load_config(path, ["tracking.report_to=wandb"]).tracking.report_to == ["wandb"]
    assert load_config(path, ["tracking.report_to=none"]).tracking.report_to == []


class OnlyWandb(BaseModel):
    """A trainer's declared flags with wandb's switch and project, and no run name."""

    use_wandb: bool = False
    wandb_project: str = "x"


def test_a_trainer_gets_the_tracking_flags_it_declares_and_is_refused_a_missing_switch():
    wandb = TrackingSection(report_to=["wandb"], project="p")
    assert wandb.trainer_args("run", OnlyWandb, "mine") == {
        "use_wandb": True,
        "wandb_project": "p",
    }
    assert wandb.trainer_args("run", None, "undeclared")["run_name"] == "run"
    with pytest.raises(ConfigError, match="tracking.report_to: trainer mine has no --use-trackio"):
        TrackingSection(report_to=["trackio"]).trainer_args("run", OnlyWandb, "mine")
    assert TrackingSection().trainer_args("run", OnlyWandb, "mine") == {}
