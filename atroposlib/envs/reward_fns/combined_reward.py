"""A reward that sums other rewards, as upstream's `CombinedReward` does.

Faithful to upstream's scoring: the parts' raw `compute` scores are summed (their own
weights are not applied), and "sum" normalisation divides that total by the sum of the
parts' weights. A part that raises is logged and left out of the total.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from .registry import registry
from .reward_function import RewardFunction

logger = logging.getLogger(__name__)

NORMALIZATIONS = ("none", "sum", "minmax")


@registry.register
class CombinedReward(RewardFunction):
    """Sum of several reward functions, optionally normalised.

    `normalization`: "none" (plain sum), "sum" (divided by the total weight of the parts)
    or "minmax" (rescaled to [0, 1] across the batch; left as is when all are equal).
    """

    def __init__(
        self,
        rewards: list[str | Mapping[str, Any]],
        normalization: str = "none",
        weight: float = 1.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(weight=weight, **kwargs)
        if normalization not in NORMALIZATIONS:
            raise ValueError(
                f"unknown normalization {normalization!r}; expected one of {NORMALIZATIONS}"
            )
        self.normalization = normalization
        self.reward_functions: list[RewardFunction] = [registry.create(r) for r in rewards]

    @property
    def name(self) -> str:
        """`combined(part1,part2,...)`."""
        return f"combined({','.join(part.name for part in self.reward_functions)})"

    def set_wandb_logger(self, logger: Any) -> None:
        """Give the logger to this reward and to every part."""
        super().set_wandb_logger(logger)
        for part in self.reward_functions:
            part.set_wandb_logger(logger)

    def compute(self, completions: list[Any], **kwargs: Any) -> list[float]:
        """Summed raw scores of the parts, normalised as configured."""
        if not completions:
            return []
        totals = [0.0] * len(completions)
        for part in self.reward_functions:
            try:
                scores = part.compute(completions, **kwargs)
            except Exception:
                logger.exception("reward %s failed; left out of the combined score", part.name)
                continue
            for i, score in enumerate(scores[: len(totals)]):
                totals[i] += score
        return self._normalize(totals)

    def _normalize(self, totals: list[float]) -> list[float]:
        if self.normalization == "sum":
            total_weight = sum(part.weight for part in self.reward_functions)
            if total_weight > 0:
                return [t / total_weight for t in totals]
        elif self.normalization == "minmax":
            low, high = min(totals), max(totals)
            if high > low:
                return [(t - low) / (high - low) for t in totals]
        return totals
