"""`rescore`: score every stored group of one environment again, with another reward.

Design: the usual late discovery of an RL run is a reward that paid for the wrong
thing; the samples themselves were fine. Every stored group keeps its chat and the
item it was scored against, so a reward can be asked again, sample by sample, without
an engine. The result is a new dataset beside the run (`RUN_DIR/rescored/<label>/`):
`<env>.jsonl` holds each group with its new `scores` and, under `rescored`, the old
ones and the step that trained it; `summary.json` says how many scores changed and by
how much, per step; `rescore.png` draws it. `replay --rescored DIR` posts that dataset.

A sample whose reward raised is never scored 0: its group is left out of the dataset
and written to `failed.jsonl` with the error, and the count is on the console.
"""

from __future__ import annotations

import json
import logging
import re
import statistics
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from atroposlib.envs.reward_spec import Reward
from atroposlib.rollouts.store import RunStore, StoredGroup, StoreError

RESCORED_DIR = "rescored"
SUMMARY_FILE = "summary.json"
PLOT_FILE = "rescore.png"
FAILED_FILE = "failed.jsonl"
MARK = "rescored"
"""The key each re-scored group keeps its provenance under."""
CHANGED_BY = 1e-9
"""Scores closer than this are the same score."""

Decode = Callable[[list[int]], str]


@dataclass
class StepChange:
    samples: int = 0
    changed: int = 0
    old: list[float] = field(default_factory=list)
    new: list[float] = field(default_factory=list)


@dataclass
class Outcome:
    """What a re-scoring changed."""

    reward: str
    env: str
    groups: int = 0
    samples: int = 0
    changed: int = 0
    deltas: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    failed_groups: int = 0
    uniform_groups: int = 0
    """Groups whose new scores are all equal: no advantage for GRPO."""
    itemless_groups: int = 0
    """Groups stored without the item they were scored against (an older run)."""
    warnings: list[str] = field(default_factory=list)
    """What the reward logged at WARNING or above while it scored."""
    steps: dict[int | None, StepChange] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        scored = self.samples - len(self.errors)
        return {
            "reward": self.reward,
            "env": self.env,
            "groups": self.groups,
            "samples": self.samples,
            "changed": self.changed,
            "changed_share": self.changed / scored if scored else 0.0,
            "mean_abs_change": statistics.fmean(map(abs, self.deltas)) if self.deltas else 0.0,
            "old_mean": _mean([s for c in self.steps.values() for s in c.old]),
            "new_mean": _mean([s for c in self.steps.values() for s in c.new]),
            "failed_samples": len(self.errors),
            "failed_groups": self.failed_groups,
            "first_errors": self.errors[:5],
            "uniform_groups": self.uniform_groups,
            "groups_without_item": self.itemless_groups,
            "reward_warnings": len(self.warnings),
            "first_warnings": self.warnings[:5],
            "per_step": [
                {
                    "step": step,
                    "samples": c.samples,
                    "changed": c.changed,
                    "old_mean": _mean(c.old),
                    "new_mean": _mean(c.new),
                }
                for step, c in sorted(self.steps.items(), key=lambda kv: (kv[0] is None, kv[0]))
            ],
        }


def default_out(store: RunStore, reward: Reward) -> Path:
    """`RUN_DIR/rescored/<the reward's name, made a folder name>`."""
    label = re.sub(r"[^A-Za-z0-9_.-]+", "_", Path(reward.label).name.replace(":", "-"))
    return store.run_dir / RESCORED_DIR / (label.strip("_.") or "reward")


