"""Which environments get a last evaluation after the trainer finished, and the command
that gives it (atroposlib/launch/final_eval.py); the whole of it runs in the CPU
quickstart's learning run (tests/launch/test_learning.py)."""

from __future__ import annotations

import json

from atroposlib.envs.eval import EVAL_HISTORY
from atroposlib.launch.final_eval import due, evaluate_command, last_evaluated_step
from atroposlib.launch.plan import EVALS_DIR
from tests.support.report_runs import STEPS, made_up_run


def test_an_environment_that_evaluated_short_of_the_end_is_due_once_per_section(tmp_path):
    plan = made_up_run(tmp_path)  # learns-1 and learns-2 are one section; flat<b> another
    assert due(plan) == []  # made_up_run's learns-1 evaluated at the last step
    history = tmp_path / EVALS_DIR / "learns-1" / EVAL_HISTORY
    lines = [json.loads(line) for line in history.read_text().splitlines()]
    history.write_text("".join(json.dumps({**r, "step": 10}) + "\n" for r in lines) + "{cut")
    assert last_evaluated_step(plan, plan.environments[0]) == 10
    assert [p.name for p in due(plan)] == ["learns-1"]  # flat<b> never evaluated: no point
    assert last_evaluated_step(plan, plan.environments[2]) is None
    assert plan.training_steps == STEPS


def test_the_final_evaluation_is_the_environments_own_command_as_evaluate(tmp_path):
    plan = made_up_run(tmp_path)
    plan.environments[0].command = ["python", "env.py", "serve", "--env.group_size", "8"]
    assert evaluate_command(plan.environments[0], "http://127.0.0.1:5", 20) == [
        *("python", "env.py", "evaluate", "--env.group_size", "8"),
        *("--openai.base_url", "http://127.0.0.1:5/v1", "--env.eval_step", "20"),
    ]
