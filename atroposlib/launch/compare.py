"""Several runs on one page: their curves on shared axes, their numbers side by side,
and the config keys in which they differ (`atropos-report RUN_A RUN_B --out FILE`).

Design: a comparison answers "what did this change do", so the page draws every run on
one axis per metric (the mean score and the loss per trainer step, then one axis per
evaluation metric) and lists only the config keys whose values differ, flattened as
`--set` names them (`trainer.args.lr`, `environments.0.env.group_size`). Each run is
read as `atropos-report RUN_DIR` reads it (rebuild.py), so a stopped or copied run
compares like a finished one. Like report.html the page is one file, its figure
embedded, so it can be mailed.
"""

from __future__ import annotations

import base64
import html
import io
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from atroposlib.launch.rebuild import RunOnDisk, read_back, rebuilt_numbers
from atroposlib.launch.report import environment_line
from atroposlib.launch.report_data import numeric_metrics, read_run
from atroposlib.launch.report_html import PAGE_STYLE, STYLES
from atroposlib.launch.report_plots import MAX_EVAL_LINES, pyplot, rolling_mean
from atroposlib.trainer_contract import MetricsRow, read_metrics

NOT_SET = "(not set)"


@dataclass
class ComparedRun:
    """One run as the page shows it."""

    label: str
    run: RunOnDisk
    rows: list[MetricsRow]
    evals: dict[str, list[dict[str, Any]]]
    numbers: dict[str, Any]
    config: dict[str, Any]
    """Its config.yaml, flattened (`flatten`)."""


def read_runs(run_dirs: Sequence[Path]) -> list[ComparedRun]:
    """Each run, labelled by its directory's name (by its path where two names clash);
    rebuild.NotARun names the first directory that holds no run."""
    runs = [read_back(run_dir) for run_dir in run_dirs]
    names = [run.name for run in runs]
    unique = len(set(names)) == len(names)
    compared = []
    for run in runs:
        reading = read_run(run.plan)
        data = yaml.safe_load(run.config_text)
        compared.append(
            ComparedRun(
                label=run.name if unique else str(run.plan.run_dir),
                run=run,
                rows=read_metrics(run.plan.metrics_path),
                evals=reading.evals,
                numbers=rebuilt_numbers(run, reading),
                config=flatten(data) if isinstance(data, dict) else {},
            )
        )
    return compared


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """{'trainer': {'args': {'lr': 1e-5}}} -> {'trainer.args.lr': 1e-5}; a list's items
    by index, as `--set` names them; an empty mapping or list is a value."""
    if isinstance(value, dict) and value:
        items = [(str(key), inner) for key, inner in value.items()]
    elif isinstance(value, list) and value:
        items = [(str(at), inner) for at, inner in enumerate(value)]
    else:
        return {prefix: value} if prefix else {}
    flat: dict[str, Any] = {}
    for key, inner in items:
        flat.update(flatten(inner, f"{prefix}.{key}" if prefix else key))
    return flat


def differing_keys(configs: Sequence[dict[str, Any]]) -> list[str]:
    """The flattened keys whose values are not the same in every config (a key missing
    from one differs), in the order they first appear. `1` and `true` differ."""
    keys = list(dict.fromkeys(key for config in configs for key in config))
    marker = object()

    def typed(config: dict[str, Any], key: str) -> tuple[type, Any]:
        value = config.get(key, marker)
        return type(value), value

    return [
        key for key in keys if len({json.dumps(typed(c, key), default=str) for c in configs}) > 1
    ]


