"""`list` and `show`: what a run trained on, per step and environment, and its samples.

A table for people and `--json` for scripts carry the same rows. A group no step
trained is listed under step None ("-"), so nothing the run sampled is hidden.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from atroposlib.rollouts.store import RunStore, StoredGroup

Decode = Callable[[list[int]], str]


@dataclass(frozen=True)
class StepRow:
    """One step's groups of one environment."""

    step: int | None
    env: str
    groups: int
    sequences: int
    score_mean: float
    score_std: float
    """The spread of the sequences' scores (population standard deviation)."""
    staleness_mean: float | None
    staleness_max: int | None


def step_rows(store: RunStore) -> list[StepRow]:
    """A row per (step, environment), trained steps first in order, then untrained."""
    buckets: dict[tuple[int | None, str], list[StoredGroup]] = {}
    for group in store.groups:
        buckets.setdefault((group.step, group.env), []).append(group)
    order = sorted(buckets, key=lambda key: (key[0] is None, key[0] or 0, key[1]))
    return [_row(step, env, buckets[(step, env)]) for step, env in order]


def _row(step: int | None, env: str, groups: list[StoredGroup]) -> StepRow:
    scores = [s for g in groups for s in g.scores]
    lags = [lag for g in groups for lag in g.staleness]
    return StepRow(
        step=step,
        env=env,
        groups=len(groups),
        sequences=sum(len(g.scores) for g in groups),
        score_mean=statistics.fmean(scores) if scores else 0.0,
        score_std=statistics.pstdev(scores) if scores else 0.0,
        staleness_mean=statistics.fmean(lags) if lags else None,
        staleness_max=max(lags) if lags else None,
    )


def rows_json(store: RunStore, rows: list[StepRow] | None = None) -> dict[str, Any]:
    """`list --json`: the rows, and the totals a script checks first."""
    rows = step_rows(store) if rows is None else rows
    return {
        "run_dir": str(store.run_dir),
        "environments": store.environments,
        "groups": len(store.groups),
        "trained_groups": sum(1 for g in store.groups if g.step is not None),
        "trained_steps": len(store.trained_steps),
        "unreadable_lines": store.skipped,
        "rows": [asdict(row) for row in rows],
    }


def rows_table(store: RunStore) -> str:
    """The rows as a fixed-width table with a one-line total under it."""
    header = f"{'step':>6}  {'environment':<20} {'groups':>6} {'seqs':>6} "
    header += f"{'score':>6} {'spread':>6} {'stale':>5} {'max':>4}"
    lines = [header]
    rows = step_rows(store)
    for row in rows:
        stale = "-" if row.staleness_mean is None else f"{row.staleness_mean:.1f}"
        most = "-" if row.staleness_max is None else str(row.staleness_max)
        step = "-" if row.step is None else str(row.step)
        lines.append(
            f"{step:>6}  {row.env[:20]:<20} {row.groups:>6} {row.sequences:>6} "
            f"{row.score_mean:>6.3f} {row.score_std:>6.3f} {stale:>5} {most:>4}"
        )
    data = rows_json(store, rows)
    untrained = data["groups"] - data["trained_groups"]
    lines.append(
        f"{data['groups']} groups in {len(store.environments)} environment(s); "
        f"{data['trained_groups']} trained over {data['trained_steps']} steps, "
        f"{untrained} never trained (step -)"
    )
    for env, count in store.skipped.items():
        lines.append(f"{env}: {count} unreadable line(s) skipped")
    return "\n".join(lines)


def show_text(groups: list[StoredGroup], decode: Decode | None) -> str:
    """Each group's prompt once and every completion with its score; `decode` turns
    tokens into text for a group sent without messages (None: its scores only)."""
    return "\n\n".join(_group_text(group, decode) for group in groups)


def _group_text(group: StoredGroup, decode: Decode | None) -> str:
    versions = sorted({v for v in group.versions if v is not None})
    sampled = f", sampled by the weights of step {versions[0]}" if len(versions) == 1 else ""
    if len(versions) > 1:
        sampled = f", sampled by the weights of steps {versions[0]}..{versions[-1]}"
    lines = [
        f"step {group.step if group.step is not None else '-'} · {group.env} · group "
        f"{group.group_id or '?'} ({len(group.scores)} samples{sampled})"
    ]
    chats = group.data.get("messages")
    if isinstance(chats, list) and chats and all(isinstance(c, list) for c in chats):
        shared = _shared_prefix(chats)
        lines += [f"  {_message(m)}" for m in chats[0][:shared]]
        for score, chat in zip(group.scores, chats, strict=False):
            answer = " / ".join(_message(m) for m in chat[shared:]) or "(empty)"
            lines.append(f"  [{score:.2f}] {answer}")
        return "\n".join(lines)
    tokens = group.data.get("tokens") or []
    masks = group.data.get("masks") or []
    for score, ids, mask in zip(group.scores, tokens, masks, strict=False):
        trained = [t for t, m in zip(ids, mask, strict=False) if m != -100]
        text = decode(trained) if decode else f"{len(trained)} completion tokens"
        lines.append(f"  [{score:.2f}] {text}")
    return "\n".join(lines)


def _shared_prefix(chats: list[list[Any]]) -> int:
    """How many leading messages every chat of the group shares (the prompt)."""
    count = 0
    for messages in zip(*chats, strict=False):
        if any(m != messages[0] for m in messages[1:]):
            break
        count += 1
    return min(count, min(len(c) for c in chats) - 1) if count else 0


def _message(message: Any) -> str:
    if not isinstance(message, dict):
        return str(message)
    content = message.get("content")
    if isinstance(content, list):  # multimodal parts: the text ones
        content = " ".join(p.get("text", "[picture]") for p in content if isinstance(p, dict))
    return f"{message.get('role', '?')}: {content}"
