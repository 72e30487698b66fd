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
import shutil
from pathlib import Path
from typing import Any

from atroposlib.launch.config import Plan
from atroposlib.launch.status import read_metrics

SAMPLES_PER_END = 3


def plot(rows: list[dict[str, Any]], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["step"] for r in rows]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    scores = [r.get("score_mean", float("nan")) for r in rows]
    top.plot(steps, scores, ".", alpha=0.5, label="mean score per step")
    window = max(1, min(10, len(scores) // 4))
    smooth = [
        sum(scores[max(0, i - window + 1) : i + 1]) / len(scores[max(0, i - window + 1) : i + 1])
        for i in range(len(scores))
    ]
    top.plot(steps, smooth, "-", label=f"rolling mean ({window} steps)")
    top.set_ylabel("mean score")
    top.legend(loc="best")
    top.grid(alpha=0.3)
    bottom.plot(steps, [r.get("loss", float("nan")) for r in rows], "-", color="tab:red")
    bottom.set_ylabel("loss")
    bottom.set_xlabel("trainer step")
    bottom.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


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


def _text(message: Any) -> str:
    if isinstance(message, str):
        return message
    if isinstance(message, list):
        return "\n".join(f"[{m.get('role')}] {m.get('content')}" for m in message)
    return json.dumps(message)


def _groups_html(groups: list[dict]) -> str:
    if not groups:
        return "<p>(no rollouts recorded)</p>"
    parts = []
    for group in groups:
        messages = group.get("messages") or [None] * len(group.get("scores", []))
        rows = "".join(
            f"<tr><td>{score:g}</td><td><pre>{html.escape(_text(m) if m else '(no text)')}</pre>"
            "</td></tr>"
            for score, m in zip(group.get("scores", []), messages, strict=False)
        )
        parts.append(
            f"<h4>{html.escape(group['_env'])}</h4><table><tr><th>score</th><th>rollout</th>"
            f"</tr>{rows}</table>"
        )
    return "\n".join(parts)


def summary(rows: list[dict[str, Any]]) -> dict[str, float | int]:
    scores = [r["score_mean"] for r in rows if "score_mean" in r]
    if not scores:
        return {"steps": 0}
    head, tail = scores[:10], scores[-10:]
    return {
        "steps": len(scores),
        "first_10_mean_score": sum(head) / len(head),
        "last_10_mean_score": sum(tail) / len(tail),
    }


def write_report(plan: Plan, config_text: str) -> Path:
    run_dir = plan.run_dir
    rows = read_metrics(plan.metrics_path)
    if plan.metrics_path.exists():
        shutil.copyfile(plan.metrics_path, run_dir / "metrics.jsonl")
    numbers = summary(rows)
    (run_dir / "summary.json").write_text(json.dumps(numbers, indent=2))
    image = ""
    if rows:
        png = plot(rows, run_dir / "report.png")
        encoded = base64.b64encode(png.read_bytes()).decode()
        image = f'<img alt="mean score and loss per step" src="data:image/png;base64,{encoded}">'
    first, last = sample_groups(plan.rollouts_dir)
    facts = "".join(
        f"<li>{k}: {v:.3f}</li>" if isinstance(v, float) else f"<li>{k}: {v}</li>"
        for k, v in numbers.items()
    )
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>atropos run {html.escape(run_dir.name)}</title>
<style>body{{font-family:sans-serif;max-width:1000px;margin:auto}}
pre{{white-space:pre-wrap;margin:0}} td,th{{border:1px solid #ccc;padding:4px;
vertical-align:top}} table{{border-collapse:collapse;width:100%}}</style></head><body>
<h1>Run {html.escape(run_dir.name)}</h1>
<p>Policy: <code>{html.escape(plan.model)}</code>; run directory
<code>{html.escape(str(run_dir))}</code></p>
<ul>{facts}</ul>
{image}
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
