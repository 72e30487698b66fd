"""One micro-batch's loss from the trainer's flags: which logprobs each term compares.

`loss.py` holds the arithmetic; this module decides its inputs:

- the PPO ratio's reference (`--ratio-reference`): the rollout's `inference_logprobs`
  (upstream's) or the trainer's own logprobs of the sampled tokens before the update.
  The trainer takes one optimizer step per batch, so those are this forward's
  logprobs, detached: the ratio is 1 in value and carries the gradient (TRL with
  num_iterations=1);
- the behaviour policy for the importance-sampling correction and the mismatch
  metrics: the rollout's `inference_logprobs` (sequences without them count as
  sampled by the trainer's policy: weight 1);
- the KL's reference: the environments' `ref_logprobs`, or `ReferencePolicy`.
"""

from __future__ import annotations

from typing import Any

import torch

from example_trainer.config import TrainingConfig
from example_trainer.data import MicroBatch
from example_trainer.loss import METRIC_REDUCTIONS, LossSettings, policy_loss
from example_trainer.reference import ReferencePolicy


def loss_settings(config: TrainingConfig) -> LossSettings:
    return LossSettings(
        loss_type=config.loss.loss_type,
        importance_sampling_level=config.loss.importance_sampling_level,
        clip_eps=config.loss.clip_eps,
        clip_eps_high=config.loss.clip_eps_high,
        kl_coef=config.loss.kl_coef,
        entropy_coef=config.loss.entropy_coef,
        max_length=config.batching.seq_len,
        is_mode=(
            config.loss.vllm_importance_sampling_mode
            if config.loss.vllm_importance_sampling_correction
            else None
        ),
        is_clip_min=config.loss.vllm_importance_sampling_clip_min,
        is_clip_max=config.loss.vllm_importance_sampling_clip_max,
        distill_coef=config.loss.distill_coef,
        distill_mode=config.loss.distill_mode,
    )


def fill_missing(values: torch.Tensor | None, logp: torch.Tensor) -> torch.Tensor:
    """Rows a sequence came without (NaN, or all when None) take the detached current logprobs."""
    if values is None:
        return logp.detach()
    values = values.to(logp.device)
    return torch.where(torch.isnan(values), logp.detach(), values)


class Objective:
    """The loss of a micro-batch given the policy's forward output (see the module docstring)."""

    def __init__(self, config: TrainingConfig, reference: ReferencePolicy | None = None) -> None:
        self.settings = loss_settings(config)
        self.against_trainer = config.loss.ratio_reference == "trainer"
        self.reference = reference

    def extra_ids(self, chunk: MicroBatch, device: torch.device) -> torch.Tensor | None:
        """The ids whose logprobs the forward must also answer: the teacher's top-k, when
        the distillation term reads the policy there (forward_topk)."""
        settings = self.settings
        if chunk.teacher is None or settings.distill_mode != "forward_topk":
            return None
        if not settings.distill_coef:
            return None
        chunk.teacher = chunk.teacher.to(device)  # moved once: `loss` reads it there too
        return chunk.teacher.ids

    def loss(
        self,
        chunk: MicroBatch,
        output: Any,
        total_tokens: int,
        total_sequences: int,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """`output`: the policy's token logprobs, or `PolicyLogprobs`'s dict of them."""
        parts = output if isinstance(output, dict) else {"logprobs": output}
        logp, entropy, student_topk = parts["logprobs"], parts.get("entropy"), parts.get("extra")
        device = logp.device
        teacher = chunk.teacher
        if teacher is not None and self.settings.distill_mode == "forward_topk":
            teacher = teacher if student_topk is not None else None  # reported with its term
        behaviour = fill_missing(chunk.old_logprobs, logp)
        old = logp.detach() if self.against_trainer else behaviour
        if self.reference is not None:
            ref = self.reference.logprobs(*forward_inputs(chunk, device), pixels=chunk.pixels)
        elif chunk.ref_logprobs is not None:
            ref = fill_missing(chunk.ref_logprobs, logp)
        else:
            ref = None
        return policy_loss(
            logp,
            old,
            chunk.advantages.to(device),
            chunk.loss_mask.to(device),
            self.settings,
            total_tokens,
            total_sequences,
            segments=chunk.segments.to(device),
            behaviour_logprobs=behaviour,
            ref_logprobs=ref,
            entropy=entropy,
            teacher=None if teacher is None else teacher.to(device),
            labels=chunk.input_ids[:, 1:].to(device),
            student_topk=student_topk,
        )


def forward_inputs(
    chunk: MicroBatch, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """The forward's inputs of a micro-batch (ids, mask, position ids), on `device`."""
    mask, positions = chunk.attention_mask, chunk.position_ids
    return (
        chunk.input_ids.to(device),
        None if mask is None else mask.to(device),
        None if positions is None else positions.to(device),
    )


class StepMetrics:
    """A step's metrics from its micro-batches': summed, token-weighted or the largest
    (`loss.METRIC_REDUCTIONS`); `joined` gives this rank's, ready for the ranks' reduction."""

    def __init__(self, settings: LossSettings, total_tokens: int) -> None:
        """Every metric the settings can produce starts at 0, so that all ranks reduce
        the same keys, an idle rank's included."""
        self.total_tokens = max(total_tokens, 1)
        names = ["pg_loss", "kl", "clip_fraction", "logprob_mismatch", "ratio_mean", "mismatch_kl"]
        if settings.entropy_coef:
            names.append("entropy")
        if settings.is_mode is not None:
            names += ["is_weight_mean", "is_clip_fraction"]
        names += list(DISTILL_SUMS)  # every rank, a teacher or not: finished() drops them
        self.sums = dict.fromkeys(["loss", *names], 0.0)
        self.maxima = dict.fromkeys(["is_weight_max"] if settings.is_mode else [], 0.0)

    def add(self, loss: float, metrics: dict[str, float]) -> None:
        self.sums["loss"] += loss
        share = metrics["tokens"] / self.total_tokens
        for key, value in metrics.items():
            how = METRIC_REDUCTIONS.get(key)
            if how == "max":
                self.maxima[key] = max(self.maxima.get(key, value), value)
            elif how is not None:
                weight = 1.0 if how == "sum" else share
                self.sums[key] = self.sums.get(key, 0.0) + value * weight

    @staticmethod
    def finished(joined: dict[str, float], total_tokens: int) -> dict[str, float]:
        """The ranks' joined sums as the step reports them: the distillation sums become
        `distill_kl` (per covered position) and `distill_coverage` (of trained positions),
        or are dropped when no position had a teacher."""
        out = {k: v for k, v in joined.items() if k not in DISTILL_SUMS}
        positions = joined.get("distill_positions", 0.0)
        if positions > 0:
            out["distill_loss"] = joined["distill_loss"]
            out["distill_kl"] = joined["distill_kl_sum"] / positions
            out["distill_coverage"] = positions / max(total_tokens, 1)
        return out


DISTILL_SUMS = ("distill_loss", "distill_kl_sum", "distill_positions")
"""The distillation metrics summed over micro-batches and ranks (see `finished`)."""
