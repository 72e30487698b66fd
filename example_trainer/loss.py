"""The policy losses, written out so that each term can be checked by hand.

Per trained token t of sequence i, with advantage A and log-ratio
l_t = logp_t - logp_old_t against the ratio's reference (`--ratio-reference`: the
rollout's inference logprobs, as upstream, or the trainer's own before the update,
as TRL and verl):

    r_t = exp(l_t)                            importance_sampling_level "token"
    r_t = exp(mean_{t in i} l_t)               "sequence": GSPO (arXiv:2507.18071)

then each registered loss (`losses.py`) turns r_t and A into a token's loss:

    grpo, dapo, dr_grpo:  loss_t = -min(r_t A, clip(r_t, 1 - eps_low, 1 + eps_high) A)
    cispo:                loss_t = -sg(min(r_t, eps_high)) A logp_t   (MiniMax-M1,
                          arXiv:2506.13585; sg = stop-gradient; eps_high is the weight's
                          absolute cap, as TRL's epsilon_high is for cispo)

then, in this order: times the importance-sampling correction weight w_t
(`importance.py`), plus kl_coef * k3_t with k3_t = exp(ref_t - logp_t) - (ref_t -
logp_t) - 1 against the reference logprobs, plus distill_coef times the
distillation term where a teacher covered the position (`distill.py`).

The loss's registration decides the normaliser, always over the whole accumulated
batch, never per micro-batch (callers pass the batch's totals, so gradient
accumulation gives the same gradient however the batch is split):

    dapo, cispo:  sum over all trained tokens / their count       (DAPO, arXiv:2503.14476)
    grpo:         each sequence's mean over its tokens / sequences (DeepSeekMath)
    dr_grpo:      sum / (sequences x max_length), a constant       (Dr. GRPO, arXiv:2503.20783)

An entropy bonus subtracts entropy_coef times the mean per-token entropy of the
trained tokens, whatever the loss type (as TRL's entropy_coef). These are TRL's
GRPOTrainer formulas (trl/trainer/grpo_trainer.py `_compute_loss`), and
tests/example_trainer/test_losses_vs_trl.py checks them against it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from example_trainer.distill import TeacherTopK, distill_per_token
from example_trainer.importance import (
    ImportanceSamplingMode,
    correction_weights,
    mismatch_kl,
    segment_sums,
)
from example_trainer.losses import LOG_RATIO_LIMIT, DistillMode, LossInputs, LossKind, loss_kind

METRIC_REDUCTIONS = {
    "pg_loss": "sum",
    "kl": "mean",
    "clip_fraction": "mean",
    "logprob_mismatch": "mean",
    "ratio_mean": "mean",
    "entropy": "mean",
    "mismatch_kl": "mean",
    "is_weight_mean": "mean",
    "is_weight_max": "max",
    "is_clip_fraction": "mean",
    "distill_loss": "sum",
    "distill_kl_sum": "sum",
    "distill_positions": "sum",
}
"""How a micro-batch's metric joins the step's: summed, averaged over trained tokens, or
the largest. Metrics a micro-batch does not compute are absent from its dict."""


@dataclass
class LossSettings:
    loss_type: str = "dapo"
    """A registered loss (`losses.LOSSES`)."""
    importance_sampling_level: Literal["token", "sequence"] = "token"
    clip_eps: float = 0.2
    clip_eps_high: float | None = None  # asymmetric clipping (DAPO's clip-higher); cispo's cap
    kl_coef: float = 0.0
    entropy_coef: float = 0.0
    max_length: int = 1
    """Dr. GRPO's constant: the longest sequence trained (--seq-len)."""
    is_mode: ImportanceSamplingMode | None = None
    """Importance-sampling correction against the rollout's logprobs (None: off)."""
    is_clip_min: float | None = None
    is_clip_max: float | None = 3.0
    distill_coef: float = 0.0
    """Weight of the distillation term (its metrics are computed whenever a teacher is)."""
    distill_mode: DistillMode = "reverse_kl"

    def __post_init__(self) -> None:
        if self.kind.ratio_level == "sequence":  # the loss is defined on it (GSPO)
            self.importance_sampling_level = "sequence"

    @property
    def eps_high(self) -> float:
        return self.clip_eps if self.clip_eps_high is None else self.clip_eps_high

    @property
    def kind(self) -> LossKind:
        return loss_kind(self.loss_type)


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """log p(input_ids[:, t] | input_ids[:, :t]) for t >= 1, shape [B, T-1] (labels shifted)."""
    logprobs = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    return logprobs.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of each position's next-token distribution, [B, T-1] like `token_logprobs`."""
    logprobs = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    return -(logprobs.exp() * logprobs).sum(-1)


