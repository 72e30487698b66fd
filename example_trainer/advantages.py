"""Advantages of one group's rollouts: the baseline each score is compared with.

- `grpo` (DeepSeekMath, arXiv:2402.03300): score minus the group mean, divided by
  the group std unless `scale == "none"` (Dr. GRPO, arXiv:2503.20783, drops the std:
  it weights easy and hard questions unequally).
- `rloo` (REINFORCE Leave-One-Out, Ahmadian et al., arXiv:2402.14740): score minus
  the mean of the *other* rollouts' scores, an unbiased baseline; equal to the GRPO
  centring times k / (k - 1). TRL's RLOOTrainer computes the same.

Computed in float64 with two exact cases, because float32 rounding of the mean
divided by a std of ~0 turned equal scores into a systematic push (`[0.9] * 16`
gave -0.056 each): equal scores carry no signal and give exactly 0, and a group of
one keeps its raw score (there is nothing to compare it with; upstream's trainer
does the same).
"""

from __future__ import annotations

from typing import Literal

import torch

AdvantageEstimator = Literal["grpo", "rloo"]
AdvantageScale = Literal["group", "none"]


def group_advantages(
    scores: torch.Tensor,
    scale: AdvantageScale = "group",
    estimator: AdvantageEstimator = "grpo",
) -> torch.Tensor:
    """One advantage per score of a group (see the module docstring)."""
    wide = scores.to(torch.float64)
    count = wide.numel()
    if count == 1:
        return scores.clone()
    if bool((wide == wide[0]).all()):
        return torch.zeros_like(scores)
    if estimator == "rloo":
        centred = wide - (wide.sum() - wide) / (count - 1)
    else:
        centred = wide - wide.mean()
    if scale == "group":
        centred = centred / (wide.std() + 1e-6)
    return centred.to(scores.dtype)
