"""The report's figure: one panel per thing a reader checks, drawn only when logged.

Panels, in order: the mean score per step (with each environment's when the run
mixes several), the loss, then whichever of KL, clip fraction, gradient norm,
entropy, completion length and the share of groups with no score spread the trainer
logged, then each environment's
evaluations against the trainer's step. Two columns; matplotlib's Agg backend, so
no display is needed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from atroposlib.launch.report_data import numeric_metrics
from atroposlib.trainer_contract import MetricsRow

OPTIONAL_PANELS = (
    ("kl", "KL to the reference"),
    ("clip_fraction", "clip fraction"),
    ("grad_norm", "gradient norm"),
    ("entropy", "entropy"),
    ("completions/mean_length", "completion length (tokens)"),
    ("frac_reward_zero_std", "share of groups with no score spread"),
)
"""Metrics rows' keys drawn when present: (key, axis label)."""
MAX_EVAL_LINES = 6


def rolling_mean(values: list[float], window: int) -> list[float]:
    return [
        sum(values[max(0, i - window + 1) : i + 1]) / len(values[max(0, i - window + 1) : i + 1])
        for i in range(len(values))
    ]


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend: figures drawn to files, no display."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot(
    rows: list[MetricsRow],
    out: Path,
    env_scores: dict[str, dict[int, float]] | None = None,
    evals: dict[str, list[dict[str, Any]]] | None = None,
    resumed_at: list[int] | None = None,
) -> Path:
    """The report's figure; a dashed line where the run was resumed, on every panel."""
    plt = pyplot()
    env_scores, evals = env_scores or {}, evals or {}
    extras = [row.model_extra or {} for row in rows]
    # a figure logged as zero throughout (KL without a reference) is not drawn
    optional = [(k, label) for k, label in OPTIONAL_PANELS if any(e.get(k) for e in extras)]
    count = 2 + len(optional) + (1 if evals else 0)
    columns = 2
    lines = (count + columns - 1) // columns
    fig, axes = plt.subplots(lines, columns, figsize=(11, 3.2 * lines), squeeze=False)
    panels = iter(axes.flat)
    steps = [r.step for r in rows]

    score = next(panels)
    scores = [r.score_mean for r in rows]
    window = max(1, min(10, len(scores) // 4))
    score.plot(steps, scores, ".", alpha=0.3, color="black", label="all environments")
    score.plot(steps, rolling_mean(scores, window), "-", color="black", linewidth=2)
    if len(env_scores) > 1:
        for label, by_step in env_scores.items():
            values = list(by_step.values())
            score.plot(list(by_step), rolling_mean(values, window), "-", label=label)
    score.set_title(f"mean score per step (rolling mean of {window})")
    score.legend(loc="best", fontsize="small")

    loss = next(panels)
    loss.plot(steps, [r.loss for r in rows], "-", color="tab:red")
    loss.set_title("loss")

    for key, label in optional:
        panel = next(panels)
        shown = [(r.step, e[key]) for r, e in zip(rows, extras, strict=True) if key in e]
        panel.plot([s for s, _ in shown], [v for _, v in shown], "-", color="tab:gray")
        panel.set_title(label)

    if evals:
        panel = next(panels)
        for env, records in evals.items():
            names = sorted({n for r in records for n in numeric_metrics(r)})[:MAX_EVAL_LINES]
            for name in names:
                points = [(r["step"], numeric_metrics(r).get(name)) for r in records]
                points = [(s, v) for s, v in points if v is not None]
                label = f"{env}: {name}"
                panel.plot([s for s, _ in points], [v for _, v in points], "o-", label=label)
        panel.set_title("evaluations")
        panel.legend(loc="best", fontsize="small")
        shown_values = [v for line in panel.get_lines() for v in line.get_ydata()]
        if shown_values and all(0 <= v <= 1 for v in shown_values):  # accuracies, shares
            panel.set_ylim(-0.02, 1.02)

    for panel in axes.flat:
        if panel.has_data():
            panel.grid(alpha=0.3)
            panel.set_xlabel("trainer step")
            for step in resumed_at or []:
                panel.axvline(step, color="tab:blue", linestyle="--", linewidth=1)
        else:
            panel.set_visible(False)
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out
