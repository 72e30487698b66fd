"""`atropos-sft-gen`'s rules: which sequences of a group are kept, and their records.

Upstream's rejection sampling, rule for rule: sort by score, best first (ties keep
their order); drop scores of 0 or below unless negative scores are allowed; with a
minimum difference d > 0, keep only scores more than d above the group's lowest score
(the lowest of all its sequences, dropped ones included); keep the first N. The
records default to TRL's prompt-completion format, as strings or as message lists (its
conversational form): either way TRL's SFTTrainer computes the loss on the completion
only, the part the environment scored and its masks train, where a `messages` record
would train the system prompt and the question too. The 'atropos' format writes
upstream's keys with the score (`messages` for a conversation).
"""

from __future__ import annotations

from typing import Any

from atroposlib.datagen.groups import Scored


def keep_best(
    group: list[Scored],
    top_n: int,
    allow_negative_scores: bool = False,
    minimum_score_diff_max_min: float = 0.0,
) -> list[Scored]:
    """The sequences of one group that sft-gen writes, best first."""
    ranked = sorted(group, key=lambda seq: seq.score, reverse=True)
    if not allow_negative_scores:
        ranked = [seq for seq in ranked if seq.score > 0]
    if minimum_score_diff_max_min > 0 and group:
        lowest = min(seq.score for seq in group)
        ranked = [seq for seq in ranked if seq.score - lowest > minimum_score_diff_max_min]
    return ranked[:top_n]


def sft_record(seq: Scored, messages: bool, style: str = "trl") -> dict[str, Any]:
    """One jsonl record: TRL's keys, or upstream's with `style='atropos'`."""
    if style == "atropos":
        if messages:
            return {"messages": seq.whole, "score": seq.score}
        return {"prefix": seq.prompt, "completion": seq.completion, "score": seq.score}
    return {"prompt": seq.prompt, "completion": seq.completion}
