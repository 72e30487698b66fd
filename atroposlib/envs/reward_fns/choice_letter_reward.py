"""Registered as "choice_letter": 1.0 for the right option letter of a multiple-choice item.

The answer is the one `<answer>` block after the reasoning (see `_final_answer`). Inside
it, "B", "(B)", "B)", "B." and "B. the option's text" all name option B; lower case
counts; "B or C" and prose do not name one letter. Those score 0, as
does a missing or unclosed think block when `require_thinking` is on.

Reference: none maintained. lm-eval grades multiple choice by log-likelihood, not by a
generated letter; the rule here is this project's, tested case by case.
"""

from __future__ import annotations

import re
from typing import Any

from ._final_answer import tagged_answer
from .registry import registry
from .reward_function import RewardFunction

# A letter alone ("B", "(B)", "B.") or a marked letter then the option's text ("B) text").
LETTER = re.compile(r"^\(?([A-Za-z])(?:\)?[.:]?$|[.):]\s+\S)")


def chosen_letter(text: str, options: int = 4) -> str | None:
    """The option letter an answer names, or None."""
    answer = tagged_answer(text, "answer", max_chars=300)
    if answer is None:
        return None
    match = LETTER.match(answer)
    if not match:
        return None
    letter = match.group(1).upper()
    return letter if ord(letter) - ord("A") < options else None


def thought_first(text: str) -> bool:
    """One non-empty, closed `<think>` block opens the reply."""
    body = text.strip()
    lowered = body.lower()
    if not lowered.startswith("<think>"):
        return False
    if lowered.count("<think>") != 1 or lowered.count("</think>") != 1:
        return False
    return bool(body[len("<think>") : lowered.index("</think>")].strip())


@registry.register(name="choice_letter")
class ChoiceLetterReward(RewardFunction):
    """1.0 or 0.0 per completion; `gold` is a letter, or one letter per completion."""

    def __init__(
        self, options: int = 4, require_thinking: bool = True, weight: float = 1.0, **kwargs: Any
    ) -> None:
        super().__init__(weight=weight, **kwargs)
        self.options = options
        self.require_thinking = require_thinking

    def compute(self, completions: list[Any], gold: Any = None, **kwargs: Any) -> list[float]:
        golds = gold if isinstance(gold, list) else [gold] * len(completions)
        scores = []
        for completion, letter in zip(completions, golds, strict=True):
            text = self.get_content(completion)
            formed = thought_first(text) or not self.require_thinking
            scores.append(float(formed and chosen_letter(text, self.options) == letter))
        return scores
