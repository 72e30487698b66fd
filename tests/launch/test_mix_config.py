"""configs/mix_cpu.yaml: three environments with weights, checked and run for a few steps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from atroposlib.cli.launch import main
from atroposlib.trainer_contract import read_metrics
from tests.support.source import REPO

pytestmark = pytest.mark.e2e
MIX = REPO / "configs" / "mix_cpu.yaml"
ENVS = ("mod_arithmetic", "letter_counting_environment", "text_reversal_environment")


def test_the_mix_passes_a_dry_run_with_each_weight(capsys):
    assert main([str(MIX), "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    commands = {line.partition(": ")[0]: line.partition(": ")[2] for line in lines}
    weights = {name: commands[name].split("--env.inference_weight ")[1].split()[0] for name in ENVS}
    assert weights == {ENVS[0]: "2.0", ENVS[1]: "1.0", ENVS[2]: "1.0"}
    assert all("--env.max_token_length 256" in commands[name] for name in ENVS)


def test_the_mix_trains_a_few_steps_on_the_tiny_model(launch, tmp_path):
    config = yaml.safe_load(MIX.read_text())
    config["run_dir"] = str(tmp_path / "run")
    config["trainer"]["args"]["training_steps"] = 2
    for environment in config["environments"]:
        environment["script"] = str((MIX.parent / environment["script"]).resolve())
    run = launch(config)
    assert run.wait(300) == 0, run.output()[-4000:]
    run_dir = Path(config["run_dir"])
    assert [row.step for row in read_metrics(run_dir / "metrics.jsonl")] == [1, 2]
    for name in ENVS:
        assert "registered as" in (run_dir / "logs" / f"{name}.log").read_text(), name
    sent = {
        name: len((run_dir / "rollouts" / f"{name}.jsonl").read_text().splitlines())
        for name in ENVS
        if (run_dir / "rollouts" / f"{name}.jsonl").exists()
    }
    assert sent.get(ENVS[0], 0) > 0 and sum(sent.values()) >= 16, sent  # 2 steps x 8 groups
    # each environment's own score, in the trainer's rows (by env_id) and in the summary
    rows = read_metrics(run_dir / "metrics.jsonl")
    assert all(any(k.startswith("score_mean/env_") for k in row.model_extra) for row in rows)
    environments = json.loads((run_dir / "summary.json").read_text())["environments"]
    assert ENVS[0] in environments and set(environments) <= set(ENVS)
    assert all(1 <= entry["steps"] <= 2 for entry in environments.values())
    assert run.leftovers() == []
