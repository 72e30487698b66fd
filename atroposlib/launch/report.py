"""The run report: metrics jsonl, a PNG of score and loss per step, one HTML page.

The HTML is self-contained (the plot is embedded) so it can be mailed or
opened from any machine; it shows the summary numbers, the plot, the config
and sample rollouts from the start and the end of training, which is where a
reader sees what the model learned.
"""

from __future__ import annotations

import base64
import html
import json
import math
import shlex
import shutil
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from atroposlib.envs.sending import DROP_REASONS
from atroposlib.launch.console import shown_path
from atroposlib.launch.ledger import account
from atroposlib.launch.plan import Plan
from atroposlib.launch.report_data import (
    RunReading,
    ScoredGroups,
    final_checkpoint,
    numeric_metrics,
    read_run,
)
from atroposlib.launch.report_html import (
    PAGE_STYLE,
    environments_table,
    facts_list,
    summary_table,
)
from atroposlib.launch.report_plots import plot
from atroposlib.launch.resume import read_parent, read_resumes, resume_command
from atroposlib.trainer_contract import (
    EventKind,
    MetricsRow,
    TrainerEvent,
    groups_path,
    read_events,
    read_metrics,
)
from atroposlib.utils.machine import machine_facts
from atroposlib.utils.tiny_model import read_build_record
from atroposlib.viewer.jsonl2html import CSS as ROLLOUT_CSS
from atroposlib.viewer.jsonl2html import create_html_for_group
from atroposlib.viewer.render import group_images

JUDGED = {True: "rose", False: "did not rise", None: "too few steps to judge"}
SAMPLES_PER_END = 3
WINDOW = 10  # steps at each end whose mean scores are compared
REPORT_TOOL = "atropos-report"
"""The console script that rebuilds a run's report from its directory (cli/report.py)."""


def report_command(run_dir: Path) -> str:
    """The command that writes `run_dir`'s report again, from its files alone."""
    return f"{REPORT_TOOL} {shlex.quote(str(run_dir))}"


def sample_groups(rollouts_dir: Path) -> tuple[list[dict], list[dict]]:
    """The first and the last groups each environment sent (its file is in send order)."""
    first, last = [], []
    for path in sorted(rollouts_dir.glob("*.jsonl")):
        groups = []
        for line in path.read_text().splitlines():
            try:
                groups.append({**json.loads(line), "_env": path.stem})
            except json.JSONDecodeError:
                continue
        first += groups[:SAMPLES_PER_END]
        last += groups[-SAMPLES_PER_END:] if len(groups) > SAMPLES_PER_END else []
    return first, last


def _groups_html(groups: list[dict]) -> str:
    """Each group as the rollout viewer draws it (atroposlib/viewer/jsonl2html.py),
    under its environment's name; a group sent without messages shows its scores."""
    if not groups:
        return "<p>(no rollouts recorded)</p>"
    parts = []
    for index, group in enumerate(groups):
        drawn = create_html_for_group(group, index)
        if not drawn:
            scores = ", ".join(f"{score:g}" for score in group.get("scores", []))
            drawn = f"<p>scores {html.escape(scores)} (no text recorded)</p>"
        parts.append(f"<h4>{html.escape(group['_env'])}</h4>{pictures_html(group)}{drawn}")
    return "\n".join(parts)


def pictures_html(group: dict) -> str:
    """The pictures a group's prompts showed (a multimodal environment's `images`), each
    once, above the answers to them."""
    uris = group_images(group)[0]
    tags = "".join(
        f'<img class="picture" src="{uri}" alt="picture {i}">' for i, uri in enumerate(uris)
    )
    return f"<div>{tags}</div>" if tags else ""


def window_means(scores: list[float]) -> tuple[float, float]:
    """Mean score over the first and over the last `WINDOW` steps."""
    return statistics.fmean(scores[:WINDOW]), statistics.fmean(scores[-WINDOW:])


def learning_verdict(scores: list[float]) -> tuple[bool | None, str]:
    """Did the mean score rise? Judged against the noise of the scores themselves.

    The rise of the last 10 steps' mean over the first 10's must exceed twice its
    standard error (the spread of the per-step scores), so a flat run whose
    numbers wobble is called flat. None when the run is too short to judge.
    """
    head, tail = scores[:WINDOW], scores[-WINDOW:]
    first, last = window_means(scores)
    means = (
        f"mean score {first:.3f} over the first {len(head)} steps, "
        f"{last:.3f} over the last {len(tail)}"
    )
    if len(scores) < 2 * WINDOW:
        return None, f"too few steps to judge learning ({len(scores)} < {2 * WINDOW}): {means}"
    error = math.sqrt(statistics.variance(head) / len(head) + statistics.variance(tail) / len(tail))
    rise = last - first
    if rise > 2 * error and rise > 0:
        return (
            True,
            f"the score rose by {rise:.3f} ({means}; twice its standard error is {2 * error:.3f})",
        )
    return False, (
        f"THE SCORE DID NOT RISE: {means} (change {rise:+.3f}; a rise must exceed twice its "
        f"standard error, {2 * error:.3f}); the policy did not learn in this run"
    )


