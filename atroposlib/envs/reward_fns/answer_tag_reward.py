"""Registered as "answer_tag": 1.0 when the one `<answer>` after thinking equals the gold.

For tasks with a short exact answer (a count, a word, a number): comparison is on the
stripped, case-folded text, and a number matches a number of the same value ("07" is
7). See `_final_answer` for what counts as the answer.

Reference: none. This project's rule for short tagged answers (`_final_answer`); no
maintained library grades `<answer>` tags, so its tests state the rule case by case.
"""

from __future__ import annotations

from typing import Any

from ._final_answer import INTEGER, tagged_answer
from .registry import registry
from .reward_function import RewardFunction


def same_answer(found: str | None, gold: Any) -> bool:
    """Exact match after normalising case, spaces and integer spelling."""
    if found is None:
        return False
    expected = str(gold).strip().casefold()
    given = found.strip().casefold()
    if INTEGER.fullmatch(expected) and INTEGER.fullmatch(given):
        return int(expected) == int(given)
    return given == expected


@registry.register(name="answer_tag")
class AnswerTagReward(RewardFunction):
    """1.0 or 0.0 per completion; `gold` is one answer or one per completion."""

    def __init__(self, tag: str = "answer", weight: float = 1.0, **kwargs: Any) -> None:
        super().__init__(weight=weight, **kwargs)
        self.tag = tag

    def compute(self, completions: list[Any], gold: Any = None, **kwargs: Any) -> list[float]:
        golds = gold if isinstance(gold, list) else [gold] * len(completions)
        return [
            float(same_answer(tagged_answer(self.get_content(c), self.tag), g))
            for c, g in zip(completions, golds, strict=True)
        ]
