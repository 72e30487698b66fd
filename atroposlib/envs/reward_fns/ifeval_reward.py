"""Registered as "ifeval": the share of verifiable instructions a completion follows.

Graded by lm-eval's IFEval checkers (`_ifeval_checks` says how); docs/rewards.md gives
the measured agreement with lm-eval's strict mode.

Design decisions:

- **Score.** The fraction of the item's constraints that hold (instruction-level
  credit), so a response that follows two of three instructions is told so; with
  `all_or_nothing=True` it is 1.0 only when every constraint holds (IFEval's strict
  prompt-level accuracy). `all_met_bonus` adds a fixed amount when all hold, a middle
  way that keeps partial credit but prefers complete answers.
- **Only the response is judged.** The text after the last `</think>`; an unclosed
  `<think>` leaves no response and scores 0.0, so keywords written while reasoning
  earn nothing. As in lm-eval, an empty response follows nothing, not even "no commas".
- **Constraints come in either hub shape**: google/IFEval's `instruction_id_list` +
  `kwargs` columns (pass a row as `reward(completions, **row)`), or allenai/RLVR-IFeval's
  `ground_truth` JSON.
- **It never raises while grading.** A constraint it cannot check (unknown id, an
  argument lm-eval would replace with a random one, punkt data missing) scores 0.0 for
  every completion and is logged once with the reason; an exception in one completion's
  check scores that completion 0.0 and leaves the rest of the batch alone.

Deliberate differences from lm-eval's strict mode, each with its reason:
- the response after `</think>` is graded, stripped (lm-eval has no reasoning block);
- a constraint lm-eval would grade against random arguments is refused, as above;
- relations beyond "less than"/"at least" (RLVR-IFeval's) are bounds on lm-eval's count;
- a keyword that is not a valid regular expression (lm-eval searches keywords as
  regexes, and raises) fails that completion's check instead of raising;
- langdetect is seeded (lm-eval's verdict on borderline text can change between runs).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from ._ifeval_checks import (
    Check,
    Constraint,
    UnsupportedInstruction,
    compile_constraints,
    constraints_from_rlvr,
    lm_eval_instructions,
    loose,
    response_text,
    strict,
)
from .registry import registry
from .reward_function import RewardFunction, log_once

# the checker API environments grade with, besides the reward itself
__all__ = [
    "Check",
    "IFEvalReward",
    "UnsupportedInstruction",
    "compile_constraints",
    "constraints_of",
    "followed",
    "ifeval_score",
    "loose",
    "response_text",
    "strict",
]

logger = logging.getLogger(__name__)


def constraints_of(
    instruction_id_list: list[str] | None = None,
    kwargs: list[Mapping[str, Any] | None] | None = None,
    ground_truth: str | Mapping[str, Any] | None = None,
) -> list[Constraint]:
    """(instruction id, kwargs) pairs from IFEval columns or an RLVR-IFeval ground truth."""
    if instruction_id_list is not None:
        given = list(kwargs or [])
        given += [{}] * (len(instruction_id_list) - len(given))
        return [(i, dict(k or {})) for i, k in zip(instruction_id_list, given, strict=True)]
    if ground_truth is not None:
        return constraints_from_rlvr(ground_truth)
    raise UnsupportedInstruction("give instruction_id_list (+ kwargs) or ground_truth")


def followed(completion: str, checks: list[Check]) -> list[bool]:
    """For each check, whether the completion's response follows it (lm-eval's strict mode)."""
    return strict(response_text(completion), checks)


def ifeval_score(
    completion: str,
    checks: list[Check],
    all_or_nothing: bool = False,
    all_met_bonus: float = 0.0,
) -> float:
    """Fraction followed (or 0/1 with `all_or_nothing`), plus `all_met_bonus` when all are."""
    results = followed(completion, checks)
    if not results:
        return 0.0
    every = all(results)
    base = float(every) if all_or_nothing else sum(results) / len(results)
    return base + (all_met_bonus if every else 0.0)


@registry.register
class IFEvalReward(RewardFunction):
    """Instruction-following reward; see the module docstring for the rules."""

    def __init__(
        self,
        all_or_nothing: bool = False,
        all_met_bonus: float = 0.0,
        weight: float = 1.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(weight=weight, **kwargs)
        lm_eval_instructions()  # a missing lm-eval is a setup error, said at once
        self.all_or_nothing = all_or_nothing
        self.all_met_bonus = all_met_bonus

    def compute(
        self,
        completions: list[Any],
        instruction_id_list: list[str] | None = None,
        ground_truth: str | Mapping[str, Any] | None = None,
        prompt: str = "",
        **kwargs: Any,
    ) -> list[float]:
        """Score each completion against one item's constraints.

        The item's kwargs column is accepted as `kwargs=` (IFEval's name) or
        `instruction_kwargs=`; `prompt` is the item's prompt, as lm-eval passes it.
        """
        instruction_kwargs = kwargs.get("instruction_kwargs", kwargs.get("kwargs"))
        try:
            constraints = constraints_of(instruction_id_list, instruction_kwargs, ground_truth)
            checks = compile_constraints(constraints, prompt)
        except (ValueError, TypeError) as error:  # UnsupportedInstruction is a ValueError
            log_once(logger, f"ifeval: this item cannot be graded, scoring 0.0: {error}")
            return [0.0] * len(completions)
        return self.score_each(
            completions,
            lambda text: ifeval_score(text, checks, self.all_or_nothing, self.all_met_bonus),
        )
