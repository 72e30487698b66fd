"""The integration configs launched from their files: distillation (`configs/
distill_cpu.yaml`, a teacher on an engine of its own) and a verifiers environment
(`configs/verifiers_cpu.yaml`). Each is a short launch: what they learn in their full
length is measured by `benchmarks/distillation.py` and the run in docs/environments.md,
not here (a full run of each costs minutes of CPU)."""

from __future__ import annotations

import json

import pytest

from atroposlib.trainer_contract import read_metrics
from tests.support.launch import finish
from tests.support.source import REPO

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(3600)]

STEPS = 4
BATCH = 16


def launched(launch, tmp_path, name: str, *sets: str):
    run_dir = tmp_path / "run"
    flags = ["--run-dir", str(run_dir), "--set", f"trainer.args.training_steps={STEPS}"]
    flags += ["--set", f"trainer.args.batch_size={BATCH}"]  # 2 groups a step, not 8
    for value in sets:
        flags += ["--set", value]
    finished = finish(launch(None, str(REPO / "configs" / name), *flags), run_dir, steps=STEPS)
    assert finished.code == 0, finished.run.output()[-4000:]
    assert finished.leftovers == []
    return finished


def test_a_teacher_engine_scores_every_group_and_the_trainer_learns_from_it(launch, tmp_path):
    """The `teacher:` section: a second engine the environment asks for prompt logprobs
    (its flags name it), groups that carry them, and a trainer that reports its KL to
    the teacher over every trained position. The teacher is the tiny model itself here,
    not the shipped `tiny-teacher` (a minute of CPU to build, and the question is the
    plumbing)."""
    finished = launched(launch, tmp_path, "distill_cpu.yaml", "teacher.model=tiny")
    run_dir = finished.run_dir
    commands = json.loads((run_dir / "commands.json").read_text())
    teacher_port = commands["teacher"][commands["teacher"].index("--port") + 1]
    env = commands["mod_arithmetic_distill"]
    assert env[env.index("--teacher.base_url") + 1] == f"http://127.0.0.1:{teacher_port}/v1"
    assert "teacher is healthy" in finished.output()
    rollouts = run_dir / "rollouts" / "mod_arithmetic_distill.jsonl"
    groups = [json.loads(line) for line in rollouts.open()]
    distilled = [g for g in groups if g.get("distill_token_ids")]
    assert distilled, "no group carried the teacher's logprobs"
    for group in distilled:
        assert [len(rows) for rows in group["distill_logprobs"]] == [
            len(tokens) for tokens in group["tokens"]
        ]
    metrics = read_metrics(run_dir / "metrics.jsonl")
    assert [m.step for m in metrics] == list(range(1, STEPS + 1))
    for row in metrics:
        extra = row.model_extra or {}
        assert extra["distill_coverage"] == 1.0 and extra["teacher_latency_s"] > 0, extra
        assert 0 <= extra["distill_kl"] < 0.5, "forward_topk to a teacher that is the policy"
    assert "teacher-kl" in finished.log("trainer")


def test_a_verifiers_environment_trains_through_the_runner(launch, tmp_path):
    """verifiers_server.py under the launcher: the engine key reaches the engine through
    verifiers' client, and every step trains on its groups."""
    finished = launched(launch, tmp_path, "verifiers_cpu.yaml")
    metrics = read_metrics(finished.run_dir / "metrics.jsonl")
    assert [m.step for m in metrics] == list(range(1, STEPS + 1))
    groups = finished.run_dir / "rollouts" / "verifiers_server.jsonl"
    first = json.loads(groups.open().readline())
    assert len(first["tokens"]) == 8 and set(first["scores"]) <= {0.0, 1.0}
    assert "the group is dropped" not in finished.log("verifiers_server")
