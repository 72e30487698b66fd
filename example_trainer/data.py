"""From API batches to micro-batch tensors: padded rows, or one packed row.

Groups arrive as lists of sequences with -100 on untrained positions. Labels
are shifted here once: position t of every [B, T-1] tensor is the prediction
of token t+1. Sequences are sorted by length before being cut into
micro-batches, so little compute goes to padding.

Packed (`pack=True`, with a token budget): a micro-batch is one row of whole
sequences end to end, with position ids that restart at each sequence and no
attention mask, which transformers reads as separate sequences (padding-free
attention: `masking_utils` builds a block-diagonal mask, flash-attention runs
varlen). No token is padding. The position that would predict a sequence's first
token from the previous sequence's last is never trained (its loss mask is off).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from atroposlib.protocol import (
    GROUPS,
    TEACHER_LATENCY_FIELD,
    WEIGHT_VERSIONS_FIELD,
    ScoredData,
    group_problems,
    sending_env,
)
from atroposlib.weight_sync.versions import version_number
from example_trainer.advantages import AdvantageEstimator, AdvantageScale, group_advantages
from example_trainer.distill import TeacherRows, TeacherTopK, teacher_rows
from example_trainer.shared_prefix import SharedPrompts, shared_prompts
from example_trainer.vision import ImageCheck, check_pictures, sequence_pictures

BatchGroups = Iterable[ScoredData | Mapping[str, Any]]
"""A step's groups, as `/batch` gives them (`ScoredData`) or as plain dicts."""


@dataclass
class MicroBatch:
    input_ids: torch.Tensor  # [B, T]
    attention_mask: torch.Tensor | None  # [B, T]; None when packed
    position_ids: torch.Tensor | None  # [1, T], restarting at each sequence, when packed
    loss_mask: torch.Tensor  # [B, T-1], trained label positions
    advantages: torch.Tensor  # [B, T-1]
    # [B, T-1]; NaN rows for sequences that came without them (the trainer fills
    # those with its own detached logprobs: ratio 1, KL 0), None when no row has them.
    # Untrained positions may hold anything; the loss masks them before use
    old_logprobs: torch.Tensor | None
    ref_logprobs: torch.Tensor | None
    segments: torch.Tensor  # [B, T-1] long: each label position's sequence in the micro-batch
    shared: SharedPrompts | None = None  # padded rows cut at their shared prompts
    teacher: TeacherTopK | None = None
    """The teacher's top-k at each label position, when any sequence carries one."""
    pictures: list[tuple[str, ...]] | None = None
    """Each row's pictures (base64), when any row has one (`vision.py` makes the pixels)."""
    pixels: dict[str, torch.Tensor] | None = None
    """Their processor's inputs on the device, made by the trainer before the forward."""


@dataclass
class Sequence:
    tokens: list[int]
    masks: list[int]
    score: float
    advantages: list[float]
    inference_logprobs: list[float] | None
    ref_logprobs: list[float] | None
    group: int = 0
    """Its group's index in the groups `flatten` was given."""
    version: int | None = None
    """The trainer step whose weights sampled it (`weight_versions`), if the engine said."""
    cut: bool = False
    """Its tokens were cut at --seq-len: a completion that did not finish here."""
    source: int | None = None
    """The environment that sent its group (`sending_env`), if the group says."""
    teacher: TeacherRows | None = None
    """The teacher's top-k per position, if its group carried them (`distill.py`)."""
    pictures: tuple[str, ...] = ()
    """Its pictures (base64), whose image tokens its `tokens` hold (`vision.py`)."""


def flatten(
    batch: BatchGroups,
    scale: AdvantageScale,
    seq_len: int,
    require_inference_logprobs: bool = False,
    estimator: AdvantageEstimator = "grpo",
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
        centred = group_advantages(scores, scale, estimator)
        versions = sampled_versions(group)
        for i, whole in enumerate(group.tokens):
            tokens = whole[:seq_len]
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
                    group=index,
                    version=versions[i] if i < len(versions) else None,
                    cut=len(whole) > seq_len,
                    source=sending_env(group),
                    teacher=teacher_rows(group, i, len(tokens)),
                    pictures=sequence_pictures(group, i),
                )
            )
    return sequences


