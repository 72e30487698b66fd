"""From API batches to padded micro-batch tensors.

Groups arrive as lists of sequences with -100 on untrained positions. Labels
are shifted here once: position t of every [B, T-1] tensor is the prediction
of token t+1. Sequences are sorted by length before being cut into
micro-batches, so little compute goes to padding.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from atroposlib.protocol import GROUPS, WEIGHT_VERSIONS_FIELD, ScoredData
from example_trainer.loss import group_advantages

PER_TOKEN_FIELDS = ("advantages", "inference_logprobs", "ref_logprobs")
"""Fields with one value per token of each sequence."""

BatchGroups = Iterable[ScoredData | Mapping[str, Any]]
"""A step's groups, as `/batch` gives them (`ScoredData`) or as plain dicts."""


@dataclass
class MicroBatch:
    input_ids: torch.Tensor  # [B, T]
    attention_mask: torch.Tensor  # [B, T]
    loss_mask: torch.Tensor  # [B, T-1], trained label positions
    advantages: torch.Tensor  # [B, T-1]
    # [B, T-1]; NaN rows for sequences that came without them (the trainer fills
    # those with its own detached logprobs: ratio 1, KL 0), None when no row has them.
    # Untrained positions may hold anything; the loss masks them before use
    old_logprobs: torch.Tensor | None
    ref_logprobs: torch.Tensor | None


@dataclass
class Sequence:
    tokens: list[int]
    masks: list[int]
    score: float
    advantages: list[float]
    inference_logprobs: list[float] | None
    ref_logprobs: list[float] | None


def flatten(
    batch: BatchGroups, scale: str, seq_len: int, require_inference_logprobs: bool = False
) -> list[Sequence]:
    """One `Sequence` per rollout; groups may come as `ScoredData` or as plain dicts.

    Every group is checked first (`check_group`): the API refuses misaligned groups,
    but a batch may come from another producer, and a misaligned per-token list
    would otherwise be broadcast over the sequence or fail deep inside torch.
    """
    sequences = []
    for index, group in enumerate(GROUPS.validate_python(list(batch))):
        check_group(index, group)
        if group.inference_logprobs is None and require_inference_logprobs:
            raise ValueError(
                f"group {index} came without inference_logprobs, which "
                "--require-inference-logprobs demands: the importance ratio needs the "
                "logprobs of the policy that sampled it (ManagedServer sends them)"
            )
        scores = torch.tensor(group.scores, dtype=torch.float64)
        centred = group_advantages(scores, scale)
        for i, tokens in enumerate(group.tokens):
            tokens = tokens[:seq_len]
            advantages = (
                list(group.advantages[i][: len(tokens)])
                if group.advantages
                else [float(centred[i])] * len(tokens)
            )
            if group.overrides and (group.overrides[i] or {}).get("set_advantage_to_zero"):
                advantages = [0.0] * len(tokens)
            sequences.append(
                Sequence(
                    tokens=list(tokens),
                    masks=list(group.masks[i][: len(tokens)]),
                    score=float(scores[i]),
                    advantages=advantages,
                    inference_logprobs=_row(group.inference_logprobs, i, len(tokens)),
                    ref_logprobs=_row(group.ref_logprobs, i, len(tokens)),
                )
            )
    return sequences


