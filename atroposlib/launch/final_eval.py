"""The last point of every eval curve: the final checkpoint, evaluated once the trainer
has finished.

Design: environments evaluate every `steps_per_eval` steps while the run goes on, on
the engine the trainer keeps in sync. At the end the trainer saves its last weights and
stops its engine (a push that nothing would sample from is wasted), so no evaluation
ever saw them: the curves ended one interval short. After a trainer that finished,
the launcher serves the final checkpoint the way the trainer served its policy (its
`engine.json`, the trainer contract) and runs each environment that evaluated during
the run once more with its own `evaluate` command, at the last step
(`--env.eval_step`), so the result joins that environment's history and the report's
plot. The processes of the run are stopped by then; a failure here is one line and
leaves the run's outcome as it was.

An evaluate-only environment (`evaluate_only: true`, a run trained only on replayed
groups) samples nothing during the run, so it is evaluated here twice on that engine:
the model the trainer started from (the policy, or a fork's parent checkpoint) at the
starting step, then the final checkpoint at the last step. A step already in its
history is not evaluated again (a second launch of a run that was evaluated).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from atroposlib.envs.eval import EVAL_HISTORY
from atroposlib.inference.launcher import EngineConfig, EngineError, EngineProcess
from atroposlib.launch.config import ENV_SUBCOMMANDS
from atroposlib.launch.plan import EVALS_DIR, Plan, ProcessPlan
from atroposlib.trainer_contract import read_engine_recipe
from atroposlib.utils.exposure import ENGINE_KEY_ENVIRONMENT, ENGINE_URLS_ENVIRONMENT
from atroposlib.utils.ports import free_port

EVALUATE_TIMEOUT_S = 1800.0
"""One environment's evaluation of the final checkpoint."""


def evaluated_steps(plan: Plan, process: ProcessPlan) -> set[int]:
    """The steps of the environment's evaluations in this run (its history.jsonl)."""
    history = plan.run_dir / EVALS_DIR / process.name / EVAL_HISTORY
    try:
        lines = history.read_text(encoding="utf-8").splitlines()
    except OSError:
        return set()
    steps = set()
    for line in lines:
        try:
            steps.add(int(json.loads(line)["step"]))
        except (ValueError, KeyError, TypeError):
            continue
    return steps


def last_evaluated_step(plan: Plan, process: ProcessPlan) -> int | None:
    """The step of the environment's latest evaluation in this run, or None (it never
    evaluated: no final point for it either)."""
    return max(evaluated_steps(plan, process), default=None)


def due(plan: Plan) -> list[ProcessPlan]:
    """The environments that ran (one per YAML section) and evaluated, but not at the
    last step."""
    chosen, sections = [], set()
    for process in plan.environments:
        if process.section in sections or process.evaluate_only:
            continue
        sections.add(process.section)
        last = last_evaluated_step(plan, process)
        if last is not None and last < plan.training_steps:
            chosen.append(process)
    return chosen


@dataclass
class Sitting:
    """One model served for evaluation, and the environments evaluated on it at `step`."""

    model: str
    step: int
    what: str
    processes: list[ProcessPlan]


def sittings(plan: Plan, final: Path) -> list[Sitting]:
    """What to evaluate after the run: the evaluate-only environments on the starting
    model, then every environment due on the final checkpoint (each step only once)."""
    only = [p for p in plan.environments if p.evaluate_only]
    start = [p for p in only if plan.start_step not in evaluated_steps(plan, p)]
    end = [p for p in only if plan.training_steps not in evaluated_steps(plan, p)]
    every = [
        Sitting(plan.starting_model, plan.start_step, "the starting model", start),
        Sitting(str(final), plan.training_steps, f"the final checkpoint ({final.name})", end),
    ]
    every[1].processes = [*due(plan), *every[1].processes]
    return [sitting for sitting in every if sitting.processes]


def evaluate_command(process: ProcessPlan, engine_url: str, step: int) -> list[str]:
    """The environment's own command as `evaluate` on `engine_url`, at `step`."""
    command = list(process.command)
    at = next(i for i, arg in enumerate(command) if i and arg in ENV_SUBCOMMANDS)
    command[at] = "evaluate"
    return [*command, "--openai.base_url", f"{engine_url}/v1", "--env.eval_step", str(step)]


def final_evaluations(plan: Plan, final: Path | None, say: Callable[[str], None]) -> None:
    """Serve `final` as the trainer served its policy and evaluate each environment due
    (and the evaluate-only ones on the starting model first)."""
    if final is None:
        if any(p.evaluate_only for p in plan.environments):
            say("no evaluation: the trainer left no checkpoint in Hugging Face format")
        return
    planned = sittings(plan, final)
    if not planned:
        return
    recipe = read_engine_recipe(plan.checkpoints)
    if recipe is None:
        say("no evaluation of the final checkpoint: the trainer recorded no engine.json")
        return
    key = {k: v for k, v in plan.trainer.env.items() if k in ENGINE_KEY_ENVIRONMENT}
    logs = plan.run_dir / "logs"
    config = EngineConfig.model_validate(
        {
            **recipe,
            "port": free_port(),
            "env": {**recipe.get("env", {}), **key},
            "log_path": str(logs / "final-eval-engine.log"),
        }
    )
    what = planned[0].what
    try:
        with EngineProcess(config) as engine:
            for sitting in planned:
                what = sitting.what
                say(f"evaluating {what} on {config.engine}")
                if engine.alive():
                    engine.restart(sitting.model)
                else:
                    engine.start(sitting.model)
                for process in sitting.processes:
                    _evaluate(process, engine.url, sitting.step, logs, say)
    except EngineError as exc:
        first = str(exc).splitlines()[0]
        say(f"no evaluation of {what}: {first} (see {logs})")


def _evaluate(
    process: ProcessPlan, url: str, step: int, logs: Path, say: Callable[[str], None]
) -> None:
    env = dict(process.env)
    if ENGINE_URLS_ENVIRONMENT in env:  # its key may go to this engine too
        env[ENGINE_URLS_ENVIRONMENT] = f"{env[ENGINE_URLS_ENVIRONMENT]},{url}"
    log = logs / f"{process.name}-final-eval.log"
    with open(log, "ab") as out:
        try:
            done = subprocess.run(
                evaluate_command(process, url, step),
                env={**os.environ, **env},
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=EVALUATE_TIMEOUT_S,
            )
        except subprocess.TimeoutExpired:
            say(f"{process.name}: the final evaluation took over {EVALUATE_TIMEOUT_S:.0f}s")
            return
    if done.returncode != 0:
        say(f"{process.name}: the final evaluation failed (exit {done.returncode}); see {log}")
        return
    say(f"{process.name}: evaluated at step {step} (see {log})")
