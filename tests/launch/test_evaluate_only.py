"""An evaluate-only environment (`evaluate_only: true`): not run during the run, it is
evaluated after the trainer finished on the model the trainer started from and on the
final checkpoint (atroposlib/launch/final_eval.py), and the report shows both
evaluations. The choice of what to evaluate is tested in-process; one test serves the
two models on a stand-in engine kind (tests/support/standin_engine.py) and runs a
stand-in environment's `evaluate` command for real."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from atroposlib.inference.engines import ENGINES, register_engine
from atroposlib.launch.final_eval import due, evaluate_command, final_evaluations, sittings
from atroposlib.launch.plan import EVALS_DIR, Plan
from atroposlib.launch.report import environment_line, run_numbers
from atroposlib.launch.report_html import environments_table
from atroposlib.trainer_contract import write_engine_recipe
from tests.support.report_runs import STEPS, made_up_config, made_up_run, write_lines
from tests.support.standin_engine import StandInEngine

FLAT = "flat<b>"  # made_up_run's second section, evaluate-only here


def with_an_evaluate_only_env(run_dir: Path) -> Plan:
    data = made_up_config()
    data["environments"][1]["evaluate_only"] = True
    plan = made_up_run(run_dir, data)
    plan.environments[2].evaluate_only = True  # as plan() marks it
    (plan.rollouts_dir / f"{FLAT}.jsonl").unlink()  # it sampled nothing for training
    return plan


def history(plan: Plan, name: str = FLAT) -> Path:
    return plan.run_dir / EVALS_DIR / name / "history.jsonl"


@pytest.mark.unit
def test_an_evaluate_only_env_is_evaluated_on_the_starting_model_then_the_final_one(tmp_path):
    plan = with_an_evaluate_only_env(tmp_path)
    flat = plan.environments[2]
    final = plan.checkpoints / f"step-{STEPS}"
    first, last = sittings(plan, final)
    assert (first.model, first.step, first.processes) == (plan.model, 0, [flat])
    assert (last.model, last.step, last.processes) == (str(final), STEPS, [flat])
    # a fork starts from its parent's checkpoint, at the parent's step
    plan.start_from, plan.start_step = tmp_path / "parent" / "step-8", 8
    assert [(s.model, s.step) for s in sittings(plan, final)] == [
        (str(tmp_path / "parent" / "step-8"), 8),
        (str(final), STEPS),
    ]
    # a step it was evaluated at is not evaluated again; an env that ran but evaluated
    # short of the end is evaluated on the final checkpoint beside it
    history(plan).parent.mkdir(parents=True)
    write_lines(history(plan), [{"step": 8, "task": "t", "metrics": {"eval/accuracy": 0.1}}])
    write_lines(history(plan, "learns-1"), [{"step": 10, "task": "t", "metrics": {}}])
    (only,) = sittings(plan, final)
    assert only.step == STEPS and [p.name for p in only.processes] == ["learns-1", FLAT]
    assert FLAT not in [p.name for p in due(plan)]


@pytest.mark.unit
def test_the_evaluation_is_the_environments_own_command_whatever_its_subcommand():
    from atroposlib.launch.plan import ProcessPlan

    url = "http://127.0.0.1:5"
    for command in (
        ["py", "env.py", "process", "--env.mode", "serve"],
        ["py", "-m", "envs.served", "evaluate", "--env.mode", "serve"],
    ):
        evaluated = evaluate_command(ProcessPlan("e", command), url, 7)
        assert evaluated[:-4] == [*command[:-3], "evaluate", "--env.mode", "serve"]
        assert evaluated[-4:] == ["--openai.base_url", f"{url}/v1", "--env.eval_step", "7"]


@pytest.mark.unit
def test_the_report_shows_an_evaluate_only_envs_first_and_last_evaluation(tmp_path):
    plan = with_an_evaluate_only_env(tmp_path)
    entry = run_numbers(plan)["environments"][FLAT]  # listed before any evaluation
    assert entry == {"steps": 0, "evaluate_only": True}
    assert environment_line(entry) == "evaluated only: not evaluated"
    history(plan).parent.mkdir(parents=True)
    write_lines(
        history(plan),
        [
            {"step": s, "task": "flat_eval", "metrics": {"eval/accuracy": a, "eval/n": 8}}
            for s, a in ((0, 0.25), (STEPS, 0.5))
        ],
    )
    entry = run_numbers(plan)["environments"][FLAT]
    assert entry["evaluations"] == 2 and entry["evaluate_only"] is True
    assert entry["first_evaluation"] == {"step": 0, "accuracy": 0.25, "n": 8.0}
    assert entry["last_evaluation"] == {"step": STEPS, "accuracy": 0.5, "n": 8.0}
    change = f"accuracy 0.250 at step 0 -> 0.500 at step {STEPS}"
    assert environment_line(entry) == f"evaluated only: {change}"
    table = environments_table({FLAT: entry})
    assert "<td>evaluated only</td>" in table
    assert f"step 0: accuracy 0.250, n 8.000; step {STEPS}: accuracy 0.500" in table


STANDIN_ENV = """\
import json, sys
from pathlib import Path

args = sys.argv[1:]
given = {name: args[i + 1] for i, name in enumerate(args[:-1]) if name.startswith("--")}
step = int(given["--env.eval_step"])
record = {"step": step, "task": "flat_eval", "metrics": {"eval/accuracy": 0.25 + step / 80}}
folder = Path(given["--env.data_dir_to_save_evals"])
folder.mkdir(parents=True, exist_ok=True)
with open(folder / "history.jsonl", "a") as out:
    out.write(json.dumps(record) + "\\n")
print(args[0], given["--openai.base_url"])
"""


@pytest.mark.integration
def test_after_the_run_it_is_evaluated_twice_on_the_engine_the_trainer_used(tmp_path):
    """The trainer's engine recipe (engine.json) serves the starting model, then is
    restarted on the final checkpoint; the environment's command runs as `evaluate` at
    step 0 and at the last step, and a second pass has nothing left to do."""
    plan = with_an_evaluate_only_env(tmp_path / "run")
    script = tmp_path / "flat_env.py"
    script.write_text(STANDIN_ENV)
    evals = plan.run_dir / EVALS_DIR / FLAT
    plan.environments[2].command = [
        *(sys.executable, str(script), "serve"),
        *("--env.data_dir_to_save_evals", str(evals)),
    ]
    final = plan.checkpoints / f"step-{STEPS}"
    final.mkdir()
    (plan.run_dir / "logs").mkdir()
    records = tmp_path / "standin.jsonl"
    register_engine(StandInEngine(records))
    said: list[str] = []
    try:
        write_engine_recipe(plan.checkpoints, {"engine": "standin", "served_model_name": "tiny"})
        final_evaluations(plan, final, said.append)
        final_evaluations(plan, final, said.append)  # both steps are in its history now
    finally:
        ENGINES.pop("standin", None)
    starts = [json.loads(line) for line in records.read_text().splitlines()]
    assert [entry["model"] for entry in starts] == [plan.model, str(final)]
    steps = [json.loads(line)["step"] for line in history(plan).read_text().splitlines()]
    assert steps == [0, STEPS], said
    log = (plan.run_dir / "logs" / f"{FLAT}-final-eval.log").read_text()
    assert log.count("evaluate http://127.0.0.1:") == 2
    assert said[0] == "evaluating the starting model on standin"
    assert f"{FLAT}: evaluated at step {STEPS}" in said[-1] and len(said) == 4
    entry = run_numbers(plan)["environments"][FLAT]
    assert entry["first_evaluation"]["step"] == 0 and entry["last_evaluation"]["step"] == STEPS