def summary(rows: list[MetricsRow]) -> dict[str, Any]:
    scores = [r.score_mean for r in rows]
    if not scores:
        return {"steps": 0}
    first, last = window_means(scores)
    learned, verdict = learning_verdict(scores)
    return {
        "steps": len(scores),
        "first_10_mean_score": first,
        "last_10_mean_score": last,
        "learned": learned,
        "verdict": verdict,
        **off_policy_numbers(rows),
    }


def scored_summary(scored: dict[str, ScoredGroups]) -> dict[str, Any]:
    """A second verdict, over every group the environments scored, kept or dropped (the
    trainer's covers only the groups they kept), by the trainer step each was scored at;
    and how many were dropped, why."""
    sums: dict[int, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for entry in scored.values():
        for step, (total, n) in entry.sums.items():
            sums[step][0] += total
            sums[step][1] += n
    scores = [total / n for _, (total, n) in sorted(sums.items()) if n]
    if not scores:
        return {}
    first, last = window_means(scores)
    learned, verdict = learning_verdict(scores)
    groups = sum(entry.groups for entry in scored.values())
    dropped: dict[str, int] = defaultdict(int)
    for entry in scored.values():
        for reason, n in entry.dropped.items():
            dropped[reason] += n
    numbers: dict[str, Any] = {
        "scored": {
            "groups": groups,
            "dropped": dict(dropped),
            "steps": len(scores),
            "first_10_mean_score": first,
            "last_10_mean_score": last,
            "learned": learned,
            "verdict": verdict,
        },
        "scored_line": (
            f"every scored group, kept or dropped: {first:.3f} -> {last:.3f} over "
            f"{len(scores)} steps: {JUDGED[learned]}"
        ),
    }
    if dropped:
        why = "; ".join(f"{n} because {DROP_REASONS.get(r, r)}" for r, n in dropped.items())
        numbers["dropped_line"] = (
            f"{sum(dropped.values())} of {groups} scored groups dropped: {why}"
        )
    return numbers


def off_policy_numbers(rows: list[MetricsRow]) -> dict[str, Any]:
    """How stale the trained samples were, and how many a --max-staleness bound dropped
    (absent when the trainer reported neither)."""
    numbers: dict[str, Any] = {}
    extras = [row.model_extra or {} for row in rows]
    lags = [extra["staleness_max"] for extra in extras if "staleness_max" in extra]
    if lags:
        numbers["staleness_max"] = int(max(lags))
    dropped = [
        extra["stale_sequences_dropped"] for extra in extras if "stale_sequences_dropped" in extra
    ]
    if dropped:
        numbers["stale_sequences_dropped"] = int(sum(dropped))
    return numbers


def event_counts(events: list[TrainerEvent]) -> dict[str, int]:
    """What the trainer reported doing besides training: engine restarts and checkpoints."""
    return {
        "engine_restarts": sum(e.kind is EventKind.ENGINE_RESTARTED for e in events),
        "checkpoints_saved": sum(e.kind is EventKind.CHECKPOINT_SAVED for e in events),
    }


def environment_numbers(
    env_scores: dict[str, dict[int, float]],
    evals: dict[str, list[dict[str, Any]]],
    evaluate_only: set[str] | frozenset[str] = frozenset(),
) -> dict[str, dict[str, Any]]:
    """Each environment's own verdict over the steps it had groups in, and its first and
    last evaluations' numbers. `evaluate_only`: the labels of the environments that only
    evaluated (listed even before they did)."""
    numbers: dict[str, dict[str, Any]] = {}
    for label in sorted(set(env_scores) | set(evals) | set(evaluate_only)):
        scores = list(env_scores.get(label, {}).values())
        entry: dict[str, Any] = {"steps": len(scores)}
        if scores:
            first, last = window_means(scores)
            learned, verdict = learning_verdict(scores)
            entry.update(
                first_10_mean_score=first, last_10_mean_score=last, learned=learned, verdict=verdict
            )
        if label in evaluate_only:
            entry["evaluate_only"] = True
        if evals.get(label):
            earliest, latest = evals[label][0], evals[label][-1]
            entry["evaluations"] = len(evals[label])
            if len(evals[label]) > 1:
                entry["first_evaluation"] = {"step": earliest["step"], **numeric_metrics(earliest)}
            entry["last_evaluation"] = {"step": latest["step"], **numeric_metrics(latest)}
        numbers[label] = entry
    return numbers


def evaluation_change(entry: dict[str, Any]) -> str:
    """An environment's first and last evaluation, for its line: `accuracy 0.300 at step
    0 -> 0.450 at step 20` (its first metric), or the one evaluation there was."""
    latest, first = entry.get("last_evaluation"), entry.get("first_evaluation")
    if not latest:
        return "not evaluated"
    name = next((k for k in latest if k != "step"), None)
    if name is None:
        return f"evaluated at step {latest['step']}"
    end = f"{latest[name]:.3f} at step {latest['step']}"
    if first is None or name not in first:
        return f"{name} {end}"
    return f"{name} {first[name]:.3f} at step {first['step']} -> {end}"


def environment_line(entry: dict[str, Any]) -> str:
    """One environment's numbers in a short line, for the closing panel."""
    if entry.get("evaluate_only"):
        return f"evaluated only: {evaluation_change(entry)}"
    if "first_10_mean_score" not in entry:
        return "no groups trained"
    return (
        f"{entry['first_10_mean_score']:.3f} -> {entry['last_10_mean_score']:.3f} over "
        f"{entry['steps']} steps: {JUDGED[entry.get('learned')]}"
    )


def replayed_only(plan: Plan) -> bool:
    """Every group the trainer got was replayed (a `replay:` section, and no environment
    that samples): its scores are the source run's, not this policy's."""
    sampling = [s for s in plan.config.environments if not s.evaluate_only]
    return plan.config.replay is not None and not sampling


def replay_verdict(per_env: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The headline of a run trained only on replayed groups: what its evaluations say
    (the trained scores cannot rise: they are the stored ones)."""
    evaluated = [
        f"{label}: {evaluation_change(entry)}"
        for label, entry in per_env.items()
        if entry.get("evaluate_only") and entry.get("last_evaluation")
    ]
    return {
        "learned": None,
        "verdict": "trained on replayed groups, whose scores are the source run's, not this "
        "policy's; " + ("; ".join(evaluated) or "no evaluation says how the policy changed"),
    }


def forked_from(run_dir: Path) -> dict[str, Any] | None:
    """summary.json's `forked_from`: the parent run and step of a fork (None otherwise)."""
    parent = read_parent(run_dir)
    if parent is None:
        return None
    return {"run_dir": parent.run_dir, "step": parent.step, "checkpoint": parent.checkpoint}


def forked_from_line(forked: dict[str, Any], cwd: Path | None = None) -> str:
    """The closing panel's line for a fork: its parent (from the working directory)."""
    parent = shown_path(Path(forked["run_dir"]), cwd)
    return f"forked from {parent} at step {forked['step']}"


def closing_notes(numbers: dict[str, Any], run_dir: Path) -> list[str]:
    """The closing panel's last lines: what is printed below it whole (the panel is
    narrow): the command that continues the run, and how to load its final model."""
    notes = []
    if numbers.get("resume_command"):
        notes.append("continue it with the command below")
    final = numbers.get("final_model")
    if final:
        shown = Path(final)
        if shown.is_relative_to(run_dir):
            shown = shown.relative_to(run_dir)
        notes.append(f"final model: {shown} (Hugging Face format; loading it: below)")
    return notes


def panel_lines(numbers: dict[str, Any], run_dir: Path) -> list[str]:
    """The closing panel's lines after the processes': restarts, groups, the verdicts
    (each environment's when there are several, or one only evaluated), the trainer's
    events and the notes on what is printed below the panel."""
    restarts = {name: n for name, n in numbers.get("restarts", {}).items() if n}
    crashes = ", ".join(f"{name} {n}" for name, n in restarts.items()) or "none"
    lines = [f"restarts after crashes: {crashes}"]
    if numbers.get("groups_line"):
        lines.append(numbers["groups_line"])
    if numbers["steps"]:
        lines.append(f"steps trained: {numbers['steps']}; {numbers['verdict']}")
    lines += [numbers[key] for key in ("scored_line", "dropped_line") if numbers.get(key)]
    environments = numbers.get("environments", {})
    evaluated_only = any(entry.get("evaluate_only") for entry in environments.values())
    if len(environments) > 1 or evaluated_only:  # each environment's own verdict
        lines += [f"{label}: {environment_line(entry)}" for label, entry in environments.items()]
    lines.append(
        f"engine restarts: {numbers['engine_restarts']}; "
        f"checkpoints saved: {numbers['checkpoints_saved']}"
    )
    return lines + closing_notes(numbers, run_dir)


def run_numbers(
    plan: Plan, restarts: dict[str, int] | None = None, reading: RunReading | None = None
) -> dict[str, Any]:
    """The summary of the run: learning verdict (the whole run's, then each
    environment's), event counts, restarts after crashes, where every acknowledged
    group went (`ledger.py`), the final model, and how to continue a run whose trainer
    did not finish. `reading`: the run's files as `read_run` read them."""
    rows = read_metrics(plan.metrics_path)
    numbers = summary(rows)
    trained = max((row.step for row in rows), default=0)
    if 0 < trained < plan.training_steps:  # a run that never trained is launched again
        numbers["resume_command"] = resume_command(plan.run_dir)
    reading = reading or read_run(plan)
    if reading.problem:
        numbers["environments_line"] = f"environments: not read ({reading.problem})"
    if reading.scored and set(reading.env_scores) <= set(reading.scored):  # every env's
        numbers.update(scored_summary(reading.scored))
    only = {section.label for section in plan.config.environments if section.evaluate_only}
    per_env = environment_numbers(reading.env_scores, reading.evals, only)
    if per_env:
        numbers["environments"] = per_env
    if numbers["steps"] and replayed_only(plan):
        numbers.update(replay_verdict(per_env))
    events = read_events(plan.events_path)
    numbers.update(event_counts(events))
    numbers["restarts"] = dict(restarts or {})
    resumes = read_resumes(plan.run_dir)
    if resumes:
        numbers["resumed_at"] = resumes
    forked = forked_from(plan.run_dir)
    if forked is not None:
        numbers["forked_from"] = forked
    final = final_checkpoint(plan.checkpoints, events)
    if final is not None:
        numbers["final_model"] = str(final)
    saved = [e.step for e in events if e.kind is EventKind.CHECKPOINT_SAVED]
    try:
        groups = account(
            plan.run_dir / "env-state",
            groups_path(plan.checkpoints),
            plan.api_state_dir,
            kept_through=max(saved, default=0),
        )
    except OSError as exc:
        numbers["groups_line"] = f"groups: not counted ({exc})"
    else:
        numbers["groups"] = groups.numbers()
        numbers["groups_line"] = groups.line()
    return numbers


def policy_name(plan: Plan) -> str:
    """The policy as the YAML names it (`tiny`), with the directory it resolved to."""
    named = plan.config.model
    return named if named == plan.model else f"{named} ({plan.model})"


def run_facts(plan: Plan) -> dict[str, Any]:
    """What the score depends on besides the config: the seed, the machine, the tiny model."""
    facts: dict[str, Any] = {"seed": plan.config.seed, "machine": machine_facts()}
    built = read_build_record(plan.model)
    if built is not None:
        facts["tiny_model"] = {
            "seed": built["spec"]["seed"],
            "kit_version": built["kit_version"],
            "training_steps": built["steps"],
            **built["reading"],
            "built_on": built["machine"],
        }
    return facts


def write_report(
    plan: Plan,
    config_text: str,
    numbers: dict[str, Any] | None = None,
    reading: RunReading | None = None,
    facts: dict[str, Any] | None = None,
) -> Path:
    """summary.json, report.png and report.html in the run directory; the page's path.
    `facts`: what the score depended on, when not this machine's (a rebuilt report)."""
    run_dir = plan.run_dir
    rows = read_metrics(plan.metrics_path)
    for records in (plan.metrics_path, plan.events_path, groups_path(plan.checkpoints)):
        if records.exists():
            shutil.copyfile(records, run_dir / records.name)
    reading = reading or read_run(plan)
    numbers = numbers if numbers is not None else run_numbers(plan, reading=reading)
    facts = facts if facts is not None else run_facts(plan)
    (run_dir / "summary.json").write_text(json.dumps({**numbers, **facts}, indent=2))
    image = ""
    if rows:
        resumes = numbers.get("resumed_at", [])
        png = plot(rows, run_dir / "report.png", reading.env_scores, reading.evals, resumes)
        encoded = base64.b64encode(png.read_bytes()).decode()
        alt = "score, loss and what else was logged, per step"
        image = f'<img alt="{alt}" src="data:image/png;base64,{encoded}">'
    first, last = sample_groups(plan.rollouts_dir)
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>atropos run {html.escape(run_dir.name)}</title>
<style>{ROLLOUT_CSS}</style>
<style>{PAGE_STYLE}</style></head><body>
<h1>Run {html.escape(run_dir.name)}</h1>
<p>Policy: <code>{html.escape(policy_name(plan))}</code>; run directory
<code>{html.escape(str(run_dir))}</code></p>
{summary_table(numbers)}
{environments_table(numbers.get("environments", {}))}
{image}
<h2>What these numbers depend on</h2>
{facts_list(facts)}
<h2>Sample rollouts: start of training</h2>
{_groups_html(first)}
<h2>Sample rollouts: end of training</h2>
{_groups_html(last)}
<h2>Config</h2>
<pre>{html.escape(config_text)}</pre>
</body></html>
"""
    out = run_dir / "report.html"
    out.write_text(page)
    return out