def rescore(
    store: RunStore, env: str, reward: Reward, out: Path, decode: Decode | None = None
) -> Outcome:
    """Score every group of `env` with `reward`; write the dataset, summary and plot."""
    groups = store.select(env)
    out.mkdir(parents=True, exist_ok=True)
    outcome = Outcome(reward.label, env)
    kept, failed = [], []
    with _warnings_into(outcome.warnings):
        scored = [(group, *_scores(group, reward, decode)) for group in groups]
    for group, new, errors in scored:
        outcome.groups += 1
        outcome.itemless_groups += "item" not in group.data
        outcome.samples += len(new)
        change = outcome.steps.setdefault(group.step, StepChange())
        change.samples += len(new)
        if errors:
            outcome.failed_groups += 1
            outcome.errors += [f"group {group.group_id} sample {i}: {e}" for i, e in errors]
            failed.append({**group.data, MARK: _mark(reward, group, errors=errors)})
            continue
        for old, value in zip(group.scores, new, strict=True):
            change.old.append(old)
            change.new.append(value)  # type: ignore[arg-type]
            if abs(value - old) > CHANGED_BY:  # type: ignore[operator]
                outcome.changed += 1
                change.changed += 1
                outcome.deltas.append(value - old)  # type: ignore[operator]
        outcome.uniform_groups += len(set(new)) <= 1
        kept.append({**group.data, "scores": new, MARK: _mark(reward, group)})
    _write_lines(out / f"{env}.jsonl", kept)
    _write_lines(out / FAILED_FILE, failed)
    (out / SUMMARY_FILE).write_text(json.dumps(outcome.summary(), indent=2) + "\n")
    plot(outcome, out / PLOT_FILE)
    return outcome


@contextmanager
def _warnings_into(found: list[str]) -> Iterator[None]:
    """Collect what is logged at WARNING while a reward scores thousands of samples:
    one console line with the count, not one line per sample."""

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            found.append(record.getMessage())

    root = logging.getLogger()
    handler = Collect(logging.WARNING)
    saved = root.handlers[:]
    root.handlers = [handler]
    try:
        yield
    finally:
        root.handlers = saved


def _scores(
    group: StoredGroup, reward: Reward, decode: Decode | None
) -> tuple[list[float | None], list[tuple[int, str]]]:
    """The new score of each sample, and (index, error) of each that raised."""
    scores: list[float | None] = []
    errors: list[tuple[int, str]] = []
    item = group.data.get("item")
    for index, (prompt, completion) in enumerate(_samples(group, decode)):
        try:
            scores.append(reward.score(completion, prompt, item))
        except Exception as error:  # the reward is the user's code: count, never score 0
            scores.append(None)
            errors.append((index, f"{type(error).__name__}: {error}"))
    return scores, errors


def _samples(group: StoredGroup, decode: Decode | None) -> list[tuple[list[dict], str]]:
    """(prompt messages, completion text) per sample: the chat's last assistant turn and
    what came before it, or the decoded completion tokens of a group without messages."""
    chats = group.data.get("messages")
    if isinstance(chats, list) and len(chats) == len(group.scores):
        pairs = []
        for chat in chats:
            last = chat[-1] if isinstance(chat, list) and chat else {}
            content = last.get("content") if isinstance(last, dict) else None
            pairs.append((chat[:-1] if isinstance(chat, list) else [], _text(content)))
        return pairs
    if decode is None:
        raise StoreError(
            f"group {group.group_id} of {group.env} carries no messages, and no tokenizer "
            "was given to decode its completions"
        )
    pairs = []
    for ids, mask in zip(
        group.data.get("tokens") or [], group.data.get("masks") or [], strict=True
    ):
        prompt = decode([t for t, m in zip(ids, mask, strict=True) if m == -100])
        completion = decode([t for t, m in zip(ids, mask, strict=True) if m != -100])
        pairs.append(([{"role": "user", "content": prompt}], completion))
    return pairs


def _text(content: Any) -> str:
    if isinstance(content, list):  # multimodal parts: the text ones
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def _mark(
    reward: Reward, group: StoredGroup, errors: list[tuple[int, str]] | None = None
) -> dict[str, Any]:
    mark: dict[str, Any] = {"reward": reward.label, "old_scores": group.scores, "step": group.step}
    if errors:
        mark["errors"] = [{"sample": i, "error": e} for i, e in errors]
    return mark


