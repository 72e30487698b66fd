"""The GRPO objective, written out so that each term can be checked by hand.

Per trained token t of sequence i, with ratio r = exp(logp - logp_old) against
the policy that sampled the rollout (the inference logprobs when the batch has
them) and advantage A:

    loss_t = -min(r * A, clip(r, 1 - eps_low, 1 + eps_high) * A) + kl_coef * k3_t
    k3_t   = exp(logp_ref - logp) - (logp_ref - logp) - 1

`min` is what makes the clip one-sided in the right direction for both signs
of A: for A > 0 the gradient vanishes once r > 1 + eps_high, for A < 0 once
r < 1 - eps_low, and in every other case it flows. (Taking the max for A < 0,
as the Atropos example trainer does, un-clips harmful updates and zeroes
useful ones.)

Normalisation is over the whole accumulated batch, never per micro-batch:
"token" (DAPO-style, the default) divides the sum over all trained tokens of
all micro-batches by their total count; "sequence" averages each sequence over
its own tokens and divides by the total number of sequences. Callers pass those
totals, so gradient accumulation gives the same gradient however the batch is
split.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch


@dataclass
class LossSettings:
    clip_eps: float = 0.2
    clip_eps_high: float | None = None  # asymmetric clipping (DAPO's clip-higher)
    kl_coef: float = 0.0
    normalization: Literal["token", "sequence"] = "token"

    @property
    def eps_high(self) -> float:
        return self.clip_eps if self.clip_eps_high is None else self.clip_eps_high


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """log p(input_ids[:, t] | input_ids[:, :t]) for t >= 1, shape [B, T-1] (labels shifted)."""
    logprobs = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    return logprobs.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)


def group_advantages(
    scores: torch.Tensor, scale: Literal["group", "none"] = "group"
) -> torch.Tensor:
    """Score minus the group mean, divided by the group std when `scale == "group"`."""
    centred = scores - scores.mean()
    if scale == "group" and scores.numel() > 1:
        centred = centred / (scores.std() + 1e-6)
    return centred


def grpo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    settings: LossSettings,
    total_tokens: int,
    total_sequences: int,
    ref_logprobs: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Loss of one micro-batch ([B, T] tensors; `mask` marks trained tokens).

    `total_tokens` / `total_sequences` count the whole accumulated batch, so the
    micro-batch losses add up to the batch loss.
    """
    mask = mask.to(logprobs.dtype)
    old_logprobs = old_logprobs.detach()
    ratio = torch.exp(logprobs - old_logprobs)
    low, high = 1.0 - settings.clip_eps, 1.0 + settings.eps_high
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, low, high) * advantages
    per_token = -torch.minimum(unclipped, clipped)
    pg_per_token = per_token
    kl_per_token = torch.zeros_like(per_token)
    if settings.kl_coef > 0 and ref_logprobs is not None:
        delta = ref_logprobs.detach() - logprobs
        kl_per_token = torch.exp(delta) - delta - 1.0
        per_token = per_token + settings.kl_coef * kl_per_token

    if settings.normalization == "token":
        weights = mask / max(total_tokens, 1)
    else:
        lengths = mask.sum(dim=1, keepdim=True).clamp(min=1.0)
        weights = mask / lengths / max(total_sequences, 1)
    loss = (per_token * weights).sum()

    with torch.no_grad():
        trained = mask.sum().clamp(min=1.0)
        gradient_cut = ((advantages > 0) & (ratio > high)) | ((advantages < 0) & (ratio < low))
        metrics = {
            "pg_loss": float((pg_per_token * weights).sum()),
            "kl": float((kl_per_token * mask).sum() / trained),
            "clip_fraction": float((gradient_cut.to(mask.dtype) * mask).sum() / trained),
            "logprob_mismatch": float(((logprobs - old_logprobs).abs() * mask).sum() / trained),
            "ratio_mean": float((ratio * mask).sum() / trained),
            "tokens": float(mask.sum()),
        }
    return loss, metrics
