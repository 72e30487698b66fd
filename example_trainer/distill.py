"""On-policy distillation: the student's tokens against a teacher's top-k.

A group may carry `distill_token_ids` / `distill_logprobs` ([sequence][position][k],
atroposlib.protocol): at position t the teacher's top-k over token t given the
tokens before it, ids in the student's vocabulary (`TeacherDistillationEnv` fills
them from a teacher engine's prompt logprobs). The data layer aligns them with the
label positions (`data.TeacherTopK`); this module turns them into a per-token loss,
added to the policy loss as `--distill-coef` times it, weighted per token like the
policy term (the loss type's normaliser), on the trained positions the teacher
covered. Two estimators (`--distill-mode`):

- `reverse_kl` (Tinker's on-policy distillation recipe, also GKD with lambda 1):
  KL(student || teacher) estimated on the sampled token x_t, k1 = log p_s(x_t) -
  log p_t(x_t). Its on-policy gradient is E[k1 * grad log p_s(x_t)], so the term is
  sg(k1) * log p_s(x_t): a per-token reward -k1, with no credit to earlier tokens. It
  needs the teacher's logprob of the sampled token, which vLLM's prompt logprobs
  always include; a position without it is not covered.
- `forward_topk`: KL(teacher || student) over the ids the teacher listed plus one
  outcome for the rest of the vocabulary: sum_k p_t(k) (log p_t(k) - log p_s(k)) +
  r_t (log r_t - log r_s), with r = 1 - sum_k p(k). A true KL between two coarsened
  distributions, so it is 0 only where the student matches the teacher on every listed
  id and on the rest, and with top_k 0 (the sampled token alone) it is the Bernoulli
  KL of that token: never a plain push up of whatever was sampled. Dense (every listed
  token gets a gradient, sampled or not), at the cost of the student's logprobs at K
  ids per position (`logprobs.head_outputs`).

The metric `distill_kl` is the term's own KL estimate averaged over covered
positions; `distill_coverage` the share of trained positions that had a teacher.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from example_trainer.losses import LOG_RATIO_LIMIT, DistillMode

REST_FLOOR = 1e-6
"""The least mass the unlisted tokens keep in forward_topk (their log stays finite)."""


@dataclass
class TeacherTopK:
    """A micro-batch's distillation targets, aligned with its label positions: position t
    of a row holds the teacher's top-k for the token at t + 1 (its `distill_*[t + 1]`).
    Entries a position lacks (a narrower top-k, a sequence without a teacher, padding)
    are id 0 with logprob -inf, so a position is covered where any logprob is finite."""

    ids: torch.Tensor  # [B, T-1, K] long
    logprobs: torch.Tensor  # [B, T-1, K] float32

    def to(self, device: torch.device) -> TeacherTopK:
        return TeacherTopK(self.ids.to(device), self.logprobs.to(device))


@dataclass
class TeacherRows:
    """One sequence's teacher arrays as its group gave them: per position, the top-k ids
    and their logprobs (cut at --seq-len with the tokens)."""

    ids: list[list[int]]
    logprobs: list[list[float]]


def teacher_rows(group: Any, index: int, length: int) -> TeacherRows | None:
    """Sequence `index`'s rows of a group's `distill_token_ids` / `distill_logprobs`,
    the first `length`; None unless the group carries both (`group_problems` checks
    them only together, and one alone teaches nothing)."""
    ids, logprobs = group.distill_token_ids, group.distill_logprobs
    if ids is None or logprobs is None:
        return None
    return TeacherRows(
        [list(row) for row in ids[index][:length]],
        [list(row) for row in logprobs[index][:length]],
    )


def teacher_logprob_of(
    ids: torch.Tensor, logprobs: torch.Tensor, labels: torch.Tensor
) -> torch.Tensor:
    """The teacher's logprob of each label ([B, T-1]); -inf where its top-k lacks it."""
    found = (ids == labels.unsqueeze(-1)) & torch.isfinite(logprobs)
    return torch.where(found, logprobs, -torch.inf).amax(-1)


def distill_per_token(
    mode: DistillMode,
    logprobs: torch.Tensor,
    teacher_ids: torch.Tensor,
    teacher_logprobs: torch.Tensor,
    labels: torch.Tensor,
    trained: torch.Tensor,
    student_topk: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(each position's loss, its KL estimate (detached), covered positions), [B, T-1].

    `logprobs`: the student's logprob of each label; `student_topk`: its logprobs at
    `teacher_ids` ([B, T-1, K], forward_topk only). Uncovered positions give 0."""
    if mode == "reverse_kl":
        teacher = teacher_logprob_of(teacher_ids, teacher_logprobs, labels)
        covered = trained & torch.isfinite(teacher)
        k1 = torch.where(covered, logprobs.detach() - teacher, 0.0)
        k1 = k1.clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
        per_token = torch.where(covered, k1 * logprobs, 0.0)
        return per_token, k1, covered
    if student_topk is None:
        raise ValueError("forward_topk needs the student's logprobs at the teacher's ids")
    present = trained.unsqueeze(-1) & torch.isfinite(teacher_logprobs)
    covered = present.any(-1)
    teacher_log = torch.where(present, teacher_logprobs, 0.0)
    teacher_p = torch.where(present, teacher_log.exp(), 0.0)
    student_log = torch.where(present, student_topk, 0.0)
    student_p = torch.where(present, student_log.exp(), 0.0)
    listed = (teacher_p * (teacher_log - student_log)).sum(-1)
    # the rest of the vocabulary as one outcome: its mass, kept off 0 for the log
    teacher_rest = (1.0 - teacher_p.sum(-1)).clamp(min=REST_FLOOR)
    student_rest = (1.0 - student_p.sum(-1)).clamp(min=REST_FLOOR)
    rest = teacher_rest * (teacher_rest.log() - student_rest.log())
    per_token = torch.where(covered, listed + rest, 0.0)
    return per_token, per_token.detach(), covered
