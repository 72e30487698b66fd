"""Registered as "r1": DeepSeek-R1 style reward, format (one `<think>` block) plus accuracy.

Also registers its two parts, "formatreasoning" and "accuracyx". Note: upstream's lazy
loader happens to bind the names "r1" and "r1_reward" to `AccuracyXReward` (the first
class in this module alphabetically); here they give `R1Reward`, the class upstream
registers as "r1" itself.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from .registry import registry
from .reward_function import RewardFunction

logger = logging.getLogger(__name__)

_THINK_BLOCK = re.compile(r"<think>.*?</think>", re.DOTALL)
_THINK_THEN_RESPONSE = re.compile(r"<think>\s*(.*?)\s*</think>\s*(.*)", re.DOTALL)


def parse_reasoning_response(text: str) -> dict[str, Any]:
    """Split into `thinking_content` and `response`; flag `multiple_thinking` blocks.

    Without a think block (or with several) the whole text is the response.
    """
    if not isinstance(text, str):
        return {"thinking_content": "", "response": str(text), "multiple_thinking": False}
    if len(_THINK_BLOCK.findall(text)) > 1:
        return {"thinking_content": "", "response": text, "multiple_thinking": True}
    found = _THINK_THEN_RESPONSE.search(text)
    if not found:
        return {"thinking_content": "", "response": text, "multiple_thinking": False}
    return {
        "thinking_content": found.group(1).strip(),
        "response": found.group(2).strip(),
        "multiple_thinking": False,
    }


def _parse_all(reward: RewardFunction, completions: list[Any]) -> list[dict[str, Any]]:
    return [parse_reasoning_response(reward.get_content(c)) for c in completions]


@registry.register
class FormatReasoningReward(RewardFunction):
    """`reward_value` for non-empty thinking, a non-empty response and one think block."""

    def __init__(
        self,
        reward_value: float = 0.5,
        require_thinking: bool = True,
        require_response: bool = True,
        allow_multiple_thinking: bool = False,
        weight: float = 1.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(weight=weight, **kwargs)
        self.reward_value = reward_value
        self.require_thinking = require_thinking
        self.require_response = require_response
        self.allow_multiple_thinking = allow_multiple_thinking

    def compute(self, completions: list[Any], **kwargs: Any) -> list[float]:
        """`reward_value` or 0.0 per completion."""
        return [self.reward_value if self._valid(p) else 0.0 for p in _parse_all(self, completions)]

    def _valid(self, parsed: dict[str, Any]) -> bool:
        if self.require_thinking and not parsed["thinking_content"]:
            return False
        if self.require_response and not parsed["response"]:
            return False
        return self.allow_multiple_thinking or not parsed["multiple_thinking"]


@registry.register
class AccuracyXReward(RewardFunction):
    """`reward_value` when the solution text appears in (or, exactly, is) the response."""

    def __init__(
        self,
        exact_match: bool = False,
        case_sensitive: bool = False,
        reward_value: float = 1.0,
        weight: float = 1.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(weight=weight, **kwargs)
        self.exact_match = exact_match
        self.case_sensitive = case_sensitive
        self.reward_value = reward_value

    def compute(
        self, completions: list[Any], solution: str | list[Any] | None = None, **kwargs: Any
    ) -> list[float]:
        """Score responses (text after the think block) against `solution`; 0.0 without one."""
        if solution is None:
            logger.warning("accuracyx reward got no solution; scoring 0.0")
            return [0.0] * len(completions)
        parsed = _parse_all(self, completions)
        solutions = solution if isinstance(solution, list) else [solution] * len(parsed)
        return [self._score(p["response"], s) for p, s in zip(parsed, solutions, strict=False)]

    def _score(self, response: str, solution: Any) -> float:
        try:
            expected = solution if isinstance(solution, str) else self.get_content(solution)
            if not self.case_sensitive:
                expected, response = expected.lower(), response.lower()
            matched = response == expected if self.exact_match else expected in response
            return self.reward_value if matched else 0.0
        except Exception:
            logger.exception("accuracyx reward failed on one completion; scoring 0.0")
            return 0.0


@registry.register
class R1Reward(RewardFunction):
    """`format_weight * format + accuracy_weight * accuracy`, each part scoring 0 or 1."""

    def __init__(
        self,
        format_weight: float = 0.5,
        accuracy_weight: float = 1.0,
        weight: float = 1.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(weight=weight, **kwargs)
        self.format_weight = format_weight
        self.accuracy_weight = accuracy_weight
        self.format_reward_fn = FormatReasoningReward(reward_value=1.0)
        self.accuracy_reward_fn = AccuracyXReward(reward_value=1.0)

    def compute(
        self, completions: list[Any], solution: str | list[Any] | None = None, **kwargs: Any
    ) -> list[float]:
        """Weighted sum of the format and accuracy parts."""
        try:
            formatting = self.format_reward_fn.compute(completions, **kwargs)
            accuracy = self.accuracy_reward_fn.compute(completions, solution=solution, **kwargs)
        except Exception:
            logger.exception("r1 reward failed; scoring 0.0")
            return [0.0] * len(completions)
        pairs = zip(formatting, accuracy, strict=False)
        return [f * self.format_weight + a * self.accuracy_weight for f, a in pairs]


def format_reasoning_reward(completions: list[Any], **kwargs: Any) -> list[float]:
    """Function form of `FormatReasoningReward(reward_value=0.5).compute`."""
    return FormatReasoningReward(reward_value=0.5).compute(completions, **kwargs)


def accuracy_reward(completions: list[Any], solution: Any, **kwargs: Any) -> list[float]:
    """Function form of `AccuracyXReward().compute`."""
    return AccuracyXReward().compute(completions, solution=solution, **kwargs)


def r1_reward(completions: list[Any], solution: Any, **kwargs: Any) -> list[float]:
    """Function form of `R1Reward().compute`."""
    return R1Reward().compute(completions, solution=solution, **kwargs)
