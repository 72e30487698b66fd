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

# A log-ratio (or KL log-ratio) beyond +-20 (a factor of 5e8) is clamped, and its
# gradient stops there: exp() of it would overflow float32 at 88, and one such token
# would otherwise decide the whole clipped gradient of the step.
LOG_RATIO_LIMIT = 20.0


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
    """Score minus the group mean, divided by the group std when `scale == "group"`.

    Computed in float64 with two exact cases, because float32 rounding of the mean
    divided by a std of ~0 turned equal scores into a systematic push (`[0.9] * 16`
    gave -0.056 each): equal scores carry no signal and give exactly 0, and a group
    of one keeps its raw score (there is nothing to compare it with; upstream's
    trainer does the same).
    """
    wide = scores.to(torch.float64)
    if wide.numel() == 1:
        return scores.clone()
    if bool((wide == wide[0]).all()):
        return torch.zeros_like(scores)
    centred = wide - wide.mean()
    if scale == "group":
        centred = centred / (wide.std() + 1e-6)
    return centred.to(scores.dtype)


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
    trained = mask.bool()
    mask = trained.to(logprobs.dtype)
    # untrained positions hold placeholders (1.0, NaN, -inf, vLLM's -9999): they are
    # replaced before exp(), since inf * 0 weight would still be NaN in loss and grad
    advantages = torch.where(trained, advantages, 0.0)
    log_ratio = torch.where(trained, logprobs - old_logprobs.detach(), 0.0)
    ratio = torch.exp(log_ratio.clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT))
    low, high = 1.0 - settings.clip_eps, 1.0 + settings.eps_high
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, low, high) * advantages
    per_token = -torch.minimum(unclipped, clipped)
    pg_per_token = per_token
    kl_per_token = torch.zeros_like(per_token)
    if settings.kl_coef > 0 and ref_logprobs is not None:
        delta = torch.where(trained, ref_logprobs.detach() - logprobs, 0.0)
        delta = delta.clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
        kl_per_token = torch.exp(delta) - delta - 1.0
        per_token = per_token + settings.kl_coef * kl_per_token

    if settings.normalization == "token":
        weights = mask / max(total_tokens, 1)
    else:
        lengths = mask.sum(dim=1, keepdim=True).clamp(min=1.0)
        weights = mask / lengths / max(total_sequences, 1)
    loss = (per_token * weights).sum()

    with torch.no_grad():
        count = mask.sum().clamp(min=1.0)
        gradient_cut = ((advantages > 0) & (ratio > high)) | ((advantages < 0) & (ratio < low))
        metrics = {
            "pg_loss": float((pg_per_token * weights).sum()),
            "kl": float((kl_per_token * mask).sum() / count),
            "clip_fraction": float((gradient_cut.to(mask.dtype) * mask).sum() / count),
            "logprob_mismatch": float(log_ratio.abs().sum() / count),
            "ratio_mean": float((ratio * mask).sum() / count),
            "tokens": float(mask.sum()),
        }
    return loss, metrics