def check_group(index: int, group: ScoredData, vocab_size: int | None = None) -> None:
    """Raise `ValueError` naming the group and what makes it untrainable.

    The rules are the API's (`group_problems` in atroposlib.protocol): per-token
    fields need one value per token, and a finite one wherever a token is trained;
    untrained positions may hold any placeholder (1.0, NaN, -inf, vLLM's -9999).
    """
    problems = group_problems(group, vocab_size=vocab_size)
    if problems:
        where, message = problems[0]
        sequence = f" sequence {where[1]}" if len(where) > 1 and isinstance(where[1], int) else ""
        raise ValueError(f"group {index}{sequence}: {message}")


def split_trainable(
    batch: BatchGroups, vocab_size: int | None = None, image_check: ImageCheck | None = None
) -> tuple[list[ScoredData], dict[int, str]]:
    """The groups a trainer can train on, and why each of the others cannot be (by
    their index in the batch).

    The API refuses such groups at intake, but a batch may hold one it queued before
    the trainer declared its vocabulary, or come from another producer. Stopping on
    it would stop again on every restart, since the API serves a kept batch again
    (the correctness review's RUN-3), so the trainer skips it and counts it.
    `image_check`: a vision-language policy's check of each sequence's image tokens.
    """
    kept: list[ScoredData] = []
    skipped: dict[int, str] = {}
    for index, group in enumerate(GROUPS.validate_python(list(batch))):
        try:
            check_group(index, group, vocab_size)
            if image_check is not None:
                check_pictures(index, group, image_check)
        except ValueError as refused:
            skipped[index] = str(refused)
        else:
            kept.append(group)
    return kept, skipped


def _row(values: list[list[float]] | None, index: int, length: int) -> list[float] | None:
    """Row `index` cut to `length` (rows are checked to match the tokens), or None."""
    return None if values is None else list(values[index][:length])


