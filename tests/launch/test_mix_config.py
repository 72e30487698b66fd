"""configs/mix_cpu.yaml as shipped: three environments with weights, run for a few steps."""

from __future__ import annotations

import json

import pytest

from atroposlib.trainer_contract import read_metrics
from tests.support.source import REPO

pytestmark = pytest.mark.e2e
MIX = REPO / "configs" / "mix_cpu.yaml"
ENVS = ("mod_arithmetic", "letter_counting_environment", "text_reversal_environment")


def test_the_mix_trains_a_few_steps_on_the_tiny_model(launch, tmp_path):
    """Launched from its file, as a user does (so its checks pass): each environment gets
    its weight and the mix's token limit, sends groups, and has its own score."""
    run_dir = tmp_path / "run"
    steps = ("--set", "trainer.args.training_steps=2")
    run = launch(None, str(MIX), "--run-dir", str(run_dir), *steps)
    assert run.wait(300) == 0, run.output()[-4000:]
    commands = json.loads((run_dir / "commands.json").read_text())

    def flag(name: str, key: str) -> str:
        return commands[name][commands[name].index(key) + 1]

    weights = {name: flag(name, "--env.inference_weight") for name in ENVS}
    assert weights == {ENVS[0]: "2.0", ENVS[1]: "1.0", ENVS[2]: "1.0"}
    assert {flag(name, "--env.max_token_length") for name in ENVS} == {"256"}
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
