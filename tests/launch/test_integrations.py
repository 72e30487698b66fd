"""The integration configs in one launch: distillation (`configs/distill_cpu.yaml`, a
teacher on an engine of its own) with the environment of `configs/verifiers_cpu.yaml`
beside its own. Both configs are planned as shipped by tests/launch/test_checks.py; here
one short run answers what each adds to a launch (a launch costs about 30 s of CPU to
start; two cost the suite 96 s, this one about 60). What they learn in their full length
is measured by `benchmarks/distillation.py` and the run in docs/environments.md, not
here (a full run of each costs minutes of CPU)."""

from __future__ import annotations

import json

import pytest

from atroposlib.trainer_contract import read_metrics
from tests.support.launch import launched_clean, shipped

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(3600)]

STEPS = 4
BATCH = 16  # 2 groups a step: one from each environment (min_batch_allocation 0.5)
DISTILL, VERIFIERS = "mod_arithmetic_distill", "verifiers_server"


@pytest.fixture(scope="module")
def both(module_launch):
    """distill_cpu.yaml with verifiers_cpu.yaml's environment added, each environment
    holding half of every batch. The teacher is the tiny model itself, not the shipped
    `tiny-teacher` (a minute of CPU to build, and the question is the plumbing)."""
    config = shipped("distill_cpu.yaml")
    config["environments"] += shipped("verifiers_cpu.yaml")["environments"]
    for env in config["environments"]:
        env["env"]["min_batch_allocation"] = 0.5
    config["teacher"]["model"] = "tiny"
    config["trainer"]["args"].update(training_steps=STEPS, batch_size=BATCH)
    return launched_clean(module_launch, config, "integrations", STEPS)


def groups(finished, env: str) -> list[dict]:
    rollouts = finished.run_dir / "rollouts" / f"{env}.jsonl"
    return [json.loads(line) for line in rollouts.open()]


def test_every_step_trains_and_batches_hold_both_environments(both):
    """Each environment holds half of a batch while both are registered (one may start
    later than the other, and at the end one stops first, its minimum going with it)."""
    metrics = read_metrics(both.run_dir / "metrics.jsonl")
    assert [m.step for m in metrics] == list(range(1, STEPS + 1))
    envs = [
        {k for k in (row.model_extra or {}) if k.startswith("score_mean/env_")} for row in metrics
    ]
    assert any(len(ids) == 2 for ids in envs), envs


def test_a_teacher_engine_scores_every_group_and_the_trainer_learns_from_it(both):
    """The `teacher:` section: a second engine the environment asks for prompt logprobs
    (its flags name it), groups that carry them, and a trainer that reports its KL to
    the teacher over the positions of those groups (the verifiers groups carry none)."""
    commands = json.loads((both.run_dir / "commands.json").read_text())
    teacher_port = commands["teacher"][commands["teacher"].index("--port") + 1]
    env = commands[DISTILL]
    assert env[env.index("--teacher.base_url") + 1] == f"http://127.0.0.1:{teacher_port}/v1"
    assert "--teacher.base_url" not in commands[VERIFIERS]
    assert "teacher is healthy" in both.output()
    distilled = [g for g in groups(both, DISTILL) if g.get("distill_token_ids")]
    assert distilled, "no group carried the teacher's logprobs"
    for group in distilled:
        assert [len(rows) for rows in group["distill_logprobs"]] == [
            len(tokens) for tokens in group["tokens"]
        ]
    assert not any(g.get("distill_token_ids") for g in groups(both, VERIFIERS))
    distilled_rows = 0
    for row in read_metrics(both.run_dir / "metrics.jsonl"):
        extra = row.model_extra or {}
        if "distill_coverage" not in extra:  # a batch of verifiers groups alone
            continue
        distilled_rows += 1
        # half of the batch is distilled: some trained positions are covered, not all
        assert 0 < extra["distill_coverage"] < 1 and extra["teacher_latency_s"] > 0, extra
        assert 0 <= extra["distill_kl"] < 0.5, "forward_topk to a teacher that is the policy"
    assert distilled_rows >= 1
    assert "teacher-kl" in both.log("trainer")


def test_a_verifiers_environment_trains_through_the_runner(both):
    """verifiers_server.py under the launcher: the engine key reaches the engine through
    verifiers' client, and its groups are trained."""
    first = groups(both, VERIFIERS)[0]
    assert len(first["tokens"]) == 8 and set(first["scores"]) <= {0.0, 1.0}
    assert "the group is dropped" not in both.log(VERIFIERS)
