"""Registered as "crossword_format": are crossword answers written as "3-Across: WORD"?

Patterns may be given compiled or as strings (a YAML config can only hold strings);
strings are compiled case-insensitively like the defaults.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from .registry import registry
from .reward_function import RewardFunction

logger = logging.getLogger(__name__)

# Upstream's two patterns, written so that no input makes them backtrack for long: a
# clue number starts only where a digit run starts (`(?<!\d)`), and the possessive
# quantifiers give up nothing a later part could use. Matched as before, they took
# two minutes on a reply of 100,000 digits.
_DEFAULT_PATTERNS = (
    r"(?<!\d)\d+-(?:Across|Down):\s+[A-Z\s]+",
    r"^(?:\d+-(?:Across|Down):\s+[A-Z\s]++[\s,]*+)+$",
)
_ANSWER = re.compile(r"(?:Across|Down):\s+([A-Za-z]+)", re.IGNORECASE)


@registry.register
class CrosswordFormatReward(RewardFunction):
    """`reward_value` when a pattern matches and every answer uses only `valid_chars`."""

    def __init__(
        self,
        format_patterns: list[re.Pattern | str] | None = None,
        reward_value: float = 1.0,
        penalize_invalid_chars: bool = True,
        valid_chars: str = "ABCDEFGHIJKLMNOPQRSTUVWXYZ",
        weight: float = 1.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(weight=weight, **kwargs)
        self.reward_value = reward_value
        self.penalize_invalid_chars = penalize_invalid_chars
        self.valid_chars = valid_chars.upper()
        self.format_patterns = [
            re.compile(p, re.IGNORECASE) if isinstance(p, str) else p
            for p in (format_patterns or _DEFAULT_PATTERNS)
        ]

    def compute(self, completions: list[Any], **kwargs: Any) -> list[float]:
        """`reward_value` for each well-formatted completion, else 0.0."""
        return [self._score(self.get_content(c)) for c in completions]

    def _score(self, content: str) -> float:
        try:
            formatted = any(pattern.search(content) for pattern in self.format_patterns)
            return self.reward_value if formatted and self._valid_answers(content) else 0.0
        except Exception:
            logger.exception("crossword format check failed; scoring 0.0")
            return 0.0

    def _valid_answers(self, content: str) -> bool:
        if not self.penalize_invalid_chars:
            return True
        return all(
            ch.upper() in self.valid_chars for answer in _ANSWER.findall(content) for ch in answer
        )


def crossword_format_reward(completions: list[Any], **kwargs: Any) -> list[float]:
    """Function form of `CrosswordFormatReward().compute`."""
    return CrosswordFormatReward().compute(completions, **kwargs)
