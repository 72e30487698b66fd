"""`atropos-dpo-gen`'s rules: which sequences of a group are paired, and their records.

Upstream's pairing, rule for rule: candidates for "chosen" are the group best first,
without scores of 0 or below unless negative scores are allowed; candidates for
"rejected" are the N lowest-scoring sequences. The i-th chosen (i < N) is paired with a
rejected candidate scoring more than d below it, picked at random (a seedable `Random`
here), and that candidate is used once. A sequence may be rejected in one pair and
chosen in another, as upstream allows. Records default to TRL's preference format
(prompt/chosen/rejected, strings or message lists); 'atropos' writes upstream's keys.
"""

from __future__ import annotations

import random
from typing import Any

from atroposlib.datagen.groups import Scored


def pair_up(
    group: list[Scored],
    n_pairs: int,
    allow_negative_scores: bool = False,
    minimum_score_diff_max_min: float = 0.5,
    rng: random.Random | None = None,
) -> list[tuple[Scored, Scored]]:
    """(chosen, rejected) pairs of one group, the chosen best first."""
    rng = rng or random.Random()
    best_first = sorted(group, key=lambda seq: seq.score, reverse=True)
    worst_first = sorted(group, key=lambda seq: seq.score)[:n_pairs]
    if not allow_negative_scores:
        best_first = [seq for seq in best_first if seq.score > 0]
    pairs = []
    for chosen in best_first[:n_pairs]:
        below = [
            seq
            for seq in worst_first
            if seq is not chosen and seq.score < chosen.score - minimum_score_diff_max_min
        ]
        if below:
            rejected = rng.choice(below)
            worst_first = [seq for seq in worst_first if seq is not rejected]
            pairs.append((chosen, rejected))
    return pairs


def dpo_record(
    chosen: Scored, rejected: Scored, messages: bool, style: str = "trl"
) -> dict[str, Any]:
    """One jsonl record: TRL's keys, or upstream's with `style='atropos'`."""
    if style == "atropos":
        if messages:
            return {"pos": chosen.whole, "neg": rejected.whole, "score": chosen.score}
        return {
            "prefix": chosen.prompt,
            "pos": chosen.completion,
            "neg": rejected.completion,
            "score": chosen.score,
        }
    return {"prompt": chosen.prompt, "chosen": chosen.completion, "rejected": rejected.completion}