def micro_batches(
    sequences: list[Sequence],
    count: int,
    pad_id: int,
    token_budget: int | None = None,
    pack: bool = False,
    share_prompts: bool = False,
) -> list[MicroBatch]:
    """Length-sorted sequences in up to `count` micro-batches, or, with `token_budget`, in
    as many as it takes to keep each one's size within it: padded (rows x longest row),
    or with `pack` the sum of the lengths in one row (see the module docstring).

    Sorting first makes neighbours about as long as each other, so little is padding. A
    sequence longer than the budget trains alone. The loss is normalised over the whole
    batch (loss.py), so how the batch is cut changes memory and time, not the gradient.
    `share_prompts`: padded micro-batches also carry their rows' shared prompts
    (`shared_prefix.py`).
    """
    ordered = sorted(sequences, key=lambda s: len(s.tokens))
    if not ordered:  # a rank whose share of the batch is empty
        return []
    if token_budget is None:
        size = -(-len(ordered) // max(1, count))
        return [
            _pad(ordered[i : i + size], pad_id, share_prompts) for i in range(0, len(ordered), size)
        ]
    chunks: list[list[Sequence]] = []
    for sequence in ordered:  # each one is the widest of its micro-batch so far
        if chunks and _tokens([*chunks[-1], sequence], pack) <= token_budget:
            chunks[-1].append(sequence)
        else:
            chunks.append([sequence])
    return [_packed(chunk) if pack else _pad(chunk, pad_id, share_prompts) for chunk in chunks]


def _tokens(chunk: list[Sequence], packed: bool) -> int:
    """A micro-batch's size: its tokens packed, or rows x longest row padded."""
    lengths = [len(s.tokens) for s in chunk]
    return sum(lengths) if packed else len(lengths) * max(lengths)


def _packed(chunk: list[Sequence]) -> MicroBatch:
    """The sequences of `chunk` end to end in one row (see the module docstring)."""
    if any(s.pictures for s in chunk):  # PolicyForward never packs a vision-language policy
        raise ValueError("sequences with pictures train in padded rows, not packed ones")
    ids = torch.tensor([t for s in chunk for t in s.tokens])[None]
    positions = torch.cat([torch.arange(len(s.tokens)) for s in chunk])[None]
    shifted = [_shifted(s) for s in chunk]  # each sequence's [n-1] label rows, plus a gap
    loss_mask = torch.cat([row for rows in shifted for row in (rows[0], _GAP_FALSE)])[:-1]
    advantages = torch.cat([row for rows in shifted for row in (rows[1], _GAP_ZERO)])[:-1]
    old = ref = None
    if any(s.inference_logprobs is not None for s in chunk):
        old = torch.cat([row for rows in shifted for row in (rows[2], _GAP_NAN)])[:-1]
    if any(s.ref_logprobs is not None for s in chunk):
        ref = torch.cat([row for rows in shifted for row in (rows[3], _GAP_NAN)])[:-1]
    segments = torch.cat(
        [torch.full((len(s.tokens),), n, dtype=torch.long) for n, s in enumerate(chunk)]
    )[:-1]  # label position t belongs to token t's sequence (a gap: never trained)
    teacher = None
    width = _teacher_width(chunk)
    if width:
        gap = ([0] * width, [-math.inf] * width)
        rows = [_teacher_rows(s, width) for s in chunk]
        teacher = TeacherTopK(
            torch.tensor([r for top, _ in rows for r in (*top, gap[0])][:-1])[None],
            torch.tensor([r for _, lps in rows for r in (*lps, gap[1])][:-1])[None],
        )
    return MicroBatch(
        ids,
        None,
        positions,
        loss_mask[None],
        advantages[None],
        None if old is None else old[None],
        None if ref is None else ref[None],
        segments[None],
        teacher=teacher,
    )


def _teacher_width(chunk: list[Sequence]) -> int:
    """The widest teacher top-k at any label position of `chunk` (0: no teacher)."""
    return max(
        (len(row) for s in chunk if s.teacher is not None for row in s.teacher.ids[1:]),
        default=0,
    )


def _teacher_rows(seq: Sequence, width: int) -> tuple[list[list[int]], list[list[float]]]:
    """A sequence's n - 1 label-position rows of teacher ids and logprobs, padded to
    `width` (see `TeacherTopK`)."""
    n = len(seq.tokens)
    if seq.teacher is None:
        return [[0] * width] * (n - 1), [[-math.inf] * width] * (n - 1)
    ids = [list(row) + [0] * (width - len(row)) for row in seq.teacher.ids[1:n]]
    lps = [list(row) + [-math.inf] * (width - len(row)) for row in seq.teacher.logprobs[1:n]]
    return ids, lps


# the label position between two packed sequences: untrained
_GAP_FALSE = torch.zeros(1, dtype=torch.bool)
_GAP_ZERO = torch.zeros(1)
_GAP_NAN = torch.full((1,), float("nan"))


def _shifted(seq: Sequence) -> tuple[torch.Tensor, ...]:
    """A sequence's label-position rows (length n - 1): trained, advantage, old, ref."""
    n = len(seq.tokens)
    missing = torch.full((n - 1,), float("nan"))
    return (
        torch.tensor([m != -100 for m in seq.masks[1:]], dtype=torch.bool),
        torch.tensor(seq.advantages[1:], dtype=torch.float32),
        missing if seq.inference_logprobs is None else torch.tensor(seq.inference_logprobs[1:]),
        missing if seq.ref_logprobs is None else torch.tensor(seq.ref_logprobs[1:]),
    )


def _pad(chunk: list[Sequence], pad_id: int, share_prompts: bool = False) -> MicroBatch:
    """Rows padded on the right to the longest; each tensor built by one `torch.tensor`
    over Python lists (a copy per row and field cost more than the forward pass does)."""
    width = max(len(s.tokens) for s in chunk)
    rows = len(chunk)
    gaps = [width - len(s.tokens) for s in chunk]
    padded = list(zip(chunk, gaps, strict=True))
    nan = float("nan")
    ids = torch.tensor([list(s.tokens) + [pad_id] * gap for s, gap in padded])
    lengths = torch.tensor([len(s.tokens) for s in chunk])
    attention = (torch.arange(width)[None] < lengths[:, None]).long()
    loss_mask = torch.tensor(
        [[m != -100 for m in s.masks[1:]] + [False] * gap for s, gap in padded],
        dtype=torch.bool,
    )
    advantages = torch.tensor(
        [list(s.advantages[1:]) + [0.0] * gap for s, gap in padded],
        dtype=torch.float32,
    )

    def labelled(values: list[list[float] | None]) -> torch.Tensor | None:
        """Per row, the label-position values (NaN where a row has none), or None."""
        if all(v is None for v in values):
            return None
        return torch.tensor(
            [
                [nan] * (width - 1) if v is None else list(v[1:]) + [nan] * gap
                for v, gap in zip(values, gaps, strict=True)
            ],
            dtype=torch.float32,
        )

    old = labelled([s.inference_logprobs for s in chunk])
    ref = labelled([s.ref_logprobs for s in chunk])
    segments = torch.arange(rows)[:, None].expand(rows, width - 1)
    shared = (
        shared_prompts([s.tokens for s in chunk], [s.masks for s in chunk], pad_id)
        if share_prompts
        else None
    )
    teacher = None
    k = _teacher_width(chunk)
    if k:
        listed = list(zip([_teacher_rows(s, k) for s in chunk], gaps, strict=True))
        teacher = TeacherTopK(
            torch.tensor([top + [[0] * k] * gap for (top, _), gap in listed]),
            torch.tensor(
                [lps + [[-math.inf] * k] * gap for (_, lps), gap in listed], dtype=torch.float32
            ),
        )
    pictures = [s.pictures for s in chunk] if any(s.pictures for s in chunk) else None
    return MicroBatch(
        ids, attention, None, loss_mask, advantages, old, ref, segments, shared, teacher, pictures
    )


def trained_tokens(sequence: Sequence) -> int:
    """Label positions that carry loss (position t predicts token t+1)."""
    return sum(1 for m in sequence.masks[1:] if m != -100)


def sampled_versions(group: ScoredData) -> list[int | None]:
    """Per sequence, the trainer step whose weights sampled it, from the group's
    `weight_versions` (see `atroposlib.protocol`); None where the engine gave no number."""
    versions = (group.model_extra or {}).get(WEIGHT_VERSIONS_FIELD) or []
    return [version_number(v) for v in versions]


def teacher_latency(groups: list[ScoredData]) -> dict[str, float]:
    """The mean seconds the groups' environments waited for their teacher
    (`TEACHER_LATENCY_FIELD`); empty when no group says."""
    waits = [
        float(wait)
        for group in groups
        if isinstance(wait := (group.model_extra or {}).get(TEACHER_LATENCY_FIELD), int | float)
    ]
    return {"teacher_latency_s": sum(waits) / len(waits)} if waits else {}


def drop_stale(
    sequences: list[Sequence], version: int, max_staleness: int | None
) -> tuple[list[Sequence], int]:
    """The sequences sampled at most `max_staleness` versions before `version` (the
    weights the trainer holds when it trains them), and how many were older. A sequence
    of unknown age is kept: one without a version, or one whose version is ahead of the
    trainer's (another run's later weights: a replayed group, `atropos-rollouts replay`)."""
    if max_staleness is None:
        return sequences, 0
    kept = [s for s in sequences if (lag := _lag(s, version)) is None or lag <= max_staleness]
    return kept, len(sequences) - len(kept)


def staleness(sequences: list[Sequence], version: int) -> dict[str, float]:
    """How many versions behind `version` the weights that sampled `sequences` were;
    empty when no sequence's age is known (an engine that labels nothing)."""
    lags = [lag for s in sequences if (lag := _lag(s, version)) is not None]
    if not lags:
        return {}
    return {"staleness_mean": sum(lags) / len(lags), "staleness_max": float(max(lags))}


def _lag(sequence: Sequence, version: int) -> int | None:
    """How many versions behind `version` the sequence's weights were; None when unknown
    (no label, or a label from weights this trainer has not reached)."""
    if sequence.version is None or sequence.version > version:
        return None
    return version - sequence.version
