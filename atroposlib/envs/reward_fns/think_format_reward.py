"""Registered as "think_format": 1.0 for one well-formed `<think>` block followed by an answer.

Why this shape: reasoning models are prompted to think inside `<think> </think>` and then
answer; graders (see `math_verify`) only read what follows `</think>`. A completion that
never closes its reasoning, opens several blocks, nests them, leaves the block empty or
stops right after `</think>` has not produced that shape, so it scores 0.0. The check is
on the tags only; whether the answer is right is another reward's job, so the two can be
weighted separately (`math_think` combines them for the math environments).

Reference: TRL's `think_format_reward` (`trl/rewards/format_rewards.py`); the two agree
on 345 of 400 seeded cases (docs/rewards.md). Deliberate differences, each because the
lenient verdict pays for a shape no grader can use: an empty reasoning block, nothing
after `</think>` (unless `require_answer=False`) and a second `</think>` score 0.0 here
and 1.0 in TRL; whitespace before `<think>` is allowed here (TRL scores it 0.0).
"""

from __future__ import annotations

from typing import Any

from .registry import registry
from .reward_function import RewardFunction


def think_format_ok(text: str, require_answer: bool = True) -> bool:
    """True for `<think>reasoning</think>answer`: one block, first, non-empty parts."""
    body = (text or "").strip()
    if not body.startswith("<think>"):
        return False
    if body.count("<think>") != 1 or body.count("</think>") != 1:
        return False
    thinking, _, answer = body[len("<think>") :].partition("</think>")
    return bool(thinking.strip()) and (bool(answer.strip()) or not require_answer)


@registry.register(name="think_format")
class ThinkFormatReward(RewardFunction):
    """1.0 when the completion is one non-empty `<think>` block then an answer, else 0.0."""

    def __init__(self, require_answer: bool = True, weight: float = 1.0, **kwargs: Any) -> None:
        super().__init__(weight=weight, **kwargs)
        self.require_answer = require_answer

    def compute(self, completions: list[Any], **kwargs: Any) -> list[float]:
        """1.0 or 0.0 per completion."""
        return [
            float(think_format_ok(self.get_content(c), self.require_answer)) for c in completions
        ]
