"""Registered as "accuracy": 1.0 when a completion's final answer equals the gold answer.

The check itself (math-verify first, numeric fallback) lives in `_answer_check`, shared
with `cascading_r1_math`. Only the text after the last `</think>` is judged, and a
response that spams `\\boxed` past a threshold scores 0.0 rather than gaming first_match.
"""

from __future__ import annotations

import logging
from typing import Any

from ._answer_check import extract_final_answer as _extract_final_answer
from ._answer_check import normalize_number as _normalize_numerical_value
from ._answer_check import verify_answer as _verify_answer
from .registry import registry
from .reward_function import RewardFunction

logger = logging.getLogger(__name__)

__all__ = [
    "AccuracyReward",
    "_extract_final_answer",
    "_normalize_numerical_value",
    "_verify_answer",
    "accuracy_reward",
]


@registry.register
class AccuracyReward(RewardFunction):
    """1.0 for a correct final answer, else 0.0 (boxed LaTeX, GSM8K "####", plain numbers)."""

    def __init__(
        self,
        tolerance: float = 1e-6,
        split_on_think_tag: bool = True,
        max_boxed_threshold: int = 6,
        weight: float = 1.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(weight=weight, **kwargs)
        self.tolerance = tolerance
        self.split_on_think_tag = split_on_think_tag
        self.max_boxed_threshold = max_boxed_threshold

    def compute(
        self,
        completions: list[Any],
        solution: str | list[str] | None = None,
        ground_truth: str | list[str] | None = None,
        **kwargs: Any,
    ) -> list[float]:
        """Score each completion against `ground_truth` (or, without it, `solution`).

        A list of answers pairs one answer with each completion; a single answer is
        used for all. With neither given every completion scores 0.0.
        """
        gold = ground_truth if ground_truth is not None else solution
        if gold is None:
            logger.warning("accuracy reward got no solution or ground_truth; scoring 0.0")
            return [0.0] * len(completions)
        answers = gold if isinstance(gold, list) else [gold] * len(completions)
        pairs = zip(completions, answers, strict=False)
        rewards = [self._score(completion, answer) for completion, answer in pairs]
        if rewards:
            logger.info("accuracy: %s/%s", sum(rewards), len(rewards))
        return rewards

    def _score(self, completion: Any, answer: Any) -> float:
        try:
            content = self.get_content(completion)
            if self.split_on_think_tag and "</think>" in content:
                content = content.split("</think>")[-1]
                if content.count("\\boxed") > self.max_boxed_threshold:
                    logger.warning("too many \\boxed answers; scoring 0.0")
                    return 0.0
            return float(_verify_answer(content, answer, self.tolerance))
        except Exception:
            logger.exception("accuracy reward failed on one completion; scoring 0.0")
            return 0.0


def accuracy_reward(
    completions: list[Any],
    solution: str | list[str] | None = None,
    ground_truth: str | list[str] | None = None,
    **kwargs: Any,
) -> list[float]:
    """Function form of `AccuracyReward().compute`."""
    return AccuracyReward().compute(
        completions, solution=solution, ground_truth=ground_truth, **kwargs
    )