def write_comparison(run_dirs: Sequence[Path], out: Path) -> Path:
    """The comparison page of `run_dirs` at `out`; its path."""
    runs = read_runs(run_dirs)
    encoded = base64.b64encode(comparison_png(runs)).decode()
    alt = "score, loss and evaluations of every run"
    image = f'<img alt="{alt}" src="data:image/png;base64,{encoded}">'
    title = f"{len(runs)} runs compared"
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>atropos: {html.escape(title)}</title>
<style>{PAGE_STYLE}</style></head><body>
<h1>{html.escape(title)}</h1>
{numbers_table(runs)}
{image}
<h2>Config keys that differ</h2>
{config_table(runs)}
</body></html>
"""
    out.write_text(page, encoding="utf-8")
    return out


def numbers_table(runs: Sequence[ComparedRun]) -> str:
    """One row per run: its score rise and verdict, its evaluations, its groups, its
    restarts and its final model."""
    head = (
        "<tr><th>run</th><th>score, first 10 -&gt; last 10</th><th>last evaluation</th>"
        "<th>groups lost / trained twice</th><th>restarts after crashes</th>"
        "<th>final model</th></tr>"
    )
    body = []
    for compared in runs:
        numbers = compared.numbers
        groups = numbers.get("groups", {})
        lost = "unknown" if groups.get("lost") is None else groups["lost"]
        cells = [
            environment_line(numbers) if numbers.get("steps") else "no steps trained",
            _evaluations(numbers.get("environments", {})),
            f"{lost} / {groups.get('duplicated', 0)}" if groups else "not counted",
            str(sum(numbers.get("restarts", {}).values())),
            numbers.get("final_model", "none"),
        ]
        style = STYLES.get(numbers.get("learned"), "unsure")
        body.append(
            f'<tr class="run {style}"><td>{_run_cell(compared)}</td>'
            + "".join(f"<td>{html.escape(str(cell))}</td>" for cell in cells)
            + "</tr>"
        )
    return f'<table class="runs">{head}{"".join(body)}</table>'


def config_table(runs: Sequence[ComparedRun]) -> str:
    """The config keys that differ, one row each, one column per run."""
    configs = [compared.config for compared in runs]
    keys = differing_keys(configs)
    if not keys:
        return "<p>Their configs are the same.</p>"
    head = "<tr><th>key</th>" + "".join(f"<th>{html.escape(r.label)}</th>" for r in runs) + "</tr>"
    rows = [
        f"<tr><td><code>{html.escape(key)}</code></td>"
        + "".join(f"<td>{html.escape(_shown(config.get(key, NOT_SET)))}</td>" for config in configs)
        + "</tr>"
        for key in keys
    ]
    return f'<table class="config">{head}{"".join(rows)}</table>'


def comparison_png(runs: Sequence[ComparedRun]) -> bytes:
    """`comparison_figure` as PNG bytes, for the page to embed."""
    plt = pyplot()
    fig = comparison_figure(runs)
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=90)
    plt.close(fig)
    return png.getvalue()


def comparison_figure(runs: Sequence[ComparedRun]) -> Any:
    """One axis per metric (the mean score, the loss, each evaluation metric), every run
    on it in its own colour, labelled with its name."""
    plt = pyplot()
    metrics = sorted(
        {
            name
            for compared in runs
            for records in compared.evals.values()
            for record in records
            for name in numeric_metrics(record)
        }
    )[:MAX_EVAL_LINES]
    columns = 2
    lines = (2 + len(metrics) + columns - 1) // columns
    fig, axes = plt.subplots(lines, columns, figsize=(11, 3.2 * lines), squeeze=False)
    panels = iter(axes.flat)
    score, loss = next(panels), next(panels)
    for at, compared in enumerate(runs):
        color, steps = f"C{at % 10}", [row.step for row in compared.rows]
        scores = [row.score_mean for row in compared.rows]
        window = max(1, min(10, len(scores) // 4))
        score.plot(steps, scores, ".", alpha=0.25, color=color)
        score.plot(steps, rolling_mean(scores, window), "-", color=color, label=compared.label)
        loss.plot(
            steps, [row.loss for row in compared.rows], "-", color=color, label=compared.label
        )
    score.set_title("mean score per step (dots; line: rolling mean of up to 10)")
    loss.set_title("loss")
    for name in metrics:
        panel = next(panels)
        for at, compared in enumerate(runs):
            for env, records in compared.evals.items():
                points = [(r["step"], numeric_metrics(r).get(name)) for r in records]
                shown = [(step, value) for step, value in points if value is not None]
                label = compared.label if len(compared.evals) == 1 else f"{compared.label}: {env}"
                if shown:
                    xs, ys = zip(*shown, strict=True)
                    panel.plot(xs, ys, "o-", color=f"C{at % 10}", label=label)
        panel.set_title(f"evaluation: {name}")
    for panel in axes.flat:
        if panel.has_data():
            panel.grid(alpha=0.3)
            panel.set_xlabel("trainer step")
            panel.legend(loc="best", fontsize="small")
        else:
            panel.set_visible(False)
    fig.tight_layout()
    return fig


def _run_cell(compared: ComparedRun) -> str:
    """The run's label, linked to its own report when it has one."""
    label = html.escape(compared.label)
    report = compared.run.plan.run_dir / "report.html"
    return f'<a href="{html.escape(report.as_uri())}">{label}</a>' if report.is_file() else label


def _evaluations(environments: dict[str, dict[str, Any]]) -> str:
    """Each environment's last evaluation: `env @ step N: accuracy 0.750`."""
    parts = []
    for label, entry in environments.items():
        latest = entry.get("last_evaluation")
        if latest:
            values = ", ".join(f"{k} {v:.3f}" for k, v in latest.items() if k != "step")
            parts.append(f"{label} @ step {latest['step']}: {values}")
    return "; ".join(parts) or "none"


def _shown(value: Any) -> str:
    """A config value exactly as YAML would read it back: text as is, the rest as JSON."""
    return value if isinstance(value, str) else json.dumps(value, default=str)