def check_group(index: int, group: ScoredData) -> None:
    """Raise `ValueError` naming the group, sequence and field that breaks alignment.

    Per-token fields need one value per token, and a finite one wherever a token
    is trained (position j >= 1 with a mask other than -100). Untrained positions
    may hold any placeholder (1.0, NaN, -inf, vLLM's -9999): the loss never reads
    them. A mistake here is an environment or engine bug, so it stops the run
    rather than training on a guess.
    """
    n = len(group.tokens)
    if len(group.masks) != n or len(group.scores) != n:
        raise ValueError(
            f"group {index}: {n} sequences but {len(group.masks)} masks "
            f"and {len(group.scores)} scores"
        )
    trained = []
    for i, (tokens, masks) in enumerate(zip(group.tokens, group.masks, strict=True)):
        if len(masks) != len(tokens):
            raise ValueError(
                f"group {index} sequence {i}: masks has {len(masks)} values "
                f"for {len(tokens)} tokens"
            )
        positions = torch.tensor(masks, dtype=torch.long) != -100
        positions[:1] = False  # the first token is never predicted
        trained.append(positions)
    for field in PER_TOKEN_FIELDS:
        rows = getattr(group, field)
        if rows is None:
            continue
        if len(rows) != n:
            raise ValueError(f"group {index}: {field} has {len(rows)} rows for {n} sequences")
        for i, (tokens, row) in enumerate(zip(group.tokens, rows, strict=True)):
            if len(row) != len(tokens):
                raise ValueError(
                    f"group {index} sequence {i}: {field} has {len(row)} values "
                    f"for {len(tokens)} tokens"
                )
            bad = trained[i] & ~torch.isfinite(torch.tensor(row, dtype=torch.float64))
            if bool(bad.any()):
                j = int(bad.nonzero()[0])
                raise ValueError(
                    f"group {index} sequence {i}: {field}[{j}] is {row[j]} at a trained position"
                )


def _row(values: list[list[float]] | None, index: int, length: int) -> list[float] | None:
    """Row `index` cut to `length` (rows are checked to match the tokens), or None."""
    return None if values is None else list(values[index][:length])


def micro_batches(sequences: list[Sequence], count: int, pad_id: int) -> list[MicroBatch]:
    """Up to `count` micro-batches of length-sorted sequences."""
    ordered = sorted(sequences, key=lambda s: len(s.tokens))
    size = -(-len(ordered) // max(1, count))
    return [_pad(ordered[i : i + size], pad_id) for i in range(0, len(ordered), size)]


def _pad(chunk: list[Sequence], pad_id: int) -> MicroBatch:
    width = max(len(s.tokens) for s in chunk)
    rows = len(chunk)
    ids = torch.full((rows, width), pad_id, dtype=torch.long)
    attention = torch.zeros((rows, width), dtype=torch.long)
    loss_mask = torch.zeros((rows, width - 1), dtype=torch.bool)
    advantages = torch.zeros((rows, width - 1))
    has_old = any(s.inference_logprobs is not None for s in chunk)
    has_ref = any(s.ref_logprobs is not None for s in chunk)
    old = torch.full((rows, width - 1), float("nan")) if has_old else None
    ref = torch.full((rows, width - 1), float("nan")) if has_ref else None
    for r, seq in enumerate(chunk):
        n = len(seq.tokens)
        ids[r, :n] = torch.tensor(seq.tokens)
        attention[r, :n] = 1
        loss_mask[r, : n - 1] = torch.tensor([m != -100 for m in seq.masks[1:]], dtype=torch.bool)
        advantages[r, : n - 1] = torch.tensor(seq.advantages[1:])
        if seq.inference_logprobs is not None:
            old[r, : n - 1] = torch.tensor(seq.inference_logprobs[1:])
        if seq.ref_logprobs is not None:
            ref[r, : n - 1] = torch.tensor(seq.ref_logprobs[1:])
    return MicroBatch(ids, attention, loss_mask, advantages, old, ref)


def trained_tokens(sequence: Sequence) -> int:
    """Label positions that carry loss (position t predicts token t+1)."""
    return sum(1 for m in sequence.masks[1:] if m != -100)


def staleness(batch: list[ScoredData], step: int) -> dict[str, float]:
    """How many steps behind `step` the weights that sampled the batch were.

    From each group's `weight_versions` (see `atroposlib.protocol`); empty when no
    sequence carries a numeric version (an engine that labels nothing).
    """
    lags = []
    for group in batch:
        versions = (group.model_extra or {}).get(WEIGHT_VERSIONS_FIELD) or []
        lags += [step - int(v) for v in versions if isinstance(v, str) and v.isdigit()]
    if not lags:
        return {}
    return {"staleness_mean": sum(lags) / len(lags), "staleness_max": float(max(lags))}
