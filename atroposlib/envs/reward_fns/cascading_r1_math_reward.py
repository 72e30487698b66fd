"""Registered (lazily) as "cascading_r1_math": accuracy, plus a format bonus only if correct.

Upstream keeps this one as plain functions, so the registry wraps
`cascading_r1_math_reward` in `LegacyFunctionWrapper`. It reads completions more
loosely than `RewardFunction.get_content` (any dict with "content", a list's first
message, else `str(completion)`), which is kept for identical scores.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from ._answer_check import extract_final_answer as _extract_final_answer
from ._answer_check import normalize_number as _normalize_numerical_value
from ._answer_check import verify_answer as _verify_answer

logger = logging.getLogger(__name__)

__all__ = [
    "_extract_final_answer",
    "_normalize_numerical_value",
    "_verify_answer",
    "accuracy_reward",
    "cascading_r1_math_reward",
    "format_reward",
    "get_completion_content",
]

_THINK_FORMAT = re.compile(r"^<think>[^<]*</think>[^<]*$", re.DOTALL)
_MAX_BOXED = 6


def get_completion_content(completion: Any) -> str:
    """Text of a completion: a string, a dict's (or its "message"'s) content, a list's first."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        if "content" in completion:
            return completion["content"]
        message = completion.get("message", {})
        if isinstance(message, dict):
            return message.get("content", "")
    elif isinstance(completion, list) and completion:
        first = completion[0]
        if isinstance(first, dict) and "content" in first:
            return first["content"]
    logger.warning("could not find the content of completion %r", completion)
    return str(completion)


def format_reward(completions: list[Any], reward_value: float = 0.5, **kwargs: Any) -> list[float]:
    """`reward_value` for exactly one `<think>...</think>` block and no other tags, else 0.0."""
    try:
        contents = [get_completion_content(c) for c in completions]
        return [reward_value if _THINK_FORMAT.match(text) else 0.0 for text in contents]
    except Exception:
        logger.exception("format reward failed; scoring 0.0")
        return [0.0] * len(completions)


def accuracy_reward(completions: list[Any], solution: Any, **kwargs: Any) -> list[float]:
    """1.0 when the answer after the last `</think>` matches `solution`, else 0.0."""
    answers = solution if isinstance(solution, list) else [solution] * len(completions)
    rewards = []
    for completion, answer in zip(completions, answers, strict=False):
        try:
            content = get_completion_content(completion)
            answer_part = content.split("</think>")[-1]
            if "</think>" in content and answer_part.count("\\boxed") > _MAX_BOXED:
                reward = 0.0
            else:
                reward = float(_verify_answer(answer_part, answer))
        except Exception as exc:
            logger.warning("accuracy check failed on one completion: %s", exc)
            reward = 0.0
        rewards.append(reward)
    return rewards


def cascading_r1_math_reward(completions: list[Any], solution: Any, **kwargs: Any) -> list[float]:
    """Accuracy (0 or 1) plus the 0.5 format bonus, the bonus counted only when correct."""
    try:
        accuracy = accuracy_reward(completions, solution, **kwargs)
        formatting = format_reward(completions)
        pairs = zip(accuracy, formatting, strict=False)
        return [acc + (fmt if acc > 0 else 0.0) for acc, fmt in pairs]
    except Exception:
        logger.exception("cascading_r1_math reward failed; scoring 0.0")
        return [0.0] * len(completions)
