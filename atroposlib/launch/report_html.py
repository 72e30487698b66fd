"""The report page's tables: the run at a glance, then each environment.

Design: a reader wants the answer first (did it learn, was anything lost, how to go
on), in words with their units, not summary.json's keys; summary.json keeps every
number for scripts. Everything shown is escaped: labels, verdicts and metric names
come from the run's files.
"""

from __future__ import annotations

import html
import json
from typing import Any

STYLES: dict[bool | None, str] = {True: "ok", False: "bad"}
PAGE_STYLE = """body{font-family:sans-serif;max-width:1000px;margin:auto}
pre{white-space:pre-wrap;margin:0} td,th{border:1px solid #ccc;padding:4px;
vertical-align:top} table{border-collapse:collapse;width:100%}
.verdict{padding:8px;font-weight:bold} .ok{background:#dfd} .bad{background:#fdd}
.unsure{background:#ffd} table.summary th{text-align:left;width:30%}
tr.resume td,tr.code td{font-family:monospace} tr.code td{white-space:pre-wrap}
img.picture{max-width:224px;margin:4px;border:1px solid #ccc}"""
"""The CSS of the run report and of the comparison page (compare.py), one look for both."""


def _number(value: Any) -> str:
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def _rows(pairs: list[tuple[str, str, str]]) -> str:
    return "".join(
        f'<tr class="{css}"><th>{html.escape(label)}</th><td>{html.escape(text)}</td></tr>'
        for label, text, css in pairs
    )


def summary_table(numbers: dict[str, Any]) -> str:
    """The run at a glance: verdict, steps, scores, groups, restarts, how to go on."""
    style = STYLES.get(numbers.get("learned"), "unsure")
    pairs = [("Verdict", numbers.get("verdict", "no steps were trained"), f"verdict {style}")]
    forked = numbers.get("forked_from")
    if forked:  # its steps go on from the parent's
        where = f"{forked['run_dir']} at step {forked['step']}"
        pairs.append(("Forked from", where, "resume"))
    if numbers.get("steps"):
        pairs.append(("Steps trained", str(numbers["steps"]), ""))
        pairs.append(
            (
                "Mean score, first 10 steps -> last 10",
                f"{numbers['first_10_mean_score']:.3f} -> {numbers['last_10_mean_score']:.3f}",
                "",
            )
        )
    if numbers.get("groups_line"):
        pairs.append(("Groups", numbers["groups_line"], ""))
    if numbers.get("scored"):
        scored = numbers["scored"]
        pairs.append(("Every scored group, kept or dropped", scored["verdict"], ""))
    if numbers.get("dropped_line"):
        pairs.append(("Groups the environments dropped", numbers["dropped_line"], ""))
    if numbers.get("resumed_at"):
        steps = ", ".join(str(step) for step in numbers["resumed_at"])
        pairs.append(("Resumed (dashed lines in the figure)", f"at step {steps}", ""))
    restarts = {name: n for name, n in numbers.get("restarts", {}).items() if n}
    crashes = ", ".join(f"{name} {n}" for name, n in restarts.items()) or "none"
    pairs.append(("Restarts after crashes", crashes, ""))
    for key, label in (
        ("engine_restarts", "Engine restarts"),
        ("checkpoints_saved", "Checkpoints saved"),
        ("staleness_max", "Largest staleness trained (steps)"),
        ("stale_sequences_dropped", "Sequences dropped as too stale"),
    ):
        if key in numbers:
            pairs.append((label, _number(numbers[key]), ""))
    if numbers.get("resume_command"):
        pairs.append(("Continue this run", numbers["resume_command"], "resume"))
    if numbers.get("final_model"):
        pairs.append(("Final model (Hugging Face format)", numbers["final_model"], "resume"))
        pairs.append(("Load it", "\n".join(loading_lines(numbers["final_model"])), "code"))
    return f'<table class="summary">{_rows(pairs)}</table>'


def loading_lines(checkpoint: str) -> list[str]:
    """Two lines of Python that load the run's final model: what a reader does next."""
    path = json.dumps(checkpoint, ensure_ascii=False)  # a Python string literal
    return [
        "from transformers import AutoModelForCausalLM",
        f"model = AutoModelForCausalLM.from_pretrained({path})",
    ]


def environments_table(environments: dict[str, dict[str, Any]]) -> str:
    """One row per environment: its own score rise and verdict, and its first and last
    evaluations."""
    if not environments:
        return ""
    head = (
        "<tr><th>environment</th><th>steps with its groups</th>"
        "<th>mean score, first 10 -> last 10</th><th>verdict</th>"
        "<th>evaluations, first and last</th></tr>"
    )
    body = []
    for label, entry in environments.items():
        style = STYLES.get(entry.get("learned"), "unsure")
        rise = (
            f"{entry['first_10_mean_score']:.3f} -> {entry['last_10_mean_score']:.3f}"
            if "first_10_mean_score" in entry
            else "-"
        )
        shown = "; ".join(
            f"step {record['step']}: "
            + ", ".join(f"{k} {_number(v)}" for k, v in record.items() if k != "step")
            for record in (entry.get("first_evaluation"), entry.get("last_evaluation"))
            if record
        )
        verdict = "evaluated only" if entry.get("evaluate_only") else entry.get("verdict", "-")
        cells = [label, str(entry.get("steps", 0)), rise, verdict, shown or "none"]
        body.append(
            f'<tr class="env {style}">'
            + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells)
            + "</tr>"
        )
    return f'<h2>Each environment</h2><table class="environments">{head}{"".join(body)}</table>'


def facts_list(values: dict[str, Any]) -> str:
    """Nested facts (seed, machine, tiny model) as nested lists."""

    def item(key: str, value: Any) -> str:
        if isinstance(value, dict):
            return f"<li>{html.escape(key)}{facts_list(value)}</li>"
        return f"<li>{html.escape(key)}: {html.escape(_number(value))}</li>"

    return f"<ul>{''.join(item(k, v) for k, v in values.items())}</ul>"
