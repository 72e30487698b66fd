r"""Registered as "math_think": the math environments' reward, correctness minus a format cost.

    score = correct - format_weight * (not well_formed)

`correct` is `math_verify` (final `\boxed{}` after `</think>` equals the gold) and
`well_formed` is `think_format`. The format term is a penalty, not a bonus: a wrong answer
never scores above 0 however tidy it is (upstream's math envs give wrong answers no
credit), and a right answer in a malformed `<think>` block scores `1 - format_weight`, so
the policy is still pushed toward the prompted shape. Scores are 1, 1 - w, 0 and -w.

A completion cut off by the token limit (`truncated`, or a completion dict whose
`finish_reason` is "length") scores as wrong and malformed: its final answer was never
written, and a `\boxed{}` seen so far is at best a draft. The environments also zero its
advantage (upstream's `mask_too_long_completions`).

Reference: none for the combination; its parts are `math_verify` (math-verify decides
equality) and `think_format` (compared with TRL's think_format_reward).
"""

from __future__ import annotations

from typing import Any

from .math_verify_reward import gold_list, grade_answer
from .registry import registry
from .reward_function import RewardFunction
from .think_format_reward import think_format_ok


def math_think_score(
    completion: str, gold: str | float | int, format_weight: float = 0.1, truncated: bool = False
) -> float:
    """Correctness (0/1) minus `format_weight` when the think/answer shape is broken."""
    if truncated:
        return -format_weight
    correct = grade_answer(completion, gold)
    return float(correct) - (0.0 if think_format_ok(completion) else format_weight)


def math_eval_fields(response: str, finish_reason: str | None, gold: str) -> dict[str, Any]:
    """A greedy eval answer graded as upstream's math servers grade it: right only when
    math-verify agrees and the answer was not cut off; the format is reported, not scored."""
    correct = finish_reason != "length" and grade_answer(response, gold)
    return {
        "response": response,
        "score": int(correct),
        "correct": correct,
        "format_ok": think_format_ok(response),
        "finish_reason": finish_reason,
    }


@registry.register(name="math_think")
class MathThinkReward(RewardFunction):
    """`math_verify` minus `format_weight` for a malformed `<think>` block (see module doc)."""

    def __init__(self, format_weight: float = 0.1, weight: float = 1.0, **kwargs: Any) -> None:
        super().__init__(weight=weight, **kwargs)
        self.format_weight = format_weight

    def compute(
        self, completions: list[Any], answer: Any = None, ground_truth: Any = None, **kwargs: Any
    ) -> list[float]:
        """Score each completion against `answer` (or `ground_truth`)."""
        golds = gold_list(len(completions), answer if answer is not None else ground_truth)
        if golds is None:
            return [0.0] * len(completions)
        return [
            math_think_score(
                self.get_content(c),
                g,
                self.format_weight,
                truncated=isinstance(c, dict) and c.get("finish_reason") == "length",
            )
            for c, g in zip(completions, golds, strict=False)
        ]
