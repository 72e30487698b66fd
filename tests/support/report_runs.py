"""A made-up finished run directory for report tests: two environments, one that learns
and one that does not, trained groups per step, evaluations, and the trainer's extras."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from atroposlib.launch.config import LaunchConfig
from atroposlib.launch.plan import Plan, ProcessPlan
from atroposlib.launch.resume import LaunchRecord, write_record
from atroposlib.trainer_contract import EventKind, RunRecords

STEPS = 20
GROUP = 4


def learning_score(step: int) -> float:
    """The learning env's mean score at `step`: 0.2 rising to 0.8."""
    return 0.2 + 0.6 * (step - 1) / (STEPS - 1)


def made_up_config() -> dict[str, Any]:
    """The YAML of the made-up run: two environments, one of them in two copies."""
    return {
        "model": "tiny",
        "environments": [
            {"script": "learns.py", "name": "learns", "copies": 2},
            {"script": "flat.py", "name": "flat<b>"},
        ],
    }


def made_up_run(run_dir: Path, data: dict[str, Any] | None = None) -> Plan:
    """Files as a two-environment launch leaves them; the plan that names them. `data`:
    the YAML's data (default `made_up_config()`)."""
    config = LaunchConfig.model_validate(data or made_up_config())
    plan = Plan(
        config=config,
        run_dir=run_dir,
        api_url="http://127.0.0.1:1",
        engine_url="http://127.0.0.1:2",
        model="tiny",
        training_steps=STEPS,
        api=ProcessPlan("api", []),
        trainer=ProcessPlan("trainer", []),
        environments=[
            ProcessPlan("learns-1", [], section=0),
            ProcessPlan("learns-2", [], section=0),
            ProcessPlan("flat<b>", [], section=1),
        ],
    )
    for folder in ("checkpoints", "rollouts", "evals/learns-1"):
        (run_dir / folder).mkdir(parents=True, exist_ok=True)
    rollouts: dict[str, list[dict]] = {"learns-1": [], "learns-2": [], "flat<b>": []}
    metrics, trained = [], []
    for step in range(1, STEPS + 1):
        # each step: one group from each copy of `learns`, one from `flat<b>` (all 0.5)
        rising = round(learning_score(step) * GROUP)
        ids = []
        for env, scores in (
            ("learns-1", [1.0] * rising + [0.0] * (GROUP - rising)),
            ("learns-2", [1.0] * rising + [0.0] * (GROUP - rising)),
            ("flat<b>", [1.0, 0.0, 1.0, 0.0]),
        ):
            group_id = f"{env}-{step}"
            ids.append(group_id)
            rollouts[env].append(
                {
                    "group_id": group_id,
                    "scores": scores,
                    "tokens": [[1, 2, 3]] * GROUP,
                    "masks": [[-100, 2, 3]] * GROUP,
                    "messages": [
                        [
                            {"role": "user", "content": f"question {step} from {env}"},
                            {"role": "assistant", "content": f"answer {i}"},
                        ]
                        for i in range(GROUP)
                    ],
                }
            )
        trained.append({"step": step, "group_ids": ids})
        mean = (2 * rising + 2) / (3 * GROUP)
        metrics.append(
            {
                "step": step,
                "score_mean": mean,
                "loss": 0.1 / step,
                "kl": 0.001 * step,
                "grad_norm": 1.0,
                "clip_fraction": 0.05,
                "completions/mean_length": 20.0 + step,
            }
        )
    write_lines(run_dir / "checkpoints" / "metrics.jsonl", metrics)
    write_lines(run_dir / "checkpoints" / "trained_groups.jsonl", trained)
    for env, groups in rollouts.items():
        write_lines(run_dir / "rollouts" / f"{env}.jsonl", groups)
    write_lines(
        run_dir / "evals" / "learns-1" / "history.jsonl",
        [
            {"step": s, "task": "learns_eval", "metrics": {"eval/accuracy": s / STEPS}}
            for s in (10, 20)
        ],
    )
    return plan


def write_lines(path: Path, records: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def launched_run(
    run_dir: Path, data: dict[str, Any] | None = None, training_steps: int = STEPS
) -> Plan:
    """`made_up_run` with what the launcher and the trainer leave besides: config.yaml,
    launch.json and commands.json as the launcher writes them before anything starts,
    and a checkpoint in Hugging Face format every 10 steps with the trainer's
    `checkpoint_saved` event. `training_steps`: what the trainer was asked for (more
    than STEPS: a run stopped before its end)."""
    data = data or made_up_config()
    plan = made_up_run(run_dir, data)
    plan.training_steps = training_steps
    config_file = run_dir / "config.yaml"
    config_file.write_text(yaml.safe_dump(data, sort_keys=False))
    write_record(run_dir, LaunchRecord(config=str(config_file)))
    plan.trainer.command = [
        "python", "-m", "example_trainer.grpo", "--model-name", plan.model,
        "--save-path", str(plan.checkpoints), "--training-steps", str(training_steps),
    ]  # fmt: skip
    commands = {process.name: process.command for process in plan.processes}
    (run_dir / "commands.json").write_text(json.dumps(commands, indent=2))
    records = RunRecords(plan.checkpoints)
    for step in range(10, STEPS + 1, 10):
        checkpoint = plan.checkpoints / f"step-{step}"
        checkpoint.mkdir()
        (checkpoint / "config.json").write_text(json.dumps({"model_type": "llama"}))
        records.event(EventKind.CHECKPOINT_SAVED, step, path=str(checkpoint))
    return plan
