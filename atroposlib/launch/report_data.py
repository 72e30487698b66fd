"""What the run report reads besides the trainer's metrics: each environment's score
per trained step, and each environment's evaluations.

Design: a mixed run's trainer sees one batch per step and logs one mean score, which
blends its environments (a task that learns and one that cannot read as one flat-ish
curve). The report splits it without asking the trainer for anything beyond the
contract: every group an environment sends is in `rollouts/<env>.jsonl` with its id
and scores, and `trained_groups.jsonl` says which ids each step trained (the last
record of a step counting), so each environment's mean score per step is the mean of
its sequences in that step. Copies of one environment count as one (their YAML
section's label). Evaluations are each environment's `history.jsonl`, one line per
evaluation with the trainer's step (atroposlib/envs/eval.py).
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from atroposlib.envs.eval import EVAL_HISTORY
from atroposlib.launch.plan import EVALS_DIR, SCORES_DIR, Plan
from atroposlib.protocol import GROUP_ID_FIELD
from atroposlib.trainer_contract import (
    EventKind,
    TrainerEvent,
    groups_path,
    read_trained_groups,
)

HF_CONFIG = "config.json"
"""What makes a checkpoint directory one `from_pretrained` loads (Hugging Face format)."""


def environment_labels(plan: Plan) -> dict[str, str]:
    """Each environment process's name -> its YAML section's label (copies share it)."""
    sections = plan.config.environments
    return {
        p.name: p.name if p.section is None else sections[p.section].label
        for p in plan.environments
    }


def _group_scores(rollouts_dir: Path, labels: dict[str, str]) -> dict[str, tuple[str, float, int]]:
    """group id -> (environment label, sum of its scores, how many)."""
    groups: dict[str, tuple[str, float, int]] = {}
    for path in sorted(rollouts_dir.glob("*.jsonl")):
        label = labels.get(path.stem, path.stem)
        with open(path, encoding="utf-8", errors="replace") as lines:
            for line in lines:
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a line cut by a crash
                group_id, scores = record.get(GROUP_ID_FIELD), record.get("scores")
                if isinstance(group_id, str) and isinstance(scores, list) and scores:
                    try:
                        groups[group_id] = (label, float(sum(scores)), len(scores))
                    except TypeError:
                        continue
    return groups


@dataclass
class ScoredGroups:
    """Every group one environment scored, kept or dropped (`scores/<env>.jsonl`): what
    the run is judged on, since the trainer sees only the groups the env kept."""

    sums: dict[int, list[float]] = field(default_factory=lambda: defaultdict(lambda: [0.0, 0.0]))
    """Trainer step -> [sum of the scores, how many] of the groups scored at it."""
    groups: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    """Why groups were dropped (`sending.DROP_REASONS`) -> how many."""


@dataclass
class RunReading:
    """What the report reads from a run's files once, for both its numbers and its figure."""

    env_scores: dict[str, dict[int, float]] = field(default_factory=dict)
    evals: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    scored: dict[str, ScoredGroups] = field(default_factory=dict)
    problem: str | None = None
    """Why they could not be read (an OSError's message), or None."""


def read_run(plan: Plan) -> RunReading:
    """Each environment's scores per step, its evaluations and every group it scored,
    read once."""
    try:
        labels = environment_labels(plan)
        return RunReading(
            run_environment_scores(plan),
            run_evaluations(plan),
            scored_groups(plan.run_dir / SCORES_DIR, labels),
        )
    except OSError as exc:
        return RunReading(problem=str(exc))


def scored_groups(scores_dir: Path, labels: dict[str, str]) -> dict[str, ScoredGroups]:
    """Each environment's scored groups (copies under their section's label)."""
    found: dict[str, ScoredGroups] = defaultdict(ScoredGroups)
    for path in sorted(scores_dir.glob("*.jsonl")):
        entry = found[labels.get(path.stem, path.stem)]
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                record = json.loads(line)
                step, scores = int(record["step"]), [float(x) for x in record["scores"]]
            except (ValueError, TypeError, KeyError):
                continue  # a line cut by a crash
            if not scores:
                continue
            entry.groups += 1
            entry.sums[step][0] += sum(scores)
            entry.sums[step][1] += len(scores)
            if record.get("dropped"):
                reason = str(record["dropped"])
                entry.dropped[reason] = entry.dropped.get(reason, 0) + 1
    return dict(sorted(found.items()))


def run_environment_scores(plan: Plan) -> dict[str, dict[int, float]]:
    """`environment_scores` of a launched run."""
    return environment_scores(
        plan.rollouts_dir, groups_path(plan.checkpoints), environment_labels(plan)
    )


def environment_scores(
    rollouts_dir: Path, trained_groups: Path, labels: dict[str, str]
) -> dict[str, dict[int, float]]:
    """Each environment's mean score per trained step (steps where it had groups)."""
    groups = _group_scores(rollouts_dir, labels)
    by_env: dict[str, dict[int, float]] = defaultdict(dict)
    for record in read_trained_groups(trained_groups):
        sums: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
        for group_id in record.group_ids:
            if group_id in groups:
                env, total, count = groups[group_id]
                sums[env][0] += total
                sums[env][1] += count
        for label, (score_sum, sequences) in sums.items():
            by_env[label][record.step] = score_sum / sequences
    return {label: dict(sorted(steps.items())) for label, steps in sorted(by_env.items())}


def run_evaluations(plan: Plan) -> dict[str, list[dict[str, Any]]]:
    """`evaluations` of a launched run, under its sections' labels."""
    return evaluations(plan.run_dir / EVALS_DIR, environment_labels(plan))


def evaluations(
    evals_dir: Path, labels: dict[str, str] | None = None
) -> dict[str, list[dict[str, Any]]]:
    """Each environment's evaluations by step: {step, task, metrics}. `labels` maps a
    process's folder to its environment (copies of one evaluate alike, and merge)."""
    found: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for path in sorted(evals_dir.glob(f"*/{EVAL_HISTORY}")):
        records = []
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(record, dict) and isinstance(record.get("metrics"), dict):
                records.append(record)
        label = (labels or {}).get(path.parent.name, path.parent.name)
        found[label].extend(records)
    return {label: sorted(records, key=lambda r: r["step"]) for label, records in found.items()}


def numeric_metrics(record: dict[str, Any]) -> dict[str, float]:
    """An evaluation's numbers (names without their `eval/` prefix), for plots and tables."""
    return {
        name.removeprefix("eval/"): float(value)
        for name, value in record["metrics"].items()
        if isinstance(value, int | float) and not isinstance(value, bool)
    }


def final_checkpoint(checkpoints: Path, events: list[TrainerEvent]) -> Path | None:
    """The newest saved checkpoint still on disk in Hugging Face format: the model the run
    leaves. Its path comes from the trainer's `checkpoint_saved` events (the contract),
    tried as recorded, then by its name under `checkpoints` (a run directory moved since).
    None for a trainer whose checkpoints `from_pretrained` cannot load."""
    for event in reversed(events):
        recorded = event.detail.get("path")
        if event.kind is not EventKind.CHECKPOINT_SAVED or not isinstance(recorded, str):
            continue
        for candidate in (Path(recorded), checkpoints / Path(recorded).name):
            if (candidate / HF_CONFIG).is_file():
                return candidate
    return None