def _write_lines(path: Path, records: list[dict[str, Any]]) -> None:
    with open(path, "w") as out:
        for record in records:
            out.write(json.dumps(record) + "\n")


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def summary_lines(outcome: Outcome, out: Path, rows: int = 10) -> list[str]:
    """What the console says: the totals, a per-step table (at most `rows` spans of
    steps) and where the dataset is."""
    data = outcome.summary()
    old, new = data["old_mean"], data["new_mean"]
    means = "" if old is None else f"; mean score {old:.3f} -> {new:.3f}"
    lines = [
        f"re-scored {outcome.groups} groups ({outcome.samples} samples) of {outcome.env} with "
        f"{outcome.reward}: {outcome.changed} scores changed ({data['changed_share']:.1%}), "
        f"by {data['mean_abs_change']:.3f} on average{means}",
    ]
    if outcome.errors:
        lines.append(
            f"{len(outcome.errors)} samples raised, so their {outcome.failed_groups} groups "
            f"are left out (see {out / FAILED_FILE}); first: {outcome.errors[0]}"
        )
    if outcome.errors and outcome.itemless_groups:
        lines.append(
            f"{outcome.itemless_groups} groups were stored without their item (a run from "
            "before items were recorded): a reward that reads the item's fields cannot "
            "score them"
        )
    if outcome.warnings:
        lines.append(
            f"the reward logged {len(outcome.warnings)} warnings; first: {outcome.warnings[0]}"
        )
    if outcome.uniform_groups:
        lines.append(
            f"{outcome.uniform_groups} groups now score all their samples the same "
            "(no advantage for GRPO)"
        )
    lines += _step_table(data["per_step"], rows)
    lines.append(f"wrote {out} ({outcome.env}.jsonl, {SUMMARY_FILE}, {PLOT_FILE})")
    return lines


def _step_table(per_step: list[dict[str, Any]], rows: int) -> list[str]:
    trained = [r for r in per_step if r["step"] is not None]
    if not trained:
        return []
    size = max(1, -(-len(trained) // rows))
    lines = [f"{'steps':>9} {'samples':>8} {'changed':>8} {'old':>6} {'new':>6}"]
    for start in range(0, len(trained), size):
        span = trained[start : start + size]
        samples = sum(r["samples"] for r in span)
        changed = sum(r["changed"] for r in span)
        old = _weighted(span, "old_mean")
        new = _weighted(span, "new_mean")
        steps = f"{span[0]['step']}-{span[-1]['step']}" if len(span) > 1 else str(span[0]["step"])
        lines.append(f"{steps:>9} {samples:>8} {changed:>8} {old:>6.3f} {new:>6.3f}")
    return lines


def _weighted(rows: list[dict[str, Any]], key: str) -> float:
    pairs = [(r[key], r["samples"]) for r in rows if r[key] is not None]
    total = sum(n for _, n in pairs)
    return sum(v * n for v, n in pairs) / total if total else float("nan")


def plot(outcome: Outcome, path: Path) -> None:
    """Mean score per trained step under the old and the new reward, and the share of
    scores that changed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = sorted(s for s in outcome.steps if s is not None)
    figure, (scores, shares) = plt.subplots(1, 2, figsize=(10, 3.5))
    if steps:
        changes = [outcome.steps[s] for s in steps]
        scores.plot(steps, [_mean(c.old) for c in changes], label="stored score")
        scores.plot(steps, [_mean(c.new) for c in changes], label=outcome.reward[-40:])
        shares.plot(steps, [c.changed / c.samples if c.samples else 0 for c in changes])
    scores.set(xlabel="trained at step", ylabel="mean score", title=outcome.env)
    scores.legend(fontsize="small")
    shares.set(xlabel="trained at step", ylabel="share of scores changed", ylim=(0, 1.05))
    figure.tight_layout()
    figure.savefig(path, dpi=80)
    plt.close(figure)
