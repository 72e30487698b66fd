"""Registered as "reversal_similarity": exact reversal 1.0, close ones partial credit.

Why partial credit: a small model rarely reverses a sentence exactly at first, and a
reward that is 0 for every near miss gives GRPO no signal. A reply whose answer is in
the required place scores `partial_weight x similarity` (difflib's ratio to the exact
reversal, in [0, 1)); the exact reversal scores 1.0. The answer is the one
`<reversed_text>` block after thinking (`answer_format="tagged"`), or the whole reply
after thinking (`"bare"`, for tiny and base models). An answer longer than twice the
target is not compared: padding cannot buy similarity.

Reference: none. Partial credit for the text-reversal environment is this project's
rule, tested case by case.
"""

from __future__ import annotations

import difflib
from typing import Any

from ._final_answer import after_thinking, tagged_answer
from .registry import registry
from .reward_function import RewardFunction

TAG = "reversed_text"


def reversal_answer(text: str, answer_format: str = "tagged", max_chars: int = 4000) -> str | None:
    """The reply's reversal attempt, or None when it is not where the format puts it."""
    if answer_format == "tagged":
        return tagged_answer(text, TAG, max_chars=max_chars)
    reply = after_thinking(text or "")
    return reply.strip() if reply is not None else None


def reversal_score(
    text: str, original: str, answer_format: str = "tagged", partial_weight: float = 0.5
) -> float:
    target = original[::-1]
    answer = reversal_answer(text, answer_format, max_chars=2 * len(target) + 16)
    if answer is None or not answer or len(answer) > 2 * len(target) + 16:
        return 0.0
    if answer == target:
        return 1.0
    return partial_weight * difflib.SequenceMatcher(None, answer, target).ratio()


@registry.register(name="reversal_similarity")
class ReversalSimilarityReward(RewardFunction):
    """Scores per completion against `original` (the text to reverse)."""

    def __init__(
        self,
        answer_format: str = "tagged",
        partial_weight: float = 0.5,
        weight: float = 1.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(weight=weight, **kwargs)
        self.answer_format = answer_format
        self.partial_weight = partial_weight

    def compute(self, completions: list[Any], original: Any = None, **kwargs: Any) -> list[float]:
        originals = original if isinstance(original, list) else [original] * len(completions)
        return [
            reversal_score(self.get_content(c), o, self.answer_format, self.partial_weight)
            for c, o in zip(completions, originals, strict=True)
        ]