def row_segments(mask: torch.Tensor) -> torch.Tensor:
    """Sequence numbers of padded rows: row r is sequence r."""
    rows = torch.arange(mask.shape[0], device=mask.device)[:, None]
    return rows.expand(mask.shape)


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    settings: LossSettings,
    total_tokens: int,
    total_sequences: int,
    *,
    segments: torch.Tensor | None = None,
    behaviour_logprobs: torch.Tensor | None = None,
    ref_logprobs: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    teacher: TeacherTopK | None = None,
    labels: torch.Tensor | None = None,
    student_topk: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Loss of one micro-batch ([B, T] tensors; `mask` marks trained tokens).

    `total_tokens` / `total_sequences` count the whole accumulated batch, so the
    micro-batch losses add up to the batch loss. `segments` numbers each position's
    sequence (packed rows hold several; default: one per row). `behaviour_logprobs`
    are the rollout's, for the correction weight and the mismatch metrics; `entropy`
    the policy's per-token entropy, for the bonus. `teacher`: the distillation targets,
    with the `labels` (the sampled tokens) and, for forward_topk, `student_topk` (the
    policy's logprobs at the teacher's ids).
    """
    trained = mask.bool()
    mask = trained.to(logprobs.dtype)
    segments = row_segments(trained) if segments is None else segments
    count = int(segments.max()) + 1 if segments.numel() else 0
    lengths = segment_sums(mask, segments, trained, count).clamp(min=1.0)
    # untrained positions hold placeholders (1.0, NaN, -inf, vLLM's -9999): they are
    # replaced before exp(), since inf * 0 weight would still be NaN in loss and grad
    advantages = torch.where(trained, advantages, 0.0)
    log_ratio = torch.where(trained, logprobs - old_logprobs.detach(), 0.0)
    if settings.importance_sampling_level == "sequence":
        mean_log_ratio = segment_sums(log_ratio, segments, trained, count) / lengths
        log_ratio_used = mean_log_ratio[segments.clamp(min=0)]
    else:
        log_ratio_used = log_ratio
    ratio = torch.exp(log_ratio_used.clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT))
    kind = settings.kind
    answer = kind.per_token(
        LossInputs(
            logprobs=torch.where(trained, logprobs, 0.0),
            ratio=ratio,
            advantages=advantages,
            trained=trained,
            clip_low=1.0 - settings.clip_eps,
            clip_high=settings.eps_high,
        )
    )
    tokens = mask.sum().clamp(min=1.0)
    if behaviour_logprobs is None:
        metrics = {"logprob_mismatch": float(log_ratio.detach().abs().sum() / tokens)}
        pg_per_token = answer.per_token
    else:
        weights, metrics = _behaviour_terms(
            logprobs.detach(), behaviour_logprobs, trained, segments, count, settings
        )
        pg_per_token = answer.per_token if weights is None else answer.per_token * weights
    kl_per_token = torch.zeros_like(pg_per_token)
    if settings.kl_coef > 0 and ref_logprobs is not None:
        kl_per_token = _k3(logprobs, ref_logprobs, trained)
    normaliser = _normaliser(
        kind, settings.max_length, mask, segments, lengths, total_tokens, total_sequences
    )
    loss = ((pg_per_token + settings.kl_coef * kl_per_token) * normaliser).sum()
    if entropy is not None:
        entropy_sum = torch.where(trained, entropy, 0.0).sum()
        if settings.entropy_coef:
            loss = loss - settings.entropy_coef * entropy_sum / max(total_tokens, 1)
        metrics["entropy"] = float(entropy_sum.detach() / tokens)
    if teacher is not None and labels is not None:
        per_token, estimate, covered = distill_per_token(
            settings.distill_mode,
            logprobs,
            teacher.ids,
            teacher.logprobs,
            labels,
            trained,
            student_topk,
        )
        distill_loss = (per_token * normaliser).sum()
        if settings.distill_coef:
            loss = loss + settings.distill_coef * distill_loss
        metrics["distill_loss"] = float(distill_loss.detach())
        metrics["distill_kl_sum"] = float((estimate * covered).sum())
        metrics["distill_positions"] = float(covered.sum())

    with torch.no_grad():
        metrics.update(
            pg_loss=float((pg_per_token * normaliser).sum()),
            kl=float((kl_per_token * mask).sum() / tokens),
            clip_fraction=float((answer.gradient_cut.to(mask.dtype) * mask).sum() / tokens),
            ratio_mean=float((ratio * mask).sum() / tokens),
            tokens=float(mask.sum()),
        )
    return loss, metrics


@torch.no_grad()
def _behaviour_terms(
    logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    trained: torch.Tensor,
    segments: torch.Tensor,
    count: int,
    settings: LossSettings,
) -> tuple[torch.Tensor | None, dict[str, float]]:
    """Against the rollout's logprobs: the correction weight of each token's policy
    gradient (None without `is_mode`) and the mismatch metrics."""
    mask = trained.to(logprobs.dtype)
    tokens = mask.sum().clamp(min=1.0)
    behaviour = torch.where(trained, behaviour_logprobs, logprobs)
    gap = torch.where(trained, logprobs - behaviour, 0.0)
    kl_gap = torch.where(trained, mismatch_kl(logprobs, behaviour), 0.0)
    metrics = {
        "logprob_mismatch": float(gap.abs().sum() / tokens),
        "mismatch_kl": float(kl_gap.sum() / tokens),
    }
    if settings.is_mode is None:
        return None, metrics
    weights, cut = correction_weights(
        logprobs,
        behaviour,
        trained,
        segments,
        count,
        settings.is_mode,
        settings.is_clip_min,
        settings.is_clip_max,
    )
    metrics["is_weight_mean"] = float((weights * mask).sum() / tokens)
    metrics["is_weight_max"] = float(weights.max()) if weights.numel() else 0.0
    metrics["is_clip_fraction"] = float(cut.to(mask.dtype).sum() / tokens)
    return weights, metrics


def _k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, trained: torch.Tensor) -> torch.Tensor:
    """Each token's k3 estimate of KL(policy || reference), with the policy's gradient."""
    delta = torch.where(trained, ref_logprobs.detach() - logprobs, 0.0)
    delta = delta.clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
    return torch.exp(delta) - delta - 1.0


def _normaliser(
    kind: LossKind,
    max_length: int,
    mask: torch.Tensor,
    segments: torch.Tensor,
    lengths: torch.Tensor,
    total_tokens: int,
    total_sequences: int,
) -> torch.Tensor:
    """Each token's weight in the batch loss (`losses.Normaliser`)."""
    if kind.normaliser == "sequence":
        return mask / lengths[segments.clamp(min=0)] / max(total_sequences, 1)
    if kind.normaliser == "constant":
        return mask / (max(total_sequences, 1) * max(max_length, 1))
    return mask / max(total_tokens, 1)
