"""Registered as "ifeval": the share of verifiable instructions a completion follows.

Design decisions:

- **Score.** The fraction of the item's constraints that hold (instruction-level
  credit), so a response that follows two of three instructions is told so; with
  `all_or_nothing=True` it is 1.0 only when every constraint holds (IFEval's strict
  prompt-level accuracy). `all_met_bonus` adds a fixed amount when all hold, a middle
  way that keeps partial credit but prefers complete answers.
- **Only the response is judged.** The text after the last `</think>`; an unclosed
  `<think>` leaves no response and scores 0.0, so keywords written while reasoning
  earn nothing (see `_ifeval_checks.response_text`). An empty response scores 0.0 even
  for constraints an empty text would vacuously meet ("no commas").
- **Constraints come in either hub shape**: google/IFEval's `instruction_id_list` +
  `kwargs` columns (pass a row as `reward(completions, **row)`), or allenai/RLVR-IFeval's
  `ground_truth` JSON. An unknown instruction id is an error, not a silent 0.0.
"""

from __future__ import annotations

import logging
from typing import Any

from ._ifeval_checks import CHECKS, check, constraints_from_rlvr, response_text
from .registry import registry
from .reward_function import RewardFunction

logger = logging.getLogger(__name__)

Constraint = tuple[str, dict[str, Any]]


def constraints_of(
    instruction_id_list: list[str] | None = None,
    kwargs: list[dict[str, Any] | None] | None = None,
    ground_truth: str | dict[str, Any] | None = None,
) -> list[Constraint]:
    """(instruction id, kwargs) pairs from IFEval columns or an RLVR-IFeval ground truth."""
    if instruction_id_list is not None:
        kwargs = list(kwargs or [])
        kwargs += [{}] * (len(instruction_id_list) - len(kwargs))
        return [(i, k or {}) for i, k in zip(instruction_id_list, kwargs, strict=True)]
    if ground_truth is not None:
        return constraints_from_rlvr(ground_truth)
    raise ValueError("give instruction_id_list (+ kwargs) or ground_truth")


def followed(completion: str, constraints: list[Constraint]) -> list[bool]:
    """For each constraint, whether the completion's response follows it."""
    response = response_text(completion)
    if not response:
        return [False] * len(constraints)
    return [check(instruction_id, response, kw) for instruction_id, kw in constraints]


def ifeval_score(
    completion: str,
    constraints: list[Constraint],
    all_or_nothing: bool = False,
    all_met_bonus: float = 0.0,
) -> float:
    """Fraction followed (or 0/1 with `all_or_nothing`), plus `all_met_bonus` when all are."""
    results = followed(completion, constraints)
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
        self.all_or_nothing = all_or_nothing
        self.all_met_bonus = all_met_bonus

    def compute(
        self,
        completions: list[Any],
        instruction_id_list: list[str] | None = None,
        ground_truth: str | dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> list[float]:
        """Score each completion against one item's constraints.

        The item's kwargs column is accepted as `kwargs=` (IFEval's name) or
        `instruction_kwargs=`.
        """
        instruction_kwargs = kwargs.get("instruction_kwargs", kwargs.get("kwargs"))
        constraints = constraints_of(instruction_id_list, instruction_kwargs, ground_truth)
        unknown = [i for i, _ in constraints if i not in CHECKS]
        if unknown:
            raise KeyError(f"no check for instructions {unknown}")
        scores = [
            ifeval_score(self.get_content(c), constraints, self.all_or_nothing, self.all_met_bonus)
            for c in completions
        ]
        logger.debug("ifeval scores %s", scores)
        return scores
