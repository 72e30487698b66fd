"""Evaluation results as a lighteval-style markdown table on stdout.

The columns are lighteval's (Groups, Version, Filter, n-shot, Metric, Value,
Stderr) so a run's log reads like the reports people already compare against;
Atropos computes no standard error, so that column is always 0.
"""

from __future__ import annotations

from typing import Any

__all__ = ["display_metrics_table"]


def _metric_label(name: str) -> str:
    return name.replace("eval/", "").replace("_", " ")


def _value(value: Any) -> str:
    """Four decimals for numbers; anything else (a note, None) as written."""
    try:
        return f"{value:.4f}"
    except (TypeError, ValueError):
        return str(value)


def _direction(name: str) -> str:
    """An up arrow for metrics where higher is better (accuracy, correctness)."""
    return "↑" if "correct" in name or "acc" in name else ""


def display_metrics_table(
    task_name: str, metrics: dict[str, Any], start_time: float, end_time: float
) -> None:
    """Print `metrics` of `task_name` as a markdown table, then the time taken."""
    print(f"\nEvaluation Results: {task_name}")
    task = str(task_name)
    labels = [_metric_label(name) for name in metrics]
    values = [_value(value) for value in metrics.values()]
    widths = {
        "groups": max(len(task), len("Groups")),
        "version": len("Version"),
        "filter": len("Filter"),
        "nshot": len("n-shot"),
        "metric": max([len("Metric"), *map(len, labels)]),
        "dir": 3,
        "value": max([len("Value"), *map(len, values)]),
        "pm": 3,
        "stderr": len("Stderr"),
    }
    w = widths
    print(
        f"|{'Groups':<{w['groups']}}|{'Version':<{w['version']}}|{'Filter':<{w['filter']}}"
        f"|{'n-shot':<{w['nshot']}}|{'Metric':<{w['metric']}}|{'':^{w['dir']}}"
        f"|{'Value':>{w['value']}}|{'':^{w['pm']}}|{'Stderr':>{w['stderr']}}|"
    )
    print(
        "|"
        + "|".join(
            "-" * w[key] for key in ("groups", "version", "filter", "nshot", "metric", "dir")
        )
        + f"|{'-' * (w['value'] - 1)}:|{'-' * w['pm']}|{'-' * (w['stderr'] - 1)}:|"
    )
    for name, label, value in zip(metrics, labels, values, strict=True):
        print(
            f"|{task:<{w['groups']}}|{1:<{w['version']}}|{'none':<{w['filter']}}"
            f"|{'':<{w['nshot']}}|{label:<{w['metric']}}|{_direction(name):^{w['dir']}}"
            f"|{value:>{w['value']}}|{'±':^{w['pm']}}|{'0.0000':>{w['stderr']}}|"
        )
    print(f"Evaluation completed in {end_time - start_time:.2f} seconds")
