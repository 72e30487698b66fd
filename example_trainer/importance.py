"""Importance-sampling correction for the gap between the engine and the trainer.

The engine that sampled a rollout (vLLM, bf16 kernels, older weights) is not quite
the policy the trainer differentiates: its logprobs of the same tokens differ. With
`old` the trainer's own logprobs of the sampled tokens before the update and
`behaviour` the rollout's `inference_logprobs`, the correction weight is

    token level:     w_t = exp(old_t - behaviour_t)
    sequence level:  w   = exp(sum_t (old_t - behaviour_t))  for every token of the sequence

and the mode bounds it, as TRL's `vllm_importance_sampling_mode` does (names, defaults
and arithmetic are TRL's, trl/trainer/grpo_trainer.py):

    *_truncate:  w <- clamp(w, clip_min, clip_max)    (truncated IS, "TIS")
    *_mask:      w <- 0 where w < clip_min or w > clip_max  (masked IS, "MIS"/IcePop)

The weight is a constant of the loss (no gradient) that multiplies each token's
policy-gradient term. Tokens of a sequence that came without inference logprobs get
weight 1 (`behaviour == old`).
"""

from __future__ import annotations

import math
from typing import Literal

import torch

ImportanceSamplingMode = Literal[
    "token_truncate", "token_mask", "sequence_truncate", "sequence_mask"
]

# a log-weight beyond this is clamped before exp(): float32 overflows at 88
LOG_WEIGHT_LIMIT = 20.0


def segment_sums(
    values: torch.Tensor, segments: torch.Tensor, trained: torch.Tensor, count: int
) -> torch.Tensor:
    """Per sequence, the sum of `values` over its trained positions ([count])."""
    picked = torch.where(trained, values, 0.0).reshape(-1)
    index = segments.clamp(min=0).reshape(-1)
    return torch.zeros(count, dtype=values.dtype, device=values.device).index_add(0, index, picked)


def correction_weights(
    old: torch.Tensor,
    behaviour: torch.Tensor,
    trained: torch.Tensor,
    segments: torch.Tensor,
    count: int,
    mode: ImportanceSamplingMode,
    clip_min: float | None,
    clip_max: float | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The weight per position ([B, T], 0 off trained positions) and whether each was
    truncated or masked (bool [B, T]).

    `segments` numbers each position's sequence within the micro-batch (0..count-1);
    positions that are not trained are ignored whatever their number.
    """
    with torch.no_grad():
        diff = torch.where(trained, old.detach() - behaviour, 0.0)
        if mode.startswith("sequence"):
            per_sequence = segment_sums(diff, segments, trained, count)
            diff = per_sequence[segments.clamp(min=0)]
        raw = torch.exp(diff.clamp(-LOG_WEIGHT_LIMIT, LOG_WEIGHT_LIMIT))
        low = -math.inf if clip_min is None else clip_min
        high = math.inf if clip_max is None else clip_max
        outside = (raw < low) | (raw > high)
        if mode.endswith("truncate"):
            weights = raw.clamp(min=low, max=high)
        else:
            weights = raw.masked_fill(outside, 0.0)
        return torch.where(trained, weights, 0.0), outside & trained


def mismatch_kl(old: torch.Tensor, behaviour: torch.Tensor) -> torch.Tensor:
    """Per token, the k3 estimate of KL(behaviour || old) from a token the behaviour policy
    sampled: r - 1 - log r with r = exp(old - behaviour); non-negative, 0 when they agree."""
    log_ratio = (old - behaviour).clamp(-LOG_WEIGHT_LIMIT, LOG_WEIGHT_LIMIT)
    return torch.exp(log_ratio) - 1.0 - log_ratio
