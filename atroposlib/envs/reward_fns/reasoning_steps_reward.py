"""Registered as "reasoning_steps": rewards visible step-by-step structure.

Four kinds of marker are counted ("Step 1:", numbered lists, bullets, sequencing words);
each kind earns its weight in full at `min_steps` occurrences and pro rata below, a
non-trivial length adds `base_score`, and the total is capped at 1.0.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from .registry import registry
from .reward_function import RewardFunction

logger = logging.getLogger(__name__)

DEFAULT_PATTERN_WEIGHTS = {
    "numbered_steps": 0.5,
    "list_numbers": 0.5,
    "bullet_points": 0.4,
    "transition_words": 0.3,
}
_TRANSITIONS = (
    "First|Second|Third|Fourth|Fifth|Next|Then|Finally|Subsequently|Afterward|Lastly|"
    "Initially|To begin|Let's begin|I'll first|After that|In conclusion|Eventually|"
    "To solve|begin by|understand|analyze|apply|compute"
)
DEFAULT_PATTERNS = {
    "numbered_steps": r"Step\s+\d+[\s:]+",
    "list_numbers": r"(?:^|\n)\s*\d+\.\s+",
    "bullet_points": r"(?:^|\n)\s*[\-\*•]\s+",
    "transition_words": rf"\b(?:{_TRANSITIONS})\b",
}


@registry.register
class ReasoningStepsReward(RewardFunction):
    """A 0..1 score for how clearly a completion lays out its reasoning steps."""

    def __init__(
        self,
        min_words: int = 10,
        min_steps: int = 3,
        base_score: float = 0.1,
        pattern_weights: dict[str, float] | None = None,
        weight: float = 1.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(weight=weight, **kwargs)
        self.min_words = min_words
        self.min_steps = min_steps
        self.base_score = base_score
        self.pattern_weights = {**DEFAULT_PATTERN_WEIGHTS, **(pattern_weights or {})}
        self.patterns = dict(DEFAULT_PATTERNS)

    def compute(self, completions: list[Any], **kwargs: Any) -> list[float]:
        """One score in [0, 1] per completion."""
        return [self._score(self.get_content(c)) for c in completions]

    def _score(self, content: str) -> float:
        score = 0.0
        counts = {}
        for kind, pattern in self.patterns.items():
            counts[kind] = len(re.findall(pattern, content, re.IGNORECASE | re.MULTILINE))
            score += min(1.0, counts[kind] / self.min_steps) * self.pattern_weights.get(kind, 0.3)
        if len(content.split()) > self.min_words:
            score += self.base_score
        score = min(1.0, score)
        logger.debug("reasoning steps %s -> %s", counts, score)
        return score


def reasoning_steps_reward(completions: list[Any], **kwargs: Any) -> list[float]:
    """Function form of `ReasoningStepsReward().compute`."""
    return ReasoningStepsReward().compute(completions, **kwargs)
